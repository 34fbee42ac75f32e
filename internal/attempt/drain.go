package attempt

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
)

// enter registers x with the engine for its phases and returns their contexts: pre,
// the caller's ctx, for the phases before the claim is durable; after, for the phases
// after it: for a client's attempt (x.detach) detached from the caller, and for a
// sweep still the caller's (a sweeper that stops cancels its runs); a drain's deadline
// ends both. ok is false
// when a drain's deadline passed: x must not run.
func (x *Exec) enter(ctx context.Context) (pre, after context.Context, release func(), ok bool) {
	base := ctx
	if x.detach {
		base = context.WithoutCancel(ctx)
	}
	after, stop := context.WithCancel(base)
	pre, cancelPre := context.WithCancel(ctx)
	unhook := context.AfterFunc(after, cancelPre)
	x.stop = stop
	if !x.env.Admission.Enter(x) {
		unhook()
		cancelPre()
		stop()
		return nil, nil, nil, false
	}
	return pre, after, func() {
		x.env.Admission.Leave(x)
		unhook()
		cancelPre()
		stop()
	}, true
}

// drained ends an attempt that may not run because a drain's deadline passed: a key
// taken over is released at once; a new key was never written.
func (x *Exec) drained(ctx context.Context) step {
	if x.claim != nil {
		return stop(vocab.Failure(vocab.Shed(vocab.ErrDraining)))
	}
	return x.settle(ctx, x.rp, step{kind: stepTransient, err: fmt.Errorf("%w: the drain's deadline passed", vocab.ErrDraining)})
}

// claiming is called before the commit that makes a new key durable. It fails when the
// caller gave up (nothing is durable yet, so the attempt ends) or a drain gave the
// attempt up; otherwise it holds the gate until done and returns the context of the
// commit: detached from the caller, bounded by the lease, whose end is its cause (so
// that a commit the lease cut names ErrLeaseExpired, as a phase's does).
func (x *Exec) claiming(ctx context.Context) (context.Context, func(), error) {
	x.gate.Lock()
	if x.abandoned {
		x.gate.Unlock()
		return nil, nil, vocab.Shed(vocab.ErrDraining)
	}
	if err := ctx.Err(); err != nil {
		x.gate.Unlock()
		if cause := context.Cause(ctx); errors.Is(cause, vocab.ErrLeaseExpired) { // the phase outlived its lease
			return nil, nil, fmt.Errorf("commit: %w: %w", cause, keytable.ErrNotSent)
		}
		return nil, nil, fmt.Errorf("claim key: the caller gave up before the claim: %w", err)
	}
	cctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), x.env.Lease, vocab.ErrLeaseExpired)
	return cctx, func() {
		cancel()
		x.durable = x.claim == nil
		x.gate.Unlock()
	}, nil
}

// Given is what a drain that gave an attempt up learns of it (Abandon).
type Given struct {
	Fence   keytable.Fence
	Flow    string
	Attempt int
	By      vocab.Executor
	// Durable: the key row exists with the attempt's fence, so the drain releases it.
	Durable bool
}

// Abandon gives x up for a drain whose deadline passed: x may commit no claim from now
// on, and the context of its phases ends.
func (x *Exec) Abandon() Given {
	x.gate.Lock()
	x.abandoned = true
	durable := x.durable
	x.gate.Unlock()
	x.stop()
	return Given{Fence: x.fence, Flow: x.flow.Name, Attempt: x.run.Attempt(), By: x.by, Durable: durable}
}
