package idemmsg_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemmsg"
	"github.com/idemflow/idemflow/internal/vocab"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

func msg(key, payload string) idemmsg.Message {
	return idemmsg.Message{Scope: "consumer", Key: key, Flow: testflow.Name, Payload: []byte(payload)}
}

func TestHandle(t *testing.T) {
	t.Parallel()
	t.Run("RedeliveryReplays", testHandleRedeliveryReplays)
	t.Run("OtherPayloadTerminates", testHandleOtherPayloadTerminates)
	t.Run("NeverTheFingerprintOfAnHTTPRequest", testHandleNeverTheFingerprintOfAnHTTPRequest)
	t.Run("InProgressRetriesLater", testHandleInProgressRetriesLater)
	t.Run("TransientRetriesWithItsDelay", testHandleTransientRetriesWithItsDelay)
	t.Run("DeadLetteredTerminates", testHandleDeadLetteredTerminates)
	t.Run("InvalidTerminates", testHandleInvalidTerminates)
	t.Run("ClientOnlyFlowRetries", testHandleClientOnlyFlowRetries)
}

func testHandleRedeliveryReplays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := testflow.Start(t)
	e := testflow.Engine(t, db.Pool, nil, p, nil)
	first := idemmsg.Handle(ctx, e, msg("m1", `{"amount":7}`))
	require.Equal(t, idemmsg.Ack, first.Action, first.Err)
	require.False(t, first.Result.Replayed)
	again := idemmsg.Handle(ctx, e, msg("m1", `{ "amount": 7.0 }`))
	require.Equal(t, idemmsg.Ack, again.Action)
	require.True(t, again.Result.Replayed)
	require.Equal(t, first.Result.Response.Body, again.Result.Response.Body)
	testflow.RequireOneEffect(t, db.Pool, p, "consumer", "m1")
}

func testHandleOtherPayloadTerminates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := testflow.Start(t)
	e := testflow.Engine(t, db.Pool, nil, p, nil)
	require.Equal(t, idemmsg.Ack, idemmsg.Handle(ctx, e, msg("m1", `{"amount":7}`)).Action)
	before := testflow.KeyRow(t, db.Pool, "consumer", "m1")
	d := idemmsg.Handle(ctx, e, msg("m1", `{"amount":8}`))
	require.Equal(t, idemmsg.Terminate, d.Action)
	require.ErrorIs(t, d.Err, workflow.ErrMismatch)
	require.Equal(t, before, testflow.KeyRow(t, db.Pool, "consumer", "m1"), "nothing written")
}

