package admin

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sources"
)

// LaneView is one lane as GET /v1/lanes shows it (SPEC §6).
type LaneView struct {
	Lane        string     `json:"lane"`
	State       string     `json:"state"` // running, paused, open, draining, stopped
	PausedUntil *time.Time `json:"paused_until"`
	PauseReason string     `json:"pause_reason"`
	Limit       float64    `json:"limit_per_second"`
	Rate        float64    `json:"rate_per_second"`     // in force
	Achieved    float64    `json:"achieved_per_second"` // last 10 s
	Depth       int        `json:"depth"`
	Capacity    int        `json:"capacity"`
	InFlight    int        `json:"in_flight"`
	DeadLetters uint64     `json:"dead_letters"`
	LastError   string     `json:"last_error"`
	// QueueWaitP99 is the p99 of the last departures' queue waits, seconds.
	QueueWaitP99 float64 `json:"queue_wait_p99_seconds"`
	// QuotaRemaining is what rate.quota still allows in the sliding window
	// ending now, in messages; null when the lane has no quota.
	QuotaRemaining *int `json:"quota_remaining"`
}

// PauseRequest is the body of POST /v1/lanes/{lane}/pause.
type PauseRequest struct {
	For    string `json:"for,omitempty"` // a Go duration; "" = until resumed
	Reason string `json:"reason,omitempty"`
}

// ReplayRequest is the body of POST /v1/lanes/{lane}/dead-letters/replay.
type ReplayRequest struct {
	Reason string `json:"reason,omitempty"`
	Since  string `json:"since,omitempty"` // RFC 3339 or a Go duration back from now
	Max    int    `json:"max,omitempty"`   // 0 = all
}

// PurgeResult is the answer of POST /v1/lanes/{lane}/purge.
type PurgeResult struct {
	// UpToSeq is the source stream's last sequence when the purge began:
	// the lane dead-letters every message up to it as purged.
	UpToSeq uint64 `json:"up_to_seq"`
	// Held is how many this replica took from its bucket at once.
	Held int `json:"held"`
	// Pending is what the consumer still had pending (delivered and not
	// acknowledged, or not yet delivered); it is dead-lettered as it arrives.
	Pending uint64 `json:"pending"`
}

// Errors a Backend returns; the API maps them to status codes.
var (
	// ErrNoLane: no lane of that name (404).
	ErrNoLane = errors.New("no such lane")
	// ErrBadRequest: the request's values are wrong (400).
	ErrBadRequest = errors.New("bad request")
	// ErrConflict: the request cannot apply in the lane's state (409).
	ErrConflict = errors.New("conflict")
	// ErrUnavailable: what the request needs is not reachable now, such
	// as the NATS server while the daemon reconnects (503): nothing was
	// changed, ask again.
	ErrUnavailable = errors.New("unavailable")
)

// Lanes is what the admin API asks of the running daemon.
type Lanes interface {
	Backend
	Lanes(ctx context.Context) []LaneView
	Lane(ctx context.Context, name string) (LaneView, error)
	Pause(ctx context.Context, name string, d time.Duration, reason string) error
	Resume(ctx context.Context, name string) error
	DeadLetters(ctx context.Context, name string, f sources.DeadLetterFilter) ([]sources.DeadLetter, error)
	Replay(ctx context.Context, name string, f sources.DeadLetterFilter) (int, error)
	Purge(ctx context.Context, name string) (PurgeResult, error)
}

// api serves the endpoints of SPEC §6.
type api struct {
	b     Lanes
	token string
	log   *slog.Logger
}

func (a api) routes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/lanes", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.b.Lanes(r.Context()))
	})
	mux.HandleFunc("GET /v1/lanes/{lane}", func(w http.ResponseWriter, r *http.Request) {
		v, err := a.b.Lane(r.Context(), laneName(r))
		a.answer(w, v, err)
	})
	mux.HandleFunc("POST /v1/lanes/{lane}/pause", a.write(a.pause))
	mux.HandleFunc("POST /v1/lanes/{lane}/resume", a.write(func(w http.ResponseWriter, r *http.Request) {
		a.answerLane(w, r, a.b.Resume(r.Context(), laneName(r)))
	}))
	mux.HandleFunc("GET /v1/lanes/{lane}/dead-letters", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		f, err := filter(q.Get("reason"), q.Get("since"), q.Get("limit"))
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		list, err := a.b.DeadLetters(r.Context(), laneName(r), f)
		a.answer(w, list, err)
	})
	mux.HandleFunc("POST /v1/lanes/{lane}/dead-letters/replay", a.write(a.replay))
	mux.HandleFunc("POST /v1/lanes/{lane}/purge", a.write(func(w http.ResponseWriter, r *http.Request) {
		res, err := a.b.Purge(r.Context(), laneName(r))
		a.answer(w, res, err)
	}))
	// Errors are JSON everywhere under /v1/ (SPEC §6), also for a path or a
	// method the API does not have: the patterns above win over these.
	for _, p := range []string{"/v1/lanes", "/v1/lanes/{lane}", "/v1/lanes/{lane}/pause", "/v1/lanes/{lane}/resume",
		"/v1/lanes/{lane}/dead-letters", "/v1/lanes/{lane}/dead-letters/replay", "/v1/lanes/{lane}/purge"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusMethodNotAllowed, fmt.Errorf("%s is not allowed on %s", r.Method, r.URL.Path))
		})
	}
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Errorf("no endpoint %s (see docs/admin-api.md)", r.URL.Path))
	})
}

