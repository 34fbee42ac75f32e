package idemhttp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemflow/idemflow/workflow"
)

// Config configures Handler, Middleware and TxMiddleware. A nil *Config means all
// defaults, but Scope has none: it is required.
type Config struct {
	// Scope resolves who owns the request's key: the authenticated account or tenant,
	// never something the client alone asserts. Required. An empty scope or an error
	// is answered 401 no-scope, a scope workflow.ValidateScope refuses (a control
	// character, not UTF-8, over 255 bytes) 401 invalid-scope; the key table is not
	// touched.
	Scope func(r *http.Request) (string, error)
	// RequireKey makes Middleware and TxMiddleware answer 400 to a request without an
	// Idempotency-Key header. When false, such a request goes straight to the wrapped
	// handler, without idempotency and without touching the key table. Handler ignores
	// it and always requires the key: a flow runs only under a key. Requests of a safe
	// method (GET, HEAD, OPTIONS, TRACE) are never keyed and need no key (see
	// Middleware).
	RequireKey bool
	// MaxBodyBytes limits the request body; a larger one is answered 413 and nothing is
	// written. Defaults to MaxBodyBytesDefault (1 MiB); at most 16 MiB. The engine's
	// workflow.Config.MaxBodyBytes applies as well.
	MaxBodyBytes int
	// Route returns the route that goes into the request's fingerprint with the method
	// and the body. Defaults to the request's escaped path and query, so that path
	// parameters are part of the request: the same key sent to /v1/charges/ch_1/refund
	// and /v1/charges/ch_2/refund is a mismatch, never a replay. Return a route
	// pattern (e.g. r.Pattern) only for routes whose path carries no meaning.
	Route func(r *http.Request) string
	// Logger receives the failures answered 500 or 503. Defaults to the engine's
	// workflow.Config.Logger.
	Logger *slog.Logger
	// ProblemTypeBase is where the "type" of the service's problem documents points.
	// Defaults to ProblemTypeBaseDefault, "about:blank": every problem's type is
	// about:blank and its title the status's text (RFC 9457, section 4.2.1), so an
	// answer points at nothing the service does not own, and a client tells the
	// problems apart by their status (each status has one meaning for a retry). Set it
	// to an absolute URI of the service's own API documentation, ending where a kind
	// can follow (".../problems/" or ".../errors#"), and each problem's type is
	// ProblemTypeBase + its kind: "key-in-progress", and so on for the kinds listed in
	// docs/API.md. Handler, Middleware and TxMiddleware refuse a base that is not
	// "about:blank" or an absolute URI.
	ProblemTypeBase string
	// Retention is how long the key table keeps a finished key, as configured for the
	// sweeper (workflow.SweeperConfig.Retention); it is advertised to clients in the
	// RetentionHeader of every answer under a key. Defaults to RetentionDefault;
	// negative sends no header. At least one minute, like the sweeper's.
	Retention time.Duration
	// Wait is how long a request that finds its key held by another attempt (or being
	// claimed by one) waits for that attempt's answer before it is answered 409
	// key-in-progress: if the answer is stored within Wait, the request gets it as a
	// replay; if the other attempt releases the key (a transient failure), the request
	// takes it over and resumes it. A waiting request holds no database connection and
	// waits on no lock (workflow.Request.Wait); the engine's
	// workflow.Config.MaxWaiters caps how many wait at once, and beyond it the answer
	// is 409 at once. Defaults to 0: no wait, 409 at once, as the IETF draft
	// describes (docs/API.md says why). At most WaitMax.
	Wait time.Duration
	// ShedHold is how long the answer to an attempt the engine turned away because it
	// is overloaded (workflow.ErrOverloaded: 503 with Retry-After) is held, on a
	// timer, before it is written. Clients that ignore Retry-After and retry at once
	// (a crowd whose requests time out and are sent again) then make one attempt per
	// hold rather than one per refusal's few microseconds of CPU, and leave the CPU to
	// the attempts the engine admitted. A held answer costs no CPU, only the request's
	// goroutine and connection, which net/http keeps for it anyway; at most
	// ShedHeldMax answers are held at once (beyond, they go at once). A client that
	// goes away ends its hold, and a refusal of a draining engine (ErrDraining) is
	// never held. Defaults to 0: every refusal is answered at once. At most one
	// second, the Retry-After it is answered with, so that a client that does wait
	// for Retry-After is not made to wait more than twice it. docs/OPERATIONS.md
	// ("Overload") says when to set it.
	ShedHold time.Duration
}

