package vocab

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/phases"
)

// The sentinels: package workflow re-exports each under the same name, where its full
// contract is documented. Each has a class (Classify); class_test.go lists them all.
var (
	// ErrInvalidKey: the idempotency key is not valid. Nothing was written.
	ErrInvalidKey = errors.New("invalid idempotency key")
	// ErrInvalidScope: the scope is not valid. Nothing was written.
	ErrInvalidScope = errors.New("invalid scope")
	// ErrControlCharacter: a key or scope holds a control character; it comes wrapped
	// with ErrInvalidKey or ErrInvalidScope.
	ErrControlCharacter = errors.New("control character")
	// ErrInvalidRequest: method or route is empty or too long. Nothing was written.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrBodyNotJSON: a flow that fingerprints members got a body that is not one
	// canonicalisable JSON value. It wraps ErrInvalidRequest.
	ErrBodyNotJSON = fmt.Errorf("%w: body is not a JSON value that can be fingerprinted by members", ErrInvalidRequest)
	// ErrUnknownFlow: no flow of that name is registered.
	ErrUnknownFlow = errors.New("unknown flow")
	// ErrBodyTooLarge: the request body is over the engine's limit.
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrMismatch: the key was used before for a different request.
	ErrMismatch = errors.New("idempotency key reused for a different request")
	// ErrInProgress: another attempt holds the key's lease (an *InProgressError).
	ErrInProgress = errors.New("request in progress")
	// ErrNewerFormat: the key's row was written by a newer build in a format this one
	// does not read.
	ErrNewerFormat = errors.New("key row written in a format this build does not read (by a newer build)")
	// ErrUnknownRecoveryPoint: the key's recovery point names a phase this build's
	// flow does not have; it comes matching ErrNewerFormat too.
	ErrUnknownRecoveryPoint = errors.New("unknown recovery point")
	// ErrDeadLettered: the key was given up on.
	ErrDeadLettered = errors.New("key dead-lettered")
	// ErrTransient: the attempt failed in a way worth retrying (a *TransientError).
	ErrTransient = errors.New("transient failure")
	// ErrResponseTooLarge: a phase's response is over the engine's limit.
	ErrResponseTooLarge = errors.New("response too large to store")
	// ErrPhaseDataTooLarge: phase data grew over the engine's limit.
	ErrPhaseDataTooLarge = errors.New("phase data too large")
	// ErrNoResponse: the flow ended without a final response.
	ErrNoResponse = errors.New("flow ended without a response")
	// ErrNotFinal: a phase answered with a status that is not a final answer (1xx);
	// it wraps ErrNoResponse. Not re-exported: callers match ErrNoResponse.
	ErrNotFinal = fmt.Errorf("status is not a final response: %w", ErrNoResponse)
	// ErrLeaseExpired: a tx phase was still running when its attempt's lease ran out.
	ErrLeaseExpired = errors.New("the attempt ran out of its lease before its phase committed")
	// ErrNeedsClient: a key of a client-only flow was to be run without its client.
	ErrNeedsClient = errors.New("only the client's retry can finish this key")
	// ErrUnstorable: for phase functions to wrap: the phase ran but its answer cannot
	// be stored, so the key is dead-lettered.
	ErrUnstorable = errors.New("its answer cannot be stored")
	// ErrOverloaded: the attempt was turned away before its claim by admission.
	ErrOverloaded = errors.New("overloaded")
	// ErrDraining: the attempt was turned away, or released its key, by a drain.
	ErrDraining = errors.New("draining")
	// ErrOpenSealed: the engine's Sealer failed to open a sealed value of the key.
	ErrOpenSealed = errors.New("cannot open the sealed value")
	// ErrStandbyBehind: no standby confirmed the commit before a call phase.
	ErrStandbyBehind = errors.New("no standby confirmed the commit before the call")
)

