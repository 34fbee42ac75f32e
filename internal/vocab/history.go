package vocab

import "time"

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
	// Derived marks an entry that was not stored but derived from the key row when it
	// was shown: the finish of a key whose finishing attempt wrote no entry
	// (Config.HistoryOmitCleanFinish, or a writer with history off). It has the
	// attempt, the outcome and At (the row's finished_at), and Millis only when the
	// attempt ran from the claim (attempt 1, nothing before it in the history); never
	// By, From or Phases.
	Derived bool `json:"derived,omitempty"`
}
