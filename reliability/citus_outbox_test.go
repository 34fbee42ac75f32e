package reliability

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

type noteArgs struct {
	N int `json:"n"`
}

func (noteArgs) Kind() string { return "note" }

type noteWorker struct {
	river.WorkerDefaults[noteArgs]
	done chan int
}

func (w *noteWorker) Work(_ context.Context, job *river.Job[noteArgs]) error {
	w.done <- job.Args.N
	return nil
}

// TestRiverBesideLocalOutbox is docs/SCALING.md's outbox on Citus with real River: a
// phase-like transaction writes the key row (on a worker), an outbox row (a Citus
// local table, DistributeOptions.Local) and a River job with InsertTx (River's tables
// stay plain tables on the coordinator); River's client then works the job from the
// coordinator. The outbox write is what makes Citus commit the whole transaction with
// two-phase commit (TestCitusCoordinatorTableCommit).
func TestRiverBesideLocalOutbox(t *testing.T) {
	t.Parallel()
	pgtest.SkipUnlessCitus(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db := pgtest.New(t) // key table distributed
	rm, err := rivermigrate.New(riverpgxv5.New(db.Pool), &rivermigrate.Config{Schema: db.Schema})
	require.NoError(t, err)
	for { // one migration a transaction: a later one uses an enum value an earlier one adds
		res, err := rm.Migrate(ctx, rivermigrate.DirectionUp, &rivermigrate.MigrateOpts{MaxSteps: 1})
		require.NoError(t, err)
		if len(res.Versions) == 0 {
			break
		}
	}
	_, err = db.Pool.Exec(ctx, `CREATE TABLE outbox (id bigint PRIMARY KEY, scope text NOT NULL)`)
	require.NoError(t, err)
	require.NoError(t, migrations.Distribute(ctx, db.Pool, &migrations.DistributeOptions{Local: []string{"outbox"}}))
	var riverInMetadata int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid
		WHERE c.relnamespace = current_schema()::regnamespace AND c.relname LIKE 'river%'`).Scan(&riverInMetadata))
	require.Zero(t, riverInMetadata, "River's tables stay plain")

	workers := river.NewWorkers()
	w := &noteWorker{done: make(chan int, 1)}
	river.AddWorker(workers, w)
	client, err := river.NewClient(riverpgxv5.New(db.Pool), &river.Config{Schema: db.Schema, Workers: workers,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}}, FetchPollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO idemflow_keys (scope, idempotency_key, id, flow, method, route, fingerprint, request_body)
			VALUES ('acct-1', 'k1', gen_random_uuid(), 'f', 'POST', '/r', sha256('{}'::bytea), '{}'::bytea)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, scope) VALUES (7, 'acct-1')`); err != nil {
			return err
		}
		_, err := client.InsertTx(ctx, tx, noteArgs{N: 7}, nil)
		return err
	}))
	require.NoError(t, client.Start(ctx))
	t.Cleanup(func() { _ = client.Stop(context.Background()) })
	select {
	case n := <-w.done:
		require.Equal(t, 7, n)
	case <-ctx.Done():
		t.Fatal("River never worked the job")
	}
}
