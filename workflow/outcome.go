package workflow

import (
	"context"
	"time"

	"github.com/idemflow/idemflow/internal/attempt"
	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
	"github.com/idemflow/idemflow/phases"
)

// An attempt on a key decides how it ended once, as a Result, and one place
// (Engine.report, below) hands that value to every reader: the key event, AttemptEnd
// and, through it, the metrics; Do, Resume and Maintenance.Run return it. The history entry rides in the statement that ends the
// attempt, written with the same Outcome.

// Outcome is how an attempt ended, or what happened to a key: one vocabulary for
// results (Result.Outcome), key events (KeyEvent.Kind), history entries
// (Attempt.Outcome), attempt events and their metrics. The strings are stored in
// history rows and exported as metric attribute values: they never change.
type Outcome = vocab.Outcome

// The outcomes, in one list. An attempt ends in one of the first ten (Result.Outcome,
// AttemptEvent.Outcome); the key event of the key it ended on (KeyEvent.Kind, emitted
// when the key's row decided it, never for shed or failed) and the history entry of an
// attempt that wrote its end (Attempt.Outcome) say the same.
const (
	OutcomeFinished     = vocab.OutcomeFinished     // this attempt stored the response
	OutcomeReplayed     = vocab.OutcomeReplayed     // a stored response was returned
	OutcomeInProgress   = vocab.OutcomeInProgress   // turned away: another attempt holds the key (409)
	OutcomeMismatch     = vocab.OutcomeMismatch     // the key was used before for another request (422)
	OutcomeReleased     = vocab.OutcomeReleased     // a transient failure; the key was released for a retry
	OutcomeDeadLettered = vocab.OutcomeDeadLettered // this attempt's failure dead-lettered the key
	OutcomeLeaseLost    = vocab.OutcomeLeaseLost    // another executor took the key over; nothing more was committed
	OutcomeParked       = vocab.OutcomeParked       // a sweep left a client-only key to its client
	OutcomeShed         = vocab.OutcomeShed         // turned away before its claim (a *ShedError): nothing was written
	OutcomeFailed       = vocab.OutcomeFailed       // any other error (a dead-lettered key, the database failing, ...)

	// What happens to a key during an attempt, before it ends: key events only.
	OutcomeClaimed   = vocab.OutcomeClaimed   // a new key row was created
	OutcomeTakenOver = vocab.OutcomeTakenOver // an expired or released lease was taken by a client's attempt
	OutcomeWaiting   = vocab.OutcomeWaiting   // a turned-away attempt waits for the holder's answer (Request.Wait)

	// What is done to a key outside any attempt: key events, and the history entries
	// of those that write one (redriven, operator_released, operator_cancelled).
	OutcomeSwept             = vocab.OutcomeSwept             // a sweeper took over an expired or released lease (Maintenance.TakeDue)
	OutcomeGivenBack         = vocab.OutcomeGivenBack         // a key taken by a sweeper was returned unrun (Maintenance.GiveBack)
	OutcomeRedriven          = vocab.OutcomeRedriven          // an operator re-drove the dead-lettered key (Redrive, BulkKeys)
	OutcomeOperatorReleased  = vocab.OutcomeOperatorReleased  // an operator took its lease away (ReleaseKey, BulkKeys)
	OutcomeOperatorCancelled = vocab.OutcomeOperatorCancelled // an operator finished it with an answer of their choosing (CancelKey)
	OutcomePurged            = vocab.OutcomePurged            // an operator deleted the finished key (PurgeKey); no history is left

	// OutcomeLayoutUnknown is a key event of no key: the engine's check of the key
	// table's layout failed (Err says why). Until a later try succeeds its claims take
	// the partitioned layout's checks (docs/PARTITIONS.md).
	OutcomeLayoutUnknown = vocab.OutcomeLayoutUnknown

	// OutcomeAbandoned is only in a key's history: the attempt ended without a word (a
	// crash, a pause, a partition) and its lease ran out.
	OutcomeAbandoned = vocab.OutcomeAbandoned
)

// Result is how one attempt on a key ended (Engine.Run, Do, Resume, Maintenance.Run):
// decided once by the attempt, read by everything downstream (package idemhttp's
// status, package idemmsg's Decision, the sweeper's Stats, the hooks) as a switch on
// Outcome. Its fields:
//
//   - Outcome is how the attempt ended.
//   - Response is the answer: stored by this attempt (OutcomeFinished) or an earlier
//     one (OutcomeReplayed). For OutcomeReleased it may be a 5xx response a phase
//     produced, to pass on as it is (it was not stored).
//   - Replayed is true when the response was stored by an earlier attempt (Outcome is
//     OutcomeReplayed).
//   - RetryAfter is, for an attempt the client may retry with the same key (in
//     progress, released, turned away: OutcomeShed, lease lost), when to retry: at
//     least one second. Zero otherwise.
//   - Phase is the phase the attempt failed in (released, dead-lettered), if any.
//   - Err is why the attempt has no answer, and what Do returns: an
//     *InProgressError, a *TransientError, a *ShedError, ErrMismatch, ErrLeaseLost
//     and so on (see Do); Classify says what kind of failure it is. Nil for
//     OutcomeFinished and OutcomeReplayed.
type Result = vocab.Result