// Defaults for Config.
const (
	// MaxBodyBytesDefault is the default Config.MaxBodyBytes, equal to the engine's
	// workflow.MaxBodyBytesDefault.
	MaxBodyBytesDefault = workflow.MaxBodyBytesDefault
	// ProblemTypeBaseDefault is the default Config.ProblemTypeBase: about:blank, the
	// problem type of RFC 9457 that means no more than the status.
	ProblemTypeBaseDefault = "about:blank"
	// RetentionDefault is the sweeper's default retention, the engine's
	// workflow.RetentionDefault.
	RetentionDefault = workflow.RetentionDefault
	// WaitMax is the longest Config.Wait: a request held longer than a minute meets
	// the idle timeouts of proxies and clients, which end it without an answer.
	WaitMax = time.Minute
	// ShedHoldMax is the longest Config.ShedHold: the Retry-After of a refusal.
	ShedHoldMax = shedRetryAfter
	// ShedHeldMax is how many refusals a handler holds at once (Config.ShedHold).
	ShedHeldMax = 10_000
)

// WithDefaults returns a copy of c with zero fields set to their defaults. Scope and
// Logger are left as they are, and so is a negative Retention, so applying it twice
// is the same as once.
func (c *Config) WithDefaults() *Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	out.MaxBodyBytes = cmp.Or(out.MaxBodyBytes, MaxBodyBytesDefault)
	if out.Route == nil {
		out.Route = defaultRoute
	}
	out.ProblemTypeBase = cmp.Or(out.ProblemTypeBase, ProblemTypeBaseDefault)
	out.Retention = cmp.Or(out.Retention, RetentionDefault)
	return &out
}

func (c *Config) validate() error {
	switch {
	case c.Scope == nil:
		return errors.New("idemhttp: Config.Scope is required")
	case c.MaxBodyBytes < 0 || c.MaxBodyBytes > 16<<20:
		return fmt.Errorf("idemhttp: Config.MaxBodyBytes %d is outside 0..16 MiB", c.MaxBodyBytes)
	case c.Wait < 0 || c.Wait > WaitMax:
		return fmt.Errorf("idemhttp: Config.Wait %s is outside 0..%s", c.Wait, WaitMax)
	case c.ShedHold < 0 || c.ShedHold > ShedHoldMax:
		return fmt.Errorf("idemhttp: Config.ShedHold %s is outside 0..%s", c.ShedHold, ShedHoldMax)
	case c.Retention >= 0 && c.Retention < time.Minute:
		return fmt.Errorf("idemhttp: Config.Retention %s is under one minute (negative sends no header)", c.Retention)
	}
	return validateTypeBase(c.ProblemTypeBase)
}

func defaultRoute(r *http.Request) string {
	if r.URL.RawQuery != "" {
		return r.URL.EscapedPath() + "?" + r.URL.RawQuery
	}
	return r.URL.EscapedPath()
}

// front is what Handler and the middlewares share: reading and checking a request,
// and writing the engine's answer.
type front struct {
	e    *workflow.Engine
	cfg  *Config
	log  *slog.Logger
	shed *refusal // the answer to a refused attempt, rendered ahead (problem.go)
	// held counts the refusals held now (Config.ShedHold); hold waits out one hold:
	// holdFor, but in tests.
	held atomic.Int64
	hold func(ctx context.Context, d time.Duration)
}

