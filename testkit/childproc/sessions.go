package childproc

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier reads one row; a pool or a connection.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// WaitSessionsGone polls pg_stat_activity (the server has no hook for it) on a ticker
// until no session whose application_name is app is left: the server noticed that a
// killed child's connections closed and ended their transactions. Until then a dead
// child's claim lock can still turn a retry away. It fails the test after 30s.
func WaitSessionsGone(t testing.TB, db Querier, app string) {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		if err := db.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			t.Fatalf("childproc: count sessions of %s: %v", app, err)
		}
		if n == 0 {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("childproc: the sessions of %s did not end within 30s", app)
		case <-tick.C:
		}
	}
}
