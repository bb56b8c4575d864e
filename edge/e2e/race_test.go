//go:build race

package e2e

// raceEnabled builds edged and edgectl with -race too when the tests run
// with -race, so data races in the real processes are caught (they exit
// with status 66 and the report lands in the node's log).
const raceEnabled = true
