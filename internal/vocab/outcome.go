package vocab

import (
	"errors"
	"time"

	"github.com/idemflow/idemflow/phases"
)

// Outcome is how an attempt ended, or what happened to a key: one vocabulary for
// results (Result.Outcome), key events (KeyEvent.Kind), history entries
// (Attempt.Outcome), attempt events and their metrics. The strings are stored in
// history rows and exported as metric attribute values: they never change.
type Outcome string

// The outcomes, in one list. An attempt ends in one of the first ten (Result.Outcome,
// AttemptEvent.Outcome); the key event of the key it ended on (KeyEvent.Kind, emitted
// when the key's row decided it, never for shed or failed) and the history entry of an
// attempt that wrote its end (Attempt.Outcome) say the same.
const (
	OutcomeFinished     Outcome = "finished"      // this attempt stored the response
	OutcomeReplayed     Outcome = "replayed"      // a stored response was returned
	OutcomeInProgress   Outcome = "in_progress"   // turned away: another attempt holds the key (409)
	OutcomeMismatch     Outcome = "mismatch"      // the key was used before for another request (422)
	OutcomeReleased     Outcome = "released"      // a transient failure; the key was released for a retry
	OutcomeDeadLettered Outcome = "dead_lettered" // this attempt's failure dead-lettered the key
	OutcomeLeaseLost    Outcome = "lease_lost"    // another executor took the key over; nothing more was committed
	OutcomeParked       Outcome = "parked"        // a sweep left a client-only key to its client
	OutcomeShed         Outcome = "shed"          // turned away before its claim (a *ShedError): nothing was written
	OutcomeFailed       Outcome = "failed"        // any other error (a dead-lettered key, the database failing, ...)

	// What happens to a key during an attempt, before it ends: key events only.
	OutcomeClaimed   Outcome = "claimed"    // a new key row was created
	OutcomeTakenOver Outcome = "taken_over" // an expired or released lease was taken by a client's attempt
	OutcomeWaiting   Outcome = "waiting"    // a turned-away attempt waits for the holder's answer (Request.Wait)

	// What is done to a key outside any attempt: key events, and the history entries
	// of those that write one (redriven, operator_released, operator_cancelled).
	OutcomeSwept             Outcome = "swept"              // a sweeper took over an expired or released lease (Maintenance.TakeDue)
	OutcomeGivenBack         Outcome = "given_back"         // a key taken by a sweeper was returned unrun (Maintenance.GiveBack)
	OutcomeRedriven          Outcome = "redriven"           // an operator re-drove the dead-lettered key (Redrive, BulkKeys)
	OutcomeOperatorReleased  Outcome = "operator_released"  // an operator took its lease away (ReleaseKey, BulkKeys)
	OutcomeOperatorCancelled Outcome = "operator_cancelled" // an operator finished it with an answer of their choosing (CancelKey)
	OutcomePurged            Outcome = "purged"             // an operator deleted the finished key (PurgeKey); no history is left

	// OutcomeLayoutUnknown is a key event of no key: the engine's check of the key table's
	// layout failed (Err says why). Until a later try succeeds its claims take the
	// partitioned layout's checks (docs/PARTITIONS.md).
	OutcomeLayoutUnknown Outcome = "layout_unknown"

	// OutcomeAbandoned is only in a key's history: the attempt ended without a word (a
	// crash, a pause, a partition) and its lease ran out.
	OutcomeAbandoned Outcome = "abandoned"
)

// Result is how one attempt on a key ended (Engine.Run, Do, Resume, Maintenance.Run):
// decided once by the attempt, read by everything downstream (package idemhttp's
// status, package idemmsg's Decision, the sweeper's Stats, the hooks) as a switch on
// Outcome.
type Result struct {
	// Outcome is how the attempt ended.
	Outcome Outcome
	// Response is the answer: stored by this attempt (OutcomeFinished) or an earlier one
	// (OutcomeReplayed). For OutcomeReleased it may be a 5xx response a phase produced,
	// to pass on as it is (it was not stored).
	Response *phases.Response
	// Replayed is true when the response was stored by an earlier attempt (Outcome is
	// OutcomeReplayed).
	Replayed bool
	// RetryAfter is, for an attempt the client may retry with the same key (in
	// progress, released, turned away: OutcomeShed, lease lost), when to retry: at
	// least one second. Zero otherwise.
	RetryAfter time.Duration
	// Phase is the phase the attempt failed in (released, dead-lettered), if any.
	Phase string
	// Err is why the attempt has no answer, and what Do returns: an *InProgressError,
	// a *TransientError, a *ShedError, ErrMismatch, ErrLeaseLost and so on (see Do).
	// Its class (Classify) says what kind of failure it is. Nil for OutcomeFinished
	// and OutcomeReplayed.
	Err error

	in Internal
}

// Internal is what a Result carries for the engine's report of it, beyond what
// callers read: unexported in Result, so that it is no part of the public API, and
// reached through Internals.
type Internal struct {
	// Recorded says that the key's row holds what Outcome says (or, for a replay, a
	// refusal or a mismatch, that the row decided it): its key event is emitted.
	Recorded bool
	// Cause is the failure behind a released or dead-lettered key or a lost lease, as
	// its key event reports it (KeyEvent.Err).
	Cause error
	// ID, Flow, Origin and RecoveryPoint are what the attempt learnt of its key (the
	// row's identity, flow, origin, and where it stands at the end), Attempt its
	// attempt number: for AttemptEnd and the key event.
	ID, Flow, Origin, RecoveryPoint string
	Attempt                         int
}

// Internals returns r's internal part, to read or set.
func Internals(r *Result) *Internal { return &r.in }

// With is r with what the attempt learnt of its key, where r did not learn it itself.
func With(r Result, id, flow, origin, rp string, attempt int) Result {
	if r.in.ID == "" {
		r.in.ID, r.in.Flow, r.in.Origin, r.in.RecoveryPoint, r.in.Attempt = id, flow, origin, rp, attempt
	}
	return r
}

// Noted is r with the cause its key event reports, recorded (its key event is due)
// or not.
func Noted(r Result, cause error, recorded bool) Result {
	r.in.Cause, r.in.Recorded = cause, recorded
	return r
}

// Answered is the result of an attempt that found resp: stored now, or replayed.
func Answered(resp *phases.Response, replayed bool) Result {
	if replayed {
		return Result{Outcome: OutcomeReplayed, Response: resp, Replayed: true, in: Internal{Recorded: true}}
	}
	return Result{Outcome: OutcomeFinished, Response: resp, in: Internal{Recorded: true}}
}

// Failure is the result of an attempt that ended with err before it decided anything
// of the key: turned away before the claim (a *ShedError from admission or a drain),
// or failed (bad input, the database failing, a key a newer build wrote).
func Failure(err error) Result {
	var shedErr *ShedError
	if errors.As(err, &shedErr) {
		return Result{Outcome: OutcomeShed, RetryAfter: shedErr.RetryAfter, Err: err}
	}
	return Result{Outcome: OutcomeFailed, Err: err}
}

// TurnedAway is the result of an attempt turned away by another attempt holding the
// key; recorded when the key's row (or its claim) turned it away, not a wait's bound.
func TurnedAway(retry time.Duration, recorded bool) Result {
	return Result{Outcome: OutcomeInProgress, RetryAfter: retry, Err: &InProgressError{RetryAfter: retry}, in: Internal{Recorded: recorded}}
}

// Split returns r as Do and Resume return it: r for an answer, else r.Err.
func Split(r *Result) (*Result, error) {
	if r.Err != nil {
		return nil, r.Err
	}
	return r, nil
}
