package main

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/stat (100 on Linux for decades).
const clockTicks = 100

// loadMeter measures how busy the machine was with *other* processes while
// a measurement ran: the CPU time of the whole machine (/proc/stat) minus
// this process's own (getrusage), as a share of all cores. These machines
// are shared; a number taken while something else ran says so.
type loadMeter struct {
	busy, total uint64
	own         time.Duration
	ok          bool
}

func startLoad() loadMeter {
	busy, total, ok := procStat()
	return loadMeter{busy: busy, total: total, own: cpuTime(), ok: ok}
}

// other returns the share (0–1) of the machine's CPU that other processes
// used since startLoad, or −1 when /proc/stat cannot be read.
func (l loadMeter) other() float64 {
	busy, total, ok := procStat()
	if !ok || !l.ok || total <= l.total {
		return -1
	}
	ownTicks := (cpuTime() - l.own).Seconds() * clockTicks
	o := (float64(busy-l.busy) - ownTicks) / float64(total-l.total)
	return min(max(o, 0), 1)
}

// procStat returns the busy and total jiffies of all CPUs.
func procStat() (busy, total uint64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0, false
	}
	var v [7]uint64
	for i := range v {
		v[i], err = strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return 0, 0, false
		}
	}
	// user nice system idle iowait irq softirq (steal counts as busy too).
	busy = v[0] + v[1] + v[2] + v[5] + v[6]
	if len(f) > 8 {
		if s, err := strconv.ParseUint(f[8], 10, 64); err == nil {
			busy += s
		}
	}
	return busy, busy + v[3] + v[4], true
}

// waitQuiet waits, for at most max, until other processes used less than
// limit of the machine over a 200 ms look, and returns how long it waited.
// It lets a noisy neighbour's burst (a compile, a test run) pass before a
// measurement starts; every contender gets the same chance.
func waitQuiet(limit float64, max time.Duration) time.Duration {
	start := time.Now()
	for time.Since(start) < max {
		l := startLoad()
		time.Sleep(200 * time.Millisecond)
		if o := l.other(); o >= 0 && o < limit {
			break
		}
	}
	return time.Since(start)
}
