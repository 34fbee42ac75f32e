package idemhttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// problemContentType is the media type of an RFC 9457 problem document.
const problemContentType = "application/problem+json"

// Problem kinds: the last segment of a problem document's type URI
// (Config.ProblemTypeBase + kind) when the service sets a base. Each is a heading of
// docs/API.md.
const (
	kindInvalidKey       = "invalid-key"        // 400: the Idempotency-Key header is missing or invalid
	kindInvalidRequest   = "invalid-request"    // 400: the body cannot be read, or method or path too long
	kindNoScope          = "no-scope"           // 401: no account owns the key
	kindInvalidScope     = "invalid-scope"      // 401: the account is not text a key can be stored under
	kindMethod           = "method-not-allowed" // 405: a safe method (GET, HEAD, ...) never runs a flow
	kindKeyInProgress    = "key-in-progress"    // 409: another attempt holds the key
	kindKeyDeadLettered  = "key-dead-lettered"  // 410: the key was given up on
	kindBodyTooLarge     = "body-too-large"     // 413
	kindKeyReused        = "key-reused"         // 422: the key was used for another request
	kindResponseTooLarge = "response-too-large" // 500: the answer is too large to store
	kindServerError      = "server-error"       // 500
	kindUnavailable      = "unavailable"        // 503 with Retry-After
)

// problem is an RFC 9457 problem document. Type is about:blank or ProblemTypeBase +
// the kind; title is the status's text; detail says to a person what to do next. No
// member names this library: the answer is the service's.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// answer writes the result of an attempt: its response, or what its outcome means
// over HTTP. Every answer carries RetentionHeader, since the request had a key.
func (f *front) answer(w http.ResponseWriter, r *http.Request, req workflow.Request, out *workflow.Result) {
	if out.Outcome == workflow.OutcomeShed && f.shed != nil && out.RetryAfter == f.shed.retryAfter {
		f.refuse(w, r, req, out)
		return
	}
	f.answerAny(w, r, req, out)
}

// answerAny is answer for any result, rendering its answer now.
func (f *front) answerAny(w http.ResponseWriter, r *http.Request, req workflow.Request, out *workflow.Result) {
	if f.cfg != nil && f.cfg.Retention > 0 {
		w.Header().Set(RetentionHeader, f.retention())
	}
	a := answerOf(out)
	if a.pass != nil {
		writeResponse(w, r, a.pass, out.Replayed, a.retryAfter)
		return
	}
	if a.level != 0 || a.status >= 500 {
		level := a.level
		if level == 0 {
			level = slog.LevelError
		}
		f.logFailure(r, req, level, a.status, a.err)
	}
	if a.retryAfter > 0 {
		w.Header().Set("Retry-After", retryAfter(a.retryAfter))
	}
	f.problem(w, a.status, a.kind, a.detail)
}

// logFailure logs an attempt answered with status, at level (debug when the client
// went away). The line is built only when the logger takes the level: under overload
// every refusal passes here, logged at debug level.
func (f *front) logFailure(r *http.Request, req workflow.Request, level slog.Level, status int, err error) {
	ctx := r.Context()
	if ctx.Err() != nil { // the client went away: nothing to alarm anyone about
		level = slog.LevelDebug
	}
	if !f.log.Enabled(ctx, level) {
		return
	}
	f.log.Log(ctx, level, "idemhttp: request failed",
		slog.Int("status", status), slog.String("flow", req.Flow), slog.String("method", req.Method),
		slog.String("route", req.Route), slog.String("scope", req.Scope), slog.String("key", req.Key),
		slog.Any("err", err))
}

// retention is RetentionHeader's value: Config.Retention in seconds.
func (f *front) retention() string {
	return strconv.FormatInt(int64(f.cfg.Retention/time.Second), 10)
}

// refusal is the answer to an attempt turned away before its claim (OutcomeShed,
// workflow.ShedError) with the engine's Retry-After, rendered once, when the handler
// is made: under overload or during a drain nearly every answer is this one, and it
// must cost about what a bare 503 costs. Its status, headers and body are those
// answerAny renders for the same result (TestRefusalPrerendered).
type refusal struct {
	retryAfter time.Duration // the Result.RetryAfter it was rendered for
	body       []byte
	names      []string // canonical header names, and their values, in the same order
	values     []string
}

