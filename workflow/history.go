package workflow

import (
	"github.com/idemflow/idemflow/internal/attempt"
	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
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
type Attempt = vocab.Attempt

// entry is a as a history entry; none when history is off.
func (e *Engine) entry(a Attempt) keytable.History { return attempt.Entry(a, e.cfg.historyKeep()) }
