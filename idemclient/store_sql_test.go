package idemclient_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemclient"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// pendingKeysSchema is the SQL store example's table: one row per pending operation.
// Keep it in the database that records what the operations are for, so that the two
// are lost, or restored, together.
const pendingKeysSchema = `
CREATE TABLE IF NOT EXISTS idemclient_pending (
	op         text PRIMARY KEY,
	key        text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now()
)`

// sqlStore is an idemclient.Store in a Postgres table, written with pgx: an example to
// copy. db is a pool, a connection or a transaction: run PutIfAbsent in the
// transaction that records the operation and the key commits with it.
type sqlStore struct {
	db interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	}
}

// PutIfAbsent is one statement. ON CONFLICT DO UPDATE, rather than DO NOTHING and a
// second SELECT, returns the row a concurrent caller inserted first (a SELECT in the
// same statement would not see it).
func (s sqlStore) PutIfAbsent(ctx context.Context, op, key string) (string, error) {
	var saved string
	err := s.db.QueryRow(ctx, `
		INSERT INTO idemclient_pending (op, key) VALUES ($1, $2)
		ON CONFLICT (op) DO UPDATE SET key = idemclient_pending.key
		RETURNING key`, op, key).Scan(&saved)
	if err != nil {
		return "", fmt.Errorf("save pending key: %w", err)
	}
	return saved, nil
}

func (s sqlStore) Delete(ctx context.Context, op string) error {
	if _, err := s.db.Exec(ctx, `DELETE FROM idemclient_pending WHERE op = $1`, op); err != nil {
		return fmt.Errorf("forget pending key: %w", err)
	}
	return nil
}

// TestSQLStore runs the store checks on sqlStore in a real Postgres, each handle on a
// pool of its own, as two processes would have.
func TestSQLStore(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	_, err := db.Pool.Exec(context.Background(), pendingKeysSchema)
	require.NoError(t, err)
	storeTests(t, func(t *testing.T) idemclient.Store { return sqlStore{db: db.NewPool(t)} })
}
