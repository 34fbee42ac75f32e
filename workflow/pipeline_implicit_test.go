package workflow_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// The tests in this file hold a pipelined phase sent in one round trip, as an
// implicit transaction (no BEGIN, no COMMIT; on a plain key table a new key's row
// inserted right after the claim lock), to what an explicit transaction gave: an
// error anywhere rolls everything back, the claim holds whatever the session's default
// isolation level, and a commit whose answer was lost is resolved.

// pipeInsertIso is a statement of the user's that records the isolation level its
// transaction runs at, as its phase.
const pipeInsertIso = `INSERT INTO pipe_effects (scope, idem_key, phase, n)
	VALUES ($1, $2, current_setting('transaction_isolation'), $3)`

// isoFlow: two pipelined phases, one round trip each (no result read): "first" inserts
// a row and goes on, "second" inserts another and answers. A new key's first phase is
// the claim lock, the key row's insert and the statement; the second is the fence, the
// statement and the finish.
func isoFlow() phases.Flow {
	return phases.Flow{Name: "iso", Phases: []phases.Phase{
		phases.Pipelined("first", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			p.Queue(pipeInsertIso, run.Scope(), run.Key(), 1)
			return nil, nil
		}),
		phases.Pipelined("second", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			p.Queue(pipeInsertIso, run.Scope(), run.Key(), 2)
			return phases.JSON(http.StatusCreated, map[string]string{"key": run.Key()})
		}),
	}}
}

// TestPipelinedImplicitRollsBack: a phase whose statement after the key row's insert
// fails (its CHECK refuses it) leaves nothing: no key row, no effect, though the
// server ran both statements (the sequence says so). No BEGIN was sent, but on Citus,
// where a pipeline without BEGIN is no transaction across nodes (the worker committed
// the key row's insert on its own: keytable's SendExplicit), one was. In every query
// exec mode.
func TestPipelinedImplicitRollsBack(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := pipeSetup(t, mode, "")
			insert := `INSERT INTO pipe_effects (scope, idem_key, phase, n) VALUES ($1, $2, 'only', $3)`
			require.NoError(t, b.engine.Register(phases.Flow{Name: "fails_late", Phases: []phases.Phase{
				phases.Pipelined("only", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
					p.Queue(insert, run.Scope(), run.Key(), 1)
					p.Queue(insert, run.Scope(), run.Key(), -1) // the CHECK refuses it
					return phases.JSON(http.StatusCreated, "never")
				}),
			}}))
			req := pipeReq("late", `{}`)
			req.Flow = "fails_late"
			begins := b.trips.begins.Load()
			_, err := b.engine.Do(context.Background(), req)
			require.Error(t, err)
			require.EqualValues(t, 2, seqRuns(t, b.db), "both inserts ran, the second refused by its CHECK")
			require.Zero(t, countKeysOf(t, b, "late"), "the key row's insert rolled back")
			var n int
			require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pipe_effects`).Scan(&n))
			require.Zero(t, n, "the first insert rolled back")
			wantBegins := 0
			if pgtest.CitusMode() {
				wantBegins = 1
			}
			require.EqualValues(t, wantBegins, b.trips.begins.Load()-begins, "BEGIN only on Citus")
		})
	}
}

// TestPipelinedIsolationDefault: on a database whose default isolation level is
// READ COMMITTED (the phases go as implicit transactions), REPEATABLE READ or
// SERIALIZABLE, on a plain key table and a partitioned one (whose claim keeps its check
// that no row exists), racing copies of each key make one effect per phase, and every
// statement of a pipelined phase ran at READ COMMITTED: at another level the first
// batch sent as an implicit transaction found it and raised before anything of it ran,
// and the engine sends BEGIN ISOLATION LEVEL READ COMMITTED from then on.
func TestPipelinedIsolationDefault(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		iso         string
		partitioned bool
	}{{"read committed", false}, {"repeatable read", false}, {"serializable", false}, {"read committed", true}, {"repeatable read", true}} {
		name := c.iso
		if c.partitioned {
			name += " partitioned"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testPipelinedIsolationDefault(t, c.iso, c.partitioned)
		})
	}
}

func testPipelinedIsolationDefault(t *testing.T, iso string, partitioned bool) {
	if partitioned && pgtest.CitusMode() {
		t.Skip("skipped on Citus: the partitioned layout is not addressed by name there")
	}
	ctx := context.Background()
	db := pgtest.NewDatabase(t)
	_, err := db.Pool.Exec(ctx, pipeSchema+`ALTER DATABASE `+pgx.Identifier{dbName(t, db)}.Sanitize()+
		` SET default_transaction_isolation = '`+iso+`'`)
	require.NoError(t, err)
	if partitioned {
		require.NoError(t, store.New().SetupPartitioned(ctx, db.Pool, store.PartitionDay, 0))
	}
	b := pipeSetupOn(t, &pipeBundle{db: db, trips: &tripCounter{}}, pgx.QueryExecModeCacheStatement, db.URL)
	var got string
	require.NoError(t, b.pool.QueryRow(ctx, `SHOW default_transaction_isolation`).Scan(&got))
	require.Equal(t, iso, got, "the engine's sessions start at the database's default")
	require.NoError(t, b.engine.Register(isoFlow()))
	const keys, copies = 4, 8
	raceKeys(t, b, keys, copies)
	rows, err := b.pool.Query(ctx, `SELECT idem_key, n, phase FROM pipe_effects ORDER BY 1, 2`)
	require.NoError(t, err)
	effects, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Key   string
		N     int64
		Phase string
	}])
	require.NoError(t, err)
	require.Len(t, effects, 2*keys, "one effect per phase and key")
	for i, r := range effects {
		require.Equal(t, fmt.Sprintf("iso%d", i/2), r.Key)
		require.EqualValues(t, i%2+1, r.N)
		require.Equal(t, "read committed", r.Phase, "the level the phase's statement ran at")
	}
	require.EqualValues(t, 2*keys, seqRuns(t, b.db), "no loser ran a statement of the phase")
}

// raceKeys sends copies of each of keys keys of isoFlow at once, and then each key
// once more: the answer is the stored one.
func raceKeys(t *testing.T, b *pipeBundle, keys, copies int) {
	t.Helper()
	ctx := context.Background()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range keys {
		for range copies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				req := pipeReq(fmt.Sprintf("iso%d", k), `{}`)
				req.Flow = "iso"
				_, _ = b.engine.Do(ctx, req) // losers answer as they may: the effects are checked
			}()
		}
	}
	close(start)
	wg.Wait()
	for k := range keys {
		req := pipeReq(fmt.Sprintf("iso%d", k), `{}`)
		req.Flow = "iso"
		res, err := b.engine.Do(ctx, req)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, res.Response.Status)
	}
}
