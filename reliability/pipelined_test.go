package reliability

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/phases"
)

// withPipelined makes e's engines and children run the flows with pipelined tx phases
// (registerFlows): the charges flow as chargeflow.PipelinedFlow, each tx phase one
// round trip with its claim or fence first, and the two-call flow's reserve and settle
// as two-round-trip pipelined phases, fenced, the transaction open between the round
// trips.
func (e *env) withPipelined(t testing.TB) *env {
	t.Helper()
	e.shape.Pipelined = true
	return e
}

// flowShape is the shape of the flows' tx phases: Go-code (the zero value) or
// pipelined, and with ReadAtClaim the charges flow's first phase in two round trips.
// FoldedClaim runs Go-code flows on engines with Config.ClaimWithFirstStatement: a new
// key's claim rides in the round trip of its first tx phase's first statement (the
// phase's after-claim point is right after that round trip: the statement ran,
// uncommitted).
type flowShape struct {
	Pipelined   bool `json:",omitempty"`
	ReadAtClaim bool `json:",omitempty"`
	FoldedClaim bool `json:",omitempty"`
}

// prefix names the shape in a subtest's name.
func (s flowShape) prefix() string {
	switch {
	case s.FoldedClaim:
		return "folded_claim_"
	case s.ReadAtClaim:
		return "pipelined_read_at_claim_"
	case s.Pipelined:
		return "pipelined_"
	}
	return ""
}

// readAtClaim returns the pipelined charges flow f with a result read in its first
// phase: a statement whose answer a callback checks, queued after create_charge's
// INSERT, so that the phase takes two round trips, the claim and the INSERT in the
// first (the phase's after-claim point is after it: the INSERT ran, uncommitted), the
// key row's insert and COMMIT in the second (its before-commit is between them).
func readAtClaim(f phases.Flow) phases.Flow {
	first := f.Phases[0]
	build := first.Pipeline
	wrapped := phases.Pipelined(first.Name, func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
		resp, err := build(run, p)
		if resp != nil || err != nil {
			return resp, err
		}
		p.Queue(`SELECT count(*) FROM charges WHERE account_id = $1 AND idempotency_key = $2`, run.Scope(), run.Key()).
			QueryRow(func(row pgx.Row) error {
				var n int
				if err := row.Scan(&n); err != nil {
					return err
				}
				if n != 1 {
					return fmt.Errorf("create_charge: %d charges of the key in its claiming transaction", n)
				}
				return nil
			})
		return nil, nil
	})
	f.Phases = append([]phases.Phase{wrapped}, f.Phases[1:]...)
	return f
}

// flowCrashPoints are crashPoints[flow] for the flow's shape. A pipelined first phase
// in one round trip sends its claim with its statements and its COMMIT, so it has no
// after-claim point: its before-commit is before anything of the key was sent. A
// two-round-trip pipelined phase's before-commit (the two-call flow's reserve and
// settle, the charges flow's create_charge with ReadAtClaim) is between its round
// trips: its statements ran, the transaction is open, the key row's write and COMMIT
// not sent; a first phase's after-claim is there too, right after its claim was read.
func flowCrashPoints(flow string, shape flowShape) []string {
	if !shape.Pipelined || shape.ReadAtClaim && flow == chargeflow.FlowName {
		return crashPoints[flow]
	}
	return slices.DeleteFunc(slices.Clone(crashPoints[flow]), func(p string) bool {
		return strings.HasSuffix(p, "/after-claim")
	})
}

// pipelinedZombieCases are TestZombies' cases for the pipelined flows. A one-round-trip
// phase paused at its before-commit has sent nothing, not even BEGIN: once resumed, a
// new key's claim (the charges flow's create_charge) must lose to the executor that
// claimed and finished the key meanwhile, and an existing key's fence (finalize) must
// refuse the stale lock version; either way the zombie runs none of the phase's
// statements. A zombie paused in a call phase reaches the next pipelined phase, whose
// fence refuses it first, in a one-round-trip phase (finalize) or in the first round
// trip of a two-round-trip one (settle). A two-round-trip phase paused between its
// round trips holds the key row's fence lock (FOR NO KEY UPDATE): its session is cut
// (cutIdle), and its second round trip fails on the dead connection.
var pipelinedZombieCases = []zombieCase{
	{chargeflow.FlowName, "do", "create_charge/before-commit", false}, // the claim lost
	{chargeflow.FlowName, "do", "provider_charge/before-call", false},
	{chargeflow.FlowName, "do", "finalize/before-commit", false}, // the fence lost, one round trip
	{twoCallFlow, "do", "capture/after-call", false},             // the fence lost, two round trips
	{twoCallFlow, "do", "settle/before-commit", true},            // between the round trips
	{chargeflow.FlowName, "sweep", "provider_charge/after-call", false},
	{chargeflow.FlowName, "sweep", "finalize/before-commit", false},
	{twoCallFlow, "sweep", "capture/before-call", false},
	{twoCallFlow, "sweep", "reserve/before-commit", true},
}
