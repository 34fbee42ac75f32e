package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

// TestKitEngineNotShedOnSlowMachine: the engines the test kit makes for tests whose
// subject is not overload (testflow.Engine) wait out a queue for a pool connection
// that a busy machine made slow, instead of shedding the test's own attempt as
// overloaded (docs/DEVELOPMENT.md, "Rules for tests on a busy machine"). The queue is
// set as a busy machine leaves it: one attempt waiting, the last waits long.
func TestKitEngineNotShedOnSlowMachine(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	workflow.SetConnQueue(b.engine, 1, 20*time.Minute)
	res, err := b.engine.Do(context.Background(), chargeReq("acct", "k1", `{"amount":5}`))
	require.NoError(t, err, "a test's own attempt shed by a slow queue")
	require.Equal(t, 201, res.Response.Status)
	requireOneEffect(t, b, "acct", "k1")
}
