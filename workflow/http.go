package workflow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
)

// HTTPConfig configures Engine.Handler and Engine.Middleware. A nil *HTTPConfig means
// all defaults, but Scope has none: it is required.
type HTTPConfig struct {
	// Scope resolves who owns the request's key: the authenticated account or tenant,
	// never something the client alone asserts. Required. An empty scope or an error
	// is answered 401 and the key table is not touched.
	Scope func(r *http.Request) (string, error)
	// RequireKey makes Middleware answer 400 to a request without an Idempotency-Key
	// header. When false, such a request goes straight to the wrapped handler, without
	// idempotency and without touching the key table. Handler ignores it and always
	// requires the key: a flow runs only under a key.
	RequireKey bool
	// MaxBodyBytes limits the request body; a larger one is answered 413 and nothing is
	// written. Defaults to MaxBodyBytesDefault (1 MiB). The engine's Config.MaxBodyBytes
	// applies as well.
	MaxBodyBytes int
	// Route returns the route that goes into the request's fingerprint with the method
	// and the body. Defaults to the request's escaped path and query, so that path
	// parameters are part of the request: the same key sent to /v1/charges/ch_1/refund
	// and /v1/charges/ch_2/refund is a mismatch, never a replay. Return a route
	// pattern (e.g. r.Pattern) only for routes whose path carries no meaning.
	Route func(r *http.Request) string
	// Logger receives the failures answered 500 or 503. Defaults to the engine's
	// Config.Logger.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with zero fields set to their defaults. Scope and
// Logger are left as they are.
func (c *HTTPConfig) WithDefaults() *HTTPConfig {
	out := HTTPConfig{}
	if c != nil {
		out = *c
	}
	if out.MaxBodyBytes == 0 {
		out.MaxBodyBytes = MaxBodyBytesDefault
	}
	if out.Route == nil {
		out.Route = defaultRoute
	}
	return &out
}

func (c *HTTPConfig) validate() error {
	switch {
	case c.Scope == nil:
		return errors.New("workflow: HTTPConfig.Scope is required")
	case c.MaxBodyBytes < 0 || c.MaxBodyBytes > 16<<20:
		return fmt.Errorf("workflow: HTTPConfig.MaxBodyBytes %d is outside 0..16 MiB", c.MaxBodyBytes)
	}
	return nil
}

func defaultRoute(r *http.Request) string {
	if r.URL.RawQuery != "" {
		return r.URL.EscapedPath() + "?" + r.URL.RawQuery
	}
	return r.URL.EscapedPath()
}

// front is what Handler and Middleware share: reading and checking a request, and
// writing the engine's answer.
type front struct {
	e   *Engine
	cfg *HTTPConfig
	log *slog.Logger
}

func (e *Engine) newFront(cfg *HTTPConfig) (*front, error) {
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	log := c.Logger
	if log == nil {
		log = e.cfg.Logger
	}
	return &front{e: e, cfg: c, log: log}, nil
}

// Handler returns an http.Handler that runs the registered flow under the request's
// Idempotency-Key: the first attempt runs the flow, later ones replay its stored
// response (with Idempotent-Replayed: true) or resume it. The flow's phases see the
// request's method, route and body through phases.Run.
//
// The flow must be registered before Handler is called. It runs on if the client goes
// away, so that the retry gets its stored answer. Handler always requires an
// Idempotency-Key (HTTPConfig.RequireKey is ignored). The fingerprint is the method,
// the route (HTTPConfig.Route) and the body, JSON by its exact value (see Fingerprint).
//
// Answers other than the flow's own are application/problem+json (RFC 9457) and never
// stored:
//   - 400: the Idempotency-Key header is missing, invalid or sent more than once; the
//     body cannot be read.
//   - 401: HTTPConfig.Scope resolved no scope. The key table is not touched.
//   - 409: another attempt holds the key; Retry-After says when its answer is likely
//     stored (whole seconds, at least 1; see Config.InProgressRetryAfter).
//   - 413: the body is over the limit.
//   - 422: the key was used for a different request.
//   - 503 with Retry-After: a transient failure or an unavailable database; nothing was
//     stored and a retry resumes the work. A 5xx response of the flow is passed on as
//     it is, with Retry-After added if it has none.
//   - 500: anything else, such as a response too large to store (never truncated) or a
//     dead-lettered key. The cause is logged, not sent.
//
// Errors: the configuration is invalid (Scope is nil), or ErrUnknownFlow.
func (e *Engine) Handler(flow string, cfg *HTTPConfig) (http.Handler, error) {
	f, err := e.newFront(cfg)
	if err != nil {
		return nil, err
	}
	if flow == MiddlewareFlow {
		return nil, fmt.Errorf("workflow: handler: flow %q is Middleware's", flow)
	}
	if _, ok := e.flow(flow); !ok {
		return nil, fmt.Errorf("workflow: handler: %w: %q", ErrUnknownFlow, flow)
	}
	return &flowHandler{front: f, flow: flow}, nil
}

type flowHandler struct {
	front *front
	flow  string
}

func (h *flowHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, _, ok := h.front.read(w, r, true)
	if !ok {
		return
	}
	req.Flow = h.flow
	// The flow runs on if the client goes away, so that its answer is stored for the
	// retry; its call phases are still bounded by the lease.
	res, err := h.front.e.Do(context.WithoutCancel(r.Context()), req)
	h.front.answer(w, r, req, res, err)
}

// read checks a request and reads its body. If the request has no key and none is
// required it returns keyed false without resolving the scope or reading the body. If
// ok is false, the problem has been written.
func (f *front) read(w http.ResponseWriter, r *http.Request, requireKey bool) (req Request, keyed, ok bool) {
	key, present, kerr := ParseKeyHeader(r.Header)
	if !present && !requireKey {
		return Request{}, false, true
	}
	scope, err := f.cfg.Scope(r)
	if err != nil || scope == "" {
		writeProblem(w, http.StatusUnauthorized, "The request has no authenticated account to own its idempotency key.")
		return Request{}, false, false
	}
	switch {
	case kerr != nil:
		writeProblem(w, http.StatusBadRequest, "The "+KeyHeader+" header is invalid: "+kerr.Error()+".")
		return Request{}, false, false
	case !present:
		writeProblem(w, http.StatusBadRequest, "The "+KeyHeader+" header is required.")
		return Request{}, false, false
	}
	body, status := readBody(w, r, f.cfg.MaxBodyBytes)
	switch status {
	case http.StatusRequestEntityTooLarge:
		writeProblem(w, status, "The request body is over the limit of "+strconv.Itoa(f.cfg.MaxBodyBytes)+" bytes.")
		return Request{}, false, false
	case http.StatusBadRequest:
		writeProblem(w, status, "The request body could not be read.")
		return Request{}, false, false
	}
	return Request{Scope: scope, Key: key, Method: r.Method, Route: f.cfg.Route(r), Body: body}, true, true
}

// readBody reads at most limit bytes of the body. The status is 0 on success, 413 for
// a body over the limit, 400 when it cannot be read.
func readBody(w http.ResponseWriter, r *http.Request, limit int) ([]byte, int) {
	if r.Body == nil || r.Body == http.NoBody {
		return []byte{}, 0
	}
	if r.ContentLength > int64(limit) {
		return nil, http.StatusRequestEntityTooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(limit)))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, http.StatusRequestEntityTooLarge
	case err != nil:
		return nil, http.StatusBadRequest
	}
	return body, 0
}
