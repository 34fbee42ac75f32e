package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// manyKeys is how many stuck keys TestTwoSweepersManyKeys makes, over manyScopes
// scopes (on Citus, over every worker's shards).
const manyKeys, manyScopes = 1000, 100

// TestTwoSweepersManyKeys: keys stuck across many scopes are finished by two sweepers
// of two engines on two pools, running at once, each key taken once and paid once.
// With IDEMFLOW_TEST_CITUS the keys are spread over both workers' shards, and only the
// per-key scan runs (Citus refuses the single statements).
func TestTwoSweepersManyKeys(t *testing.T) {
	t.Parallel()
	for name, scan := range map[string]workflow.Scan{"Single": workflow.ScanSingle, "PerKey": workflow.ScanPerKey} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if scan == workflow.ScanSingle && pgtest.CitusMode() {
				t.Skip("skipped: Citus refuses the single statements (ctid) on a distributed key table")
			}
			twoSweepers(t, scan)
		})
	}
}

func twoSweepers(t *testing.T, scan workflow.Scan) {
	ctx := context.Background()
	var taken [2]sweptKeys
	b := setup(t, setupOpts{engine: &workflow.Config{Scan: scan, AdmitWait: -1, Hooks: workflow.Hooks{Key: taken[0].hook}}})
	manyStuckKeys(t, b)

	cfg := (&workflow.Config{Scan: scan, Hooks: workflow.Hooks{Key: taken[1].hook}}).WithDefaults()
	other, err := workflow.New(b.db.NewPool(t), cfg)
	require.NoError(t, err)
	require.NoError(t, registerFlows(other, b.provider.URL, nil))
	swCfg := &sweeper.Config{BatchSize: 50, Concurrency: 8, Grace: -1}
	sweepAtOnce(t, [2]*engineSweeper{b.newSweeper(t, swCfg), sweeperOf(t, other, swCfg)}, swCfg.BatchSize)

	both := map[string]int{}
	for i := range taken {
		require.NotZero(t, taken[i].len(), "sweeper %d took no key", i)
		for k, n := range taken[i].seen() {
			both[k] += n
		}
	}
	t.Logf("sweeper 0 took %d keys, sweeper 1 took %d", taken[0].len(), taken[1].len())
	require.Len(t, both, manyKeys)
	for k, n := range both {
		require.Equal(t, 1, n, "key %s was taken %d times", k, n)
	}
	var unfinished, ledger, settled int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys WHERE status <> 'finished'`).Scan(&unfinished))
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(DISTINCT (scope, idem_key)), (SELECT count(*) FROM settlements) FROM ledger`).Scan(&ledger, &settled))
	require.Zero(t, unfinished)
	require.Equal(t, manyKeys, ledger, "one ledger row a key")
	require.Equal(t, manyKeys, settled, "one settlement a key")
	require.Equal(t, manyKeys, b.provider.Made(), "one payment a key")
}

// manyStuckKeys makes manyKeys keys over manyScopes scopes stuck at the pay phase, and
// due. The keys are made by 16 attempts at once that admission lets wait as long as it
// takes (the engine's AdmitWait -1): on a loaded machine they may otherwise be shed as
// overloaded, which is not what the test is about.
func manyStuckKeys(t *testing.T, b *bundle) {
	t.Helper()
	b.fail.setAll(func(_, phase string) bool { return phase == testflow.Pay })
	var wg sync.WaitGroup
	errs := make([]error, manyKeys)
	slots := make(chan struct{}, 16)
	for i := range manyKeys {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer func() { <-slots; wg.Done() }()
			req := chargeReq(fmt.Sprintf("k%04d", i))
			req.Scope = fmt.Sprintf("acct-%03d", i%manyScopes)
			if _, err := b.engine.Do(context.Background(), req); !errors.Is(err, workflow.ErrTransient) {
				errs[i] = fmt.Errorf("key %s: want a transient failure, got %v", req.Key, err)
			}
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	b.fail.setAll(nil)
	testflow.Sweepable(t, b.db.Pool)
	if pgtest.CitusMode() {
		requireOnEveryWorker(t, b.db)
	}
}

// sweepAtOnce runs a pass of both sweepers at once, pass after pass, until a pass of
// each takes nothing, requiring every key taken to be finished.
func sweepAtOnce(t *testing.T, sweepers [2]*engineSweeper, batch int) {
	t.Helper()
	for pass := 0; ; pass++ {
		require.Less(t, pass, 4*manyKeys/batch, "the sweepers stopped making progress")
		var stats [2]sweeper.Stats
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, s := range sweepers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				stats[i], errs[i] = s.RunOnce(context.Background())
			}()
		}
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
		require.Equal(t, stats[0].Taken, stats[0].Finished, "every key taken is finished")
		require.Equal(t, stats[1].Taken, stats[1].Finished, "every key taken is finished")
		if stats[0].Taken == 0 && stats[1].Taken == 0 {
			break
		}
	}
}

// sweptKeys counts the OutcomeSwept events of one engine by scope and key.
type sweptKeys struct {
	mu   sync.Mutex
	keys map[string]int
}

func (s *sweptKeys) hook(_ context.Context, e workflow.KeyEvent) {
	if e.Kind != workflow.OutcomeSwept {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[string]int{}
	}
	s.keys[e.Scope+"/"+e.Key]++
}

func (s *sweptKeys) seen() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.keys))
	for k, n := range s.keys {
		out[k] = n
	}
	return out
}

func (s *sweptKeys) len() int { return len(s.seen()) }

// requireOnEveryWorker checks that the keys of db's schema have rows on the shards of
// more than one worker.
func requireOnEveryWorker(t *testing.T, db *pgtest.DB) {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
		SELECT n.nodename || ':' || n.nodeport, count(*)
		FROM (SELECT get_shard_id_for_distribution_column('idemflow_keys', scope) AS shard FROM idemflow_keys) k
		JOIN pg_dist_placement p ON p.shardid = k.shard
		JOIN pg_dist_node n ON n.groupid = p.groupid
		GROUP BY 1 ORDER BY 1`)
	require.NoError(t, err)
	perNode := map[string]int{}
	for rows.Next() {
		var node string
		var n int
		require.NoError(t, rows.Scan(&node, &n))
		perNode[node] = n
	}
	require.NoError(t, rows.Err())
	t.Logf("keys per worker: %v", perNode)
	require.Len(t, perNode, 2, "the keys are on both workers")
}