// The errors of the database and of fencing, which the key table's driver returns
// as these values (it aliases them), translated from pgx's errors.
var (
	// ErrNotFound: no key row matches.
	ErrNotFound = errors.New("key not found")
	// ErrLeaseLost: a fenced statement matched no row. The key was taken over (its lock
	// version moved), finished or deleted by someone else; the caller's transaction, if
	// any, is aborted.
	ErrLeaseLost = errors.New("lease lost")
	// ErrClaimBusy: another attempt holds the key's claim lock: it is running the key's
	// first transaction right now. Nothing was written.
	ErrClaimBusy = errors.New("key is being claimed by another attempt")
	// ErrClaimExists: a new key's insert found its row already there; the transaction
	// is aborted. Look the row up.
	ErrClaimExists = errors.New("key row exists")
	// ErrConflict: a serialization failure or deadlock; the whole transaction may be
	// retried.
	ErrConflict = errors.New("transaction conflict")
	// ErrUnavailable: the database could not be reached or the connection broke.
	ErrUnavailable = errors.New("database unavailable")
	// ErrMisconfigured: the server refused a statement in a way only the connection's
	// settings cause (pgx's default query exec mode behind a pooler in transaction
	// mode that keeps no prepared statements). Retrying does not help; the message
	// names the fix.
	ErrMisconfigured = errors.New("connection misconfigured: prepared statements do not survive between transactions " +
		"(a pooler in transaction mode, such as pgbouncer, is in between); set default_query_exec_mode=cache_describe " +
		"(or exec) on the pgx pool's connection string or ConnConfig.DefaultQueryExecMode, " +
		"or run pgbouncer 1.21 or later with max_prepared_statements > 0")
	// ErrRefused: the server refused a statement in a way that retrying cannot change.
	ErrRefused = errors.New("statement refused by the database, permanently (a retry would be refused the same way)")
)

// The operator API's errors (workflow's ListKeys, ReleaseKey, Redrive, PurgeKey,
// CancelKey, BulkKeys): no attempt returns them. Each is the operator's request being
// wrong for the keys as they are, so a client fault: nothing was changed.
var (
	// ErrUnknownStatus: a list asked for a status there is none of.
	ErrUnknownStatus = errors.New("unknown key status")
	// ErrWrongStatus: an operator's action found the key in a status it does not
	// apply to.
	ErrWrongStatus = errors.New("wrong key status")
	// ErrInvalidCursor: a list's cursor is not one of a page of the same status.
	ErrInvalidCursor = errors.New("invalid list cursor")
	// ErrEmptyFilter: a bulk action was given no filter and not asked to act on every
	// key.
	ErrEmptyFilter = errors.New("bulk action without a filter (set BulkOptions.All to act on every key)")
	// ErrCallMayHaveRun: a cancel was refused for a key one of whose call phases may
	// already have reached the remote side.
	ErrCallMayHaveRun = errors.New("a call phase may have reached the remote side")
	// ErrCompensationUnknown: a cancel was refused for a key whose flow the engine does
	// not register, so it can neither tell whether the flow declares a compensation
	// nor run one.
	ErrCompensationUnknown = errors.New("whether the flow declares a compensation is unknown")
)

// ErrCompensationFailed: the compensation a cancel ran returned an error or panicked:
// the flow's fault, a server fault. Nothing was changed.
var ErrCompensationFailed = errors.New("the compensation failed")

// InProgressError is returned while another attempt holds a key's lease.
type InProgressError struct {
	// RetryAfter is when the holder's answer is likely stored: by default the average
	// time the engine saw new keys of the flow take from claim to answer (the time left
	// on the holder's lease, by the database clock, until one was seen); see
	// Config.InProgressRetryAfter. At least one second, at most the lease left.
	RetryAfter time.Duration
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("request in progress; retry after %s", e.RetryAfter)
}

// Is makes errors.Is(err, ErrInProgress) true.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// TransientError is returned when an attempt failed but may succeed later. Nothing new
// was stored and the key keeps its recovery point. A phase asks for a delay with
// phases.RetryLater (a *phases.RetryError going in); this is what comes out.
type TransientError struct {
	// Phase is the phase that failed.
	Phase string
	// RetryAfter suggests when to retry (never less than one second).
	RetryAfter time.Duration
	// Response is a 5xx response the phase produced, if any, to pass on unstored.
	Response *phases.Response
	// Err is the cause.
	Err error
}

func (e *TransientError) Error() string {
	return fmt.Sprintf("phase %s: transient failure: %v", e.Phase, e.Err)
}

// Unwrap returns the cause.
func (e *TransientError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrTransient) true.
func (e *TransientError) Is(target error) bool { return target == ErrTransient }

// ShedError turns an attempt away before its claim: the engine is overloaded or
// draining. Nothing was written; the client should retry, with the same key, after
// RetryAfter (an idemhttp handler answers 503 with Retry-After).
type ShedError struct {
	// RetryAfter is when to retry: one second.
	RetryAfter time.Duration
	// Err is ErrOverloaded or ErrDraining.
	Err error
}

func (e *ShedError) Error() string {
	return fmt.Sprintf("turned away before the claim (%v); retry after %s", e.Err, e.RetryAfter)
}

// Unwrap returns ErrOverloaded or ErrDraining.
func (e *ShedError) Unwrap() error { return e.Err }

// Shed is the error of an attempt turned away before its claim because of why
// (ErrOverloaded or ErrDraining), to retry after a second.
func Shed(why error) *ShedError { return &ShedError{RetryAfter: time.Second, Err: why} }
