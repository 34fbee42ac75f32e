package reliability

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// settleBound is the longest deadline the engine gives a statement of its own that
// runs after the caller's context ended (re-reading a key whose commit outcome is
// unknown, releasing a key): workflow's settle timeouts.
const settleBound = 10 * time.Second

// stuckLimit is how long an attempt or a sweeper pass may run before a test calls it
// stuck for good. It measures none of the engine's bounds: those are checked on the
// deadlines its statements carry (deadlines), which a slow machine does not change.
// It is only a backstop against a hang, far above any bound, so that a loaded machine
// (CI runs every package at once on two cores) cannot reach it.
const stuckLimit = 2 * time.Minute

// deadlines is a pgx tracer for an engine pool: it records, for every statement the
// pool sends and every connection it hands out, whether its context had a deadline and
// how far away it was. Nothing can wait on the database longer than its context's
// deadline, so "every wait had a deadline, none further than X" bounds every attempt
// by X per wait, whatever the machine's speed. Waits whose context carries
// untracedKey (a test's own) are not recorded.
type deadlines struct {
	mu       sync.Mutex
	none     []string      // the waits that had no deadline
	furthest time.Duration // the furthest deadline a wait had, from its start
	waits    int
}

type untracedKey struct{}

// untraced marks ctx as a test's own: deadlines does not record its waits.
func untraced(ctx context.Context) context.Context {
	return context.WithValue(ctx, untracedKey{}, true)
}

func (d *deadlines) record(ctx context.Context, what string) {
	if ctx.Value(untracedKey{}) != nil {
		return
	}
	at, ok := ctx.Deadline()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.waits++
	if !ok {
		d.none = append(d.none, what)
		return
	}
	d.furthest = max(d.furthest, time.Until(at))
}

// TraceQueryStart records a statement (Begin, Commit and Rollback are statements too).
func (d *deadlines) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	sql, _, _ := strings.Cut(strings.TrimSpace(data.SQL), "\n")
	d.record(ctx, sql)
	return ctx
}

func (d *deadlines) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceAcquireStart records a wait for a pooled connection.
func (d *deadlines) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	d.record(ctx, "acquire a connection")
	return ctx
}

func (d *deadlines) TraceAcquireEnd(context.Context, *pgxpool.Pool, pgxpool.TraceAcquireEndData) {}

// reset forgets what was recorded.
func (d *deadlines) reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.none, d.furthest, d.waits = nil, 0, 0
}

// requireWithin checks that every wait recorded had a deadline at most bound away.
func (d *deadlines) requireWithin(t testing.TB, bound time.Duration) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	require.Positive(t, d.waits, "no wait on the database was recorded")
	require.Empty(t, d.none, "waits on the database with no deadline: nothing bounds them")
	require.LessOrEqual(t, d.furthest, bound, "a wait on the database had a deadline further than %s", bound)
}

func (d *deadlines) String() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return fmt.Sprintf("waits=%d without_deadline=%d furthest_deadline=%s", d.waits, len(d.none), d.furthest.Round(time.Millisecond))
}
