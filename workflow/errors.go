package workflow

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/phases"
)

var (
	// ErrInvalidKey: the idempotency key is empty, longer than 255 bytes or holds a
	// character outside printable ASCII. Nothing was written.
	ErrInvalidKey = errors.New("invalid idempotency key")
	// ErrInvalidScope: the scope is empty, longer than 255 bytes, not UTF-8 or holds a
	// control character (ValidateScope). Nothing was written.
	ErrInvalidScope = errors.New("invalid scope")
	// ErrControlCharacter: a key or scope holds a C0 control character (U+0000-U+001F),
	// DEL (U+007F) or a C1 control character (U+0080-U+009F). It comes wrapped with
	// ErrInvalidKey or ErrInvalidScope; nothing was written and no statement was sent.
	ErrControlCharacter = errors.New("control character")
	// ErrInvalidRequest: method or route is empty or too long. Nothing was written.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrUnknownFlow: no flow of that name is registered. Nothing was written.
	ErrUnknownFlow = errors.New("unknown flow")
	// ErrBodyTooLarge: the request body is over Config.MaxBodyBytes. Nothing was written.
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrMismatch: the key was used before for a different request (method, route, flow
	// or body). Nothing was written.
	ErrMismatch = errors.New("idempotency key reused for a different request")
	// ErrInProgress: another attempt holds the key's lease. The error is an
	// *InProgressError saying when to retry.
	ErrInProgress = errors.New("request in progress")
	// ErrUnknownRecoveryPoint: the key's recovery point names a phase this build's flow
	// does not have: a newer (or older) version of the flow wrote it. The key is left
	// untouched for a build that has the phase, or an operator, to decide; the error
	// matches ErrNewerFormat too, so it is answered as retryable.
	ErrUnknownRecoveryPoint = errors.New("unknown recovery point")
	// ErrDeadLettered: the key was given up on, after too many failed attempts or
	// because a phase ran but its answer could not be stored (ErrUnstorable, as for an
	// idemhttp middleware's handler); it keeps its last error and can be re-driven
	// explicitly.
	ErrDeadLettered = errors.New("key dead-lettered")
	// ErrTransient: the attempt failed in a way worth retrying. Nothing new was stored,
	// the key was released and keeps its recovery point. The error is a *TransientError.
	ErrTransient = errors.New("transient failure")
	// ErrResponseTooLarge: a phase's response is over Config.MaxResponseBytes. It is
	// never truncated; the attempt fails as transient with this error (an idemhttp
	// middleware, whose handler already ran, wraps it in ErrUnstorable instead: the key
	// is dead-lettered).
	ErrResponseTooLarge = errors.New("response too large to store")
	// ErrPhaseDataTooLarge: phase data grew over Config.MaxPhaseDataBytes.
	ErrPhaseDataTooLarge = errors.New("phase data too large")
	// ErrNoResponse: the flow ended without a final response: its last phase returned
	// none, or a phase answered with an informational status (1xx, 101 included), which
	// is never stored or replayed. The key was released.
	ErrNoResponse = errors.New("flow ended without a response")
	// ErrLeaseExpired: a tx phase (an idemhttp TxMiddleware handler) was still running
	// when the attempt's lease (Config.Lease) ran out, so its transaction was not
	// committed: nothing of the phase stays. It comes inside a *TransientError; the key
	// keeps its recovery point. A phase that hits it is hung or too slow for the lease.
	ErrLeaseExpired = errors.New("the attempt ran out of its lease before its phase committed")
)

// errNotFinal: a phase answered with a status that is not a final answer (1xx,
// including 101 Switching Protocols). It is never stored or replayed; the attempt
// fails like one without a response, and the key is released.
var errNotFinal = fmt.Errorf("status is not a final response: %w", ErrNoResponse)

// Errors of the database and of fencing. They are the key table's own values
// (aliases, not copies, of the internal package that runs the engine's SQL and
// translates pgx's errors), so errors.Is matches them whichever layer wrapped them;
// this is their one public name.
var (
	// ErrUnavailable: the database could not be reached or the connection broke. It
	// comes back on its own when nothing was run yet, and inside a *TransientError
	// when a phase failed with it (then the key was released or its lease runs out).
	ErrUnavailable = keytable.ErrUnavailable
	// ErrConflict: a serialization failure or deadlock outlived Config.TxRetries
	// (inside a *TransientError), or the key kept changing under the attempt. Retrying
	// is safe.
	ErrConflict = keytable.ErrConflict
	// ErrLeaseLost: this executor's lease was taken over while it ran; its uncommitted
	// work was rolled back and the new owner answers.
	ErrLeaseLost = keytable.ErrLeaseLost
	// ErrClaimBusy: a claim found another attempt holding the key's claim lock (it is
	// running the key's first transaction right now), and ErrClaimExists: a new key's
	// insert found the key's row already there. Neither reaches a caller of Do (the
	// attempt answers as the key's row then says: in progress, replay, or a retry); a
	// PhaseEnd hook sees the phase end with one of them, having written nothing.
	ErrClaimBusy   = keytable.ErrClaimBusy
	ErrClaimExists = keytable.ErrClaimExists
	// ErrNotFound: Resume or Redrive found no key row.
	ErrNotFound = keytable.ErrNotFound
	// ErrMisconfigured: the connection's settings do not fit what is between the
	// engine and Postgres: pgx's default query exec mode behind a pooler in
	// transaction mode that keeps no prepared statements. The message names the fix
	// (default_query_exec_mode=cache_describe); retrying does not help. The HTTP layer
	// answers it 500, not 503.
	ErrMisconfigured = keytable.ErrMisconfigured
	// ErrRefused: the database refused one of the engine's statements, or a tx
	// phase's, for good: a feature it does not support (SQLSTATE 0A000, as Citus
	// answers a statement it cannot run on one shard), a syntax error, an undefined or
	// forbidden object (class 42), a missing schema or database. It is never a
	// *TransientError: a retry would be refused the same way. A key whose row exists
	// is dead-lettered with the refusal as its last error, so no sweeper retries it;
	// re-drive it once the cause is fixed. The HTTP layer answers it 500.
	ErrRefused = keytable.ErrRefused
)

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
