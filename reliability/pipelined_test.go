package reliability

import (
	"slices"
	"strings"
	"testing"
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
