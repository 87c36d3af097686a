// Package admin is the daemon's HTTP surface on admin.listen (SPEC §6):
// /metrics, /healthz and /readyz, and the home of the admin API and console.
package admin

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shaper-dev/shaper/cmd/shaper/internal/admin/console"
)

// Backend is what the admin endpoints ask of the running daemon.
type Backend interface {
	// NotReady returns why the daemon is not ready, or "" when it is.
	NotReady() string
}

// NewHandler returns the admin mux: reg's metrics at /metrics, liveness at
// /healthz (always 200 while the process serves), readiness at /readyz
// (200, or 503 with the reason from b.NotReady), and the admin API of SPEC
// §6 on b, whose write endpoints need "Authorization: Bearer <token>" when
// token is not empty, and the web console at / (its assets under /console/).
func NewHandler(reg *prometheus.Registry, b Lanes, token string, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	api{b: b, token: token, log: log}.routes(mux)
	mux.Handle("GET /{$}", console.Handler())
	mux.Handle("GET "+console.AssetPrefix, console.Handler())
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := b.NotReady(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}
