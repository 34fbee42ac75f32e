package pgtest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// SQLKeyStatesBroken selects, from the key table of the connection's schema, the rows
// that break the rules migration 004 took out of the table's CHECK constraints and left
// to the engine's statements: a finished row carries its whole response (a status of
// 100-499, headers, a body, finished_at) and no lease; an unfinished one carries no
// response and no finished_at. It mirrors the dropped constraints exactly, NULLs
// included (a CHECK passes on NULL): only a row whose rule is false is selected.
const SQLKeyStatesBroken = `SELECT scope || ' ' || idempotency_key || ' ' || status FROM idemflow_keys
WHERE ((status = 'finished'
		AND recovery_point = 'finished'
		AND response_status BETWEEN 100 AND 499
		AND response_headers IS NOT NULL
		AND response_body IS NOT NULL
		AND finished_at IS NOT NULL
		AND locked_until IS NULL)
	OR (status <> 'finished'
		AND response_status IS NULL
		AND response_body IS NULL
		AND finished_at IS NULL)) IS FALSE
ORDER BY 1 LIMIT 10`

// CheckKeyStates returns an error naming the key rows of url's schema that break the
// state rules (SQLKeyStatesBroken), or nil when there are none or the schema has no
// key table (a test that removed it).
func CheckKeyStates(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("pgtest: check key states: %w", err)
	}
	defer conn.Close(context.Background()) //nolint:errcheck // the check's result is what matters
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('idemflow_keys') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("pgtest: check key states: %w", err)
	}
	if !exists {
		return nil
	}
	rows, err := conn.Query(ctx, SQLKeyStatesBroken)
	if err != nil {
		return fmt.Errorf("pgtest: check key states: %w", err)
	}
	broken, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("pgtest: check key states: %w", err)
	}
	if len(broken) > 0 {
		return fmt.Errorf("pgtest: key rows in an inconsistent state (finished without its whole response or with a lease, or a response on an unfinished row): %s",
			strings.Join(broken, "; "))
	}
	return nil
}

// checkStatesAtEnd registers CheckKeyStates on db to run when t ends, before the pool
// is closed and the schema dropped. A test that leaves such a row on purpose removes
// it before it ends.
func checkStatesAtEnd(t testing.TB, db *DB) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := CheckKeyStates(ctx, db.URL); err != nil {
			t.Error(err)
		}
	})
}