func newFront(e *workflow.Engine, cfg *Config) (*front, error) {
	if e == nil {
		return nil, errors.New("idemhttp: nil engine")
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	f := &front{e: e, cfg: c, log: cmp.Or(c.Logger, e.Config().Logger), hold: holdFor}
	f.shed = f.newRefusal()
	return f, nil
}

// Handler returns an http.Handler that runs the flow registered on engine under the
// request's Idempotency-Key: the first attempt runs the flow, later ones replay its
// stored response (with Idempotent-Replayed: true) or resume it. The flow's phases see
// the request's method, route and body through phases.Run. docs/API.md describes every
// answer for the API's clients.
//
// The flow must be registered before Handler is called. If the client goes away
// before the key's claim is durable, the attempt ends there, having written nothing
// (under overload, the work of clients that gave up is not done); once the claim is
// durable the flow runs on without the client, so that the retry gets its stored
// answer (see workflow.Engine.Do). Handler always requires an
// Idempotency-Key (Config.RequireKey is ignored). The fingerprint is the method, the
// route (Config.Route) and the body, JSON by its exact value (see
// workflow.Fingerprint).
//
// Methods: a flow is an operation, which only an unsafe method (POST, PUT, PATCH,
// DELETE and the like) runs under a key. A request of a safe method (GET, HEAD,
// OPTIONS, TRACE: RFC 9110 section 9.2.1) never runs the flow, never touches the key
// table and is answered 405 method-not-allowed, whatever its Idempotency-Key header
// says: the key belongs to the operation, and a client that follows the operation's
// 303 See Other to a GET must never be answered as if it had reused the key (422).
// (Middleware passes such a request to its handler as a request without a key.)
//
// A stored answer keeps its status, body bytes and the headers of
// workflow.Config.StoredHeaders, and always Content-Type, Content-Encoding and Vary,
// which describe the body; a body without a Content-Type is answered with the type
// net/http sniffs, the same on every replay. A phase's 1xx (including 101) is not a
// final answer: it is never stored, and the attempt is answered 500 and the key
// released.
//
// Every answer under a key carries RetentionHeader (Config.Retention in seconds).
// Answers other than the flow's own are application/problem+json (RFC 9457), with a
// type of Config.ProblemTypeBase + kind, and never stored (docs/API.md lists them for
// API consumers):
//   - 400 invalid-key: the Idempotency-Key header is missing, invalid (not 1-255
//     printable ASCII) or sent more than once. 400 invalid-request: the body cannot
//     be read, or the method or path is too long.
//   - 401 no-scope: Config.Scope resolved no scope (an error, or empty). 401
//     invalid-scope: it resolved one no key can be stored under (over 255 bytes, not
//     UTF-8, a C0 or C1 control character or DEL: workflow.ValidateScope), refused
//     before the body is read. Nothing is written, and neither is logged above debug
//     level: clients can cause them at will.
//   - 405 method-not-allowed: a GET, HEAD, OPTIONS or TRACE request. Allow names the
//     route pattern's method when it has one (none when that method is safe), else
//     DELETE, PATCH, POST, PUT.
//   - 409 key-in-progress: another attempt holds the key (after Config.Wait, if
//     set); Retry-After says when its answer is likely stored (whole seconds, at
//     least 1; see workflow.Config.InProgressRetryAfter).
//   - 410 key-dead-lettered: the key was given up on (after too many failed attempts,
//     or because a middleware's handler ran but its answer could not be stored) and
//     finishes only if an operator re-drives it (workflow.Engine.Redrive). No Retry-After:
//     retrying, with this key or a new one, is not what the client should do.
//   - 413 body-too-large: the body is over the limit.
//   - 422 key-reused: the key was used for a different request (method, route or
//     body) of an unsafe method. Nothing was done for this one; the detail tells the
//     client not to send it under a new key before checking what the first request
//     did (resending it unchanged gets its answer). Not for a request that follows a
//     307 or 308 stored under the key to its Location: that one runs (see Middleware).
//   - 503 unavailable, with Retry-After: a transient failure or an unavailable
//     database; nothing was stored and a retry resumes the work. Also the answer of
//     an attempt turned away before its claim (a *workflow.ShedError: the engine is
//     overloaded, workflow.Config.MaxInFlight and AdmitWait, or draining; when
//     overloaded, held for Config.ShedHold first); nothing was written, and a body whose length is declared (Content-Length, at most the limit)
//     was not read: such a body is read only once the engine admits the attempt, which
//     holds its place in flight while the body comes (bound the time a client may take
//     with http.Server's ReadTimeout). A 5xx response of the flow is passed on as it
//     is, with Retry-After added if it has none.
//   - 500 server-error or response-too-large: anything else, such as a response too
//     large to store (never truncated) or a statement the database refuses for good
//     (workflow.ErrRefused: never a 503, since a retry would be refused the same way).
//     The cause is logged, not sent.
//
// Errors: the configuration is invalid (Scope is nil, Retention under a minute),
// workflow.ErrUnknownFlow, or the flow is client-only (phases.Flow.ClientOnly), like
// the middlewares' flows.
func Handler(engine *workflow.Engine, flow string, cfg *Config) (http.Handler, error) {
	f, err := newFront(engine, cfg)
	if err != nil {
		return nil, err
	}
	switch got, ok := engine.Flow(flow); {
	case !ok:
		return nil, fmt.Errorf("idemhttp: handler: %w: %q", workflow.ErrUnknownFlow, flow)
	case got.ClientOnly:
		return nil, fmt.Errorf("idemhttp: handler: flow %q is client-only: its attempts must bring its phases, as the middlewares' do", flow)
	}
	return &flowHandler{front: f, flow: flow}, nil
}

type flowHandler struct {
	front *front
	flow  string
}

func (h *flowHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, late, keyed, ok := h.front.read(w, r, true)
	if !ok {
		return
	}
	if !keyed { // a safe method: a flow is an operation, never run by a read
		w.Header().Set("Allow", allowed(r))
		h.front.problem(w, http.StatusMethodNotAllowed, kindMethod, "The "+r.Method+" method reads; it does not run this operation. Send the operation's own method (Allow).")
		return
	}
	req.Flow = h.flow
	h.front.serve(w, r, req, late)
}

// allowed is the Allow header of a 405 to a safe method: the method of the route's
// pattern when it names one, empty when that method is safe (a flow routed to GET runs
// for no method), else every unsafe method that has an operation to run.
func allowed(r *http.Request) string {
	if method, _, ok := strings.Cut(r.Pattern, " "); ok && method != "" {
		if safeMethod(method) {
			return ""
		}
		return method
	}
	return "DELETE, PATCH, POST, PUT"
}

// safeMethod reports whether method is safe (RFC 9110 section 9.2.1): a read, which
// an Idempotency-Key never applies to (the IETF draft scopes the key to
// non-idempotent methods, and safe ones are idempotent already).
func safeMethod(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// read checks a request. A body of declared length within the limit is left unread,
// for serve to read with late once the engine admits the attempt; any other is read
// now (late nil). If the request's method is safe (its Idempotency-Key header, valid or not, is
// not read), or it has no key and none is required, it returns keyed false without
// resolving the scope or reading the body. If ok is false, the problem has been written.
func (f *front) read(w http.ResponseWriter, r *http.Request, requireKey bool) (req workflow.Request, late *lateBody, keyed, ok bool) {
	if safeMethod(r.Method) { // never keyed: a read runs no operation and stores nothing
		return workflow.Request{}, nil, false, true
	}
	key, present, kerr := ParseKeyHeader(r.Header)
	if !present && !requireKey {
		return workflow.Request{}, nil, false, true
	}
	scope, err := f.cfg.Scope(r)
	if err != nil || scope == "" {
		f.problem(w, http.StatusUnauthorized, kindNoScope, noScopeDetail)
		return workflow.Request{}, nil, false, false
	}
	if err := workflow.ValidateScope(scope); err != nil { // before the body is read
		f.problem(w, http.StatusUnauthorized, kindInvalidScope, invalidScopeDetail)
		return workflow.Request{}, nil, false, false
	}
	switch {
	case kerr != nil:
		f.problem(w, http.StatusBadRequest, kindInvalidKey, "The "+KeyHeader+" header is invalid: "+kerr.Error()+".")
		return workflow.Request{}, nil, false, false
	case !present:
		f.problem(w, http.StatusBadRequest, kindInvalidKey, "The "+KeyHeader+" header is required.")
		return workflow.Request{}, nil, false, false
	}
	req = workflow.Request{Scope: scope, Key: key, Method: r.Method, Route: f.cfg.Route(r), Wait: f.cfg.Wait}
	if r.ContentLength >= 0 && r.ContentLength <= int64(f.cfg.MaxBodyBytes) {
		// Read once the engine admits the attempt (front.serve), holding its place: a
		// refusal (overloaded, draining) never reads it, and net/http discards it.
		return req, &lateBody{f: f, w: w, r: r}, true, true
	}
	// Of unknown length (it could be over the limit) or declared over it: read now, so
	// that one over the limit is answered 413 whatever the engine's load.
	body, status := readBody(w, r, f.cfg.MaxBodyBytes)
	if status != 0 {
		f.bodyProblem(w, status)
		return workflow.Request{}, nil, false, false
	}
	req.Body = body
	return req, nil, true, true
}

// bodyProblem answers a request whose body readBody could not read (its status).
func (f *front) bodyProblem(w http.ResponseWriter, status int) {
	if status == http.StatusRequestEntityTooLarge {
		f.problem(w, status, kindBodyTooLarge, "The request body is over the limit of "+strconv.Itoa(f.cfg.MaxBodyBytes)+" bytes.")
		return
	}
	f.problem(w, http.StatusBadRequest, kindInvalidRequest, "The request body could not be read.")
}

// lateBody is the body of a request that read left unread: run reads it once the
// engine admits the attempt (workflow.Engine.RunReading).
type lateBody struct {
	f      *front
	w      http.ResponseWriter
	r      *http.Request
	body   []byte
	status int     // readBody's status when it could not read the body
	to     *[]byte // where the body goes too, if set (a middleware's live request)
}

// errBodyUnread is what lateBody.read gives the engine when the body could not be
// read; the answer is front.bodyProblem's, as for a body read before the engine.
var errBodyUnread = errors.New("idemhttp: the request body could not be read")

func (b *lateBody) read() ([]byte, error) {
	b.body, b.status = readBody(b.w, b.r, b.f.cfg.MaxBodyBytes)
	if b.status != 0 {
		return nil, errBodyUnread
	}
	if b.to != nil {
		*b.to = b.body
	}
	return b.body, nil
}

// serve runs req for r and writes its answer; late, if not nil, reads the body once
// the engine admits the attempt.
func (f *front) serve(w http.ResponseWriter, r *http.Request, req workflow.Request, late *lateBody) {
	// The client's cancellation is honoured until the claim; after it the engine
	// detaches the attempt, so that its answer is stored for the retry.
	out := f.run(r.Context(), r, req, late)
	if late != nil && late.status != 0 {
		f.bodyProblem(w, late.status)
		return
	}
	f.answer(w, r, req, out)
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
