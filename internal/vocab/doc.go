// Package vocab is the engine's vocabulary: how an attempt on a key ends (Outcome,
// Result), the events the engine reports (AttemptEvent, PhaseEvent, KeyEvent), the
// errors a caller branches on and the classes of failure they fall in (Classify).
//
// It sits at the bottom of the engine, so that every room of it (the key table's
// driver, the executor of an attempt, the request front, the adapters through
// package workflow) speaks the same words without importing each other. Package
// workflow re-exports every name here under the same name, as an alias (type
// aliases, `var ErrX = vocab.ErrX`, constants), so errors.Is and type switches see
// one value and one type whichever layer made them; users never import this package.
// Its name is not "outcome", which the engine's code uses for variables.
//
//	if vocab.Classify(err) == vocab.ClassRetry {
//		// answer 409 or 503 with Retry-After; redeliver a message later
//	}
//
// A Result carries, besides what callers read, what the attempt learnt of its key for
// its report (Internal): unexported, so not part of workflow's API, and reached by the
// engine's machinery through Internals.
//
// It may import package phases and the standard library only: no other idemflow
// package, and nothing that talks to a database.
package vocab
