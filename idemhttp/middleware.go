package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// MiddlewareFlow is the flow Middleware stores its keys under, registered on the
// engine by the first call to Middleware: a client-only flow (phases.Flow.ClientOnly)
// of one call phase. Its keys can only be finished by their client's retry, which
// brings the wrapped handler and the live request as the phase's function
// (workflow.Request.ClientPhases); a sweeper parks them rather than running them.
const MiddlewareFlow = "idemflow.http"

// middlewarePhase is the only phase of the middleware flows: for MiddlewareFlow a call
// phase, so that the key is claimed and committed before the wrapped handler runs.
const middlewarePhase = "handle"

// Middleware returns a middleware on engine that makes any http.Handler idempotent
// under the request's Idempotency-Key, as one step: the key is claimed and committed
// (so that a concurrent duplicate is answered 409) before the wrapped handler runs; the
// handler's response (status, headers and body) is captured and stored, then sent; a
// later attempt gets it replayed with Idempotent-Replayed: true.
//
// What happens to the key depends on how the handler ends:
//   - A response of status 200-499 is stored and sent: the key is finished.
//   - A 5xx response is passed on but not stored, and the key is released, so the next
//     attempt runs the handler again. So is a handler that panics before writing
//     anything, answered 500. Answer 5xx only when the handler had no effect.
//   - A handler that wrote a response that cannot be stored (its body is over the
//     engine's workflow.Config.MaxResponseBytes; it is never truncated) or that
//     panicked after it began writing has had its effect, but its answer is lost.
//     Running it again would repeat the effect, so the key is dead-lettered (status
//     dead, with the reason as its last error) and this attempt and every later one
//     get the answer of a dead-lettered key (see Handler), which is not worth
//     retrying. Nothing runs the handler again for that key until an operator
//     re-drives it (workflow.Engine.Redrive), which they should do only after
//     checking the effect.
//
// The handler can still run twice for one key in three cases, because the key row
// says only that the handler started, not what it did: the process dies while the
// handler runs; the handler outlives the key's lease (its context ends shortly before
// the lease does, and a handler that ignores its context may go on after a retry
// took the key over; its own answer is then refused, 409); or the database fails
// while the answer is being stored, so that the key is released or its lease runs
// out. Against these: keep the handler well inside workflow.Config.Lease and honour its
// context, and make its effects safe to repeat — write them with TxMiddleware, so that
// they commit with the stored answer or not at all, or pass an idempotency key of
// your own (derived from the request's key and scope) to any remote call.
//
// A request of a safe method (GET, HEAD, OPTIONS, TRACE) passes straight to the
// handler, as it is, whatever its Idempotency-Key header holds (valid, invalid or
// none, with or without Config.RequireKey): the key belongs to operations, a read
// needs none, and the key table is not touched. So a client that follows an
// operation's 303 See Other with a GET that still carries the operation's key (Go's
// http.Client copies the header onto the redirect) gets the resource, never a 422
// for a key it did not reuse. Any other request without a key passes straight to the
// handler, or is answered 400 when Config.RequireKey is set. The wrapped handler gets
// a copy of the request whose body is the bytes already read; its context does not
// end when the client goes away (so that the answer is stored for the retry) but
// shortly before the key's lease does.
// Every other answer is as described for Handler. Any number of middlewares may share
// an engine: requests of different routes are told apart by Config.Route, which is
// part of the fingerprint, so a key reused on another route is a mismatch (422).
//
// Except for a redirect stored under the key. A 307 or 308 the handler answers (a
// ServeMux's own 307 for a missing trailing slash, when the middleware wraps the mux)
// is stored as the key's answer like any other; the client then repeats the same
// method and body, under the same key, at the Location. That request is the same
// operation, not a reuse: when the key's stored answer is a 307 or 308 of the same
// method whose Location resolves to the request's path and query, the request runs
// under a key derived from the client's key and its route (MovedKeyPrefix), the same
// on every retry, so that following the redirect again, or going straight to the new
// address, gets its answer. (The stored answer keeps no body to compare: a different
// body sent there first runs; once that key is stored, a different body is a 422.)
// One hop is followed: a stored redirect to a stored redirect ends in 422. Redirects
// answered outside the middleware (http.RedirectHandler on the old route) need none
// of this: the key is first used at the new address.
//
// The response writer the handler gets buffers everything: Flush only fixes the status
// and headers, and Hijack is not supported.
//
// A protocol upgrade cannot be stored or replayed, so it is never run under a key: a
// WebSocket's GET goes to the handler as any GET does, and any other request that asks
// for one (an Upgrade header or a Connection: upgrade token, as h2c sends, or the
// CONNECT method) and carries an Idempotency-Key is answered 400 with problem type
// upgrade-not-idempotent before the handler runs, and nothing is written; without a key it goes to the handler as any request without a
// key does (and the handler gets the real response writer, which can be hijacked). An
// informational status the handler writes (1xx, 101 included) is dropped, as net/http
// drops a second WriteHeader: it is never sent, stored or replayed, and the answer is
// what the handler writes after it (200 if it writes only a body, or nothing).
//
// The wrapped handler reaches its request through the phase function that this attempt
// brings to the engine (workflow.Request.ClientPhases), a closure over the request and
// its response writer; nothing rides in a context, and a key run without its client (by
// Resume, or a sweeper) runs nothing (workflow.ErrNeedsClient).
//
// Errors: the configuration is invalid (Scope is nil), or a flow named MiddlewareFlow
// was registered that is not this middleware's.
func Middleware(engine *workflow.Engine, cfg *Config) (func(http.Handler) http.Handler, error) {
	return middleware(engine, cfg, phases.Call(middlewarePhase, nil), MiddlewareFlow)
}