// laneName is the request's {lane}, lower-cased as the config loader
// lower-cases lane names (a new-user pass: "shaper pause PAYMENTS" was a
// 404 for the lane its config calls Payments).
func laneName(r *http.Request) string { return strings.ToLower(r.PathValue("lane")) }

// write guards a write endpoint with the bearer token (when one is set),
// compared in constant time.
func (a api) write(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.token != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(a.token)) != 1 {
				// Logged too, with the caller's address, never what it sent.
				a.log.Warn("admin API write refused: no valid admin.token", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
				w.Header().Set("WWW-Authenticate", `Bearer realm="shaper"`)
				writeError(w, http.StatusUnauthorized, errors.New("write endpoints need Authorization: Bearer <admin.token>"))
				return
			}
		}
		a.log.Info("admin API write", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
		h(w, r)
	}
}

func (a api) pause(w http.ResponseWriter, r *http.Request) {
	var req PauseRequest
	if !readJSON(w, r, &req) {
		return
	}
	var d time.Duration
	if req.For != "" {
		var err error
		if d, err = time.ParseDuration(req.For); err != nil || d <= 0 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("for: want a positive Go duration such as 10m, got %q", req.For))
			return
		}
	}
	a.answerLane(w, r, a.b.Pause(r.Context(), laneName(r), d, req.Reason))
}

func (a api) replay(w http.ResponseWriter, r *http.Request) {
	var req ReplayRequest
	if !readJSON(w, r, &req) {
		return
	}
	if req.Max < 0 {
		writeError(w, http.StatusBadRequest, fmt.Errorf("max: want ≥ 0, got %d", req.Max))
		return
	}
	f, err := filter(req.Reason, req.Since, "")
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	f.Limit = req.Max
	n, err := a.b.Replay(r.Context(), laneName(r), f)
	a.answer(w, map[string]int{"replayed": n}, err)
}

// answerLane answers a write with the lane's new view.
func (a api) answerLane(w http.ResponseWriter, r *http.Request, err error) {
	if err != nil {
		a.answer(w, nil, err)
		return
	}
	v, err := a.b.Lane(r.Context(), laneName(r))
	a.answer(w, v, err)
}

func (a api) answer(w http.ResponseWriter, v any, err error) {
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, v)
	case errors.Is(err, ErrNoLane):
		writeError(w, http.StatusNotFound, err)
	case errors.Is(err, ErrBadRequest):
		writeError(w, http.StatusBadRequest, err)
	case errors.Is(err, ErrConflict):
		writeError(w, http.StatusConflict, err)
	case errors.Is(err, ErrUnavailable):
		writeError(w, http.StatusServiceUnavailable, err)
	default:
		writeError(w, http.StatusInternalServerError, err)
	}
}

// filter parses the dead-letter filter of a query or body: since is RFC
// 3339 or a Go duration back from now.
func filter(reason, since, limit string) (sources.DeadLetterFilter, error) {
	f := sources.DeadLetterFilter{Reason: reason}
	if reason != "" && !slices.Contains(shaper.DeadLetterReasons, reason) {
		return f, fmt.Errorf("reason: want one of %s, got %q", strings.Join(shaper.DeadLetterReasons, ", "), reason)
	}
	if since != "" {
		if t, err := time.Parse(time.RFC3339, since); err == nil {
			f.Since = t
		} else if d, err := time.ParseDuration(since); err == nil && d > 0 {
			f.Since = time.Now().Add(-d)
		} else {
			return f, fmt.Errorf("since: want RFC 3339 or a duration such as 1h, got %q", since)
		}
	}
	if limit != "" {
		n, err := strconv.Atoi(limit)
		if err != nil || n < 0 {
			return f, fmt.Errorf("limit: want a number ≥ 0, got %q", limit)
		}
		f.Limit = n
	}
	return f, nil
}

func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, 1<<16)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, fmt.Errorf("body: %w", err))
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, errors.New("body: one JSON object expected, more follows"))
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}
