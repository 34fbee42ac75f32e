package reliability

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The soak: hours of steady traffic through two `charges serve` processes while two
// `charges worker` processes sweep and delete finished keys after a retention window
// of minutes, and a server is SIGKILLed and restarted every few minutes. It samples
// every process's live heap and goroutines (CHARGES_STATS_EVERY), the key table and
// its indexes, and the latency of fresh requests and replays beside an interleaved
// bare control (serve -bare-control), writes the samples to CSV files, computes its
// pass lines from those files, and draws them (soak.svg). At the end every key must
// have one effect and a final answer, and the checker and the history checker must
// find nothing.
//
// IDEMFLOW_SOAK=1 runs it for IDEMFLOW_SOAK_DURATION (default 1h) and enforces every
// pass line; IDEMFLOW_SOAK_OUT names the directory of its files (default: a new
// directory under the system's temporary directory, logged). Without IDEMFLOW_SOAK
// the quick tier runs it for 90 s with two kills (150 s on the partitioned layout) and
// asserts only what does not depend on the machine's speed (see soakLines.enforce).
// IDEMFLOW_SOAK_LAYOUT chooses the key table's layout (soakLayouts: plain, by default
// in the full soak, or partitioned; the quick tier runs both unless told).
const (
	envSoak         = "IDEMFLOW_SOAK"
	envSoakDuration = "IDEMFLOW_SOAK_DURATION"
	envSoakOut      = "IDEMFLOW_SOAK_OUT"
)

// soakMode reports whether the full soak runs (IDEMFLOW_SOAK=1).
func soakMode() bool { return os.Getenv(envSoak) == "1" }

// soakConfig is one soak run's shape.
type soakConfig struct {
	full        bool          // the full soak: every pass line is enforced
	duration    time.Duration // of the mixed load, after the capacity measurement
	capacityFor time.Duration // the closed-loop measurement at the start
	retention   time.Duration // the workers' -retention
	lease       time.Duration // every process's -lease
	killEvery   time.Duration // between server kills
	sampleEvery time.Duration
	window      time.Duration // the p99 line's first and last windows
	warmup      time.Duration // before the p99 line's first window
	slack       time.Duration // the row bound's allowance for cleanup lag and retries
	layout      string        // layoutPlain or layoutPartitioned (IDEMFLOW_SOAK_LAYOUT)
	width       time.Duration // the partitions' width; 0 on the plain layout
	load        float64       // share of the measured capacity offered
	out         string        // directory of the CSV files and the chart
}

func soakSettings(t testing.TB, layout string) soakConfig {
	t.Helper()
	c := soakConfig{
		layout: layout, duration: 90 * time.Second, capacityFor: 5 * time.Second, retention: time.Minute,
		lease: 5 * time.Second, killEvery: 45 * time.Second, sampleEvery: 2 * time.Second,
		window: 25 * time.Second, warmup: 20 * time.Second, slack: 20 * time.Second, load: 0.7,
	}
	if layout == layoutPartitioned {
		// 150 s: the first partition (created at set-up) ends within a minute and is past
		// the quick tier's retention a minute later, so at least one partition is
		// removed, and its drop captured, during the run.
		c.width, c.duration = soakPartitionWidth, 150*time.Second
	}
	if soakMode() {
		c.full = true
		c.duration, c.capacityFor, c.retention = time.Hour, 20*time.Second, 5*time.Minute
		c.killEvery, c.sampleEvery = 4*time.Minute, 5*time.Second
		c.window, c.warmup, c.slack = 10*time.Minute, 7*time.Minute, 30*time.Second
		if raw := os.Getenv(envSoakDuration); raw != "" {
			d, err := time.ParseDuration(raw)
			require.NoError(t, err, envSoakDuration)
			require.GreaterOrEqual(t, d, c.warmup+2*c.window, "%s: the p99 line needs warm-up and two windows", envSoakDuration)
			c.duration = d
		}
	}
	c.out = os.Getenv(envSoakOut)
	if c.out != "" && len(soakLayouts(t)) > 1 {
		c.out = filepath.Join(c.out, layout) // the quick tier soaks both layouts at once
	}
	if c.out == "" && c.full {
		dir, err := os.MkdirTemp("", "idemflow-soak-")
		require.NoError(t, err)
		c.out = dir
	} else if c.out == "" {
		c.out = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(c.out, 0o755))
	return c
}

// layoutName names the run's layout in its logs and chart: "plain", or "partitioned
// (1m partitions)".
func (c soakConfig) layoutName() string {
	if c.layout == layoutPartitioned {
		return fmt.Sprintf("%s (%s partitions)", c.layout, c.width)
	}
	return c.layout
}

