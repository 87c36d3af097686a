package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"
)

// Issue 15's sections: 6 (Redis global pacing, redis.go), 9 (an idle
// daemon, idle.go) and 10 (many lanes in one process, manylanes.go). This
// file holds their plan, their results and their place in a run.

// issue15 is the plan of sections 6, 9 and 10.
type issue15 struct {
	idleSpan   time.Duration // section 9: the measured span
	idleScrape time.Duration // section 9: a /metrics scrape every …
	manyLanes  int           // section 10: lanes in one process
	manyRate   float64       // section 10: each lane's limit, per second
	manySpan   time.Duration // section 10: the measured span under backlog
	redisRates []float64     // section 6: the shared limits
	redisSpan  time.Duration // section 6: each rate under backlog
}

func issue15Plan(quick bool) issue15 {
	p := issue15{
		idleSpan: 60 * time.Second, idleScrape: 15 * time.Second,
		manyLanes: 200, manyRate: 5, manySpan: 20 * time.Second,
		redisRates: []float64{100, 1000, 10000}, redisSpan: 10 * time.Second,
	}
	if quick {
		p.idleSpan = 3 * time.Second
		p.manyLanes, p.manySpan = 20, 2*time.Second
		p.redisSpan = time.Second
	}
	return p
}

// issue15Results holds what sections 6, 9 and 10 measured.
type issue15Results struct {
	idle      *idleRow     // section 9
	many      []manyResult // section 10: JetStream, in-memory
	redis     []redisRow   // section 6
	redisSkip string       // section 6 not run: why (no redis-server outside CI)
}

// issue15Section reports whether name is a -section of issue 15.
func issue15Section(name string) bool {
	return name == "idle" || name == "lanes" || name == "redis"
}

// runIssue15 measures sections 6, 10 and 9 in a full or quick run; env is
// the run's embedded NATS server (section 10 reads from it).
func (res *Results) runIssue15(ctx context.Context, env *natsEnv, quiet func(), logf func(string, ...any)) {
	quiet()
	res.runRedis(logf)
	logf("section 6 done at %s", time.Since(res.started).Round(time.Millisecond))
	quiet()
	res.runMany(ctx, env, logf)
	logf("section 10 done at %s", time.Since(res.started).Round(time.Millisecond))
	quiet()
	res.runIdleSection(logf)
	logf("section 9 done at %s", time.Since(res.started).Round(time.Millisecond))
}

// runOnly runs the section opts.Only names (-section).
func (res *Results) runOnly(logf func(string, ...any)) error {
	switch res.opts.Only {
	case "idle":
		res.runIdleSection(logf)
	case "redis":
		res.runRedis(logf)
	case "lanes":
		dir, err := os.MkdirTemp("", "shaper-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		env, err := startNATS(dir)
		if err != nil {
			return err
		}
		defer env.close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		res.runMany(ctx, env, logf)
	default:
		return fmt.Errorf("unknown section %q", res.opts.Only)
	}
	return nil
}

func (res *Results) runIdleSection(logf func(string, ...any)) {
	p := res.plan
	row := runIdle(p.idleSpan, p.idleScrape, logf)
	if row.err == nil {
		logf("idle daemon: %.3f %% of one core over %s, %d scrapes, %.0f wake-ups/s",
			100*row.share(), row.span.Round(time.Millisecond), row.scrapes, float64(row.switches)/row.span.Seconds())
	}
	res.noteIdle(row)
}

// noteIdle keeps section 9's result; a failure, and in a full run a daemon
// at or above idleBound, is a failed measurement (quick runs are too short
// to judge).
func (res *Results) noteIdle(row idleRow) {
	res.idle = &row
	switch {
	case row.err != nil:
		res.problems = append(res.problems, "idle daemon: "+row.err.Error())
	case !res.opts.Quick && row.share() >= idleBound:
		res.problems = append(res.problems, fmt.Sprintf("idle daemon: %.3f %% of one core, bound %.1f %%", 100*row.share(), 100*idleBound))
	}
}

// runSection runs one section of issue 15 alone and prints it (-section).
func runSection(name string, quick bool, stdout, stderr io.Writer) int {
	res, err := Run(Options{Quick: quick, Only: name, Progress: stderr})
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	var hs []string
	switch name {
	case "idle":
		fmt.Fprint(stdout, res.idleMarkdown())
		hs = res.idleHeadline()
	case "lanes":
		fmt.Fprint(stdout, res.manyMarkdown())
		hs = res.manyHeadlines()
	case "redis":
		fmt.Fprint(stdout, res.redisMarkdown())
		hs = res.redisHeadlines()
	}
	for _, h := range hs {
		fmt.Fprintln(stdout, "- "+h)
	}
	for _, pr := range res.problems {
		fmt.Fprintln(stderr, "bench:", pr)
	}
	if len(res.problems) > 0 {
		return 1
	}
	return 0
}

// issue15Headlines are the headlines of sections 6, 9 and 10.
func (res *Results) issue15Headlines() []string {
	var hs []string
	hs = append(hs, res.redisHeadlines()...)
	hs = append(hs, res.idleHeadline()...)
	hs = append(hs, res.manyHeadlines()...)
	return hs
}
