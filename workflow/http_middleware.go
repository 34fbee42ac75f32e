package workflow

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/idemflow/idemflow/phases"
)

// MiddlewareFlow is the flow Middleware stores its keys under, registered on the
// engine by the first call to Middleware. Its keys can only be finished by their
// client's retry, since the wrapped handler needs the live request: Resumable reports
// false for it, so a sweeper releases such keys rather than running them.
const MiddlewareFlow = "idemflow.http"

// middlewarePhase is MiddlewareFlow's only phase: a call phase, so that the key is
// claimed and committed before the wrapped handler runs.
const middlewarePhase = "handle"

// errNotLive is the transient failure of a middleware key run without its request,
// such as by Resume.
var errNotLive = errors.New("workflow: middleware key run without its live request; only its client's retry can finish it")

// Middleware returns a middleware that makes any http.Handler idempotent under the
// request's Idempotency-Key, as one step: the key is claimed and committed (so that a
// concurrent duplicate is answered 409) before the wrapped handler runs; the handler's
// response (status, headers and body) is captured and stored, then sent; a later
// attempt gets it replayed with Idempotent-Replayed: true. A 5xx response is passed on
// but not stored, and the key is released, so the next attempt runs the handler again.
// So is a handler that panics, answered 500. A response over the engine's
// Config.MaxResponseBytes is never truncated: the client gets a 500 problem and the key
// is released.
//
// A request without a key passes straight to the handler, or is answered 400 when
// HTTPConfig.RequireKey is set. The wrapped handler gets a copy of the request whose
// body is the bytes already read; its context does not end when the client goes away
// (so that the answer is stored for the retry) but shortly before the key's lease does.
// Every other answer is as described for Handler. Any number of middlewares may share
// an engine: requests of different routes are told apart by HTTPConfig.Route, which is
// part of the fingerprint, so a key reused on another route is a mismatch (422).
//
// The response writer the handler gets buffers everything: Flush only fixes the status
// and headers, and Hijack is not supported.
//
// Errors: the configuration is invalid (Scope is nil), or a flow named MiddlewareFlow
// was registered with Register.
func (e *Engine) Middleware(cfg *HTTPConfig) (func(http.Handler) http.Handler, error) {
	f, err := e.newFront(cfg)
	if err != nil {
		return nil, err
	}
	if err := e.registerMiddlewareFlow(); err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return &idempotent{front: f, next: next}
	}, nil
}

// registerMiddlewareFlow registers MiddlewareFlow unless it is already there.
func (e *Engine) registerMiddlewareFlow() error {
	if _, ok := e.flow(MiddlewareFlow); !ok {
		f := phases.Flow{Name: MiddlewareFlow, Phases: []phases.Phase{phases.Call(middlewarePhase, e.runLive)}}
		if err := e.registerClientOnly(f); err == nil {
			return nil
		}
		// Another Middleware call registered it first, or Register took the name.
	}
	if e.Resumable(MiddlewareFlow) {
		return fmt.Errorf("workflow: middleware: flow %q is registered with Register; the name is reserved", MiddlewareFlow)
	}
	return nil
}

// idempotent is the handler Middleware wraps around next.
type idempotent struct {
	front *front
	next  http.Handler
}

// liveKey is the context key of the live request a middleware key runs with.
type liveKey struct{}

// live is what MiddlewareFlow's phase needs of the request being served.
type live struct {
	scope, key string
	r          *http.Request
	w          http.ResponseWriter
	body       []byte
	next       http.Handler
}

func (h *idempotent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, keyed, ok := h.front.read(w, r, h.front.cfg.RequireKey)
	if !ok {
		return
	}
	if !keyed {
		h.next.ServeHTTP(w, r)
		return
	}
	req.Flow = MiddlewareFlow
	ctx := context.WithValue(context.WithoutCancel(r.Context()), liveKey{}, &live{scope: req.Scope, key: req.Key, r: r, w: w, body: req.Body, next: h.next})
	res, err := h.front.e.Do(ctx, req)
	h.front.answer(w, r, req, res, err)
}

// runLive is MiddlewareFlow's phase: it runs the wrapped handler on a copy of the live
// request and returns the captured response.
func (e *Engine) runLive(ctx context.Context, run *phases.Run) (*phases.Response, error) {
	l, _ := ctx.Value(liveKey{}).(*live)
	if l == nil || l.scope != run.Scope() || l.key != run.Key() {
		return nil, errNotLive
	}
	r := l.r.Clone(ctx)
	r.Body = io.NopCloser(bytes.NewReader(l.body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(l.body)), nil }
	r.ContentLength = int64(len(l.body))
	r.TransferEncoding = nil
	c := &capture{w: l.w, header: http.Header{}, limit: e.cfg.MaxResponseBytes}
	l.next.ServeHTTP(c, r)
	return c.response()
}

// capture is the http.ResponseWriter a wrapped handler writes to: it keeps the whole
// response, to be stored before it is sent.
type capture struct {
	w      http.ResponseWriter // the real writer, for deadlines only
	header http.Header         // what Header returns
	sent   http.Header         // header as of WriteHeader
	status int
	body   bytes.Buffer
	limit  int
	over   bool // the body went over limit
}

var (
	_ http.ResponseWriter = (*capture)(nil)
	_ http.Flusher        = (*capture)(nil)
	_ io.StringWriter     = (*capture)(nil)
)

// Header implements http.ResponseWriter. Changes after WriteHeader have no effect.
func (c *capture) Header() http.Header { return c.header }

// WriteHeader implements http.ResponseWriter. Informational (1xx) statuses are
// dropped: they cannot be replayed.
func (c *capture) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does
	}
	if c.status != 0 || (code < 200 && code != http.StatusSwitchingProtocols) {
		return
	}
	c.status = code
	c.sent = c.header.Clone()
}

// Write implements http.ResponseWriter. Past the engine's response limit it fails with
// an error wrapping ErrResponseTooLarge.
func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(c.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if c.over || c.body.Len()+len(p) > c.limit {
		c.over = true
		return 0, fmt.Errorf("%w: the limit is %d bytes", ErrResponseTooLarge, c.limit)
	}
	return c.body.Write(p)
}

// WriteString implements io.StringWriter.
func (c *capture) WriteString(s string) (int, error) { return c.Write([]byte(s)) }

// Flush implements http.Flusher. Nothing is sent before the response is stored, so it
// only fixes the status and headers.
func (c *capture) Flush() {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
}

// SetReadDeadline is for http.ResponseController.
func (c *capture) SetReadDeadline(t time.Time) error {
	return http.NewResponseController(c.w).SetReadDeadline(t)
}

// SetWriteDeadline is for http.ResponseController.
func (c *capture) SetWriteDeadline(t time.Time) error {
	return http.NewResponseController(c.w).SetWriteDeadline(t)
}

// EnableFullDuplex is for http.ResponseController. The body was read in full before
// the handler ran, so reading it while writing is always possible.
func (c *capture) EnableFullDuplex() error { return nil }

// response returns what the handler wrote, completed as net/http would: status 200 if
// none was written, and a sniffed Content-Type if the handler set none.
func (c *capture) response() (*phases.Response, error) {
	if c.over {
		return nil, fmt.Errorf("%w: the limit is %d bytes", ErrResponseTooLarge, c.limit)
	}
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	h := c.sent
	body := c.body.Bytes()
	if _, typed := h["Content-Type"]; !typed && len(body) > 0 && h.Get("Content-Encoding") == "" {
		h.Set("Content-Type", http.DetectContentType(body))
	}
	return &phases.Response{Status: c.status, Header: h, Body: body}, nil
}
