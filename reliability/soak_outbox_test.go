package reliability

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The soak's outbox: the servers' finalize phase inserts a River receipt job in its
// own transaction and the workers mail it. A queue that falls behind grows for as long
// as the load lasts, with every other line green (the soaks of 2026-12-07 found one
// that way, by hand), so the soak samples the backlog, judges it against the load, and
// at the end lets the workers finish and checks one receipt per succeeded charge.

// outboxDrainFor is how long the workers get, after the load, to mail what is left.
const outboxDrainFor = 3 * time.Minute

// sqlOutboxBacklog counts the receipt jobs not yet finished (River sets finalized_at
// when a job completes, is cancelled or discarded).
const sqlOutboxBacklog = `SELECT count(*) FROM river_job WHERE kind = 'receipt' AND finalized_at IS NULL`

// outboxBacklog is the number of receipt jobs not yet worked (NaN if the query failed:
// River's table is made by the workers' start).
func (s *soak) outboxBacklog() float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int64
	if err := s.env.db.Pool.QueryRow(ctx, sqlOutboxBacklog).Scan(&n); err != nil {
		return math.NaN()
	}
	return float64(n)
}

// drainOutbox waits, the load over and the workers still running, until no receipt
// job is left, and returns how long that took. River's workers run in their own
// processes, so the database is polled: the wait is on the jobs' state, not on a clock.
func (s *soak) drainOutbox(t testing.TB) time.Duration {
	t.Helper()
	from := time.Now()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(outboxDrainFor)
	for {
		left := s.outboxBacklog()
		if left == 0 {
			return time.Since(from)
		}
		select {
		case <-tick.C:
		case <-deadline:
			require.FailNow(t, "the outbox did not drain", "%v receipt jobs left %s after the load", left, outboxDrainFor)
		}
	}
}

// requireReceipts checks, once the outbox drained, that every succeeded charge has
// exactly one receipt job and every other charge none, that no job is left unworked,
// and that every receipt was mailed (by its key: a mail sent twice under one key is
// the at-least-once a mail service dedupes, and is reported).
func (s *soak) requireReceipts(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var succeeded, jobs, unfinished, wrong int64
	require.NoError(t, s.env.db.Pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM charges WHERE status = 'succeeded'),
			(SELECT count(*) FROM river_job WHERE kind = 'receipt'),
			(SELECT count(*) FROM river_job WHERE kind = 'receipt' AND state <> 'completed'),
			(SELECT count(*) FROM (
				SELECT c.status, count(j.id) AS n FROM charges c
				LEFT JOIN river_job j ON j.kind = 'receipt' AND j.args->>'charge_id' = c.id::text
				GROUP BY c.id, c.status) x
			 WHERE n <> CASE WHEN status = 'succeeded' THEN 1 ELSE 0 END)`).
		Scan(&succeeded, &jobs, &unfinished, &wrong))
	mailed, repeats := s.mailedKeys()
	t.Logf("soak outbox: succeeded_charges=%d receipt_jobs=%d not_completed=%d charges_with_wrong_jobs=%d receipts_mailed=%d (distinct keys) mails_repeated=%d",
		succeeded, jobs, unfinished, wrong, mailed, repeats)
	require.Zero(t, wrong, "charges whose receipt jobs are not one per succeeded charge")
	require.Equal(t, succeeded, jobs, "one receipt job per succeeded charge, no other")
	require.Zero(t, unfinished, "receipt jobs not completed after the drain")
	require.Equal(t, succeeded, mailed, "a receipt mailed for every succeeded charge")
}

// outboxLine is the backlog's pass line: the largest backlog sampled in the last
// quarter, in seconds of the load's submissions over that quarter. A queue that keeps
// up holds a second or two (the workers poll every 100 ms); one that falls behind grows
// by the run's length.
func outboxLine(cfg soakConfig, samples *csvTable, end float64) passLine {
	from := 3 * end / 4
	worst := 0.0
	for _, v := range samples.between("outbox_backlog", from, end+1) {
		worst = max(worst, v)
	}
	sub := samples.between("submitted", from, end+1)
	rate := math.NaN()
	if len(sub) > 1 {
		rate = (sub[len(sub)-1] - sub[0]) / (end - from)
	}
	return passLine{
		Name:  fmt.Sprintf("receipt outbox backlog, largest in the last quarter (%.0f jobs), in seconds of submissions (%.1f/s)", worst, rate),
		Value: worst / rate, Limit: 30, Enforced: cfg.full,
	}
}

// TestOutboxLine: the backlog line passes a queue that keeps up and fails one that
// grows with the run (the shape of the soaks of 2026-12-07, whose two workers mailed 39
// receipts a second against 69 charges).
func TestOutboxLine(t *testing.T) {
	t.Parallel()
	table := func(backlog func(ts float64) float64) *csvTable {
		tb := &csvTable{cols: map[string]int{"t_s": 0, "submitted": 1, "outbox_backlog": 2}}
		for ts := 0.0; ts <= 3600; ts += 5 {
			tb.rows = append(tb.rows, []float64{ts, 100 * ts, backlog(ts)})
		}
		return tb
	}
	cfg := soakConfig{full: true}
	keepsUp := outboxLine(cfg, table(func(float64) float64 { return 150 }), 3600)
	require.True(t, keepsUp.pass(), "%s", keepsUp)
	require.InDelta(t, 1.5, keepsUp.Value, 1e-9, "150 jobs at 100 submissions a second")
	behind := outboxLine(cfg, table(func(ts float64) float64 { return 30 * ts }), 3600)
	require.False(t, behind.pass(), "%s", behind)
	require.True(t, behind.Enforced)
}
