package idemmsg

import (
	"context"
	"errors"
	"time"

	"github.com/idemflow/idemflow/workflow"
)

// Method and Route are the workflow.Request method and route of every message. No
// request through package idemhttp has them (its routes are paths, which start with
// "/"), so a message and an HTTP request never match each other's fingerprint, even
// under the same scope and key. Phases see them as run.Method() and run.Route().
const (
	Method = "MESSAGE"
	Route  = "message"
)

// RetryDelayDefault is Decision.Delay for a Retry whose cause suggests no delay of its
// own (the database unavailable, a conflict, a lease lost, an unregistered flow).
const RetryDelayDefault = time.Second

// Message is one delivery of a message, as the engine sees it.
type Message struct {
	// Scope owns the key: the consumer's identity, or the tenant the message belongs
	// to. Keys are unique per scope. 1-255 bytes of UTF-8 text without control
	// characters (workflow.ValidateScope).
	Scope string
	// Key is the idempotency key: the message id (such as NATS's Nats-Msg-Id) or a
	// business key from the payload, the same on every redelivery. 1-255 printable
	// ASCII characters (workflow.ValidateKey). A scope or key that holds a control
	// character is terminated with workflow.ErrControlCharacter before any statement
	// is sent; derive both from the message so that every one the consumer accepts is
	// valid (examples/payouts turns any id into a valid key).
	Key string
	// Flow names a registered flow.
	Flow string
	// Payload is the message body: fingerprinted (canonical JSON when it is JSON),
	// stored with the key for resumption, and given to the phases as run.Body().
	Payload []byte
}

// Request returns the workflow.Request of m, with Method and Route.
func (m Message) Request() workflow.Request {
	return workflow.Request{Scope: m.Scope, Key: m.Key, Flow: m.Flow, Method: Method, Route: Route, Body: m.Payload}
}

// Handle runs one delivery of m through engine.Run and says what the consumer should
// do with it: see Decide.
func Handle(ctx context.Context, engine *workflow.Engine, m Message) Decision {
	return Decide(engine.Run(ctx, m.Request()))
}

// Action is what a consumer does with a delivery.
type Action int

const (
	// Ack: the message's answer is stored (Decision.Result; Replayed for a
	// redelivery). Acknowledge the message.
	Ack Action = iota + 1
	// Retry: the message's work is not finished, and nothing final was stored: another
	// delivery holds the key, or the attempt failed in a way worth retrying. Have the
	// message redelivered after Decision.Delay (a negative acknowledgement with a
	// delay), or simply do not acknowledge it.
	Retry
	// Terminate: no redelivery can succeed: the key was used for another payload
	// (ErrMismatch), the message is invalid (key, scope, size), or the key was
	// dead-lettered. Stop redelivery; dead-letter or alert as the application wants.
	Terminate
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case Terminate:
		return "terminate"
	}
	return "Action(invalid)"
}

// Decision is what to do with a delivery, decided from the engine's answer.
type Decision struct {
	Action Action
	// Delay is, for Retry, how long to wait before the message is redelivered: the
	// engine's Retry-After for an attempt turned away by a live lease or for a
	// transient failure, else RetryDelayDefault. Zero for Ack and Terminate.
	Delay time.Duration
	// Result is, for Ack, the stored answer. A flow's deterministic failure (a 4xx
	// response) is an answer too: acknowledge it, and read Result.Response to act on it.
	Result *workflow.Result
	// Err is the engine's error, for Retry and Terminate.
	Err error
}

// Decide maps the result of an attempt (workflow.Engine.Run) to a Decision, by its
// outcome, and a failure by the class the engine gives its error (workflow.Classify):
//
//	outcome                                     action     delay
//	finished, replayed                          Ack        -
//	in_progress, released, shed, lease_lost     Retry      its RetryAfter
//	mismatch, dead_lettered                     Terminate  -
//	failed: workflow.ClassClientFault           Terminate  -
//	(ErrInvalidKey, ErrInvalidScope,
//	ErrInvalidRequest, ErrBodyTooLarge, ...)
//	failed: workflow.ClassDeadLettered          Terminate  -
//	failed: workflow.ClassRetry: ErrNewerFormat Retry      NewerFormatRetryAfter
//	(a newer build wrote the key)
//	failed: workflow.ClassRetry, any other      Retry      RetryDelayDefault
//	(ErrUnavailable, ErrConflict, a context's)
//	failed: workflow.ClassServerFault           Retry      RetryDelayDefault
//	(ErrUnknownFlow, ErrNeedsClient,
//	ErrMisconfigured, ErrRefused, ...)
//
// A fault of the service is retried, not terminated: nothing of the message was
// written, the fault is the consumer's to fix (an unregistered flow, as during a
// deployment; a client-only flow, which only an HTTP client's retry can run; a
// pgx setting that does not fit a pooler), and terminating would lose the message;
// bound redeliveries in the broker (JetStream's MaxDeliver) to catch a real mistake.
// A key dead-lettered by a transient failure (a sweep's last attempt) is retried
// like a release: the redelivery finds it dead-lettered and terminates.
func Decide(out *workflow.Result) Decision {
	switch out.Outcome {
	case workflow.OutcomeFinished, workflow.OutcomeReplayed:
		return Decision{Action: Ack, Result: out}
	case workflow.OutcomeInProgress, workflow.OutcomeReleased, workflow.OutcomeShed, workflow.OutcomeLeaseLost:
		return Decision{Action: Retry, Delay: positive(out.RetryAfter), Err: out.Err}
	case workflow.OutcomeDeadLettered:
		if out.RetryAfter > 0 {
			return Decision{Action: Retry, Delay: out.RetryAfter, Err: out.Err}
		}
		return Decision{Action: Terminate, Err: out.Err}
	case workflow.OutcomeMismatch:
		return Decision{Action: Terminate, Err: out.Err}
	}
	err := out.Err
	switch workflow.Classify(err) {
	case workflow.ClassClientFault, workflow.ClassDeadLettered:
		return Decision{Action: Terminate, Err: err}
	}
	if errors.Is(err, workflow.ErrNewerFormat) {
		return Decision{Action: Retry, Delay: workflow.NewerFormatRetryAfter, Err: err}
	}
	return Decision{Action: Retry, Delay: RetryDelayDefault, Err: err}
}

func positive(d time.Duration) time.Duration {
	if d <= 0 {
		return RetryDelayDefault
	}
	return d
}
