package idemhttp

import (
	"context"
	"net/http"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// TxMiddlewareFlow is the flow TxMiddleware stores its keys under, registered on the
// engine by the first call to TxMiddleware: like MiddlewareFlow, a client-only flow,
// here of one tx phase.
const TxMiddlewareFlow = "idemflow.http.tx"

// TxMiddleware returns a middleware on engine like Middleware whose wrapped handler
// runs inside the transaction that claims the key and stores its answer, so that the
// handler's own SQL takes effect exactly once: the handler gets the transaction from
// TxFromContext(r.Context()), and its writes and the stored response commit together,
// in one COMMIT, or not at all.
//
// The transaction begins and claims the key (in the same round trip) before the
// handler runs; a concurrent duplicate finds the key being claimed and is answered 409
// at once. The key row is written only with the COMMIT, already finished, so a key
// whose handler has not committed leaves nothing behind:
//   - A response of status 200-499 is stored with the handler's writes.
//   - A 5xx response is passed on, not stored, and the transaction rolls back: nothing
//     of the attempt stays, and the next attempt runs the handler again.
//   - A handler that panics, or whose response is over
//     workflow.Config.MaxResponseBytes (never truncated), is answered as Handler
//     answers the failure (500) and rolled back likewise.
//   - A crash or a lost connection before the COMMIT rolls everything back; after it,
//     retries get the stored answer.
//   - A client that goes away before the COMMIT ends the handler's context (nothing is
//     durable yet, so the work is not done for nobody): its statements fail and the
//     transaction rolls back, leaving no key row.
//
// The handler may be called again within one attempt: after a serialization failure or
// a deadlock the whole transaction is re-run (workflow.Config.TxRetries), each time
// with a fresh response writer and request body; only the last call's writes commit. So
// the handler must not write anywhere but the transaction (a remote call, a message, a
// write through another connection): those are neither rolled back nor fenced. It must
// not use the transaction from more than one goroutine at a time, and should not commit
// or roll it back itself. The transaction ends when the handler returns: from then on
// every call on it (by a goroutine or a client that kept it) fails with
// phases.ErrTxDone and reaches no connection, and a handler that returns while a call
// of its own is still running on it fails and commits nothing. It is READ COMMITTED and,
// like any tx phase's, bounded by workflow.Config.Lease; the handler runs with a
// context that ends with it.
//
// A request without a key (when Config.RequireKey is false) goes straight to the
// handler with no transaction: TxFromContext returns nil, and the handler must answer
// without one. Everything else (keys, scopes, configuration, answers) is as for
// Middleware.
//
// Errors: the configuration is invalid (Scope is nil), or a flow named
// TxMiddlewareFlow was registered that is not this middleware's.
func TxMiddleware(engine *workflow.Engine, cfg *Config) (func(http.Handler) http.Handler, error) {
	return middleware(engine, cfg, phases.Tx(middlewarePhase, nil), TxMiddlewareFlow)
}

// txKey is the context key of the transaction TxMiddleware gives its handler.
type txKey struct{}

// TxFromContext returns the transaction of the key being served by a TxMiddleware
// handler: pass it the request's context. It returns nil for any other context.
func TxFromContext(ctx context.Context) phases.DBTX {
	tx, _ := ctx.Value(txKey{}).(phases.DBTX)
	return tx
}

// runTx is TxMiddlewareFlow's phase function: it runs the wrapped handler with tx in
// its request's context and returns the captured response, for the engine to store in
// the same transaction. A panic goes on to the engine, which rolls the transaction back.
func (l *live) runTx(ctx context.Context, tx phases.DBTX, _ *phases.Run) (*phases.Response, error) {
	c := &capture{w: l.w, header: http.Header{}, limit: l.limit}
	l.serve(context.WithValue(ctx, txKey{}, tx), c)
	return c.response()
}
