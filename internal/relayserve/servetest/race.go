//go:build race

package servetest

// RaceEnabled is true when the tests run with -race: Build then builds
// the relay binary with -race too, so data races in the real server are
// caught (the process exits with status 66 and the report is in its log).
const RaceEnabled = true
