package attempt

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
	"github.com/idemflow/idemflow/phases"
)

// maxHistoryError is the most of an error an entry keeps.
const maxHistoryError = 500

// history is the entry of the attempt x runs, ending with outcome (in phase, with
// cause); none when history is off, or for a first attempt that finished from the
// start when such entries are omitted.
func (x *Exec) history(outcome vocab.Outcome, phase string, cause error) keytable.History {
	keep := x.env.HistoryKeep
	if keep == 0 {
		return keytable.History{}
	}
	if outcome == vocab.OutcomeFinished && x.env.HistoryOmitCleanFinish && x.start == 0 && x.run.Attempt() == 1 {
		return keytable.History{} // derived from the key row when shown (workflow.InspectKey)
	}
	done := x.done
	if outcome == vocab.OutcomeFinished {
		done++ // the phase that answered
	}
	a := vocab.Attempt{
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
		a.Error = cause.Error()
	}
	return Entry(a, keep)
}

// startedAt is the recovery point x's attempt started at.
func startedAt(x *Exec) string {
	if x.start == 0 {
		return phases.Started
	}
	return x.flow.Phases[x.start-1].Name
}

// Entry is a as a history entry for a key that keeps keep entries (Config.History),
// its Error cut to 500 bytes; none when keep is 0 (history is off).
func Entry(a vocab.Attempt, keep int) keytable.History {
	if keep == 0 {
		return keytable.History{}
	}
	a.Error = cut(a.Error, maxHistoryError)
	b, ok := appendJSON(append(make([]byte, 0, entryCap), '['), &a)
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
func appendJSON(buf []byte, a *vocab.Attempt) ([]byte, bool) {
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
	if a.Derived {
		buf = append(buf, `,"derived":true`...)
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
