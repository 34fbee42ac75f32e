package reliability

import (
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestOutboxUnderKills runs the charges example's real HTTP server (whose finalize
// phase inserts a River receipt job in its own transaction: a transactional outbox) as
// two processes with their sweepers, sends patient clients' charges to either, and
// SIGKILLs a server at random moments (another is started in its place). Every key
// must end finished under the checker's invariants, and River must hold exactly one
// receipt job for every succeeded charge and none for any other: one job per
// committed finalize, however often finalize ran.
func TestOutboxUnderKills(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEnv(t, pgtest.New(t))
	flags := []string{"-sweeper=true", "-sweep-interval", "50ms", "-sweep-grace", "1ms", "-lease", "2s"}
	var mu sync.Mutex
	servers := []*server{env.startServerWith(t, flags), env.startServerWith(t, flags)}
	pick := func() string {
		mu.Lock()
		defer mu.Unlock()
		return servers[rand.IntN(len(servers))].url
	}
	client := &http.Client{Timeout: 10 * time.Second}
	clients := startPatients(4, "outbox", func(w, i int, key string) bool {
		req := request("acct", key, chargeflow.FlowName, int64(1+(w*7919+i*104729)%10000))
		return !env.postTo(t, client, pick(), req).Retryable
	})
	kills := 0
	until := time.Now().Add(time.Duration(scale(3, 20, 180)) * time.Second)
	for time.Now().Before(until) {
		pause(nil, 200*time.Millisecond, 600*time.Millisecond)
		i := rand.IntN(2)
		mu.Lock()
		victim := servers[i]
		mu.Unlock()
		require.NoError(t, syscall.Kill(victim.cmd.Process.Pid, syscall.SIGKILL))
		<-victim.done
		kills++
		next := env.startServerWith(t, flags)
		mu.Lock()
		servers[i] = next
		mu.Unlock()
	}
	keys, errs := clients.finish()
	waitUntil(t, 2*time.Minute, "the servers' sweepers finished every key", func() bool {
		var left int
		require.NoError(t, env.db.Pool.QueryRow(ctx, `SELECT count(*) FROM idemflow_keys WHERE status <> 'finished'`).Scan(&left))
		return left == 0
	})
	for _, s := range servers {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		<-s.done
	}
	r := env.check(t, checkOpts{keys: keys})
	require.Empty(t, errs)
	require.Positive(t, kills, "servers were killed")
	var succeeded, jobs, wrong int
	require.NoError(t, env.db.Pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM charges WHERE status = 'succeeded'),
			(SELECT count(*) FROM river_job WHERE kind = 'receipt'),
			(SELECT count(*) FROM charges c WHERE (SELECT count(*) FROM river_job j WHERE j.kind = 'receipt' AND j.args->>'charge_id' = c.id::text)
				<> CASE WHEN c.status = 'succeeded' THEN 1 ELSE 0 END)`).Scan(&succeeded, &jobs, &wrong))
	require.Zero(t, wrong, "charges whose receipt jobs are not one per committed finalize")
	require.Equal(t, succeeded, jobs, "one receipt job per succeeded charge, no other")
	t.Logf("outbox under kills: servers_killed=%d keys=%d succeeded_charges=%d receipt_jobs=%d duplicates=%d unfinished=%d %s",
		kills, len(keys), succeeded, jobs, r.DuplicateEffects+r.DuplicatePayments, r.Unfinished, r.History)
}
