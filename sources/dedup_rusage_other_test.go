//go:build !unix

package sources

import "time"

// cpuTime is not measured here (BenchmarkDedup reports 0).
func cpuTime() time.Duration { return 0 }
