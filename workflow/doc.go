// Package workflow is idemflow's engine: it registers flows, runs a request's phases
// under its idempotency key, replays finished keys, answers in-progress and mismatched
// attempts, takes over keys whose lease ended and resumes them from their recovery point.
//
// Usage:
//
//	engine, err := workflow.New(pool, nil) // nil *Config: all defaults
//	if err != nil { ... }
//	if err := engine.Register(chargeFlow); err != nil { ... }
//
//	res, err := engine.Do(ctx, workflow.Request{
//		Scope: accountID, Key: r.Header.Get("Idempotency-Key"),
//		Flow: "create_charge", Method: "POST", Route: "/v1/charges", Body: body,
//	})
//	switch {
//	case err == nil:
//		// res.Response is the answer; res.Replayed says whether it was stored earlier.
//	case errors.Is(err, workflow.ErrInProgress):
//		// 409; err.(*workflow.InProgressError).RetryAfter says when to come back.
//	case errors.Is(err, workflow.ErrMismatch):
//		// 422: the key was used for a different request.
//	case errors.Is(err, workflow.ErrTransient):
//		// 503: nothing stored; the work resumes on the next attempt or sweep.
//	}
//
// The HTTP layer puts this behind net/http: Engine.Handler serves a registered flow and
// Engine.Middleware makes any plain handler idempotent (its response is captured and
// stored unless it is 5xx). Both read the Idempotency-Key header (an RFC 8941 string or
// a bare token), take the scope from HTTPConfig.Scope, answer errors as
// application/problem+json and mark replays with Idempotent-Replayed: true.
//
//	h, err := engine.Handler("create_charge", &workflow.HTTPConfig{Scope: accountFromAuth})
//	mux.Handle("POST /v1/charges", h)
//
// Cost of a fresh request: one round trip to look the key up, then per tx phase one
// commit, with the claim riding in the first tx phase's transaction (pipelined with
// BEGIN and the phase's first statement) and the fenced recovery-point update pipelined
// with COMMIT. A replay is one round trip. No transaction is open while a call phase runs.
//
// This package imports idemflow's phases and store packages,
// github.com/go-json-experiment/json/jsontext (the JSON tokenizer under Fingerprint),
// github.com/gowebpki/jcs (RFC 8785, only to compare fingerprints stored before v2) and
// github.com/dunglas/httpsfv (RFC 8941).
package workflow
