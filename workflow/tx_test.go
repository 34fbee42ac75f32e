package workflow_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/tenants"
	"github.com/idemflow/idemflow/workflow"
)

// TestTxEndsWithPhase: once a tx phase returns, nothing its code kept of its
// transaction reaches a connection again. With a pool of one connection, tenant a's
// phase keeps its transaction (and its savepoint, rows, a batch's results) and uses
// them while tenant b's phase holds that connection: every call fails with
// phases.ErrTxDone, and b's transaction commits b's note alone.
func TestTxEndsWithPhase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := tenants.New(t)
	k := &keptOfPhase{}
	s.Phase["a"] = k.phase
	res, err := s.Engine.Do(ctx, tenants.Req("a"))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)

	s.WhileBHolds(t, func() { k.requireDone(t) })
	require.Equal(t, []string{"a", "b"}, s.Notes(t), "nothing of a's late calls committed, in b's transaction or elsewhere")
	var data []byte
	require.NoError(t, s.DB.Pool.QueryRow(ctx, `SELECT lo_get($1)`, k.oid).Scan(&data))
	require.Equal(t, "in the phase", string(data), "the large object written in the phase committed with it, and nothing after it")
}

// keptOfPhase is what TestTxEndsWithPhase's phase of tenant a keeps of its
// transaction: the pgx.Tx, a savepoint left open, rows, a batch's results, and a
// large object it wrote.
type keptOfPhase struct {
	tx, sp pgx.Tx
	rows   pgx.Rows
	br     pgx.BatchResults
	lo     *pgx.LargeObject
	oid    uint32
}

// phase is tenant a's phase: it uses its transaction every way and keeps it.
func (k *keptOfPhase) phase(ctx context.Context, tx phases.DBTX) (*phases.Response, error) {
	k.tx = tx.(pgx.Tx)
	var err error
	if k.sp, err = k.tx.Begin(ctx); err != nil {
		return nil, err
	}
	if err := k.sp.Commit(ctx); err != nil {
		return nil, err
	}
	k.sp, err = k.tx.Begin(ctx) // left open
	if err != nil {
		return nil, err
	}
	if k.rows, err = tx.Query(ctx, `SELECT 1`); err != nil {
		return nil, err
	}
	k.rows.Close() // read in the phase, kept past it
	b := &pgx.Batch{}
	b.Queue(`SELECT 1`)
	k.br = tx.SendBatch(ctx, b)
	if err := k.br.Close(); err != nil {
		return nil, err
	}
	los := k.tx.LargeObjects() // large objects work in the phase's transaction
	if k.oid, err = los.Create(ctx, 0); err != nil {
		return nil, err
	}
	if k.lo, err = los.Open(ctx, k.oid, pgx.LargeObjectModeWrite); err != nil {
		return nil, err
	}
	if _, err := k.lo.Write([]byte("in the phase")); err != nil {
		return nil, err
	}
	return tenants.Created(ctx, tx)
}

