package workflow

import "github.com/idemflow/idemflow/internal/vocab"

// The errors a caller branches on. Each is the value of the engine's vocabulary
// (an internal package every layer of the engine shares), so errors.Is matches it
// whichever layer made or wrapped it, and each falls in one Class (Classify).
var (
	// ErrInvalidKey: the idempotency key is empty, longer than 255 bytes or holds a
	// character outside printable ASCII. Nothing was written.
	ErrInvalidKey = vocab.ErrInvalidKey
	// ErrInvalidScope: the scope is empty, longer than 255 bytes, not UTF-8 or holds a
	// control character (ValidateScope). Nothing was written.
	ErrInvalidScope = vocab.ErrInvalidScope
	// ErrControlCharacter: a key or scope holds a C0 control character (U+0000-U+001F),
	// DEL (U+007F) or a C1 control character (U+0080-U+009F). It comes wrapped with
	// ErrInvalidKey or ErrInvalidScope; nothing was written and no statement was sent.
	ErrControlCharacter = vocab.ErrControlCharacter
	// ErrInvalidRequest: method or route is empty or too long. Nothing was written.
	ErrInvalidRequest = vocab.ErrInvalidRequest
	// ErrUnknownFlow: no flow of that name is registered. Nothing was written.
	ErrUnknownFlow = vocab.ErrUnknownFlow
	// ErrBodyTooLarge: the request body is over Config.MaxBodyBytes. Nothing was written.
	ErrBodyTooLarge = vocab.ErrBodyTooLarge
	// ErrMismatch: the key was used before for a different request (method, route, flow
	// or body). Nothing was written.
	ErrMismatch = vocab.ErrMismatch
	// ErrInProgress: another attempt holds the key's lease. The error is an
	// *InProgressError saying when to retry.
	ErrInProgress = vocab.ErrInProgress
	// ErrUnknownRecoveryPoint: the key's recovery point names a phase this build's flow
	// does not have: a newer (or older) version of the flow wrote it. The key is left
	// untouched for a build that has the phase, or an operator, to decide; the error
	// matches ErrNewerFormat too, so it is answered as retryable.
	ErrUnknownRecoveryPoint = vocab.ErrUnknownRecoveryPoint
	// ErrDeadLettered: the key was given up on, after too many failed attempts or
	// because a phase ran but its answer could not be stored (ErrUnstorable, as for an
	// idemhttp middleware's handler); it keeps its last error and can be re-driven
	// explicitly.
	ErrDeadLettered = vocab.ErrDeadLettered
	// ErrTransient: the attempt failed in a way worth retrying. Nothing new was stored,
	// the key was released and keeps its recovery point. The error is a *TransientError.
	ErrTransient = vocab.ErrTransient
	// ErrResponseTooLarge: a phase's response is over Config.MaxResponseBytes. It is
	// never truncated; the attempt fails as transient with this error (an idemhttp
	// middleware, whose handler already ran, wraps it in ErrUnstorable instead: the key
	// is dead-lettered).
	ErrResponseTooLarge = vocab.ErrResponseTooLarge
	// ErrPhaseDataTooLarge: phase data grew over Config.MaxPhaseDataBytes.
	ErrPhaseDataTooLarge = vocab.ErrPhaseDataTooLarge
	// ErrNoResponse: the flow ended without a final response: its last phase returned
	// none, or a phase answered with an informational status (1xx, 101 included), which
	// is never stored or replayed. The key was released.
	ErrNoResponse = vocab.ErrNoResponse
	// ErrLeaseExpired: a tx phase (an idemhttp TxMiddleware handler) was still running
	// when the attempt's lease (Config.Lease) ran out, so its transaction was not
	// committed: nothing of the phase stays. It comes inside a *TransientError; the key
	// keeps its recovery point. A phase that hits it is hung or too slow for the lease.
	ErrLeaseExpired = vocab.ErrLeaseExpired
)

// Errors of the database and of fencing. They are the key table's own values (the
// internal package that runs the engine's SQL returns them, translated from pgx's
// errors), so errors.Is matches them whichever layer wrapped them; this is their one
// public name.
var (
	// ErrUnavailable: the database could not be reached or the connection broke. It
	// comes back on its own when nothing was run yet, and inside a *TransientError
	// when a phase failed with it (then the key was released or its lease runs out).
	ErrUnavailable = vocab.ErrUnavailable
	// ErrConflict: a serialization failure or deadlock outlived Config.TxRetries
	// (inside a *TransientError), or the key kept changing under the attempt. Retrying
	// is safe.
	ErrConflict = vocab.ErrConflict
	// ErrLeaseLost: this executor's lease was taken over while it ran; its uncommitted
	// work was rolled back and the new owner answers.
	ErrLeaseLost = vocab.ErrLeaseLost
	// ErrClaimBusy: a claim found another attempt holding the key's claim lock (it is
	// running the key's first transaction right now), and ErrClaimExists: a new key's
	// insert found the key's row already there. Neither reaches a caller of Do (the
	// attempt answers as the key's row then says: in progress, replay, or a retry); a
	// PhaseEnd hook sees the phase end with one of them, having written nothing.
	ErrClaimBusy   = vocab.ErrClaimBusy
	ErrClaimExists = vocab.ErrClaimExists
	// ErrNotFound: Resume or Redrive found no key row.
	ErrNotFound = vocab.ErrNotFound
	// ErrMisconfigured: the connection's settings do not fit what is between the
	// engine and Postgres: pgx's default query exec mode behind a pooler in
	// transaction mode that keeps no prepared statements. The message names the fix
	// (default_query_exec_mode=cache_describe); retrying does not help. The HTTP layer
	// answers it 500, not 503.
	ErrMisconfigured = vocab.ErrMisconfigured
	// ErrRefused: the database refused one of the engine's statements, or a tx
	// phase's, for good: a feature it does not support (SQLSTATE 0A000, as Citus
	// answers a statement it cannot run on one shard), a syntax error, an undefined or
	// forbidden object (class 42), a missing schema or database. It is never a
	// *TransientError: a retry would be refused the same way. A key whose row exists
	// is dead-lettered with the refusal as its last error, so no sweeper retries it;
	// re-drive it once the cause is fixed. The HTTP layer answers it 500.
	ErrRefused = vocab.ErrRefused
)

