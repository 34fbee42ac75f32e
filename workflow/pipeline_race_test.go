package workflow_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// holdPipeFlow's one pipelined phase inserts an effect row and holds its first entrant
// in the insert's callback, with the claim held and the transaction open, until the
// gate opens; it answers 201 with what it was sent.
func holdPipeFlow(name string, holds map[string]*hold) phases.Flow {
	return phases.Flow{Name: name, Phases: []phases.Phase{
		phases.Pipelined("hold", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			h := holds[run.Key()]
			p.Queue(`INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'hold', 1) RETURNING id`,
				run.Scope(), run.Key()).QueryRow(func(row pgx.Row) error {
				var id int64
				if err := row.Scan(&id); err != nil {
					return err
				}
				return h.wait(context.Background(), h.enter())
			})
			return phases.JSON(201, map[string]string{"key": run.Key(), "body": string(run.Body())})
		}),
	}}
}

// TestPipelinedClaimLost races many attempts on one key at a time while the first
// holds the claim inside its transaction: every loser answers at once, and none of
// them runs the phase's statement on the server (the sequence and the tracer say so)
// or its callback.
func TestPipelinedClaimLost(t *testing.T) {
	t.Parallel()
	const keys, senders = 6, 17
	b := pipeSetup(t, pgx.QueryExecModeCacheStatement, "")
	holds := map[string]*hold{}
	for k := range keys {
		holds[fmt.Sprintf("k%d", k)] = newHold()
	}
	flow := holdPipeFlow("pipe_hold", holds)
	require.NoError(t, b.engine.Register(flow))
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		answers := race(t, b.engine, flow.Name, key, holds[key], senders)
		require.EqualValues(t, 1, holds[key].entered.Load(), "key %s: callbacks run", key)
		requireLoserAnswers(t, key, answers)
		require.EqualValues(t, k+1, seqRuns(t, b.db), "key %s: inserts the server ran, rolled back or not", key)
		b.trips.mu.Lock()
		ran := b.trips.ran
		b.trips.mu.Unlock()
		require.Equal(t, k+1, ran, "key %s: statements of the phase that ran", key)
	}
}

// TestPipelinedFenceLost: an executor whose lease was taken over while it was in a call
// phase runs none of the next pipelined phase's statements: its fence refuses it.
func TestPipelinedFenceLost(t *testing.T) {
	t.Parallel()
	b := pipeSetup(t, pgx.QueryExecModeCacheStatement, "")
	var calls atomic.Int32
	inside, gate := make(chan struct{}), make(chan struct{})
	require.NoError(t, b.engine.Register(pipeFlow("pipe_gate", &calls, func() {
		if calls.Load() == 1 {
			close(inside)
			<-gate
		}
	})))
	req := pipeReq("stale", `{"a":1}`)
	req.Flow = "pipe_gate"
	done := make(chan error, 1)
	go func() {
		_, err := b.engine.Do(context.Background(), req)
		done <- err
	}()
	<-inside
	expireLease(t, b.db, "acct", "stale")
	res, err := b.engine.Resume(context.Background(), "acct", "stale")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, res.Response.Status)
	close(gate)
	require.ErrorIs(t, <-done, workflow.ErrLeaseLost)
	require.EqualValues(t, 2, seqRuns(t, b.db), "reserve once, settle once: the stale executor ran nothing")
}