// requireDone: every call on what the phase kept fails with phases.ErrTxDone.
func (k *keptOfPhase) requireDone(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	_, err := k.tx.Exec(ctx, `INSERT INTO notes (name) VALUES ('a-late')`)
	require.ErrorIs(t, err, phases.ErrTxDone, "Exec after the phase")
	require.ErrorIs(t, err, pgx.ErrTxClosed, "pgx sees a closed transaction")
	_, err = k.tx.Query(ctx, `INSERT INTO notes (name) VALUES ('a-late-query') RETURNING name`)
	require.ErrorIs(t, err, phases.ErrTxDone, "Query")
	var name string
	require.ErrorIs(t, k.tx.QueryRow(ctx, `INSERT INTO notes (name) VALUES ('a-late-row') RETURNING name`).Scan(&name), phases.ErrTxDone, "QueryRow")
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO notes (name) VALUES ('a-late-batch')`)
	require.ErrorIs(t, k.tx.SendBatch(ctx, b).Close(), phases.ErrTxDone, "SendBatch")
	_, err = k.tx.CopyFrom(ctx, pgx.Identifier{"notes"}, []string{"name"}, pgx.CopyFromRows([][]any{{"a-late-copy"}}))
	require.ErrorIs(t, err, phases.ErrTxDone, "CopyFrom")
	_, err = k.tx.Prepare(ctx, "late", `INSERT INTO notes (name) VALUES ('a-late-prepared')`)
	require.ErrorIs(t, err, phases.ErrTxDone, "Prepare")
	_, err = k.tx.Begin(ctx)
	require.ErrorIs(t, err, phases.ErrTxDone, "Begin")
	require.ErrorIs(t, k.tx.Commit(ctx), phases.ErrTxDone, "Commit")
	require.ErrorIs(t, k.tx.Rollback(ctx), phases.ErrTxDone, "Rollback")
	require.Nil(t, k.tx.Conn(), "Conn")
	_, err = k.sp.Exec(ctx, `INSERT INTO notes (name) VALUES ('a-late-savepoint')`)
	require.ErrorIs(t, err, phases.ErrTxDone, "a savepoint's Exec")
	require.ErrorIs(t, k.sp.Commit(ctx), phases.ErrTxDone, "a savepoint's Commit")
	require.False(t, k.rows.Next(), "rows kept past the phase")
	require.ErrorIs(t, k.rows.Err(), phases.ErrTxDone, "rows kept past the phase")
	require.ErrorIs(t, k.rows.Scan(&name), phases.ErrTxDone, "rows kept past the phase")
	require.Nil(t, k.rows.RawValues(), "rows kept past the phase")
	_, err = k.br.Exec()
	require.ErrorIs(t, err, phases.ErrTxDone, "batch results kept past the phase")
	los := k.tx.LargeObjects()
	_, err = los.Create(ctx, 0)
	require.ErrorIs(t, err, phases.ErrTxDone, "LargeObjects().Create")
	require.ErrorIs(t, los.Unlink(ctx, k.oid), phases.ErrTxDone, "LargeObjects().Unlink")
	_, err = k.lo.Write([]byte("late"))
	require.ErrorIs(t, err, phases.ErrTxDone, "a large object opened in the phase")
	spLos := k.sp.LargeObjects()
	_, err = spLos.Create(ctx, 0)
	require.ErrorIs(t, err, phases.ErrTxDone, "a savepoint's LargeObjects().Create")
}

// TestTxEndsWithPhaseRowsLeftOpen: a phase that returns with rows still open fails (its
// connection is still busy with them, so it cannot commit), and the rows it kept
// refuse to be read after it, rather than read from a connection gone back to the pool.
func TestTxEndsWithPhaseRowsLeftOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := tenants.New(t)
	var rows pgx.Rows
	s.Phase["a"] = func(ctx context.Context, tx phases.DBTX) (*phases.Response, error) {
		var err error
		if rows, err = tx.Query(ctx, `SELECT generate_series(1, 3)`); err != nil {
			return nil, err
		}
		if !rows.Next() {
			return nil, rows.Err()
		}
		return tenants.Created(ctx, tx) // two rows unread
	}
	_, err := s.Engine.Do(ctx, tenants.Req("a"))
	require.ErrorIs(t, err, workflow.ErrTransient)

	s.Phase["a"] = tenants.Created
	s.WhileBHolds(t, func() {
		var n int
		require.ErrorIs(t, rows.Scan(&n), phases.ErrTxDone)
		require.False(t, rows.Next())
		require.ErrorIs(t, rows.Err(), phases.ErrTxDone)
		rows.Close()
	})
	res, err := s.Engine.Do(ctx, tenants.Req("a"))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)
	require.Equal(t, []string{"a", "b"}, s.Notes(t))
}

// TestTxEndsWithPhaseConn: the *pgx.Conn that Conn hands out during the phase cannot
// be taken back, so the engine closes that connection when the phase ends instead of
// giving it back to the pool: tenant a's kept *pgx.Conn fails ("conn closed") while
// tenant b works on a new connection of the pool of one.
func TestTxEndsWithPhaseConn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := tenants.New(t)
	var kept *pgx.Conn
	var pidA uint32
	s.Phase["a"] = func(ctx context.Context, tx phases.DBTX) (*phases.Response, error) {
		kept = tx.(pgx.Tx).Conn()
		pidA = kept.PgConn().PID()
		return tenants.Created(ctx, tx)
	}
	res, err := s.Engine.Do(ctx, tenants.Req("a"))
	require.NoError(t, err)
	require.Equal(t, 201, res.Response.Status)

	s.WhileBHolds(t, func() {
		_, err := kept.Exec(ctx, `INSERT INTO notes (name) VALUES ('a-late')`)
		require.ErrorContains(t, err, "conn closed")
	})
	require.Equal(t, []string{"a", "b"}, s.Notes(t))
	var pidB uint32
	require.NoError(t, s.Pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pidB))
	require.NotEqual(t, pidA, pidB, "the pool's connection is a new one")
}

// TestTxEndsWithPhaseStray: a phase that returns while a goroutine it started is still
// running a statement on its transaction fails, and commits nothing; the connection
// stays with that goroutine (the pool opens another for tenant b meanwhile) and is
// closed when its statement returns, after which the goroutine's calls fail with
// phases.ErrTxDone.
func TestTxEndsWithPhaseStray(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := tenants.New(t)
	// The stray statement waits for an advisory lock the test holds on a connection
	// of its own, so it is in progress when the phase returns.
	holder, err := s.DB.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock(4242)`)
	require.NoError(t, err)

	strayDone := make(chan error, 1)
	var kept phases.DBTX
	s.Phase["a"] = func(ctx context.Context, tx phases.DBTX) (*phases.Response, error) {
		kept = tx
		go func() {
			_, err := tx.Exec(context.Background(), `SELECT pg_advisory_lock(4242)`)
			strayDone <- err
		}()
		// Wait until the stray statement is on the server, waiting for the lock.
		require.Eventually(t, func() bool {
			var waiting bool
			err := holder.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND NOT granted)`).Scan(&waiting)
			return err == nil && waiting
		}, lockWait, lockTick)
		return tenants.Created(ctx, tx)
	}
	_, err = s.Engine.Do(ctx, tenants.Req("a"))
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.ErrorContains(t, err, "still in use by another goroutine")

	// The stray goroutine still has the old connection; b gets a new one.
	s.WhileBHolds(t, func() {})
	_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock(4242)`)
	require.NoError(t, err)
	require.NoError(t, <-strayDone, "the stray statement ran to its end")
	_, err = kept.Exec(ctx, `INSERT INTO notes (name) VALUES ('a-late')`)
	require.ErrorIs(t, err, phases.ErrTxDone)
	require.Equal(t, []string{"b"}, s.Notes(t), "nothing of a's phase committed")
	// The stray goroutine closed its connection: the server has no session waiting
	// for or holding the lock.
	require.Eventually(t, func() bool {
		var n int
		err := holder.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242`).Scan(&n)
		return err == nil && n == 0
	}, lockWait, lockTick)
}

// TestTxEndsWithPhaseRacingGoroutine is for the race detector: a goroutine that uses
// the phase's transaction in a loop while the phase ends is either admitted before the
// end (then the phase fails and commits nothing) or refused after it, never on the
// connection at the same time as the engine.
func TestTxEndsWithPhaseRacingGoroutine(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := tenants.New(t)
	var wg sync.WaitGroup
	names := []string{"r1", "r2", "r3", "r4", "r5", "r6"}
	answered := []string{} // as the notes are read: empty, not nil, when no request was answered
	for _, tenant := range names {
		s.Phase[tenant] = func(ctx context.Context, tx phases.DBTX) (*phases.Response, error) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					var one int
					err := tx.QueryRow(context.Background(), `SELECT 1`).Scan(&one)
					if errors.Is(err, phases.ErrTxDone) {
						return
					}
					if err != nil {
						t.Errorf("a call admitted during the phase failed: %v", err)
						return
					}
				}
			}()
			return tenants.Created(ctx, tx)
		}
		_, err := s.Engine.Do(ctx, tenants.Req(tenant))
		if err == nil {
			answered = append(answered, tenant)
		} else {
			require.ErrorIs(t, err, workflow.ErrTransient, "a phase that ended with the goroutine's statement in flight fails")
		}
	}
	wg.Wait()
	require.Equal(t, answered, s.Notes(t), "a tenant's note committed if and only if its request was answered")
}

const (
	lockWait = time.Minute          // how long a test waits for the server to show a lock
	lockTick = 5 * time.Millisecond // how often it looks
)

// TestTxPhaseOutlivesLease: a tx phase still running when the attempt's lease runs out
// fails with ErrLeaseExpired (inside a *TransientError), and nothing it wrote commits:
// whether its Go code is still running (hung until the lease ends) or one of its
// statements is (cancelled by the lease's end: the error keeps pgx's own beside the
// lease's).
func TestTxPhaseOutlivesLease(t *testing.T) {
	t.Parallel()
	for name, hang := range map[string]func(ctx context.Context, tx phases.DBTX) error{
		"GoCode": func(ctx context.Context, tx phases.DBTX) error {
			<-ctx.Done()
			return nil
		},
		"Statement": func(ctx context.Context, tx phases.DBTX) error {
			_, err := tx.Exec(ctx, `SELECT pg_sleep(3600)`)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t)
			_, err := db.Pool.Exec(ctx, `CREATE TABLE notes (name text PRIMARY KEY)`)
			require.NoError(t, err)
			e, err := workflow.New(db.Pool, &workflow.Config{Lease: time.Second})
			require.NoError(t, err)
			require.NoError(t, e.Register(phases.Flow{Name: "notes", Phases: []phases.Phase{
				phases.Tx("write", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
					if err := note(ctx, tx, run.Scope()); err != nil {
						return nil, err
					}
					if err := hang(ctx, tx); err != nil {
						return nil, err
					}
					return tenants.Created(ctx, tx)
				}),
			}}))
			_, err = e.Do(ctx, tenants.Req("a"))
			require.ErrorIs(t, err, workflow.ErrLeaseExpired)
			require.ErrorIs(t, err, workflow.ErrTransient)
			if name == "Statement" {
				require.ErrorIs(t, err, context.DeadlineExceeded, "the statement's own error is kept")
			}
			var n int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM notes`).Scan(&n))
			require.Zero(t, n, "nothing of the phase committed")
		})
	}
}

