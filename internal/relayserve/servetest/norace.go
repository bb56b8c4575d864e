//go:build !race

package servetest

// RaceEnabled is true when the tests run with -race.
const RaceEnabled = false
