package pgdocker_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idemflowtest/pgdocker"
)

func TestMain(m *testing.M) {
	idemflowtest.MainWith(m, idemflowtest.Options{Fallback: pgdocker.Start})
}

// TestNoDaemon: with DOCKER_HOST at a socket nothing listens on, Start fails with
// ErrNoDaemon and returns no stop function.
func TestNoDaemon(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "none.sock"))
	url, stop, err := pgdocker.Start(context.Background(), nil)
	require.ErrorIs(t, err, pgdocker.ErrNoDaemon)
	require.Empty(t, url)
	require.Nil(t, stop)
}

// TestNewDB: with the fallback passed to MainWith, the kit gives a test its own
// migrated schema (here from TEST_DATABASE_URL or local server binaries when there are
// some, from a postgres:15 container when Docker is all the machine has).
func TestNewDB(t *testing.T) {
	db := idemflowtest.NewDB(t)
	var schema string
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT current_schema()`).Scan(&schema))
	require.Equal(t, db.Schema, schema)
}
