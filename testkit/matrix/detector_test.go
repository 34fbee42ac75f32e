package matrix

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestDetector: the detector a cell relies on can fail. A session of a cell's engine
// pool that only prepares (Parses) a statement on the user's table while the test
// holds ACCESS EXCLUSIVE on it is reported; so is one that waits on a lock held by a
// session idle in a transaction (as a held winner is).
func TestDetector(t *testing.T) {
	t.Parallel()
	r := newRig(t, cell{shape: shapeTx, layout: layoutPlain, mode: pgx.QueryExecModeCacheStatement, crash: crashNone})
	e := r.newEngine("a")

	l := r.lockTable("m_effects", "ACCESS EXCLUSIVE")
	parsed := make(chan error, 1)
	go func() {
		conn, err := e.pool.Acquire(r.ctx)
		if err == nil {
			_, err = conn.Conn().Prepare(r.ctx, "", r.deps.insert) // a Parse and nothing else
			conn.Release()
		}
		parsed <- err
	}()
	var v violations
	r.waitFor("the detector to report the Parse", func() bool {
		r.observe(nil, map[*locker]string{l: "a Parse"}, &v)
		return len(v.list) > 0
	})
	require.Contains(t, v.list[0], "a Parse: INSERT INTO")
	l.release(t)
	require.NoError(t, <-parsed)

	owner, err := e.pool.Begin(r.ctx)
	require.NoError(t, err)
	defer owner.Rollback(context.Background())
	_, err = owner.Exec(r.ctx, `SELECT pg_advisory_xact_lock(1, 2)`)
	require.NoError(t, err)
	waited := make(chan error, 1)
	go func() {
		_, err := e.pool.Exec(r.ctx, `SELECT pg_advisory_xact_lock(1, 2)`)
		waited <- err
	}()
	v = violations{}
	r.waitFor("the detector to report the wait", func() bool {
		r.observe(nil, nil, &v)
		return len(v.list) > 0
	})
	require.True(t, strings.HasPrefix(v.list[0], "an attempt waits on a lock held by the key's owner"), v.list[0])
	require.NoError(t, owner.Rollback(r.ctx))
	require.NoError(t, <-waited)
}
