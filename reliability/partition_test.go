package reliability

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// The experiments on the partitioned key table (docs/PARTITIONS.md): the fault suites
// run on a key table partitioned by the day (TestNetworkFaults' partitioned_ cases,
// TestDatabaseFaultsPartitioned), and the checker looks for duplicate (scope, key)
// rows, which only the claim lock prevents on this layout.

// newPartitionedEnv is newEnv on a fresh schema whose key table is partitioned by the
// day, partitions a week ahead; the audit trigger is created on the partitioned table.
func newPartitionedEnv(t testing.TB) *env {
	t.Helper()
	if pgtest.CitusMode() {
		t.Skip("skipped: this suite is built for plain PostgreSQL; on Citus TestPartitionsUnderTraffic covers the layout (docs/PARTITIONS.md)")
	}
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, store.New().SetupPartitioned(ctx, db.Pool, store.PartitionDay, 0))
	return newEnv(t, db)
}

// newEnvOf is newEnv, or newPartitionedEnv when partitioned.
func newEnvOf(t testing.TB, partitioned bool) *env {
	t.Helper()
	if partitioned {
		return newPartitionedEnv(t)
	}
	return newEnv(t, pgtest.New(t))
}

// TestCheckerCatchesDuplicateRows: on the partitioned layout a second row for a key
// can be inserted by anything that skips the claim lock (its primary key includes
// created_at); the checker reports it.
func TestCheckerCatchesDuplicateRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newPartitionedEnv(t)
	en := env.engine(env.pool(poolOpts{}), nil)
	a := request("acct", "a", chargeflow.FlowName, 100)
	_, err := env.do(ctx, en, a)
	require.NoError(t, err)
	clean := env.check(&captureTB{TB: t}, checkOpts{keys: [][2]string{{"acct", "a"}}})
	require.Empty(t, clean.Violations)

	// The same key again, a microsecond later (same partition), without the claim lock.
	_, err = env.db.Pool.Exec(ctx, `INSERT INTO idemflow_keys
	(scope, idempotency_key, id, flow, method, route, fingerprint, request_body, created_at)
SELECT scope, idempotency_key, gen_random_uuid(), flow, method, route, fingerprint, '', created_at + interval '1 microsecond'
FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = 'a'`)
	require.NoError(t, err)
	c := &captureTB{TB: t}
	r := env.check(c, checkOpts{keys: [][2]string{{"acct", "a"}}})
	require.NotEmpty(t, c.errors, "the checker reported the violation")
	require.Equal(t, 1, r.DuplicateRows)
}
