package reliability

import (
	"slices"
	"strings"
	"testing"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
)

// withPipelined makes e's engines and children run the flows with pipelined tx phases
// (registerFlows): the charges flow as chargeflow.PipelinedFlow, each tx phase one
// round trip with its claim or fence first, and the two-call flow's reserve and settle
// as two-round-trip pipelined phases, fenced, the transaction open between the round
// trips.
func (e *env) withPipelined(t testing.TB) *env {
	t.Helper()
	e.pipelined = true
	return e
}

// flowCrashPoints are crashPoints[flow] for the flow's Go-code or pipelined shape. A
// pipelined first phase sends its claim with its statements and its COMMIT in one
// round trip, so it has no after-claim point: its before-commit is before anything of
// the key was sent. A two-round-trip pipelined phase's before-commit (the two-call
// flow's reserve and settle) is between its round trips: its statements ran, the
// transaction is open, the key row's write and COMMIT not sent.
func flowCrashPoints(flow string, pipelined bool) []string {
	if !pipelined {
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