// TestTxKeyRowInsertOutlivesLease: a new key's insert of its row that waits past the
// lease (the key table held in SHARE mode: reads pass, on Citus too, where a trigger
// on the distributed table would be refused) fails the attempt with ErrLeaseExpired,
// inside a *TransientError, beside the statement's own deadline error, as a phase's
// statement cut by the lease does; nothing is written.
//
//   - Claim: at REPEATABLE READ the claim inserts the row in its own round trip,
//     before the phase's function, which never runs.
//   - FirstCommit: at READ COMMITTED the claim (its lock and look-up) and the phase's
//     own write pass, and the row is inserted with the commit, detached from the
//     caller and bounded by a lease of its own. The phase must return within its own
//     lease for the commit to be sent at all: 3 s leaves a loaded machine room.
func TestTxKeyRowInsertOutlivesLease(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		iso   pgx.TxIsoLevel
		lease time.Duration
		runs  int
	}{
		{"Claim", pgx.RepeatableRead, time.Second, 0},
		{"FirstCommit", "", 3 * time.Second, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.New(t)
			_, err := db.Pool.Exec(ctx, `CREATE TABLE notes (name text PRIMARY KEY)`)
			require.NoError(t, err)
			holder, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer holder.Rollback(ctx) //nolint:errcheck
			_, err = holder.Exec(ctx, `LOCK TABLE idemflow_keys IN SHARE MODE`)
			require.NoError(t, err)
			e, err := workflow.New(db.Pool, &workflow.Config{Lease: c.lease})
			require.NoError(t, err)
			ran := make(chan struct{}, 1)
			write := phases.Tx("write", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
				ran <- struct{}{}
				if err := note(ctx, tx, run.Scope()); err != nil {
					return nil, err
				}
				return tenants.Created(ctx, tx)
			})
			write.IsoLevel = c.iso
			require.NoError(t, e.Register(phases.Flow{Name: "notes", Phases: []phases.Phase{write}}))
			_, err = e.Do(ctx, tenants.Req("a"))
			require.ErrorIs(t, err, workflow.ErrLeaseExpired)
			require.ErrorIs(t, err, workflow.ErrTransient)
			require.ErrorIs(t, err, context.DeadlineExceeded, "the insert's own error is kept: it was sent")
			require.Len(t, ran, c.runs, "runs of the phase's function")
			require.NoError(t, holder.Rollback(ctx))
			var n int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM notes) + (SELECT count(*) FROM idemflow_keys)`).Scan(&n))
			require.Zero(t, n, "nothing written")
		})
	}
}

// TestTxConnectionWaitOutlivesLease: a lease that runs out while its first phase still
// waits for its connection (a pool that hands it out late; in the wild, an exhausted
// pool or a stalled machine) fails the attempt with ErrLeaseExpired, inside a
// *TransientError, beside the wait's own deadline error; nothing is claimed and the
// phase never runs.
func TestTxConnectionWaitOutlivesLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	var armed atomic.Bool
	cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
		if armed.CompareAndSwap(true, false) { // the first phase's connection
			<-ctx.Done() // not handed out before the lease ends
			return true, ctx.Err()
		}
		return true, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	e, err := workflow.New(pool, &workflow.Config{Lease: time.Second, AdmitWait: -1, Hooks: workflow.Hooks{
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			armed.Store(true)
			return ctx
		},
	}})
	require.NoError(t, err)
	ran := make(chan struct{}, 1)
	require.NoError(t, e.Register(phases.Flow{Name: "notes", Phases: []phases.Phase{
		phases.Tx("write", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			ran <- struct{}{}
			return tenants.Created(ctx, tx)
		}),
	}}))
	_, err = e.Do(ctx, tenants.Req("a"))
	require.False(t, armed.Load(), "the first phase asked for its connection")
	require.ErrorIs(t, err, workflow.ErrLeaseExpired)
	require.ErrorIs(t, err, workflow.ErrTransient)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the wait's own error is kept")
	require.Empty(t, ran, "the phase's function did not run")
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys`).Scan(&n))
	require.Zero(t, n, "nothing was claimed")
}
