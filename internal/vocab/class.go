package vocab

import (
	"context"
	"errors"

	"github.com/idemflow/idemflow/phases"
)

// Class is the kind of failure an error is, which decides how an adapter answers it
// (an HTTP status class, a message's disposition). The engine owns the classes, so
// that every adapter answers a failure alike and a new error is classed once, here;
// an adapter may still pick its exact answer within a class (400, 401, 413 or 422;
// 409 or 503; a Retry-After).
type Class int

const (
	// ClassNone is the class of no error.
	ClassNone Class = iota
	// ClassRetry: nothing final happened and the same request, with the same key, may
	// succeed later: another attempt holds the key, the engine is overloaded or
	// draining, the database is unavailable or in conflict, a newer build wrote the
	// key, or a phase failed transiently (the key was released and keeps its recovery
	// point). Answer 409 or 503 with Retry-After; redeliver a message later.
	ClassRetry
	// ClassClientFault: the request is wrong (its key, scope, method, route or body,
	// or a key reused for another request, or a key that does not exist, or an
	// operator's action that does not apply to the keys as they are), so no retry
	// of the same request can succeed; nothing was written. Answer 4xx, never logged
	// as an error, since any client can cause it; terminate a message.
	ClassClientFault
	// ClassDeadLettered: the key was given up on; no retry succeeds until an operator
	// re-drives it, and its request may have taken effect in part. Not the client's
	// fault, nor anything a retry clears: answer 410; terminate a message.
	ClassDeadLettered
	// ClassServerFault: the service is at fault, not the request: a flow's (a panic,
	// no final response, an answer or phase data too large, an answer that cannot be
	// stored), its wiring's (an unregistered flow, a client-only flow run without its
	// client, a sealer that cannot open what it sealed) or the database's
	// configuration (ErrMisconfigured, ErrRefused). A retry succeeds only once the
	// service is fixed. Answer 500 and log it; keep a message for redelivery (nothing
	// of it is lost while the fault is fixed). Every error Classify does not know
	// is one.
	ClassServerFault
)

func (c Class) String() string {
	switch c {
	case ClassNone:
		return "none"
	case ClassRetry:
		return "retry"
	case ClassClientFault:
		return "client_fault"
	case ClassDeadLettered:
		return "dead_lettered"
	case ClassServerFault:
		return "server_fault"
	}
	return "Class(invalid)"
}

// The sentinels of each class, in the order Classify tries them.
var (
	serverFaults = []error{ErrResponseTooLarge, ErrNoResponse, ErrPhaseDataTooLarge, ErrUnstorable,
		ErrRefused, ErrMisconfigured, ErrOpenSealed, ErrNeedsClient, ErrUnknownFlow, ErrCompensationFailed}
	retries = []error{ErrTransient, ErrInProgress, ErrNewerFormat, ErrUnknownRecoveryPoint, ErrLeaseLost,
		ErrLeaseExpired, ErrUnavailable, ErrConflict, ErrClaimBusy, ErrClaimExists, ErrOverloaded, ErrDraining,
		ErrStandbyBehind, context.Canceled, context.DeadlineExceeded}
	clientFaults = []error{ErrInvalidKey, ErrInvalidScope, ErrControlCharacter, ErrInvalidRequest,
		ErrBodyTooLarge, ErrMismatch, ErrNotFound, ErrUnknownStatus, ErrWrongStatus, ErrInvalidCursor, ErrEmptyFilter,
		ErrCallMayHaveRun, ErrCompensationUnknown}
)

// Classify returns the class of err, which may wrap any of the engine's errors. A
// fault of the service wins over anything it comes with (a panic inside a
// *TransientError is a server fault, not a retry), a dead-lettered key over a retry,
// and a retry over a client fault (a *TransientError a phase returned with a cause of
// its own: the engine released the key and retries it). An error of none of the
// engine's kinds is a server fault.
func Classify(err error) Class {
	if err == nil {
		return ClassNone
	}
	var panicked *phases.PanicError
	switch {
	case errors.As(err, &panicked), isAny(err, serverFaults):
		return ClassServerFault
	case errors.Is(err, ErrDeadLettered):
		return ClassDeadLettered
	case isAny(err, retries):
		return ClassRetry
	case isAny(err, clientFaults):
		return ClassClientFault
	}
	return ClassServerFault
}

func isAny(err error, targets []error) bool {
	for _, target := range targets {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// Sentinels returns every error variable of the package, each of which has a class:
// for tests of adapters, which check that they answer each as its class says.
func Sentinels() []error {
	return []error{ErrInvalidKey, ErrInvalidScope, ErrControlCharacter, ErrInvalidRequest, ErrBodyNotJSON,
		ErrUnknownFlow, ErrBodyTooLarge, ErrMismatch, ErrInProgress, ErrNewerFormat, ErrUnknownRecoveryPoint,
		ErrDeadLettered, ErrTransient, ErrResponseTooLarge, ErrPhaseDataTooLarge, ErrNoResponse, ErrNotFinal,
		ErrLeaseExpired, ErrNeedsClient, ErrUnstorable, ErrOverloaded, ErrDraining, ErrOpenSealed, ErrStandbyBehind,
		ErrNotFound, ErrLeaseLost, ErrClaimBusy, ErrClaimExists, ErrConflict, ErrUnavailable, ErrMisconfigured, ErrRefused,
		ErrUnknownStatus, ErrWrongStatus, ErrInvalidCursor, ErrEmptyFilter, ErrCallMayHaveRun, ErrCompensationUnknown,
		ErrCompensationFailed}
}