func testHandleNeverTheFingerprintOfAnHTTPRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := testflow.Start(t)
	e := testflow.Engine(t, db.Pool, nil, p, nil)
	_, err := e.Do(ctx, workflow.Request{Scope: "consumer", Key: "m1", Flow: testflow.Name, Method: "POST", Route: "/charges", Body: []byte(`{"amount":7}`)})
	require.NoError(t, err)
	d := idemmsg.Handle(ctx, e, msg("m1", `{"amount":7}`))
	require.Equal(t, idemmsg.Terminate, d.Action)
	require.ErrorIs(t, d.Err, workflow.ErrMismatch)
	var method, route string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT method, route FROM idemflow_keys WHERE idempotency_key = 'm1'`).Scan(&method, &route))
	require.Equal(t, "POST", method)
}

func testHandleInProgressRetriesLater(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := testflow.Start(t)
	entered, release := make(chan struct{}), make(chan struct{})
	e := testflow.Engine(t, db.Pool, nil, p, func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Pay {
			close(entered)
			<-release
		}
		return nil
	})
	done := make(chan idemmsg.Decision, 1)
	go func() { done <- idemmsg.Handle(ctx, e, msg("m1", `{"amount":7}`)) }()
	<-entered
	d := idemmsg.Handle(ctx, e, msg("m1", `{"amount":7}`))
	require.Equal(t, idemmsg.Retry, d.Action)
	require.ErrorIs(t, d.Err, workflow.ErrInProgress)
	var ip *workflow.InProgressError
	require.ErrorAs(t, d.Err, &ip)
	require.Equal(t, ip.RetryAfter, d.Delay)
	require.GreaterOrEqual(t, d.Delay, time.Second)
	close(release)
	require.Equal(t, idemmsg.Ack, (<-done).Action)
}

func testHandleTransientRetriesWithItsDelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := testflow.Start(t)
	e := testflow.Engine(t, db.Pool, nil, p, func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Pay && run.Attempt() == 1 {
			return phases.RetryLater(testflow.ErrInjected, 7*time.Second)
		}
		return nil
	})
	d := idemmsg.Handle(ctx, e, msg("m1", `{"amount":7}`))
	require.Equal(t, idemmsg.Retry, d.Action)
	require.ErrorIs(t, d.Err, testflow.ErrInjected)
	require.Equal(t, 7*time.Second, d.Delay)
	require.Equal(t, idemmsg.Ack, idemmsg.Handle(ctx, e, msg("m1", `{"amount":7}`)).Action)
	testflow.RequireOneEffect(t, db.Pool, p, "consumer", "m1")
}

func testHandleDeadLetteredTerminates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := testflow.Start(t)
	e := testflow.Engine(t, db.Pool, nil, p, func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if run.Phase() == testflow.Pay {
			return errors.Join(testflow.ErrInjected, workflow.ErrUnstorable)
		}
		return nil
	})
	d := idemmsg.Handle(ctx, e, msg("m1", `{"amount":7}`))
	require.Equal(t, idemmsg.Terminate, d.Action, d.Err)
	require.ErrorIs(t, d.Err, workflow.ErrDeadLettered)
	again := idemmsg.Handle(ctx, e, msg("m1", `{"amount":7}`))
	require.Equal(t, idemmsg.Terminate, again.Action)
}

func testHandleInvalidTerminates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := testflow.Start(t)
	e := testflow.Engine(t, db.Pool, nil, p, nil)
	for _, m := range []idemmsg.Message{
		{Scope: "consumer", Key: "", Flow: testflow.Name, Payload: []byte(`{}`)},
		{Scope: "", Key: "k", Flow: testflow.Name, Payload: []byte(`{}`)},
		{Scope: "consumer", Key: "k", Flow: testflow.Name, Payload: make([]byte, 2<<20)},
	} {
		require.Equal(t, idemmsg.Terminate, idemmsg.Handle(ctx, e, m).Action)
	}
	d := idemmsg.Handle(ctx, e, idemmsg.Message{Scope: "consumer", Key: "k", Flow: "no_such_flow", Payload: []byte(`{}`)})
	require.Equal(t, idemmsg.Retry, d.Action, "an unregistered flow waits for the deployment")
	require.ErrorIs(t, d.Err, workflow.ErrUnknownFlow)
	require.Zero(t, testflow.CountKeys(t, db.Pool))
}

// A message for a client-only flow (only an HTTP client's retry brings its phases) is
// a fault of the consumer's wiring, as the engine classes ErrNeedsClient: kept for
// redelivery, as an unregistered flow is, never terminated, and nothing is written.
func testHandleClientOnlyFlowRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, p := testflow.Start(t)
	e := testflow.Engine(t, db.Pool, nil, p, nil)
	require.NoError(t, e.Register(phases.Flow{Name: "client_only", ClientOnly: true, Phases: []phases.Phase{phases.Call("work", nil)}}))
	d := idemmsg.Handle(ctx, e, idemmsg.Message{Scope: "consumer", Key: "k", Flow: "client_only", Payload: []byte(`{}`)})
	require.ErrorIs(t, d.Err, workflow.ErrNeedsClient)
	require.Equal(t, workflow.ClassServerFault, workflow.Classify(d.Err))
	require.Equal(t, idemmsg.Retry, d.Action)
	require.Equal(t, idemmsg.RetryDelayDefault, d.Delay)
	require.Zero(t, testflow.CountKeys(t, db.Pool))
}

// Every error of the engine decides a failed delivery as its class says: a client
// fault or a dead-lettered key terminates it, a retry or a fault of the service has it
// redelivered after a delay. A new error is decided right once it is classed.
func TestDecideFollowsClass(t *testing.T) {
	t.Parallel()
	for _, sentinel := range vocab.Sentinels() {
		err := fmt.Errorf("workflow: attempt: %w", sentinel)
		t.Run(sentinel.Error(), func(t *testing.T) {
			t.Parallel()
			d := idemmsg.Decide(&workflow.Result{Outcome: workflow.OutcomeFailed, Err: err})
			require.Equal(t, err, d.Err)
			switch class := workflow.Classify(err); class {
			case workflow.ClassClientFault, workflow.ClassDeadLettered:
				require.Equal(t, idemmsg.Terminate, d.Action, "%v", class)
				require.Zero(t, d.Delay)
			case workflow.ClassRetry, workflow.ClassServerFault:
				require.Equal(t, idemmsg.Retry, d.Action, "%v", class)
				require.Positive(t, d.Delay)
			default:
				t.Fatalf("class %v", class)
			}
		})
	}
	d := idemmsg.Decide(&workflow.Result{Outcome: workflow.OutcomeFailed, Err: fmt.Errorf("%w: status %q", workflow.ErrNewerFormat, "paused")})
	require.Equal(t, idemmsg.Retry, d.Action)
	require.Equal(t, workflow.NewerFormatRetryAfter, d.Delay, "a newer build's key waits for the deployment")
}