// middleware returns the middleware that runs its handler as the one phase of the
// client-only flow named flow, registering the flow unless it is already there.
func middleware(e *workflow.Engine, cfg *Config, phase phases.Phase, flow string) (func(http.Handler) http.Handler, error) {
	f, err := newFront(e, cfg)
	if err != nil {
		return nil, err
	}
	shape := phases.Flow{Name: flow, ClientOnly: true, Phases: []phases.Phase{phase}}
	if err := registerClientOnly(e, shape); err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return &idempotent{front: f, flow: flow, tx: phase.Kind == phases.KindTx, next: next}
	}, nil
}

// registerClientOnly registers the client-only flow shape unless a flow of its name
// and shape is already there: every middleware of an engine shares it.
func registerClientOnly(e *workflow.Engine, shape phases.Flow) error {
	err := e.Register(shape)
	if err == nil {
		return nil
	}
	// Another middleware registered it first, or someone else took the name.
	got, ok := e.Flow(shape.Name)
	if !ok {
		return err
	}
	if !got.ClientOnly || len(got.Phases) != len(shape.Phases) {
		return fmt.Errorf("idemhttp: middleware: flow %q is registered and is not the middleware's; the name is reserved", shape.Name)
	}
	for i, p := range got.Phases {
		if p.Name != shape.Phases[i].Name || p.Kind != shape.Phases[i].Kind {
			return fmt.Errorf("idemhttp: middleware: flow %q is registered and is not the middleware's; the name is reserved", shape.Name)
		}
	}
	return nil
}

// idempotent is the handler a middleware wraps around next.
type idempotent struct {
	front *front
	flow  string // MiddlewareFlow or TxMiddlewareFlow
	tx    bool   // the flow's phase is a tx phase (TxMiddleware)
	next  http.Handler
}

// live is one attempt's request, which only that attempt has: the phase function it
// brings to the engine closes over it.
type live struct {
	r     *http.Request
	w     http.ResponseWriter
	body  []byte // set once read, when read late (lateBody)
	next  http.Handler
	limit int // the engine's workflow.Config.MaxResponseBytes
}

