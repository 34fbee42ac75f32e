package idemflowui

import (
	"cmp"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idemflow/idemflow/workflow"
)

// Defaults and limits of Options.
const (
	BodyLimitDefault = 16 << 10
	BodyLimitMax     = 1 << 20
	PageSizeDefault  = 50
	WindowDefault    = time.Hour
	// WriteTokenMinBytes is the shortest write or read token New accepts.
	WriteTokenMinBytes = 16
	// SessionDefault is how long a login lasts.
	SessionDefault = 12 * time.Hour
)

// Options configure a Handler. A nil *Options means all defaults: read-only, mounted
// at the root.
type Options struct {
	// Prefix is the path the handler is mounted at, such as "/idemflow", without a
	// trailing slash; every link starts with it and the handler strips it from the
	// requests it serves, so mount it at Prefix+"/". Defaults to "" (the root).
	Prefix string
	// WriteToken, when set, lets an operator who logs in with it re-drive dead-lettered
	// keys, release leases, act on many keys at once and cancel a key with a final
	// answer. At least WriteTokenMinBytes bytes. Empty (the default)
	// makes the pages read-only: no button is shown and every POST is refused (403).
	WriteToken string
	// BodyLimit is the most bytes of a stored request body the key page shows, when
	// the operator asks for it. Defaults to 16 KiB; at most 1 MiB.
	BodyLimit int
	// PageSize is how many keys a list page shows. Defaults to 50; at most
	// workflow.ListLimitMax.
	PageSize int
	// Window is how far back the overview counts finished and dead-lettered keys and
	// draws its chart (twelve bars). Defaults to 1h; at most 24h. The overview's cost
	// grows with the keys that finished in the window.
	Window time.Duration
	// Session is how long a login lasts. Defaults to 12h.
	Session time.Duration
	// Logger receives failures answered with 500. Defaults to slog.Default().
	Logger *slog.Logger
	// ReadToken, when set, makes every page need a login, with this token (a session
	// that only reads) or the write token; without a session a page answers 401 with
	// the login form and nothing of the key table. At least WriteTokenMinBytes bytes,
	// and not the write token. Empty (the default): reading needs no login.
	ReadToken string
	// Hosts are the names the handler answers besides the ones it always answers: the
	// Host header localhost and an IP literal equal to the address the request came in
	// on (so http://127.0.0.1:8081/ and http://10.0.0.5:8081/ work on the listener of
	// that address). Any other Host is refused with 403 before anything is read: a web
	// page the operator visits could otherwise rebind its own name to the listener's
	// address and read keys and request bodies (DNS rebinding). An entry is a name
	// (any port, such as "ops.example.com") or a name:port as a browser sends it, case
	// insensitive. Behind a reverse proxy, list the names the proxy passes on. AnyHost
	// ("*") turns the check off: only for a handler behind authentication of your own.
	Hosts []string
	// RunbookURL is the address of the runbooks the pages link to when they explain
	// a status (in progress, stuck, dead-lettered): docs/OPERATIONS.md, or your own
	// copy of it, whose section anchors ("#runbook-stuck-keys", ...) are appended.
	// Defaults to RunbookURLDefault.
	RunbookURL string
}

