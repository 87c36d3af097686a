// Package console is the admin endpoint's web console (SPEC §6, GET /): a
// page that polls the admin API of its own origin and shows every lane's
// state and numbers, live charts of departures, depth and queue wait, the
// pause and resume buttons and the dead letters with replay.
//
// It is self-contained: one HTML, one CSS and one JavaScript file embedded
// in the binary, no external assets, no build step. A Content-Security-Policy
// allowing only the page's own origin says so to the browser too, and the
// script writes values from the API with textContent only.
package console

import (
	"embed"
	"net/http"
	"path"
)

//go:embed index.html console.css console.js
var files embed.FS

// AssetPrefix is the path under which Handler serves the console's CSS and
// JavaScript (index.html refers to them relative to "/").
const AssetPrefix = "/console/"

// contentTypes are the content types of the embedded files, by extension:
// set here rather than looked up in the system's MIME tables, which vary.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
}

// csp lets the page load its own files and call its own origin's API, and
// nothing else: no external host, no inline script, no frames.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
	"img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console: index.html at "/" and the assets under
// [AssetPrefix] (GET and HEAD); anything else is 404. Mount it on "GET /{$}"
// and "GET /console/".
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := ""
		switch p := r.URL.Path; {
		case p == "/":
			name = "index.html"
		case path.Dir(p)+"/" == AssetPrefix && path.Base(p) != "index.html":
			name = path.Base(p)
		}
		body, err := files.ReadFile(name)
		ct, known := contentTypes[path.Ext(name)]
		if name == "" || err != nil || !known {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Content-Type", ct)
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// The files change only with the binary; revalidation is cheap.
		h.Set("Cache-Control", "no-cache")
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(body)
	})
}
