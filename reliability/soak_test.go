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

	"github.com/idemflow/idemflow/testkit/pgtest"
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
// the quick tier runs it for 90 s with two kills and asserts only what does not
// depend on the machine's speed (see soakLines.enforce).
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
	load        float64       // share of the measured capacity offered
	out         string        // directory of the CSV files and the chart
}

func soakSettings(t testing.TB) soakConfig {
	t.Helper()
	c := soakConfig{
		duration: 90 * time.Second, capacityFor: 5 * time.Second, retention: time.Minute,
		lease: 5 * time.Second, killEvery: 45 * time.Second, sampleEvery: 2 * time.Second,
		window: 25 * time.Second, warmup: 20 * time.Second, slack: 20 * time.Second, load: 0.7,
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
// with IDEMFLOW_SOAK=1 an hour or more. Backs invariants 1, 3, 5 and 6 under hours of
// cleanup and kills, and the pass lines of docs/RELIABILITY.md's soak section.
func TestSoak(t *testing.T) {
	if !soakMode() {
		t.Parallel()
	}
	cfg := soakSettings(t)
	env := newEnv(t, pgtest.New(t))
	_, err := env.db.Pool.Exec(context.Background(), retiredSQL(env.db.Schema))
	require.NoError(t, err)
	s := newSoak(t, env, cfg)
	s.startProcs()
	capacity := s.measureCapacity()
	rate := capacity * cfg.load
	t.Logf("soak: capacity %.1f fresh req/s at concurrency 8 over %s; offering %.1f req/s (%.0f%%) for %s; retention %s; a kill every %s; files in %s",
		capacity, cfg.capacityFor, rate, cfg.load*100, cfg.duration, cfg.retention, cfg.killEvery, cfg.out)
	s.run(rate)
	s.stopProcs()
	require.NoError(t, s.writeFiles())

	r := env.check(t, checkOpts{keys: s.load.submittedKeys(), retired: true})
	c := s.load.counts()
	t.Logf("soak: %s kills=%d retired=%d receipts_mailed=%d", c, s.kills(), r.Retired, s.mails.Load())
	require.Zero(t, r.DuplicateEffects+r.DuplicatePayments, "duplicate effects")
	require.Zero(t, r.Unfinished, "unfinished keys")
	require.Positive(t, r.Retired, "the cleanup deleted finished keys during the run")
	require.Positive(t, s.kills(), "a server was killed and restarted")
	require.Positive(t, s.mails.Load(), "the workers mailed receipts (their River client works)")
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
