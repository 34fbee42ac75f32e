package workflow

import (
	"encoding/json"
	"time"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/store"
)

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
type Attempt struct {
	// Attempt is the key's attempt number (see AttemptEvent.Attempt).
	Attempt int `json:"attempt"`
	// By is who ran it; empty for an abandoned attempt (the takeover does not know).
	By Executor `json:"by,omitempty"`
	// From is the recovery point the attempt started at.
	From string `json:"from,omitempty"`
	// Phases are the phases the attempt completed, in order.
	Phases []string `json:"phases,omitempty"`
	// Outcome is how it ended.
	Outcome Outcome `json:"outcome"`
	// Phase is the phase it failed in (released, dead-lettered); Error the failure,
	// cut to 500 bytes.
	Phase string `json:"phase,omitempty"`
	Error string `json:"error,omitempty"`
	// Millis is how long the attempt took, as its executor measured it.
	Millis int64 `json:"ms,omitempty"`
	// Reached is the recovery point an abandoned attempt, or an attempt whose lease an
	// operator released, had reached.
	Reached string `json:"reached,omitempty"`
	// LeaseLive is, for an operator's release, whether the lease taken away was live.
	LeaseLive bool `json:"lease_live,omitempty"`
	// At is when the entry was written, by the database clock: the end of the
	// attempt, or when its abandonment was noticed.
	At time.Time `json:"at,omitzero"`
}

// maxHistoryError is the most of an error an entry keeps.
const maxHistoryError = 500

// history is the entry of the attempt x runs, ending with outcome (in phase, with
// cause); none when history is off.
func (x *exec) history(outcome Outcome, phase string, cause error) store.History {
	keep := x.e.cfg.historyKeep()
	if keep == 0 {
		return store.History{}
	}
	done := x.done
	if outcome == OutcomeFinished {
		done++ // the phase that answered
	}
	a := Attempt{
		Attempt: x.run.Attempt(), By: x.by, From: startedAt(x), Outcome: outcome, Phase: phase,
		Millis: time.Since(x.began).Milliseconds(),
	}
	if end := min(x.start+done, len(x.flow.Phases)); end > x.start {
		a.Phases = make([]string, 0, end-x.start)
		for _, p := range x.flow.Phases[x.start:end] {
			a.Phases = append(a.Phases, p.Name)
		}
	}
	if cause != nil {
		a.Error = cut(cause.Error(), maxHistoryError)
	}
	return x.e.entry(a)
}

// startedAt is the recovery point x's attempt started at.
func startedAt(x *exec) string {
	if x.start == 0 {
		return phases.Started
	}
	return x.flow.Phases[x.start-1].Name
}

// entry is a as a history entry; none when history is off.
func (e *Engine) entry(a Attempt) store.History {
	keep := e.cfg.historyKeep()
	if keep == 0 {
		return store.History{}
	}
	b, err := json.Marshal(a)
	if err != nil { // an Attempt always encodes
		return store.History{}
	}
	return store.History{Entry: b, Keep: keep}
}

// cut returns s cut to at most n bytes on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