// split returns r as Do and Resume return it: r for an answer, else r.Err.
func split(r *Result) (*Result, error) { return vocab.Split(r) }

// answered is the result of an attempt that found resp: stored now, or replayed.
func answered(resp *phases.Response, replayed bool) Result { return vocab.Answered(resp, replayed) }

// failure is the result of an attempt that ended with err before it decided anything
// of the key: turned away before the claim (a *ShedError from admission or a drain),
// or failed (bad input, the database failing, a key a newer build wrote).
func failure(err error) Result { return vocab.Failure(err) }

// inProgress is the result of an attempt turned away by another attempt holding the
// key; recorded when the key's row (or its claim) turned it away, not a wait's bound.
func inProgress(retry time.Duration, recorded bool) Result {
	return vocab.TurnedAway(retry, recorded)
}

// noted is r with the failure its key event reports (cause), recorded (the key's row
// holds what r says: its key event is due) or not.
func noted(r Result, cause error, recorded bool) Result { return vocab.Noted(r, cause, recorded) }

// standing is r with the recovery point its key stands at (rp).
func standing(r Result, rp string) Result {
	vocab.Internals(&r).RecoveryPoint = rp
	return r
}

// withKey is r with what the attempt learnt of its key, where r did not learn it itself.
func withKey(r Result, id, flow, origin, rp string, attempt int) Result {
	return vocab.With(r, id, flow, origin, rp, attempt)
}

// runAttempt runs one attempt, described by ev, and reports its result: ev's AttemptStart
// runs first, and its context is run's.
func (e *Engine) runAttempt(ctx context.Context, ev AttemptEvent, run func(context.Context) (Result, error)) (Result, error) {
	if start := e.cfg.Hooks.AttemptStart; start != nil {
		if c := start(ctx, ev); c != nil {
			ctx = c
		}
	}
	r, unrecorded := run(ctx)
	e.report(ctx, ev, r, unrecorded)
	return r, unrecorded
}

// report is the one place an attempt's result goes out: the key's event (for an
// outcome the key's row records) and AttemptEnd. unrecorded, when set, is why a
// sweep's result could not be recorded (the key's fate is left to its lease): the
// attempt then ends failed, with no key event.
func (e *Engine) report(ctx context.Context, ev AttemptEvent, r Result, unrecorded error) {
	in := vocab.Internals(&r)
	if in.ID != "" {
		ev.ID, ev.Attempt, ev.RecoveryPoint, ev.Origin = in.ID, in.Attempt, in.RecoveryPoint, in.Origin
	}
	if ev.Flow == "" { // Resume learns the flow from the key row
		ev.Flow = in.Flow
	}
	ev.Outcome, ev.Phase, ev.Err = r.Outcome, r.Phase, r.Err
	if unrecorded != nil {
		ev.Outcome, ev.Err = OutcomeFailed, unrecorded
	} else if in.Recorded {
		e.attemptEvent(ctx, KeyEvent{Kind: r.Outcome, Flow: ev.Flow, Scope: ev.Scope, Key: ev.Key, RecoveryPoint: in.RecoveryPoint, Err: in.Cause})
	}
	if e.cfg.Hooks.AttemptEnd != nil {
		e.cfg.Hooks.AttemptEnd(ctx, ev)
	}
}

// Key events go out at two points, the only callers of Hooks.Key
// (TestOneKeyEventEmitter pins them and their callers, so a new one is seen):
// attemptEvent for what happens to a key during an attempt, and acted for what is
// done to it outside any attempt.

// attemptEvent is the key event of an attempt: its outcome, from report, the one place
// an attempt's result goes out; and its milestones, at the moment they happen, where
// crash tests stop a process (OutcomeClaimed once the claim is durable, from
// the executor's Exec.committed; OutcomeTakenOver, from existingRow; OutcomeWaiting, from keyWaiter.wait).
func (e *Engine) attemptEvent(ctx context.Context, ev KeyEvent) {
	if e.cfg.Hooks.Key != nil {
		e.cfg.Hooks.Key(ctx, ev)
	}
}

// acted is the key event of what an operator or the engine's maintenance did to a key
// outside any attempt, once that change has committed: operate (ReleaseKey, PurgeKey,
// Redrive), CancelKey, bulkOne (BulkKeys), abandon (Drain), TakeDue and GiveBack; and
// of what the engine failed to learn (startupCheck's OutcomeLayoutUnknown, no key).
func (e *Engine) acted(ctx context.Context, ev KeyEvent) {
	if e.cfg.Hooks.Key != nil {
		e.cfg.Hooks.Key(ctx, ev)
	}
}

// Attempt is one entry of a key's history (KeyInfo.History): an attempt on the key,
// or an operator's action on it. Entries are written by the statement that ends the
// attempt (the finish, the release, the dead-letter, the park), so they cost no round
// trip and no commit of their own; an attempt that ended without one (its process
// crashed or paused, its lease ran out) is recorded as abandoned by the takeover that
// follows it. A key keeps the newest Config.History entries and loses them with the
// key.
//
// Its JSON form is what the history column holds and what `idemflow keys show -json`
// prints, field for field.
type Attempt = vocab.Attempt

// entry is a as a history entry; none when history is off.
func (e *Engine) entry(a Attempt) keytable.History { return attempt.Entry(a, e.cfg.historyKeep()) }
