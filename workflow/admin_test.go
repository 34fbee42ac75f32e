package workflow_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// sweepOnce takes every due key (no grace) and runs it, as one sweeper pass.
func sweepOnce(t *testing.T, e *workflow.Engine, maxAttempts int) []workflow.Outcome {
	t.Helper()
	ctx := context.Background()
	taken, err := e.Maintenance().TakeDue(ctx, workflow.TakeDueOpts{Limit: 100, Grace: -1})
	require.NoError(t, err)
	var out []workflow.Outcome
	for _, tk := range taken {
		res, err := e.Maintenance().Run(ctx, tk, &workflow.RunOpts{MaxAttempts: maxAttempts})
		require.NoError(t, err)
		out = append(out, res.Outcome)
	}
	return out
}

func keysOf(p workflow.KeyPage) []string {
	var out []string
	for _, k := range p.Keys {
		out = append(out, k.Scope+"/"+k.Key)
	}
	return out
}

// adminKeys makes one key of each status: acct/done finished, acct/stuck released
// after a failure and due, acct/dead dead-lettered, other/held held by a live lease
// (in progress, not stuck). It returns the holder of other/held.
func adminKeys(t *testing.T, b *bundle) *testflow.Holder {
	t.Helper()
	ctx := context.Background()
	h := testflow.NewHolder("held")
	e := b.newEngine(t, setupOpts{before: h.Before})
	_, err := e.Do(ctx, chargeReq("acct", "done", `{"amount":1}`))
	require.NoError(t, err)
	b.provider.FailNext(1)
	_, err = e.Do(ctx, chargeReq("acct", "dead", `{"amount":2}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	sweepable(t, b.db)
	b.provider.FailNext(1)
	require.Equal(t, []workflow.Outcome{workflow.OutcomeDeadLettered}, sweepOnce(t, e, 1))
	b.provider.FailNext(1)
	_, err = e.Do(ctx, chargeReq("acct", "stuck", `{"amount":3}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	sweepable(t, b.db)
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(ctx, chargeReq("other", "held", `{"amount":4}`))
		done <- err
	}()
	<-h.Entered
	t.Cleanup(func() {
		h.Let()
		<-done
	})
	return h
}

func TestListKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	adminKeys(t, b)
	list := func(o workflow.ListOptions) []string {
		t.Helper()
		p, err := b.engine.ListKeys(ctx, o)
		require.NoError(t, err)
		return keysOf(p)
	}
	require.ElementsMatch(t, []string{"acct/done", "acct/dead", "acct/stuck", "other/held"}, list(workflow.ListOptions{}))
	require.ElementsMatch(t, []string{"acct/stuck", "other/held"}, list(workflow.ListOptions{Status: workflow.KeysInProgress}))
	require.Equal(t, []string{"acct/stuck"}, list(workflow.ListOptions{Status: workflow.KeysStuck}))
	require.Equal(t, []string{"acct/dead"}, list(workflow.ListOptions{Status: workflow.KeysDead}))
	require.Equal(t, []string{"acct/done"}, list(workflow.ListOptions{Status: workflow.KeysFinished}))
	require.Equal(t, []string{"other/held"}, list(workflow.ListOptions{Scope: "other"}))
	require.Empty(t, list(workflow.ListOptions{Flow: "nope"}))
	require.Len(t, list(workflow.ListOptions{Flow: testflow.Name}), 4)
	// Sweepable moved the claims of the keys unfinished then an hour back.
	require.ElementsMatch(t, []string{"acct/dead", "acct/stuck"}, list(workflow.ListOptions{OlderThan: 30 * time.Minute}))

	p, err := b.engine.ListKeys(ctx, workflow.ListOptions{Status: workflow.KeysDead})
	require.NoError(t, err)
	dead := p.Keys[0]
	require.Equal(t, workflow.KeysDead, dead.Status)
	require.Equal(t, testflow.Reserve, dead.RecoveryPoint)
	require.Contains(t, dead.LastError, "503")
	require.Equal(t, 2, dead.Attempts)
	require.Nil(t, dead.FinishedAt)
	p, err = b.engine.ListKeys(ctx, workflow.ListOptions{Scope: "other"})
	require.NoError(t, err)
	require.Equal(t, workflow.KeysInProgress, p.Keys[0].Status, "a live lease is not stuck")

	// Bad input is refused by name and reads nothing.
	_, err = b.engine.ListKeys(ctx, workflow.ListOptions{Status: "stale"})
	require.ErrorIs(t, err, workflow.ErrUnknownStatus)
	_, err = b.engine.ListKeys(ctx, workflow.ListOptions{Scope: "\xff"})
	require.ErrorIs(t, err, workflow.ErrInvalidScope)
	_, err = b.engine.ListKeys(ctx, workflow.ListOptions{Limit: workflow.ListLimitMax + 1})
	require.ErrorIs(t, err, workflow.ErrInvalidRequest)
	_, err = b.engine.ListKeys(ctx, workflow.ListOptions{After: "not a cursor"})
	require.ErrorIs(t, err, workflow.ErrInvalidCursor)
}

func TestListKeysPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	var want []string
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		_, err := b.engine.Do(ctx, chargeReq("acct", k, `{"amount":1}`))
		require.NoError(t, err)
		want = append(want, "acct/"+k)
	}
	// Two keys finished at the same instant are ordered by scope and key.
	_, err := b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET finished_at = (SELECT min(finished_at) FROM idemflow_keys) WHERE idempotency_key IN ('b', 'c')`)
	require.NoError(t, err)
	var got []string
	o := workflow.ListOptions{Status: workflow.KeysFinished, Limit: 2}
	pages := 0
	for {
		p, err := b.engine.ListKeys(ctx, o)
		require.NoError(t, err)
		pages++
		got = append(got, keysOf(p)...)
		if p.Next == "" {
			break
		}
		o.After = p.Next
		_, err = b.engine.ListKeys(ctx, workflow.ListOptions{Status: workflow.KeysDead, After: p.Next})
		require.ErrorIs(t, err, workflow.ErrInvalidCursor, "a cursor belongs to its status")
	}
	require.Equal(t, 3, pages)
	require.ElementsMatch(t, want, got, "every key once")
	require.Len(t, got, 5)
}

func TestInspectKeyHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	b.provider.FailNext(1)
	_, err := b.engine.Do(ctx, chargeReq("acct", "k", `{"amount":5}`))
	require.ErrorIs(t, err, workflow.ErrTransient)

	info, err := b.engine.InspectKey(ctx, "acct", "k")
	require.NoError(t, err)
	require.Equal(t, workflow.KeysInProgress, info.Status, "released with a backoff: not due yet")
	require.Equal(t, testflow.Reserve, info.RecoveryPoint)
	require.Equal(t, "POST", info.Method)
	require.Equal(t, "/charges", info.Route)
	require.JSONEq(t, `{"amount":5}`, string(info.Request))
	require.Positive(t, info.PhaseDataBytes)
	require.Contains(t, info.LastError, "503")
	require.Equal(t, testflow.Pay, info.FailedPhase)
	require.Zero(t, info.LeaseLeft)
	require.Len(t, info.History, 1)
	first := info.History[0]
	require.Equal(t, 1, first.Attempt)
	require.Equal(t, workflow.ExecutorClient, first.By)
	require.Equal(t, phases.Started, first.From)
	require.Equal(t, []string{testflow.Reserve}, first.Phases)
	require.Equal(t, workflow.OutcomeReleased, first.Outcome)
	require.Equal(t, testflow.Pay, first.Phase)
	require.Contains(t, first.Error, "503")
	require.False(t, first.At.IsZero())

	sweepable(t, b.db)
	require.Equal(t, []workflow.Outcome{workflow.OutcomeFinished}, sweepOnce(t, b.engine, 0))
	info, err = b.engine.InspectKey(ctx, "acct", "k")
	require.NoError(t, err)
	require.Equal(t, workflow.KeysFinished, info.Status)
	require.Equal(t, 201, info.ResponseStatus)
	require.NotNil(t, info.FinishedAt)
	require.Empty(t, info.LastError)
	require.Len(t, info.History, 2)
	second := info.History[1]
	require.Equal(t, workflow.Attempt{Attempt: 2, By: workflow.ExecutorSweeper, From: testflow.Reserve,
		Phases: []string{testflow.Pay, testflow.Settle}, Outcome: workflow.OutcomeFinished},
		workflow.Attempt{Attempt: second.Attempt, By: second.By, From: second.From, Phases: second.Phases, Outcome: second.Outcome})
	require.False(t, second.At.Before(first.At))

	// The JSON form is the column's, field for field.
	raw, err := json.Marshal(info.History)
	require.NoError(t, err)
	var stored string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT history::text FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = 'k'`).Scan(&stored))
	var a, c []map[string]any
	require.NoError(t, json.Unmarshal(raw, &a))
	require.NoError(t, json.Unmarshal([]byte(stored), &c))
	require.Equal(t, len(c), len(a))
	for i := range c {
		require.ElementsMatch(t, keys(c[i]), keys(a[i]))
	}

	_, err = b.engine.InspectKey(ctx, "acct", "missing")
	require.ErrorIs(t, err, workflow.ErrNotFound)
	_, err = b.engine.InspectKey(ctx, "acct\x00", "k")
	require.ErrorIs(t, err, workflow.ErrInvalidScope)
	_, err = b.engine.InspectKey(ctx, "acct", "")
	require.ErrorIs(t, err, workflow.ErrInvalidKey)
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestHistoryAbandonedAndBounded: an attempt whose lease ran out is recorded as
// abandoned by the takeover after it, and the history keeps only the newest entries.
func TestHistoryAbandonedAndBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	h := testflow.NewHolder("k")
	held := b.newEngine(t, setupOpts{before: h.Before, cfg: &workflow.Config{History: 3}})
	done := make(chan error, 1)
	go func() {
		_, err := held.Do(ctx, chargeReq("acct", "k", `{"amount":5}`))
		done <- err
	}()
	<-h.Entered
	expireLease(t, b.db, "acct", "k")
	other := b.newEngine(t, setupOpts{cfg: &workflow.Config{History: 3}})
	b.provider.FailNext(1)
	_, err := other.Resume(ctx, "acct", "k")
	require.ErrorIs(t, err, workflow.ErrTransient)
	h.Let()
	require.ErrorIs(t, <-done, workflow.ErrLeaseLost, "the paused attempt is fenced")

	info, err := other.InspectKey(ctx, "acct", "k")
	require.NoError(t, err)
	require.Len(t, info.History, 2)
	require.Equal(t, workflow.OutcomeAbandoned, info.History[0].Outcome)
	require.Equal(t, 1, info.History[0].Attempt)
	require.Equal(t, testflow.Reserve, info.History[0].Reached)
	require.Equal(t, workflow.OutcomeReleased, info.History[1].Outcome)
	require.Equal(t, 2, info.History[1].Attempt)

	for range 3 {
		sweepable(t, b.db)
		b.provider.FailNext(1)
		require.Equal(t, []workflow.Outcome{workflow.OutcomeReleased}, sweepOnce(t, other, 0))
	}
	info, err = other.InspectKey(ctx, "acct", "k")
	require.NoError(t, err)
	require.Len(t, info.History, 3, "bounded by Config.History")
	for i, a := range info.History {
		require.Equal(t, 3+i, a.Attempt, "the newest are kept")
		require.Equal(t, workflow.ExecutorSweeper, a.By)
	}

	off := b.newEngine(t, setupOpts{cfg: &workflow.Config{History: -1}})
	_, err = off.Do(ctx, chargeReq("acct", "quiet", `{"amount":5}`))
	require.NoError(t, err)
	info, err = off.InspectKey(ctx, "acct", "quiet")
	require.NoError(t, err)
	require.Empty(t, info.History, "History -1 writes none")
}

func TestReleaseKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	h := testflow.NewHolder("k")
	held := b.newEngine(t, setupOpts{before: h.Before})
	done := make(chan error, 1)
	go func() {
		_, err := held.Do(ctx, chargeReq("acct", "k", `{"amount":5}`))
		done <- err
	}()
	<-h.Entered
	before := state(t, b.db, "acct", "k")
	require.True(t, before.HasLease)
	require.Empty(t, sweepOnce(t, b.engine, 0), "a live lease is not swept")

	require.NoError(t, b.engine.ReleaseKey(ctx, "acct", "k"))
	after := state(t, b.db, "acct", "k")
	require.False(t, after.HasLease)
	require.Equal(t, before.LockVersion+1, after.LockVersion, "the holder is fenced")
	p, err := b.engine.ListKeys(ctx, workflow.ListOptions{Status: workflow.KeysStuck})
	require.NoError(t, err)
	require.Equal(t, []string{"acct/k"}, keysOf(p), "released: due at once")

	// The paused holder resumes before any sweep: its commit is fenced.
	h.Let()
	require.ErrorIs(t, <-done, workflow.ErrLeaseLost)
	require.Equal(t, testflow.Effects{Ledger: 1}, effects(t, b.db, "acct", "k"), "nothing of the holder's settle committed")
	require.Equal(t, []workflow.Outcome{workflow.OutcomeFinished}, sweepOnce(t, b.engine, 0))
	requireOneEffect(t, b, "acct", "k")
	info, err := b.engine.InspectKey(ctx, "acct", "k")
	require.NoError(t, err)
	require.Len(t, info.History, 2)
	require.Equal(t, workflow.Attempt{Attempt: 1, By: workflow.ExecutorOperator, Outcome: workflow.OutcomeOperatorReleased,
		Reached: testflow.Reserve, LeaseLive: true}, withoutTime(info.History[0]))
	require.Equal(t, workflow.OutcomeFinished, info.History[1].Outcome)

	row := keyRow(t, b.db, "acct", "k")
	requireWrongStatus(t, b.engine.ReleaseKey(ctx, "acct", "k"), "not in progress")
	require.ErrorIs(t, b.engine.ReleaseKey(ctx, "acct", "missing"), workflow.ErrNotFound)
	require.ErrorIs(t, b.engine.ReleaseKey(ctx, "\xfe", "k"), workflow.ErrInvalidScope)
	require.Equal(t, row, keyRow(t, b.db, "acct", "k"), "refusals change nothing")
}