// TestPipelinedFenceHeldLock: the fence never waits for a lock another transaction
// holds on the key row; it answers a conflict at once.
func TestPipelinedFenceHeldLock(t *testing.T) {
	t.Parallel()
	b := pipeSetup(t, pgx.QueryExecModeCacheStatement, "")
	ctx := context.Background()
	// A key left at reserve, as a crash after its commit leaves it.
	_, err := b.pool.Exec(ctx, `INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route, fingerprint, request_body, recovery_point, phase_data)
		VALUES ('acct', 'held', gen_random_uuid(), 'pipe', 'POST', '/pipe', '\x00', '', 'reserve', '{}')`)
	require.NoError(t, err)
	var f keytable.Fence
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT scope, idempotency_key, id::text, lock_version, created_at FROM idemflow_keys WHERE idempotency_key = 'held'`).
		Scan(&f.Scope, &f.Key, &f.ID, &f.LockVersion, &f.CreatedAt))
	holder, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx)
	_, err = holder.Exec(ctx, `SELECT 1 FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = 'held' FOR UPDATE`)
	require.NoError(t, err)

	st := keytable.New()
	fence := func(k keytable.Fence) error {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		bt := &pgx.Batch{}
		head := st.QueueHead(bt, keytable.Head{Fence: k, Lock: true})
		bt.Queue(`INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ('acct', 'held', 'after', 1)`)
		br := tx.SendBatch(ctx, bt)
		defer br.Close()
		_, err = head.Read(br)
		return err
	}
	require.ErrorIs(t, fence(f), keytable.ErrConflict, "a held lock")
	require.NoError(t, holder.Rollback(ctx))
	stale := f
	stale.LockVersion++
	require.ErrorIs(t, fence(stale), keytable.ErrLeaseLost, "a stale lock version")
	require.NoError(t, fence(f))
	require.EqualValues(t, 1, seqRuns(t, b.db), "the statement after a refusing fence never ran")
}

// TestPipelinedErrors: a failing statement or callback rolls the phase back and
// counts as a tx phase's error would: transient (nothing stored) or, through
// phases.Fail, a response stored alone.
func TestPipelinedErrors(t *testing.T) {
	t.Parallel()
	b := pipeSetup(t, pgx.QueryExecModeCacheStatement, "")
	ctx := context.Background()
	phase := func(name string, build phases.PipelineFunc) {
		require.NoError(t, b.engine.Register(phases.Flow{Name: name, Phases: []phases.Phase{phases.Pipelined("only", build)}}))
	}
	insert := `INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'only', $3)`
	phase("bad_statement", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
		p.Queue(insert, run.Scope(), run.Key(), 1)
		p.Queue(insert, run.Scope(), run.Key(), -1) // the CHECK refuses it
		return phases.JSON(201, "never")
	})
	phase("declined", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
		p.Queue(insert, run.Scope(), run.Key(), 1).Exec(func(pgconn.CommandTag) error {
			return phases.Fail(&phases.Response{Status: http.StatusPaymentRequired, Body: []byte("declined")})
		})
		return nil, nil
	})
	phase("then_fails", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
		p.Queue(insert, run.Scope(), run.Key(), 1)
		p.Then(func(*phases.Run) (*phases.Response, error) { return nil, fmt.Errorf("then failed") })
		return nil, nil
	})
	phase("no_answer_twice", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
		p.Then(func(*phases.Run) (*phases.Response, error) { return phases.JSON(201, "then") })
		return phases.JSON(201, "builder")
	})
	effects := func(key string) int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pipe_effects WHERE idem_key = $1`, key).Scan(&n))
		return n
	}
	for _, flow := range []string{"bad_statement", "then_fails", "no_answer_twice"} {
		req := pipeReq(flow, `{}`)
		req.Flow = flow
		_, err := b.engine.Do(ctx, req)
		var te *workflow.TransientError
		require.ErrorAs(t, err, &te, flow)
		require.Zero(t, effects(flow), flow)
		require.Zero(t, countKeysOf(t, b, flow), "%s: a fresh key's transient failure leaves no row", flow)
	}
	req := pipeReq("declined", `{}`)
	req.Flow = "declined"
	res, err := b.engine.Do(ctx, req)
	require.NoError(t, err)
	require.Equal(t, http.StatusPaymentRequired, res.Response.Status)
	require.Zero(t, effects("declined"), "the phase's insert rolled back")
	again, err := b.engine.Do(ctx, req)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, http.StatusPaymentRequired, again.Response.Status)
}

func countKeysOf(t *testing.T, b *pipeBundle, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM idemflow_keys WHERE idempotency_key = $1`, key).Scan(&n))
	return n
}
