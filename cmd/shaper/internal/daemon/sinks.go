package daemon

import (
	"fmt"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/sinks"
)

func (d *Daemon) newSink(sc config.Sink, maxInFlight int) (drain.Sink, error) {
	build, ok := sinkKinds[sc.Kind]
	if !ok {
		return nil, fmt.Errorf("unknown sink kind %q", sc.Kind)
	}
	return build(d, sc, maxInFlight)
}

// sinkKinds builds a lane's sink by sink.kind: adding a kind is its file in
// sinks/, its keys in config, and one row here (docs/architecture.md).
var sinkKinds = map[string]func(d *Daemon, sc config.Sink, maxInFlight int) (drain.Sink, error){
	config.SinkHTTP: func(d *Daemon, sc config.Sink, maxInFlight int) (drain.Sink, error) {
		s, err := sinks.NewHTTP(sinks.HTTPConfig{URL: sc.URL, Method: sc.Method, Headers: sc.Headers,
			SuccessStatus: sc.SuccessStatus, RetryableStatus: sc.RetryableStatus,
			Signing: sinks.SigningConfig{Scheme: sc.Signing.Scheme, Secrets: sc.Signing.Secrets},
			Auth:    sc.Auth.HTTPAuth(), TLS: sc.TLS.HTTPTLS()},
			sinks.WithLogger(d.log), sinks.WithMaxIdleConnsPerHost(max(sinks.DefaultMaxIdleConnsPerHost, maxInFlight)))
		if err != nil {
			return nil, err
		}
		return s, nil
	},
	config.SinkNATS: func(d *Daemon, sc config.Sink, _ int) (drain.Sink, error) {
		return sinks.NewNATS(d.js, sc.Subject), nil
	},
	config.SinkLog: func(d *Daemon, _ config.Sink, _ int) (drain.Sink, error) {
		return sinks.NewLog(d.stdout), nil
	},
}

func closeSink(s drain.Sink) {
	if c, ok := s.(interface{ Close() error }); ok {
		_ = c.Close()
	}
}

// closeSinks closes the lane's sink and its dead-letter publisher, after
// the lane drained.
func (rec *laneRec) closeSinks() {
	closeSink(rec.sink)
	closeSink(rec.dead)
}