func withoutTime(a workflow.Attempt) workflow.Attempt {
	a.At = time.Time{}
	return a
}

func TestPurgeKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	adminKeys(t, b)
	rows := map[string]string{}
	for _, k := range []string{"dead", "stuck"} {
		rows[k] = keyRow(t, b.db, "acct", k)
		requireWrongStatus(t, b.engine.PurgeKey(ctx, "acct", k), "not finished")
		require.Equal(t, rows[k], keyRow(t, b.db, "acct", k))
	}
	require.ErrorIs(t, b.engine.PurgeKey(ctx, "acct", "missing"), workflow.ErrNotFound)
	require.ErrorIs(t, b.engine.PurgeKey(ctx, "other", "done"), workflow.ErrNotFound, "scoped")
	first, err := b.engine.InspectKey(ctx, "acct", "done")
	require.NoError(t, err)

	require.NoError(t, b.engine.PurgeKey(ctx, "acct", "done"))
	require.Equal(t, "", keyRow(t, b.db, "acct", "done"))
	// As documented: the same key now starts a new operation.
	res, err := b.engine.Do(ctx, chargeReq("acct", "done", `{"amount":1}`))
	require.NoError(t, err)
	require.False(t, res.Replayed)
	again, err := b.engine.InspectKey(ctx, "acct", "done")
	require.NoError(t, err)
	require.NotEqual(t, first.ID, again.ID)
	require.Equal(t, 2, effects(t, b.db, "acct", "done").Ledger)
}

func TestCountAndGaugeKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	adminKeys(t, b)
	counts, err := b.engine.CountKeys(ctx)
	require.NoError(t, err)
	require.Equal(t, []workflow.KeyCount{
		{Flow: testflow.Name, Status: workflow.KeysDead, Keys: 1},
		{Flow: testflow.Name, Status: workflow.KeysFinished, Keys: 1},
		{Flow: testflow.Name, Status: workflow.KeysInProgress, Keys: 1},
		{Flow: testflow.Name, Status: workflow.KeysStuck, Keys: 1},
	}, counts)
	gauges, err := b.engine.GaugeKeys(ctx)
	require.NoError(t, err)
	require.Len(t, gauges, 1)
	require.Positive(t, gauges[0].OldestDue, "the stuck key has been due a while")
	gauges[0].OldestDue = 0
	require.Equal(t, []workflow.KeyGauge{{Flow: testflow.Name, InProgress: 2, Stuck: 1, Dead: 1}}, gauges)
}

// TestCountOutcomes: finished and dead-lettered keys are counted by flow and bucket in
// the window, keys that ended before it are not, and bad options are refused.
func TestCountOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	adminKeys(t, b)
	_, err := b.engine.Do(ctx, chargeReq("acct", "old", `{"amount":5}`))
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET finished_at = statement_timestamp() - interval '2 hours' WHERE idempotency_key = 'old'`)
	require.NoError(t, err)

	got, err := b.engine.CountOutcomes(ctx, workflow.OutcomeOptions{Window: time.Hour, Bucket: time.Hour})
	require.NoError(t, err)
	var dead, finished int64
	for _, o := range got {
		require.Equal(t, testflow.Name, o.Flow)
		require.Zero(t, o.Start.UnixNano()%int64(time.Hour), "buckets start on the hour")
		switch o.Status {
		case workflow.KeysDead:
			dead += o.Keys
		case workflow.KeysFinished:
			finished += o.Keys
		}
	}
	require.Equal(t, [2]int64{1, 1}, [2]int64{finished, dead}, "acct/done and acct/dead; acct/old ended before the window")

	only, err := b.engine.CountOutcomes(ctx, workflow.OutcomeOptions{Window: 24 * time.Hour, Status: workflow.KeysDead})
	require.NoError(t, err)
	require.Len(t, only, 1)
	require.Equal(t, workflow.KeysDead, only[0].Status)

	require.NoError(t, b.engine.Redrive(ctx, "acct", "dead"))
	only, err = b.engine.CountOutcomes(ctx, workflow.OutcomeOptions{Window: 24 * time.Hour, Status: workflow.KeysDead})
	require.NoError(t, err)
	require.Empty(t, only, "a re-driven key is no longer dead")

	for _, o := range []workflow.OutcomeOptions{
		{Window: -time.Hour}, {Window: 8 * 24 * time.Hour}, {Bucket: time.Millisecond},
		{Window: 24 * time.Hour, Bucket: time.Second}, {Status: workflow.KeysStuck},
	} {
		_, err := b.engine.CountOutcomes(ctx, o)
		require.ErrorIs(t, err, workflow.ErrInvalidRequest, "%+v", o)
	}
}

// TestRedriveHistory: a re-drive is an operator's entry, and bad input is refused.
func TestRedriveHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	adminKeys(t, b)
	require.ErrorIs(t, b.engine.Redrive(ctx, "acct\xff", "dead"), workflow.ErrInvalidScope)
	require.NoError(t, b.engine.Redrive(ctx, "acct", "dead"))
	info, err := b.engine.InspectKey(ctx, "acct", "dead")
	require.NoError(t, err)
	last := info.History[len(info.History)-1]
	require.Equal(t, workflow.Attempt{By: workflow.ExecutorOperator, Outcome: workflow.OutcomeRedriven}, withoutTime(last))
	require.Equal(t, workflow.KeysStuck, info.Status)
	requireWrongStatus(t, b.engine.Redrive(ctx, "acct", "dead"), "not dead-lettered")
}

// requireWrongStatus checks that err is an operator action's refusal of a key in the
// wrong status, and that it says the key is, or is not, what status says.
func requireWrongStatus(t *testing.T, err error, status string) {
	t.Helper()
	require.ErrorIs(t, err, workflow.ErrWrongStatus)
	require.ErrorContains(t, err, " is "+status)
}
