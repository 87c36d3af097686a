// Package tick puts the daemon's quiet periodic wake-ups on one grid per
// process: a lane's pull renewal (sources) and its house loop (drain) wait
// until the next instant of the grid of their period, not a period after
// whenever they last ran. Lanes that had traffic at different moments then
// still wake together when quiet, and one wake-up of the process serves
// them all: after traffic, an idle daemon with 10 lanes woke 136–139 times
// a second with each lane on its own phase, 65–70 with the pulls on the
// grid, and 23–27 with the house loops on it too (issue 15,
// docs/performance.md, session 29).
package tick

import (
	"math/rand/v2"
	"time"
)

// Phase shifts this process's grid, so that the replicas of a deployment
// do not all wake in the same millisecond. It is drawn once, at start, in
// [0, 1 h); grids of periods that divide one another nest.
var Phase = time.Duration(rand.Int64N(int64(time.Hour)))

// Until returns the wait from now to the next instant of the process's
// grid of every (the instants t with t + Phase a whole multiple of every
// since the Unix epoch), in (0, every]. every must be positive.
func Until(now time.Time, every time.Duration) time.Duration {
	return every - time.Duration((now.UnixNano()+int64(Phase))%int64(every))
}