// retiredSQL creates, in schema, rel_retired and the trigger that copies every deleted
// key row into it: the cleanup deletes finished keys during the soak, and the checker
// (checkOpts.retired) still checks their effects, payments and answers.
func retiredSQL(schema string) string {
	s := pgx.Identifier{schema}.Sanitize()
	return fmt.Sprintf(`
CREATE TABLE %[1]s.rel_retired (
	scope           text        NOT NULL,
	idem_key        text        NOT NULL,
	id              uuid        NOT NULL,
	flow            text        NOT NULL,
	status          text        NOT NULL,
	response_status int,
	response_body   bytea,
	how             text        NOT NULL DEFAULT 'delete', -- or 'drop': with its partition (retiredPartitionSQL)
	deleted_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION %[1]s.rel_retire_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO %[1]s.rel_retired (scope, idem_key, id, flow, status, response_status, response_body)
	VALUES (OLD.scope, OLD.idempotency_key, OLD.id, OLD.flow, OLD.status, OLD.response_status, OLD.response_body);
	RETURN NULL;
END
$$;
CREATE TRIGGER rel_retire AFTER DELETE ON %[1]s.idemflow_keys
	FOR EACH ROW EXECUTE FUNCTION %[1]s.rel_retire_row();`, s)
}

// TestSoak runs the soak (see the constants above): the quick tier's 90 seconds, or
// with IDEMFLOW_SOAK=1 an hour or more, on each layout of soakLayouts (a subtest per
// layout). Backs invariants 1, 3, 5 and 6 under hours of cleanup and kills, and the
// pass lines of docs/RELIABILITY.md's soak section.
func TestSoak(t *testing.T) {
	if !soakMode() {
		t.Parallel()
	}
	for _, layout := range soakLayouts(t) {
		t.Run(layout, func(t *testing.T) {
			if !soakMode() {
				t.Parallel()
			}
			runSoak(t, soakSettings(t, layout))
		})
	}
}

// runSoak is one soak on cfg's layout.
func runSoak(t *testing.T, cfg soakConfig) {
	env, first := newSoakEnv(t, cfg)
	s := newSoak(t, env, cfg)
	s.startProcs()
	capacity := s.measureCapacity()
	rate := capacity * cfg.load
	t.Logf("soak: capacity %.1f fresh req/s at concurrency 8 over %s; offering %.1f req/s (%.0f%%) for %s; retention %s; layout %s; a kill every %s; files in %s",
		capacity, cfg.capacityFor, rate, cfg.load*100, cfg.duration, cfg.retention, cfg.layoutName(), cfg.killEvery, cfg.out)
	s.run(rate)
	drained := s.drainOutbox(t)
	t.Logf("soak: the outbox drained %s after the load", drained.Round(100*time.Millisecond))
	s.stopProcs()
	require.NoError(t, s.writeFiles())

	r := env.check(t, checkOpts{keys: s.load.submittedKeys(), retired: true})
	c := s.load.counts()
	ctx := context.Background()
	deleted, dropped, parts := retiredCounts(ctx, t, env, cfg.layout)
	t.Logf("soak: %s kills=%d retired=%d (deleted %d, dropped with their partition %d; partitions dropped %d) receipts_mailed=%d",
		c, s.kills(), r.Retired, deleted, dropped, parts, s.mailsSent())
	require.Zero(t, r.DuplicateEffects+r.DuplicatePayments, "duplicate effects")
	require.Zero(t, r.Unfinished, "unfinished keys")
	require.Positive(t, r.Retired, "the cleanup deleted finished keys during the run")
	require.Equal(t, int64(r.Retired), deleted+dropped, "every retired row says how it went")
	if cfg.layout == layoutPartitioned {
		n := requirePartitionsCaptured(ctx, t, env, first, cfg.width)
		require.Positive(t, n, "the workers removed partitions during the run")
		// The batched expiry deletes only in partitions past their removal that a live
		// key keeps attached: most keys go with their partition, without a delete.
		require.Greater(t, dropped, deleted, "keys retired with their partition, not one by one")
		t.Logf("soak: %d partitions removed since the first, each drop captured", n)
	}
	require.Positive(t, s.kills(), "a server was killed and restarted")
	require.Positive(t, s.mailsSent(), "the workers mailed receipts (their River client works)")
	s.requireReceipts(t)
	c.require(t)

	samples, err := readCSV(s.samplesPath())
	require.NoError(t, err)
	for _, slot := range soakSlots {
		for _, m := range []string{"_heap_live", "_goroutines", "_pool_total"} {
			v := samples.between(slot+m, 0, math.Inf(1))
			require.NotEmpty(t, v, "%s was sampled", slot+m)
			require.Positive(t, quantile(v, 0.5), "%s", slot+m)
		}
	}
	for _, slot := range soakSlots[2:] {
		dir := filepath.Join(cfg.out, "heap-"+slot)
		profiles, err := filepath.Glob(filepath.Join(dir, "heap-*.pb.gz"))
		require.NoError(t, err)
		require.NotEmpty(t, profiles, "%s wrote heap profiles (CHARGES_HEAP_PROFILE_DIR)", slot)
		t.Logf("soak: %s wrote %d heap profiles in %s, one each %s (go tool pprof -base <earlier> <later>)",
			slot, len(profiles), dir, cfg.duration/4)
	}
	lines, err := computeSoakLines(cfg, s.samplesPath(), s.latenciesPath(), s.killsPath())
	require.NoError(t, err)
	for _, l := range lines.all {
		t.Logf("soak pass line: %s", l)
	}
	svg, err := soakChartFile(s.samplesPath(), s.killsPath(), cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(cfg.out, "soak.svg"), []byte(svg), 0o644))
	lines.enforce(t)
}