func (h *idempotent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if safeMethod(r.Method) { // never keyed, whatever its key (an upgrade's GET included)
		h.next.ServeHTTP(w, r)
		return
	}
	if upgrade(r) && len(r.Header.Values(KeyHeader)) > 0 {
		h.front.problem(w, http.StatusBadRequest, kindUpgrade, upgradeDetail)
		return
	}
	req, late, keyed, ok := h.front.read(w, r, h.front.cfg.RequireKey)
	if !ok {
		return
	}
	if !keyed {
		h.next.ServeHTTP(w, r)
		return
	}
	req.Flow = h.flow
	l := &live{r: r, w: w, body: req.Body, next: h.next, limit: h.front.e.Config().MaxResponseBytes}
	if late != nil {
		late.to = &l.body
	}
	if h.tx {
		req.ClientPhases = []phases.Phase{phases.Tx(middlewarePhase, l.runTx)}
	} else {
		req.ClientPhases = []phases.Phase{phases.Call(middlewarePhase, l.run)}
	}
	h.front.serve(w, r, req, late)
}

// kindUpgrade is the problem kind of a keyed upgrade request (400); the other kinds
// are in problem.go. It is a heading of docs/API.md.
const kindUpgrade = "upgrade-not-idempotent"

// kindLeaseExpired is the problem kind of an attempt whose phase (a TxMiddleware
// handler) ran past its lease (503); a heading of docs/API.md.
const kindLeaseExpired = "lease-expired"

// leaseExpiredDetail is the detail of the answer to an attempt that ran out of its lease.
const leaseExpiredDetail = "The request ran out of its time (its lease) before it could be committed; nothing of it was kept. " +
	"Retry after the Retry-After seconds with the same key."

// upgradeDetail is the detail of the answer to a keyed upgrade request.
const upgradeDetail = "A protocol upgrade cannot be made idempotent: send it without an " + KeyHeader + " header."

// upgrade reports whether r asks to switch protocols: an Upgrade header (WebSocket,
// h2c), a Connection header naming the upgrade token, or the CONNECT method.
func upgrade(r *http.Request) bool {
	if r.Method == http.MethodConnect || len(r.Header.Values("Upgrade")) > 0 {
		return true
	}
	for _, v := range r.Header.Values("Connection") {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
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

// run is MiddlewareFlow's phase function: it runs the wrapped handler and returns the
// captured response. A handler that panics before writing anything fails as a
// panicking phase does (transient); one whose answer is too large or that panicked
// after it began writing fails with workflow.ErrUnstorable, which dead-letters the key.
func (l *live) run(ctx context.Context, _ *phases.Run) (resp *phases.Response, err error) {
	c := &capture{w: l.w, header: http.Header{}, limit: l.limit}
	defer func() {
		v := recover()
		switch {
		case v == nil:
		case c.status != 0:
			resp, err = nil, fmt.Errorf("the handler ran but %w: it panicked after writing status %d: %v", workflow.ErrUnstorable, c.status, v)
		default:
			resp, err = nil, &phases.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	l.serve(ctx, c)
	resp, err = c.response()
	if errors.Is(err, workflow.ErrResponseTooLarge) {
		err = fmt.Errorf("the handler ran but %w: %v", workflow.ErrUnstorable, err)
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

// WriteHeader implements http.ResponseWriter. Informational statuses (1xx, 101
// Switching Protocols included) are dropped: they cannot be stored or replayed, and no
// upgrade runs under a key (see Middleware).
func (c *capture) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does
	}
	if c.status != 0 || code < 200 {
		return
	}
	c.status = code
	c.sent = c.header.Clone()
}

// Write implements http.ResponseWriter. Past the engine's response limit it fails with
// an error wrapping workflow.ErrResponseTooLarge.
func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(c.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if c.over || c.body.Len()+len(p) > c.limit {
		c.over = true
		return 0, fmt.Errorf("%w: the limit is %d bytes", workflow.ErrResponseTooLarge, c.limit)
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
		return nil, fmt.Errorf("%w: the limit is %d bytes", workflow.ErrResponseTooLarge, c.limit)
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
