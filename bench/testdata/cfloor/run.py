#!/usr/bin/env python3
"""Runs the C floor (floor.c) against section 11's downstream process.

usage: run.py BENCH_BINARY FLOOR_BINARY [burn_us]

BENCH_BINARY is `go build -o /tmp/bench ./bench`; with SHAPERBENCH_HTTP_DOWNSTREAM=1
it is the downstream that stamps each request with the kernel's receive time.
Prints the rate at those stamps as section 11 computes it, (n - 1) / (last - first),
and the most requests in any 10 ms and 1 s window (G1 bounds 51 and 5001).
"""
import bisect, os, subprocess, sys

bench, floor = sys.argv[1], sys.argv[2]
burn = sys.argv[3] if len(sys.argv) > 3 else "0"
n = 50000
env = dict(os.environ, SHAPERBENCH_HTTP_DOWNSTREAM="1")
down = subprocess.Popen([bench], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
host, port = down.stdout.readline().split()[1].rsplit(":", 1)
subprocess.run(["/usr/bin/time", "-f", "CPU %U s user %S s system", floor, host, port, str(n), burn], check=True)
down.stdin.close()
ts = []
for line in down.stdout:
    k, _, v = line.strip().partition(" ")
    if k == "T":
        ts.append(int(v))
    elif k == "END":
        break
down.wait()
ts.sort()
rate = (len(ts) - 1) / ((ts[-1] - ts[0]) / 1e9)
w10 = max(bisect.bisect_left(ts, t + 10_000_000, i) - i for i, t in enumerate(ts))
w1s = max(bisect.bisect_left(ts, t + 1_000_000_000, i) - i for i, t in enumerate(ts))
gap = max(b - a for a, b in zip(ts, ts[1:]))
print(f"C floor, burn {burn} us: {len(ts)} requests, {rate:.1f}/s ({(rate - 5000) / 50:+.2f} %), "
      f"longest gap {gap / 1e6:.2f} ms, most in 10 ms {w10}, in 1 s {w1s}")