// Handler serves the pages. It is safe for concurrent use.
type Handler struct {
	engine   *workflow.Engine
	opts     Options
	secret   []byte // signs sessions and CSRF tokens; made by New
	pages    map[string]*template.Template
	mux      *http.ServeMux
	cop      *http.CrossOriginProtection
	sessions sessions
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// New returns a handler for engine's key table. opts may be nil.
//
// Errors: a prefix that does not start with "/" or ends with one, a write or read token
// shorter than WriteTokenMinBytes, a read token equal to the write token, a malformed
// entry of Hosts, or a limit out of range.
func New(engine *workflow.Engine, opts *Options) (*Handler, error) {
	if engine == nil {
		return nil, errors.New("idemflowui: nil engine")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	o.BodyLimit = cmp.Or(o.BodyLimit, BodyLimitDefault)
	o.PageSize = cmp.Or(o.PageSize, PageSizeDefault)
	o.Window = cmp.Or(o.Window, WindowDefault)
	o.Session = cmp.Or(o.Session, SessionDefault)
	o.Logger = cmp.Or(o.Logger, slog.Default())
	o.RunbookURL = cmp.Or(o.RunbookURL, RunbookURLDefault)
	hosts, err := checkHosts(o.Hosts)
	if err != nil {
		return nil, err
	}
	o.Hosts = hosts
	switch {
	case o.Prefix != "" && (!strings.HasPrefix(o.Prefix, "/") || strings.HasSuffix(o.Prefix, "/")):
		return nil, fmt.Errorf("idemflowui: prefix %q must start with / and not end with one", o.Prefix)
	case o.WriteToken != "" && len(o.WriteToken) < WriteTokenMinBytes:
		return nil, fmt.Errorf("idemflowui: write token is %d bytes, want at least %d", len(o.WriteToken), WriteTokenMinBytes)
	case o.ReadToken != "" && len(o.ReadToken) < WriteTokenMinBytes:
		return nil, fmt.Errorf("idemflowui: read token is %d bytes, want at least %d", len(o.ReadToken), WriteTokenMinBytes)
	case o.ReadToken != "" && o.ReadToken == o.WriteToken:
		return nil, errors.New("idemflowui: the read token is the write token: give a read token of its own, or none")
	case o.BodyLimit < 1 || o.BodyLimit > BodyLimitMax:
		return nil, fmt.Errorf("idemflowui: body limit %d is outside 1..%d", o.BodyLimit, BodyLimitMax)
	case o.PageSize < 1 || o.PageSize > workflow.ListLimitMax:
		return nil, fmt.Errorf("idemflowui: page size %d is outside 1..%d", o.PageSize, workflow.ListLimitMax)
	case o.Window < time.Minute || o.Window > 24*time.Hour:
		return nil, fmt.Errorf("idemflowui: window %v is outside 1m..24h", o.Window)
	case o.Session < time.Minute:
		return nil, fmt.Errorf("idemflowui: session %v is under a minute", o.Session)
	}
	h := &Handler{engine: engine, opts: o, secret: make([]byte, 32), mux: http.NewServeMux(),
		cop: http.NewCrossOriginProtection(), sessions: sessions{byID: map[string]session{}}}
	if _, err := rand.Read(h.secret); err != nil {
		return nil, fmt.Errorf("idemflowui: secret: %w", err)
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	h.pages = pages
	h.routes()
	return h, nil
}

// routes registers the pages. Paths are without the prefix.
func (h *Handler) routes() {
	static, _ := fs.Sub(staticFS, "static") // the embedded folder is always there
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /{$}", h.overview)
	h.mux.HandleFunc("GET /keys", h.list)
	h.mux.HandleFunc("GET /key", h.key)
	h.mux.HandleFunc("GET /key/confirm", h.confirm)
	h.mux.HandleFunc("POST /key/redrive", h.write(h.redrive))
	h.mux.HandleFunc("POST /key/release", h.write(h.release))
	h.mux.HandleFunc("GET /key/cancel", h.cancelForm)
	h.mux.HandleFunc("POST /key/cancel", h.write(h.cancel))
	h.mux.HandleFunc("GET /bulk", h.bulkCount)
	h.mux.HandleFunc("POST /bulk", h.write(h.bulkAct))
	h.mux.HandleFunc("GET /login", h.loginPage)
	h.mux.HandleFunc("POST /login", h.login)
	h.mux.HandleFunc("POST /logout", h.logout)
}

// ServeHTTP serves a page, with the security headers on every answer.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Cache-Control", "no-store")
	if !h.hostAllowed(r) {
		http.Error(w, "idemflow ui: not served under this host name; the operator can allow it (idemflowui.Options.Hosts, idemflow ui -allow-host)", http.StatusForbidden)
		return
	}
	path := r.URL.Path
	if h.opts.Prefix != "" {
		rest, ok := strings.CutPrefix(path, h.opts.Prefix)
		if !ok || !strings.HasPrefix(rest, "/") {
			h.fail(w, r, http.StatusNotFound, "no such page")
			return
		}
		r2 := *r
		u := *r.URL
		u.Path, u.RawPath = rest, ""
		r2.URL = &u
		r = &r2
	}
	if r.Method == http.MethodPost {
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	}
	if h.opts.ReadToken != "" && r.URL.Path != "/login" && !strings.HasPrefix(r.URL.Path, "/static/") {
		if s, _ := h.session(r); s == "" {
			h.needLogin(w, r)
			return
		}
	}
	h.mux.ServeHTTP(w, r)
}

// link is the path of a page under the prefix.
func (h *Handler) link(path string) string { return h.opts.Prefix + path }
