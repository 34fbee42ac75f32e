package workflow

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/phases"
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
func (x *exec) history(outcome Outcome, phase string, cause error) keytable.History {
	keep := x.e.cfg.historyKeep()
	if keep == 0 {
		return keytable.History{}
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
func (e *Engine) entry(a Attempt) keytable.History {
	keep := e.cfg.historyKeep()
	if keep == 0 {
		return keytable.History{}
	}
	b, ok := a.appendJSON(append(make([]byte, 0, entryCap), '['))
	if !ok { // an At json.Marshal refuses too (a year past 9999): no entry, as before
		return keytable.History{}
	}
	// As the array the statement takes (keytable.History), so that it is not copied again.
	return keytable.History{Entry: append(b, ']'), Keep: keep}
}

// entryCap is room for a usual entry: a finish's, with two phases, is about 100 bytes.
const entryCap = 192

// appendJSON appends a's JSON form to buf, byte for byte what json.Marshal writes
// (fields in order, the same omissions and escapes), without its reflection: every
// attempt that ends writes one, on the request's path (a test compares the two). It
// reports false where json.Marshal fails: an At it cannot encode.
func (a *Attempt) appendJSON(buf []byte) ([]byte, bool) {
	buf = strconv.AppendInt(append(buf, `{"attempt":`...), int64(a.Attempt), 10)
	buf = appendMember(buf, `,"by":`, string(a.By))
	buf = appendMember(buf, `,"from":`, a.From)
	if len(a.Phases) > 0 {
		buf = append(buf, `,"phases":[`...)
		for i, p := range a.Phases {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendJSONString(buf, p)
		}
		buf = append(buf, ']')
	}
	buf = appendJSONString(append(buf, `,"outcome":`...), string(a.Outcome))
	buf = appendMember(buf, `,"phase":`, a.Phase)
	buf = appendMember(buf, `,"error":`, a.Error)
	if a.Millis != 0 {
		buf = strconv.AppendInt(append(buf, `,"ms":`...), a.Millis, 10)
	}
	buf = appendMember(buf, `,"reached":`, a.Reached)
	if a.LeaseLive {
		buf = append(buf, `,"lease_live":true`...)
	}
	if !a.At.IsZero() {
		at, err := a.At.MarshalJSON()
		if err != nil {
			return buf, false
		}
		buf = append(append(buf, `,"at":`...), at...)
	}
	return append(buf, '}'), true
}

// appendMember appends the member name (with its comma and colon) and s, unless s is
// empty (omitempty).
func appendMember(buf []byte, name, s string) []byte {
	if s == "" {
		return buf
	}
	return appendJSONString(append(buf, name...), s)
}

// appendJSONString appends s as json.Marshal quotes it: printable ASCII that needs no
// escape (json.Marshal also escapes <, > and &) as it is, anything else by json.Marshal.
func appendJSONString(buf []byte, s string) []byte {
	for i := range len(s) {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(buf, q...)
		}
	}
	return append(append(append(buf, '"'), s...), '"')
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
