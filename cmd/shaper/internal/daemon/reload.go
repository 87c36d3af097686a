package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"syscall"
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/internal/filewatch"
)

// Reload applies a new configuration (SIGHUP or a change of the file,
// issue 6): lanes whose settings can change in place are updated (rate,
// slack, warmup, capacity, timeouts, retries, max_in_flight, sink); a lane
// whose source or overflow mode changed is drained and started anew; new
// lanes start; removed lanes drain gracefully. Nothing held is nak'd by an
// in-place update. An invalid configuration changes nothing: its problems
// are logged and the running one stays. Settings outside downstreams (NATS,
// admin, log, shutdown, redis) need a restart; a change there is logged.
func (d *Daemon) Reload(ctx context.Context, cfg *config.Config) {
	if d.draining.Load() {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.cfg
	var restart []string // the sections that changed (a new-user pass: which?)
	for _, c := range []struct {
		name    string
		changed bool
	}{
		{"nats", !reflect.DeepEqual(old.NATS, cfg.NATS)}, {"admin", old.Admin != cfg.Admin}, {"log", old.Log != cfg.Log},
		{"shutdown", old.Shutdown != cfg.Shutdown}, {"redis", !reflect.DeepEqual(old.Redis, cfg.Redis)},
	} {
		if c.changed {
			restart = append(restart, c.name)
		}
	}
	if len(restart) > 0 {
		d.log.Warn("reload: changes outside downstreams need a restart; they were not applied", "sections", restart)
	}
	drainTimeout := old.Shutdown.DrainTimeout
	d.failed = map[string]string{} // retried below with the new configuration
	for name, rec := range d.lanes {
		lc, ok := cfg.Downstreams[name]
		if !ok {
			d.dropLane(name)
			d.retire(name, rec, "removed from the configuration", drainTimeout)
			d.m.Remove(name)
			continue
		}
		if reflect.DeepEqual(rec.cfg, lc) {
			continue
		}
		d.updateLane(ctx, name, rec, lc, drainTimeout)
	}
	d.addLanes(ctx, cfg)
	d.cfg = cfg
	d.log.Info("configuration reloaded", "lanes", len(d.lanes))
}

// retire drains a lane that left the configuration in the background,
// within drainTimeout, and closes its sinks; d.retired waits for it.
func (d *Daemon) retire(name string, rec *laneRec, why string, drainTimeout time.Duration) {
	d.log.Info("reload: draining lane", "lane", name, "why", why)
	d.retired.Add(1)
	go func() {
		defer d.retired.Done()
		dctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
		defer cancel()
		rec.lane.Drain(dctx)
		rec.closeSinks()
	}()
}

// updateLane applies lc to a running lane: in place when it can, else by a
// drain and a new lane. d.mu is held.
func (d *Daemon) updateLane(ctx context.Context, name string, rec *laneRec, lc config.Lane, drainTimeout time.Duration) {
	err := rec.lane.Update(lc)
	if errors.Is(err, drain.ErrRestartNeeded) {
		// The replacement must not fetch before the old lane handed its
		// messages back: drain first, then start the new one.
		d.log.Info("reload: lane restarts (source, overflow, dead letter, sink kind or another key it cannot change in place)", "lane", name)
		dctx, cancel := context.WithTimeout(ctx, drainTimeout)
		rec.lane.Drain(dctx)
		cancel()
		rec.closeSinks()
		nrec, err := d.newLane(ctx, name, lc)
		if err != nil {
			d.log.Error("reload: lane could not restart", "lane", name, "err", err)
			d.dropLane(name)
			d.failed[name] = err.Error()
			return
		}
		d.setLane(name, nrec)
		nrec.lane.Start()
		return
	}
	if !reflect.DeepEqual(rec.cfg.Sink, lc.Sink) {
		sink, err := d.newSink(lc.Sink, lc.Task.MaxInFlight)
		if err != nil {
			d.log.Error("reload: new sink rejected; the old one stays", "lane", name, "err", err)
		} else {
			old := rec.lane.SetSink(sink)
			rec.sink = sink
			go closeSink(old) // waits for the calls still running
		}
	}
	rec.cfg = lc
}

// addLanes starts the lanes of cfg that are not running. d.mu is held.
func (d *Daemon) addLanes(ctx context.Context, cfg *config.Config) {
	for name, lc := range cfg.Downstreams {
		if _, ok := d.lanes[name]; ok {
			continue
		}
		rec, err := d.newLane(ctx, name, lc)
		if err != nil {
			d.log.Error("reload: new lane could not start (not ready until a reload fixes it)", "lane", name, "err", err)
			d.failed[name] = err.Error()
			continue
		}
		d.setLane(name, rec)
		rec.lane.Start()
		d.log.Info("reload: lane added", "lane", name)
	}
}

// Serve starts d and runs it until SIGTERM or SIGINT, then drains: a second
// signal skips to the nak-and-exit step (SPEC §3, Drain). SIGHUP, or a change
// of the config file at path, reloads the configuration (issue 6).
func Serve(d *Daemon, log *slog.Logger, path string, reload func() (*config.Config, error)) error {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := d.Start(context.Background()); err != nil {
		return fmt.Errorf("shaper: start: %w", err)
	}
	changed, lastWrite, stopWatch := watchFile(path, log)
	defer stopWatch()
	var sig os.Signal
	// settle fires when a change found the file empty and no other change
	// came within emptySettle: only then is the empty file read, and
	// rejected, once.
	var settle <-chan time.Time
	for sig == nil {
		select {
		case sig = <-sigs:
		case <-hup:
			settle = nil
			_ = d.ApplyReload("SIGHUP", reload)
		case <-changed:
			if fileEmpty(path) {
				log.Debug("config file empty: waiting for the write to finish", "path", path, "wait", emptySettle)
				settle = time.After(emptySettle)
				continue
			}
			settle = nil
			_ = d.ApplyReload("file changed", reload)
		case <-settle:
			// Writes still going on (a burst longer than the wait): wait
			// until the file has been quiet for emptySettle; their own
			// change comes 200 ms after the last of them.
			if quiet := time.Since(lastWrite()); quiet < emptySettle {
				settle = time.After(emptySettle - quiet)
				continue
			}
			settle = nil
			_ = d.ApplyReload("file changed", reload)
		}
	}
	log.Info("signal received: draining", "signal", sig.String(), "drain_timeout", d.cfg.Shutdown.DrainTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Shutdown.DrainTimeout)
	defer cancel()
	go func() {
		select {
		case s := <-sigs:
			log.Warn("second signal: handing the rest back now", "signal", s.String())
			cancel()
		case <-ctx.Done():
		}
	}()
	sum := d.Drain(ctx)
	log.Info("shaper stopped", "delivered", sum.Delivered, "nacked", sum.Nacked,
		"dead_lettered", sum.DeadLettered, "handed_back", sum.Leftovers)
	return nil
}

// ApplyReload is the reload path of Serve (SIGHUP, a change of the file,
// named by trigger): it loads the configuration with load and applies it
// with Reload, or, when load fails (the file does not validate), logs the
// problems and keeps the running configuration. Either way it sets
// shaper_config_last_reload_successful (1 applied, 0 rejected) and, on
// success, shaper_config_last_reload_success_timestamp_seconds, so that a
// rejected reload shows in /metrics and alerts, not only in the logs (issue
// 12). It returns load's error.
func (d *Daemon) ApplyReload(trigger string, load func() (*config.Config, error)) error {
	cfg, err := load()
	if err != nil {
		d.log.Error("reload rejected: the running configuration stays", "trigger", trigger, "err", err)
		d.m.ConfigLoaded(false, time.Now())
		return err
	}
	d.log.Info("reloading configuration", "trigger", trigger)
	d.Reload(context.Background(), cfg)
	d.m.ConfigLoaded(true, time.Now())
	return nil
}

// emptySettle is how long a change of the config file that left it empty
// waits for the write to finish before the empty file is read (and
// rejected). A truncate-then-write caught in between (field case C31: `: >
// config.yaml`, 300 ms, then the file; or a burst of in-place writes whose
// debounce ends between a truncate and its write) is then no rejection at
// all: the write's own change comes first and is applied.
const emptySettle = time.Second

// fileEmpty reports whether the file at path is empty as config.Load judges
// it (config.Empty). A file that cannot be read is not empty: the reload
// reports why.
func fileEmpty(path string) bool {
	raw, err := os.ReadFile(path)
	return err == nil && config.Empty(raw)
}

// watchFile reports changes of the file at path (writes, or an editor's or
// a Kubernetes ConfigMap's rename-into-place), debounced by 200 ms
// (internal/filewatch, which watches the directory: a rename replaces the
// file's inode), and the time of its latest write (zero before one).
func watchFile(path string, log *slog.Logger) (changed <-chan struct{}, lastWrite func() time.Time, stop func()) {
	out := make(chan struct{}, 1)
	stop, lastWrite, err := filewatch.WatchActivity([]string{path}, 200*time.Millisecond, func() {
		select {
		case out <- struct{}{}:
		default:
		}
	})
	if err != nil {
		log.Warn("config file not watched: reload with SIGHUP", "err", err)
	}
	return out, lastWrite, stop
}