// shedRetryAfter is the Retry-After the engine gives an attempt turned away before its
// claim (workflow.ShedError: one second): the refusal rendered ahead is for it, any
// other is rendered when it comes.
const shedRetryAfter = time.Second

// newRefusal renders the answer to a refused attempt for f's configuration.
func (f *front) newRefusal() *refusal {
	rf := &refusal{retryAfter: shedRetryAfter}
	a := answerOf(&workflow.Result{Outcome: workflow.OutcomeShed, RetryAfter: shedRetryAfter})
	rf.body = f.problemBody(a.status, a.kind, a.detail)
	add := func(name, value string) {
		rf.names = append(rf.names, http.CanonicalHeaderKey(name))
		rf.values = append(rf.values, value)
	}
	if f.cfg.Retention > 0 {
		add(RetentionHeader, f.retention())
	}
	add("Retry-After", retryAfter(a.retryAfter))
	add("Content-Type", problemContentType)
	add("Content-Length", strconv.Itoa(len(rf.body)))
	add("Cache-Control", "no-store")
	return rf
}

// refuse writes f.shed, the answer to out, a refused attempt, logged as answerAny
// logs it (at debug level).
func (f *front) refuse(w http.ResponseWriter, r *http.Request, req workflow.Request, out *workflow.Result) {
	if f.cfg.ShedHold > 0 && errors.Is(out.Err, workflow.ErrOverloaded) {
		f.holdRefusal(r.Context())
	}
	rf := f.shed
	f.logFailure(r, req, slog.LevelDebug, http.StatusServiceUnavailable, out.Err)
	h := w.Header()
	vals := make([]string, len(rf.values)) // one allocation for every value, none shared between answers
	copy(vals, rf.values)
	for i, name := range rf.names {
		h[name] = vals[i : i+1 : i+1]
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write(rf.body)
}

// holdRefusal holds a refusal for Config.ShedHold, unless ShedHeldMax are held
// already.
func (f *front) holdRefusal(ctx context.Context) {
	n := f.held.Add(1)
	defer f.held.Add(-1)
	if n <= ShedHeldMax {
		f.hold(ctx, f.cfg.ShedHold)
	}
}

// holdFor waits d, or until ctx ends.
func holdFor(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// httpAnswer is what the result of an attempt means over HTTP.
type httpAnswer struct {
	status     int
	kind       string
	detail     string
	retryAfter time.Duration    // sent as Retry-After when positive
	pass       *phases.Response // the response to send as it is: the answer, or a 5xx to pass on
	level      slog.Level       // log at this level when non-zero; 5xx log as errors by default
	err        error            // what is logged
}

// answerOf maps the result of workflow.Engine.Run to its HTTP answer, by its outcome;
// a failure's cause decides only among the failures (failed). The detail never carries
// the error's text.
func answerOf(out *workflow.Result) httpAnswer {
	var a httpAnswer
	switch out.Outcome {
	case workflow.OutcomeFinished, workflow.OutcomeReplayed:
		if resp := out.Response; resp != nil && resp.Status >= 200 && resp.Status <= 999 {
			return httpAnswer{pass: resp}
		}
		a = failed(errors.New("the engine answered without a valid final response"))
	case workflow.OutcomeShed:
		// Load or a deploy, not a fault: logged at debug level, since under overload
		// every refusal would otherwise be a line.
		a = httpAnswer{status: http.StatusServiceUnavailable, kind: kindUnavailable, retryAfter: out.RetryAfter, level: slog.LevelDebug,
			detail: "The service is busy or restarting; nothing was done: retry after " + retryAfter(out.RetryAfter) + " s with the same key."}
	case workflow.OutcomeInProgress:
		a = httpAnswer{status: http.StatusConflict, kind: kindKeyInProgress, retryAfter: out.RetryAfter,
			detail: "Another request with this idempotency key is in progress; retry after " + retryAfter(out.RetryAfter) +
				" s with the same key and the same request to get its answer."}
	case workflow.OutcomeMismatch:
		a = mismatch()
	case workflow.OutcomeLeaseLost:
		a = httpAnswer{status: http.StatusConflict, kind: kindKeyInProgress, retryAfter: time.Second, level: slog.LevelWarn,
			detail: "Another attempt took this request over; retry after 1 s with the same key and the same request to get its answer."}
	case workflow.OutcomeReleased, workflow.OutcomeDeadLettered:
		a = released(out)
	default:
		a = failed(out.Err)
	}
	if a.err == nil {
		a.err = out.Err
	}
	return a
}

// released is the answer to an attempt that failed after its claim: a transient
// failure (workflow.ClassRetry) passes a phase's 5xx response on, answers a phase that
// ran out of its lease as such, and any other one 503, all with the engine's
// Retry-After. Anything else, and an attempt that dead-lettered the key without a
// transient failure, is answered as a failure of its class (failed).
func released(out *workflow.Result) httpAnswer {
	if out.RetryAfter <= 0 || workflow.Classify(out.Err) != workflow.ClassRetry || errors.Is(out.Err, workflow.ErrNewerFormat) {
		return failed(out.Err)
	}
	switch {
	case errors.Is(out.Err, workflow.ErrLeaseExpired):
		return httpAnswer{status: http.StatusServiceUnavailable, kind: kindLeaseExpired, retryAfter: out.RetryAfter, detail: leaseExpiredDetail}
	case out.Response != nil && out.Response.Status >= 500 && out.Response.Status <= 999:
		return httpAnswer{status: out.Response.Status, pass: out.Response, retryAfter: out.RetryAfter, level: slog.LevelWarn}
	}
	return httpAnswer{status: http.StatusServiceUnavailable, kind: kindUnavailable, retryAfter: out.RetryAfter, level: slog.LevelWarn,
		detail: "The request could not be completed now; nothing was lost: retry after " + retryAfter(out.RetryAfter) + " s with the same key."}
}

// failed is the answer to an attempt that failed (workflow.OutcomeFailed), by the
// class the engine gives its error (workflow.Classify): a client fault is a 4xx
// (clientFault) and never logged as an error, since any client can cause it; a retry
// a 503 with Retry-After; a dead-lettered key a 410; a server fault a 500.
func failed(err error) httpAnswer {
	switch workflow.Classify(err) {
	case workflow.ClassClientFault:
		return clientFault(err)
	case workflow.ClassRetry:
		if errors.Is(err, workflow.ErrNewerFormat) {
			// A newer build wrote the key (a rolling deploy): never a final answer here.
			return httpAnswer{status: http.StatusServiceUnavailable, kind: kindUnavailable, retryAfter: workflow.NewerFormatRetryAfter, level: slog.LevelWarn,
				detail: "The request is being handled by a newer version of the service; retry after " +
					retryAfter(workflow.NewerFormatRetryAfter) + " s with the same key and the same request to get its answer."}
		}
		return httpAnswer{status: http.StatusServiceUnavailable, kind: kindUnavailable, retryAfter: time.Second, level: slog.LevelWarn,
			detail: "The service is briefly unavailable; retry after 1 s with the same key."}
	case workflow.ClassDeadLettered:
		return httpAnswer{status: http.StatusGone, kind: kindKeyDeadLettered, level: slog.LevelWarn,
			detail: "The request under this idempotency key was given up on: it failed too often, or it ran but its answer " +
				"could not be stored. It will not finish unless " +
				"the service's operators re-drive it. Do not retry it, and do not send it again with a new key: it may have " +
				"taken effect in part. Contact the service."}
	}
	if errors.Is(err, workflow.ErrResponseTooLarge) {
		return httpAnswer{status: http.StatusInternalServerError, kind: kindResponseTooLarge, detail: "The response is too large to store, so it was not sent."}
	}
	return httpAnswer{status: http.StatusInternalServerError, kind: kindServerError, detail: "The request failed.", err: err}
}

// clientFault is the answer to a request the engine found wrong
// (workflow.ClassClientFault): the exact 4xx by what is wrong, 400 when the engine
// says no more.
func clientFault(err error) httpAnswer {
	switch {
	case errors.Is(err, workflow.ErrInvalidKey):
		return httpAnswer{status: http.StatusBadRequest, kind: kindInvalidKey, detail: "The " + KeyHeader + " header is invalid."}
	case errors.Is(err, workflow.ErrInvalidScope):
		// The Scope function returned something no key can be stored under (not UTF-8,
		// a control character, too long), most likely copied from the request: no
		// valid principal. read refuses it before the engine; this is the backstop.
		return httpAnswer{status: http.StatusUnauthorized, kind: kindInvalidScope, level: slog.LevelDebug, detail: invalidScopeDetail}
	case errors.Is(err, workflow.ErrBodyNotJSON):
		return httpAnswer{status: http.StatusBadRequest, kind: kindInvalidRequest, detail: "The request body must be one JSON value without duplicate member names."}
	case errors.Is(err, workflow.ErrInvalidRequest):
		return httpAnswer{status: http.StatusBadRequest, kind: kindInvalidRequest, detail: "The request's method or path is too long."}
	case errors.Is(err, workflow.ErrBodyTooLarge):
		return httpAnswer{status: http.StatusRequestEntityTooLarge, kind: kindBodyTooLarge, detail: "The request body is over the limit."}
	case errors.Is(err, workflow.ErrMismatch):
		return mismatch()
	}
	return httpAnswer{status: http.StatusBadRequest, kind: kindInvalidRequest, detail: "The request cannot be run as it was sent."}
}

// mismatch is the answer to a key reused for a different request.
func mismatch() httpAnswer {
	return httpAnswer{status: http.StatusUnprocessableEntity, kind: kindKeyReused,
		detail: "The idempotency key was already used for a different request (method, route or body); nothing was done for this one. " +
			"The first request may have taken effect: do not send this request again under a new key before checking its outcome. " +
			"Resend the first request unchanged, with this key, to get its answer."}
}

// noScopeDetail is the detail of a 401: Scope resolved no scope, or one that is not
// valid.
const noScopeDetail = "The request has no authenticated account to own its idempotency key."

// invalidScopeDetail is the detail of a 401 whose scope is not valid text
// (workflow.ValidateScope).
const invalidScopeDetail = "The request's account identifier cannot own an idempotency key: it must be 1-255 bytes " +
	"of UTF-8 text without control characters."

// writeResponse writes resp. retry, when positive, is sent as Retry-After unless resp
// has one.
func writeResponse(w http.ResponseWriter, r *http.Request, resp *phases.Response, replayed bool, retry time.Duration) {
	merged := http.Header{}
	for k, v := range resp.Header {
		ck := http.CanonicalHeaderKey(k)
		merged[ck] = append(merged[ck], v...)
	}
	h := w.Header()
	for k, v := range merged {
		h[k] = v // the response's own header wins over one set before it
	}
	if replayed {
		h.Set(ReplayedHeader, "true")
	}
	if retry > 0 && h.Get("Retry-After") == "" {
		h.Set("Retry-After", retryAfter(retry))
	}
	// The Content-Type net/http would sniff, set here so that it is part of the answer
	// the same way on every replay (as net/http does, never for an encoded body).
	if _, typed := h["Content-Type"]; !typed && bodyAllowed(resp.Status) && len(resp.Body) > 0 && h.Get("Content-Encoding") == "" {
		h.Set("Content-Type", http.DetectContentType(resp.Body))
	}
	if bodyAllowed(resp.Status) && r.Method != http.MethodHead {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	if bodyAllowed(resp.Status) {
		_, _ = w.Write(resp.Body) // the client went away; nothing to do
	}
}

// problem writes a problem document of kind. It is never stored.
func (f *front) problem(w http.ResponseWriter, status int, kind, detail string) {
	body := f.problemBody(status, kind, detail)
	h := w.Header()
	h.Set("Content-Type", problemContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// problemBody is the problem document of kind.
func (f *front) problemBody(status int, kind, detail string) []byte {
	body, _ := json.Marshal(problem{Type: problemType(f.typeBase(), kind), Title: http.StatusText(status), Status: status, Detail: detail})
	return body
}

func (f *front) typeBase() string {
	if f.cfg == nil {
		return ProblemTypeBaseDefault
	}
	return f.cfg.ProblemTypeBase
}

// problemType is the type URI of kind under base; base "about:blank" stands for
// every kind.
func problemType(base, kind string) string {
	if base == ProblemTypeBaseDefault {
		return base
	}
	return base + kind
}

// validateTypeBase refuses a Config.ProblemTypeBase that is neither about:blank nor
// an absolute URI (a scheme, and a host or an opaque part); empty is the default.
func validateTypeBase(base string) error {
	if base == "" || base == ProblemTypeBaseDefault {
		return nil
	}
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" || (u.Host == "" && u.Opaque == "") {
		return fmt.Errorf("idemhttp: Config.ProblemTypeBase %q is not about:blank or an absolute URI a problem kind can follow", base)
	}
	return nil
}

// retryAfter formats d as Retry-After delay-seconds: whole seconds, rounded up, at
// least 1.
func retryAfter(d time.Duration) string {
	s := max((d+time.Second-1)/time.Second, 1)
	return strconv.FormatInt(int64(s), 10)
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
