package childproc

import (
	"context"
	"sync"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// Boundary names, after a phase's name and a slash ("reserve/before-commit"), or alone.
const (
	AfterClaim   = "after-claim"   // a new key's claim is held in its first tx phase; nothing committed (Hooks.ClaimHeld)
	TxStart      = "start"         // a tx phase is about to open its transaction
	BeforeCommit = "before-commit" // a tx phase's function succeeded; its COMMIT (and the key row's write) not sent
	AfterCommit  = "after-commit"  // a tx phase committed
	BeforeCall   = "before-call"   // a call phase is about to run; nothing of it left the process
	AfterCall    = "after-call"    // a call phase's function returned successfully; its result not yet durable
	Claimed      = "claimed"       // the commit that wrote a new key's row
	TakenOver    = "taken-over"    // a retry took over an expired or released lease
	Swept        = "swept"         // a sweeper took over a key
	Finished     = "finished"      // the response was stored
)

// Points fires at one boundary of a run, the nth time it is reached, or, with the
// boundary "", at the first phase boundary reached (before-commit, after-commit,
// before-call, after-call or finished).
type Points struct {
	point string
	nth   int
	fire  func(at string)

	mu   sync.Mutex
	seen int
}

// NewPoints returns points that call fire(at) at point the nth time it is reached (0
// means the first). fire usually ends or pauses the process (Kill, Stop).
func NewPoints(point string, nth int, fire func(at string)) *Points {
	return &Points{point: point, nth: nth, fire: fire}
}

// At fires if p is the point and this is the nth time it is reached.
func (ps *Points) At(p string) {
	if ps.point != "" && p != ps.point {
		return
	}
	ps.mu.Lock()
	ps.seen++
	hit := ps.seen == max(ps.nth, 1)
	ps.mu.Unlock()
	if hit {
		ps.fire(p)
	}
}

// phase is At for a phase boundary, which the empty point also matches.
func (ps *Points) phase(phase, at string) {
	if ps.point == "" {
		ps.At(phase + "/" + at)
		return
	}
	if p := phase + "/" + at; p == ps.point {
		ps.At(p)
	}
}

// Hooks are the engine hooks that reach the points, followed by next's.
func (ps *Points) Hooks(next workflow.Hooks) workflow.Hooks {
	return workflow.JoinHooks(workflow.Hooks{
		ClaimHeld: func(ctx context.Context, ev workflow.PhaseEvent) {
			if ps.point != "" {
				ps.At(ev.Phase + "/" + AfterClaim)
			}
		},
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if ev.Kind == phases.KindCall {
				ps.phase(ev.Phase, BeforeCall)
			} else if ps.point != "" {
				ps.At(ev.Phase + "/" + TxStart)
			}
			return ctx
		},
		BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) { ps.phase(ev.Phase, BeforeCommit) },
		PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
			switch {
			case err != nil:
			case ev.Kind == phases.KindCall:
				ps.phase(ev.Phase, AfterCall)
			default:
				ps.phase(ev.Phase, AfterCommit)
			}
		},
		Key: func(ctx context.Context, ev workflow.KeyEvent) {
			switch {
			case ev.Kind == workflow.OutcomeFinished:
				ps.At(Finished)
			case ps.point == "":
			case ev.Kind == workflow.OutcomeClaimed:
				ps.At(Claimed)
			case ev.Kind == workflow.OutcomeTakenOver:
				ps.At(TakenOver)
			case ev.Kind == workflow.OutcomeSwept:
				ps.At(Swept)
			}
		},
	}, next)
}
