package reliability

import (
	"context"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestDatabaseFaults runs continuous load while backends are terminated at random
// (pg_terminate_backend), COMMIT acknowledgements are lost (the fault proxy cuts the
// connection after the server committed), and, for a while, the database refuses every
// new connection while all the engine's connections are terminated. Backs invariants 1,
// 3, 5 and 6: a commit whose outcome the client never learned is resolved by reading
// the key, never redone or lost.
func TestDatabaseFaults(t *testing.T) {
	t.Parallel()
	testDatabaseFaults(t, newEnv(t, pgtest.New(t)).withSide(t))
}

// TestDatabaseFaultsPartitioned is TestDatabaseFaults on a key table partitioned by the
// day (partition_test.go): its sweeper's passes maintain the partitions meanwhile.
func TestDatabaseFaultsPartitioned(t *testing.T) {
	t.Parallel()
	testDatabaseFaults(t, newPartitionedEnv(t).withSide(t))
}

// TestDatabaseFaultsPipelined is TestDatabaseFaults with the flows' pipelined tx
// phases (pipelined_test.go): a lost COMMIT acknowledgement or a terminated backend
// lands in the round trip that carries the claim or the fence, the statements, the key
// row's write and COMMIT, or between a two-round-trip phase's round trips.
func TestDatabaseFaultsPipelined(t *testing.T) {
	t.Parallel()
	testDatabaseFaults(t, newEnv(t, pgtest.New(t)).withSide(t).withPipelined(t))
}

// testDatabaseFaults is TestDatabaseFaults on env.
func testDatabaseFaults(t *testing.T, env *env) {
	proxy := env.proxy()
	cfg := &workflow.Config{Lease: 2 * time.Second, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second}
	en := env.engine(env.pool(poolOpts{via: proxy, connectTimeout: 2 * time.Second}), cfg)
	sw := env.sweeper(en, &workflow.SweeperConfig{Interval: 100 * time.Millisecond, MaxAttempts: 1000})
	require.NoError(t, sw.Start(context.Background()))
	l := env.startLoad(en, loadOpts{workers: tier(4, 8), prefix: "dbfaults", attemptTimeout: 5 * time.Second})
	probeConfig, err := pgx.ParseConfig(env.db.URL)
	require.NoError(t, err)
	host, port, err := net.SplitHostPort(proxy.Addr())
	require.NoError(t, err)
	pn, _ := strconv.Atoi(port)
	probeConfig.Host, probeConfig.Port = host, uint16(pn)
	probeConfig.TLSConfig, probeConfig.Fallbacks = nil, nil

	ctx := context.Background()
	events := scale(40, 400, 3000)
	terminated, armedAcks := 0, 0
	stop := make(chan struct{})
	// One refusal window half way (every 500 events in the nightly tier).
	refuseEvery := scale(events/2, events/2, 500)
	for i := range events {
		require.True(t, pause(stop, 20*time.Millisecond, 120*time.Millisecond))
		if i > 0 && i%refuseEvery == 0 {
			// The database refuses connections for a while, and every connection the
			// engine had is cut: nothing gets through until it accepts again.
			proxy.Refuse(true)
			n, err := env.terminate(ctx, 1000)
			require.NoError(t, err)
			terminated += n
			refusedAt := time.Now()
			// A client of its own knocks too, so that the refusal is observed
			// whatever the load is doing.
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			probe, err := pgx.ConnectConfig(pctx, probeConfig)
			cancel()
			if err == nil {
				_ = probe.Close(ctx)
			}
			require.Error(t, err, "a refused connection")
			pause(stop, time.Duration(tier(1000, 3000))*time.Millisecond-time.Since(refusedAt), 0)
			proxy.Refuse(false)
			continue
		}
		switch {
		case rand.IntN(2) == 0:
			n, err := env.terminate(ctx, 1)
			require.NoError(t, err)
			terminated += n
		case proxy.CommitDropsArmed() == 0: // one lost acknowledgement at a time
			proxy.DropNextCommitAck()
			armedAcks++
		}
	}
	drain := l.finish(t)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	require.NoError(t, sw.Stop(sctx))
	cancel()

	keys := l.submitted()
	r := env.check(t, checkOpts{keys: keys})
	require.Positive(t, terminated, "backends were terminated")
	require.Positive(t, proxy.Dropped(), "commit acknowledgements were lost")
	require.Positive(t, proxy.Refused(), "connections were refused")
	t.Logf("database faults: commit_ack_drops_armed=%d backends_terminated=%d commit_acks_lost=%d connections_refused=%d keys=%d attempts=%d drain=%s longest_attempt=%s duplicates=%d unfinished=%d",
		armedAcks, terminated, proxy.Dropped(), proxy.Refused(), len(keys), l.attempts.Load(), drain.Round(time.Millisecond),
		l.maxAttempt().Round(time.Millisecond), r.DuplicateEffects+r.DuplicatePayments+r.DuplicateRows, r.Unfinished)
}
