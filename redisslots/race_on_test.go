//go:build race

package redisslots

// raceEnabled reports whether the tests run under the race detector: the
// long-run rate floors are claims about the product, never built with it,
// so under -race they are logged, and scripts/test.sh runs those tests again
// without it, where they are asserted. Windows and ceilings are asserted in
// both.
const raceEnabled = true
