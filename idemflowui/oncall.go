package idemflowui

import (
	"context"
	"errors"
	"strings"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// RunbookURLDefault is the default Options.RunbookURL: docs/OPERATIONS.md of
// idemflow's repository.
const RunbookURLDefault = "https://github.com/idemflow/idemflow/blob/main/docs/OPERATIONS.md"

// explanation is what a status means, said in place, with its runbook section.
type explanation struct {
	Text   string
	Anchor string // a section of docs/OPERATIONS.md, without "#"
}

// explanations say in place what each status means; each links its runbook section
// of docs/OPERATIONS.md (integration/monitoring holds the alert rules' links to the same
// sections, and TestRunbookAnchors these).
var explanations = map[workflow.KeyStatus]explanation{
	workflow.KeysInProgress: {"In progress: an attempt holds the key (its lease is live), or it failed for a " +
		"moment and waits for its backoff before the next. Normal in passing; a client that retries meanwhile " +
		"is answered 409 with Retry-After.", "runbook-keys-in-progress"},
	workflow.KeysStuck: {"Stuck: in progress, but its lease ran out or was released and its backoff is over: " +
		"it is due, and a sweeper takes it at its next pass. A few for a few seconds are normal; keys that " +
		"stay stuck mean no sweeper is taking them.", "runbook-stuck-keys"},
	workflow.KeysDead: {"Dead-lettered: its attempts ran out (or its answer could not be stored), so nothing " +
		"will finish it by itself; a client's retry is answered 410. Fix the cause, then re-drive it: it " +
		"resumes from its recovery point.", "runbook-dead-lettered-keys"},
	workflow.KeysFinished: {"Finished: its answer is stored, and every retry with the key gets it, byte for " +
		"byte, until retention deletes it.", "the-states-of-a-key"},
}

// explain is the explanation of status, with its runbook's address under base.
func explain(base string, status workflow.KeyStatus) (text, link string) {
	x, ok := explanations[status]
	if !ok {
		return "", ""
	}
	return x.Text, base + "#" + x.Anchor
}

// derivedKey is a call phase's derived key as the key page shows it.
type derivedKey struct {
	Phase string
	Key   string // what the phase sends the remote side (phases.Run.DerivedKey)
	State string // "sent", "may have been sent" or "not reached"
	// Failed marks the phase the key's last error happened in.
	Failed bool
}

// derivedKeys are the derived keys of info's call phases, in flow order, and how far
// each got by the key's recovery point: a call at or before it was sent and
// completed; one after it but before the next tx phase may have been sent (the next
// attempt sends it again, with the same key); a later one not yet. Of a finished key,
// a call its history records as run was sent; without history, or when the finishing
// attempt stored no entry (Attempt.Derived), one may have been.
// known is false when the flow is not registered with engine, which then cannot tell
// which phases are calls.
func derivedKeys(engine *workflow.Engine, info *workflow.KeyInfo) (keys []derivedKey, known bool) {
	f, ok := engine.Flow(info.Flow)
	if !ok {
		return nil, false
	}
	ran := map[string]bool{}        // the phases the key's history says completed
	stored := len(info.History) > 0 // the finishing attempt's phases are in the history
	for _, a := range info.History {
		for _, p := range a.Phases {
			ran[p] = true
		}
		if a.Derived {
			stored = false
		}
	}
	at, err := f.Index(info.RecoveryPoint)
	finished := info.RecoveryPoint == phases.Finished || info.Status == workflow.KeysFinished
	if err != nil && !finished { // a recovery point this build does not have
		at = -2
	}
	reached := at >= -1 // the calls an attempt may have sent end at the next tx phase
	for i, p := range f.Phases {
		if i > at && p.Kind == phases.KindTx {
			reached = false
		}
		if p.Kind != phases.KindCall {
			continue
		}
		state := "not reached"
		switch {
		case finished && ran[p.Name]:
			state = "sent"
		case finished && len(info.History) == 0:
			state = "sent, unless the flow answered before it (no history kept)"
		case finished && !stored:
			state = "sent, unless the flow answered before it (the finishing attempt stored no entry)"
		case finished:
		case at == -2:
			state = "unknown (recovery point " + info.RecoveryPoint + " is not in this build's flow)"
		case i <= at:
			state = "sent"
		case reached:
			state = "may have been sent"
		}
		keys = append(keys, derivedKey{Phase: p.Name, State: state,
			Key:    workflow.PhaseEvent{ID: info.ID, Phase: p.Name}.DerivedKey(),
			Failed: info.FailedPhase == p.Name && !finished})
	}
	return keys, true
}

// failure is what the dead-letter list shows of a key's last failure.
type failure struct {
	Phase string // the phase it failed in; "" when unknown
	Class string
	Hint  string // what the class means
}

// errorClasses are the classes of a last error the engine names, by the sentinel
// whose text it contains, most specific first (a panic is also a transient failure).
// The engine stores errors as text; the sentinels' own texts are matched, so the
// classes follow them. Any other error is the phase's own (classify).
var errorClasses = []struct {
	text, class, hint string
}{
	{panicText, "panic", "a phase panicked: a bug in the flow's code"},
	{workflow.ErrResponseTooLarge.Error(), "response too large", "the answer is over the engine's MaxResponseBytes: raise it or answer less"},
	{workflow.ErrPhaseDataTooLarge.Error(), "phase data too large", "the data carried between phases is over the limit"},
	{workflow.ErrNoResponse.Error(), "no response", "the flow ended without an answer: a bug in the flow"},
	{workflow.ErrLeaseExpired.Error(), "lease expired", "a phase ran longer than the lease: raise the lease or shorten the phase"},
	{workflow.ErrUnknownRecoveryPoint.Error(), "unknown recovery point", "the key stopped at a phase this build does not have: deploy a build that has it"},
	{workflow.ErrUnknownFlow.Error(), "unknown flow", "no engine that swept it registers the flow"},
	{workflow.ErrNewerFormat.Error(), "newer format", "a newer build wrote the key: finish the deploy"},
}

// panicText is what every phases.PanicError says before its value.
var panicText = strings.TrimSuffix((&phases.PanicError{Value: ""}).Error(), ": ")

// classify is the class of a last error, and what it means: one the engine names
// (errorClasses), else the error a phase returned ("phase error") when the phase is
// known, else "other".
func classify(lastError, phase string) (class, hint string) {
	for _, c := range errorClasses {
		if strings.Contains(lastError, c.text) {
			return c.class, c.hint
		}
	}
	switch {
	case lastError == "":
		return "", ""
	case phase != "":
		return "phase error", "the phase returned this error on every attempt: usually the remote service or the database"
	}
	return "other", "see the last error"
}

// failures reads the failed phase of each dead-lettered key of a list page (one read
// of each key, at most a page of them) and classifies its last error.
func (h *Handler) failures(ctx context.Context, keys []workflow.KeySummary) (map[string]failure, error) {
	out := make(map[string]failure, len(keys))
	for _, k := range keys {
		f := failure{}
		info, err := h.engine.InspectKey(ctx, k.Scope, k.Key)
		switch {
		case err == nil:
			f.Phase = info.FailedPhase
		case !errors.Is(err, workflow.ErrNotFound): // gone since the list was read: no phase
			return nil, err
		}
		f.Class, f.Hint = classify(k.LastError, f.Phase)
		out[k.ID] = f
	}
	return out, nil
}
