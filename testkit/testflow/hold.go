package testflow

import (
	"context"
	"sync/atomic"

	"github.com/idemflow/idemflow/phases"
)

// Holder pauses the first call phase run for one key until Let is called, so that a
// test holds a live lease on a key whose row is written: the attempt is mid-flow with
// no transaction open. Pass its Before as Options.Before (or to Engine).
type Holder struct {
	key string
	// Entered is closed when the call phase is reached and paused.
	Entered chan struct{}
	armed   atomic.Bool
	release chan struct{}
}

// NewHolder returns a holder for key.
func NewHolder(key string) *Holder {
	h := &Holder{key: key, Entered: make(chan struct{}), release: make(chan struct{})}
	h.armed.Store(true)
	return h
}

// Before pauses the key's first call phase.
func (h *Holder) Before(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
	if tx == nil && run.Key() == h.key && h.armed.CompareAndSwap(true, false) {
		close(h.Entered)
		<-h.release
	}
	return nil
}

// Let lets the paused phase go on. Call it once.
func (h *Holder) Let() { close(h.release) }
