// Package idemhttp puts idemflow's engine behind net/http: Handler serves a flow
// registered on a workflow.Engine, Middleware makes any plain http.Handler idempotent
// (its response is captured and stored unless it is 5xx), and TxMiddleware does the
// same with the handler's own SQL in the transaction that stores its answer
// (TxFromContext). All three read the Idempotency-Key header (an RFC 8941 string or a
// bare token; ParseKeyHeader), take the scope from Config.Scope, answer errors as
// application/problem+json (RFC 9457) with a type per kind, mark replays with
// Idempotent-Replayed: true and advertise the retention in Idempotency-Key-Retention.
// docs/API.md describes every answer for an API's clients.
//
// Usage:
//
//	engine, err := workflow.New(pool, nil)
//	if err != nil {
//		return err
//	}
//	if err := engine.Register(chargeFlow); err != nil {
//		return err
//	}
//	create, err := idemhttp.Handler(engine, "create_charge", &idemhttp.Config{Scope: accountFromAuth})
//	if err != nil {
//		return err
//	}
//	mux.Handle("POST /v1/charges", create)
//
//	idempotent, err := idemhttp.Middleware(engine, &idemhttp.Config{Scope: accountFromAuth, RequireKey: true})
//	if err != nil {
//		return err
//	}
//	mux.Handle("POST /v1/refunds", idempotent(refundHandler))
//
// How a middleware's handler gets its request. The wrapped handler needs the live
// request and its response writer, which only the attempt serving them has, so the
// middlewares' keys are stored under client-only flows (phases.Flow.ClientOnly):
// MiddlewareFlow, of one call phase, and TxMiddlewareFlow, of one tx phase, each
// registered once per engine by the first middleware that needs it. Each attempt hands
// the engine the phase function to run (workflow.Request.ClientPhases): a closure over
// that attempt's request and writer, built just before Engine.Do and dropped when it
// returns. Nothing rides in a context, no table of live requests is kept, and the
// engine needs no back door: a key run without its client (Engine.Resume, a sweeper)
// has no function to run, so the engine refuses (workflow.ErrNeedsClient) and the
// sweeper parks the key for its client's retry. A table keyed by the key row's
// identity (run.ID()) was the alternative; it was not chosen because that identity is
// made inside Do for a new key, so it cannot be set before Do, and a table keyed by
// (scope, key) would hand one attempt's writer to another attempt of the same key.
//
// The key belongs to operations, which only unsafe methods run: a request of a safe
// method (GET, HEAD, OPTIONS, TRACE) is never keyed, whatever its Idempotency-Key
// header holds. Handler answers it 405; a middleware passes it to its handler as it
// is, so that the GET a client sends to follow an operation's 303 See Other reaches
// the resource even when it still carries the operation's key.
//
// Protocol upgrades are never run under a key: a middleware answers a keyed request
// of an unsafe method that asks to switch protocols (h2c, CONNECT) 400 with problem
// type upgrade-not-idempotent before its handler runs, and drops an informational
// status (1xx, 101 included) its handler writes, so that the stored answer is always a final
// one and the handler never runs twice for want of one (see Middleware).
//
// This package imports idemflow's workflow and phases packages and
// github.com/dunglas/httpsfv (RFC 8941). workflow has no net/http code; this package is
// where it lives.
package idemhttp
