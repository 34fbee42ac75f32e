package workflow

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
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
// attempt gets it replayed with Idempotent-Replayed: true.
//
// What happens to the key depends on how the handler ends:
//   - A response of status 100-499 is stored and sent: the key is finished.
//   - A 5xx response is passed on but not stored, and the key is released, so the next
//     attempt runs the handler again. So is a handler that panics before writing
//     anything, answered 500. Answer 5xx only when the handler had no effect.
//   - A handler that wrote a response that cannot be stored (its body is over the
//     engine's Config.MaxResponseBytes; it is never truncated) or that panicked after
//     it began writing has had its effect, but its answer is lost. Running it again
//     would repeat the effect, so the key is dead-lettered (status dead, with the
//     reason as its last error) and this attempt and every later one get the answer
//     of a dead-lettered key (see Handler), which is not worth retrying. Nothing runs
//     the handler again for that key until an operator re-drives it (Engine.Redrive),
//     which they should do only after checking the effect.
//
// The handler can still run twice for one key in three cases, because the key row
// says only that the handler started, not what it did: the process dies while the
// handler runs; the handler outlives the key's lease (its context ends shortly before
// the lease does, and a handler that ignores its context may go on after a retry
// took the key over; its own answer is then refused, 409); or the database fails
// while the answer is being stored, so that the key is released or its lease runs
// out. Against these: keep the handler well inside Config.Lease and honour its
// context, and make its effects safe to repeat — write them with TxMiddleware, so that
// they commit with the stored answer or not at all, or pass an idempotency key of
// your own (derived from the request's key and scope) to any remote call.
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
	return e.middleware(cfg, phases.Flow{Name: MiddlewareFlow, Phases: []phases.Phase{phases.Call(middlewarePhase, e.runLive)}})
}

// middleware returns the middleware that runs its handler in the client-only flow,
// registering the flow unless it is already there.
func (e *Engine) middleware(cfg *HTTPConfig, flow phases.Flow) (func(http.Handler) http.Handler, error) {
	f, err := e.newFront(cfg)
	if err != nil {
		return nil, err
	}
	if err := e.registerMiddlewareFlow(flow); err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return &idempotent{front: f, flow: flow.Name, next: next}
	}, nil
}

// registerMiddlewareFlow registers f unless it is already there.
func (e *Engine) registerMiddlewareFlow(f phases.Flow) error {
	if _, ok := e.flow(f.Name); !ok {
		if err := e.registerClientOnly(f); err == nil {
			return nil
		}
		// Another middleware call registered it first, or Register took the name.
	}
	if e.Resumable(f.Name) {
		return fmt.Errorf("workflow: middleware: flow %q is registered with Register; the name is reserved", f.Name)
	}
	return nil
}

// idempotent is the handler a middleware wraps around next.
type idempotent struct {
	front *front
	flow  string // MiddlewareFlow or TxMiddlewareFlow
	next  http.Handler
}

// liveKey is the context key of the live request a middleware key runs with.
type liveKey struct{}

// live is what a middleware flow's phase needs of the request being served.
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
	req.Flow = h.flow
	ctx := context.WithValue(context.WithoutCancel(r.Context()), liveKey{}, &live{scope: req.Scope, key: req.Key, r: r, w: w, body: req.Body, next: h.next})
	res, err := h.front.e.Do(ctx, req)
	h.front.answer(w, r, req, res, err)
}

// liveRequest returns the live request of run's key, or nil when the key is run
// without it (by Resume).
func liveRequest(ctx context.Context, run *phases.Run) *live {
	l, _ := ctx.Value(liveKey{}).(*live)
	if l == nil || l.scope != run.Scope() || l.key != run.Key() {
		return nil
	}
	return l
}

// serve runs the wrapped handler on a copy of the live request with context ctx,
// writing to c. A panic of the handler goes on to the caller.
func (l *live) serve(ctx context.Context, c *capture) {
	r := l.r.Clone(ctx)
	r.Body = io.NopCloser(bytes.NewReader(l.body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(l.body)), nil }
	r.ContentLength = int64(len(l.body))
	r.TransferEncoding = nil
	l.next.ServeHTTP(c, r)
}

// errUnstorable: the handler ran, so its effect may have happened, but its answer
// cannot be stored. The engine dead-letters a key that fails with it instead of
// releasing it, so that no attempt runs the handler again.
var errUnstorable = errors.New("the handler ran but its answer cannot be stored")

// runLive is MiddlewareFlow's phase: it runs the wrapped handler and returns the
// captured response. A handler that panics before writing anything fails as a panicking
// phase does (transient); one whose answer is too large or that panicked after it began
// writing fails with errUnstorable.
func (e *Engine) runLive(ctx context.Context, run *phases.Run) (resp *phases.Response, err error) {
	l := liveRequest(ctx, run)
	if l == nil {
		return nil, errNotLive
	}
	c := &capture{w: l.w, header: http.Header{}, limit: e.cfg.MaxResponseBytes}
	defer func() {
		v := recover()
		switch {
		case v == nil:
		case c.status != 0:
			resp, err = nil, fmt.Errorf("%w: handler panicked after writing status %d: %v", errUnstorable, c.status, v)
		default:
			resp, err = nil, &phases.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	l.serve(ctx, c)
	resp, err = c.response()
	if errors.Is(err, ErrResponseTooLarge) {
		err = fmt.Errorf("%w: %v", errUnstorable, err)
	}
	return resp, err
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