// InProgressError is returned while another attempt holds a key's lease. RetryAfter
// is when the holder's answer is likely stored: by default the average time the
// engine saw new keys of the flow take from claim to answer (the time left on the
// holder's lease, by the database clock, until one was seen); see
// Config.InProgressRetryAfter. At least one second, at most the lease left.
// errors.Is(err, ErrInProgress) is true of it.
type InProgressError = vocab.InProgressError

// TransientError is returned when an attempt failed but may succeed later. Nothing new
// was stored and the key keeps its recovery point. A phase asks for a delay with
// phases.RetryLater (a *phases.RetryError going in); this is what comes out: Phase is
// the phase that failed, RetryAfter when to retry (never less than one second),
// Response a 5xx response the phase produced, if any, to pass on unstored, and Err
// the cause (Unwrap). errors.Is(err, ErrTransient) is true of it.
type TransientError = vocab.TransientError

// Class is the kind of failure an error is, which decides how to answer it: an HTTP
// status class, a message's disposition. The engine classes its errors (Classify), so
// that every adapter (package idemhttp, package idemmsg, your own) answers a failure
// alike, and an adapter picks its exact answer within the class (400, 401, 413 or 422
// for a client fault; 409 or 503, and the Retry-After, for a retry).
type Class = vocab.Class

// The classes.
const (
	// ClassNone is the class of no error (nil).
	ClassNone = vocab.ClassNone
	// ClassRetry: nothing final happened and the same request, with the same key, may
	// succeed later: another attempt holds the key (ErrInProgress, ErrLeaseLost), the
	// engine is overloaded or draining (a *ShedError), the database is unavailable or
	// in conflict (ErrUnavailable, ErrConflict, a context's error), a newer build wrote
	// the key (ErrNewerFormat), or a phase failed transiently (a *TransientError: the
	// key was released and keeps its recovery point). Answer 409 or 503 with
	// Retry-After; redeliver a message later.
	ClassRetry = vocab.ClassRetry
	// ClassClientFault: the request is wrong (ErrInvalidKey, ErrInvalidScope,
	// ErrInvalidRequest, ErrBodyNotJSON, ErrBodyTooLarge, ErrMismatch, ErrNotFound), so
	// no retry of the same request can succeed; nothing was written. Answer 4xx, never
	// logged as an error, since any client can cause it; terminate a message.
	ClassClientFault = vocab.ClassClientFault
	// ClassDeadLettered: the key was given up on (ErrDeadLettered); no retry succeeds
	// until an operator re-drives it, and its request may have taken effect in part.
	// Not the client's fault, nor anything a retry clears: answer 410; terminate a
	// message.
	ClassDeadLettered = vocab.ClassDeadLettered
	// ClassServerFault: the service is at fault, not the request: a flow's (a
	// *phases.PanicError, ErrNoResponse, ErrResponseTooLarge, ErrPhaseDataTooLarge,
	// ErrUnstorable), its wiring's (ErrUnknownFlow, ErrNeedsClient, ErrOpenSealed) or
	// the database's configuration (ErrMisconfigured, ErrRefused). A retry succeeds
	// only once the service is fixed. Answer 500 and log it; keep a message for
	// redelivery. Every error the engine does not know is one.
	ClassServerFault = vocab.ClassServerFault
)

// Classify returns the class of err, an error of Do, Resume or Result.Err that may
// wrap any of the engine's errors. A fault of the service wins over what it comes
// with (a panic inside a *TransientError is a server fault), a dead-lettered key over
// a retry, and a retry over a client fault (a *TransientError whose cause a phase
// made: the key was released and will be retried). An error the engine does not know
// is a server fault.
func Classify(err error) Class { return vocab.Classify(err) }

// ErrStandbyBehind: a call phase did not start because no standby that counts
// (Config.StandbyWait, StandbyNames) confirmed, within Config.StandbyWait, the commit
// that precedes it. The key was released; a retry tries again. It comes inside a
// *TransientError.
var ErrStandbyBehind = vocab.ErrStandbyBehind

// Client-only flows (phases.Flow.ClientOnly) are registered by the names and kinds of
// their phases; every attempt brings the functions (Request.ClientPhases), closing over
// what only that attempt has, such as package idemhttp's live request. There is no
// other way for a phase to reach its client: nothing rides in the context, and the
// engine keeps no per-attempt state of its own.

var (
	// ErrNeedsClient: a key of a client-only flow (phases.Flow.ClientOnly) was to be run
	// without its client: by Do without Request.ClientPhases, by Resume, or by a sweeper,
	// which parks such keys and records this as their last error. Only the client's
	// retry can finish the key. Nothing was run.
	ErrNeedsClient = vocab.ErrNeedsClient
	// ErrUnstorable is for phase functions to wrap: the phase ran, so its effect may
	// have happened, but its answer cannot be stored (package idemhttp's middleware
	// returns "the handler ran but " + this for a handler whose response is too large
	// or that panicked after it began writing). Running the phase again would repeat
	// the effect, so the key is dead-lettered at once instead of released, and the
	// attempt fails with ErrDeadLettered, as every later one does until Redrive.
	ErrUnstorable = vocab.ErrUnstorable
)
