package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/childproc"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// bin is the idemflow binary the tests run, built by TestMain.
var bin string

func TestMain(m *testing.M) {
	childproc.RunIfChild() // a paused key holder runs instead of the tests
	dir, err := os.MkdirTemp("", "idemflow-cli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "idemflow")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build idemflow: %v\n%s", err, out)
		os.Exit(1)
	}
	code := idemflowtest.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// bundle is a schema with the test flow's tables, an engine on it and a provider.
type bundle struct {
	db       *pgtest.DB
	provider *idemflowtest.Remote
	engine   *workflow.Engine
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db, p := testflow.Start(t)
	return &bundle{db: db, provider: p, engine: testflow.Engine(t, db.Pool, nil, p, nil)}
}

// serverURL is the schema's URL without its search_path: the CLI is told the schema
// with -schema.
func serverURL(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	q := u.Query()
	q.Del("search_path")
	u.RawQuery = q.Encode()
	return u.String()
}

// result is what a run of the binary did.
type result struct {
	stdout, stderr string
	code           int
}

// cli runs the binary on b's schema with args after the connection flags.
func (b *bundle) cli(t *testing.T, args ...string) result {
	t.Helper()
	return runBin(t, append([]string{"-database-url", serverURL(t, b.db), "-schema", b.db.Schema}, args...)...)
}

func runBin(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL=")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errOut.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return r
}

// ok requires exit status 0.
func (r result) ok(t *testing.T) result {
	t.Helper()
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	return r
}

// lines decodes -json output: one object per line.
func (r result) lines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), "line %q", l)
		out = append(out, m)
	}
	return out
}

// documented are the fields of every key object (cmd/idemflow's doc).
var documented = []string{"scope", "key", "id", "flow", "status", "recovery_point", "attempts", "last_error", "created_at", "updated_at", "finished_at"}

func fields(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// keysInStates makes acct/done finished, acct/stuck released and due, acct/dead
// dead-lettered.
func keysInStates(t *testing.T, b *bundle) {
	t.Helper()
	ctx := context.Background()
	_, err := b.engine.Do(ctx, req("acct", "done", 1))
	require.NoError(t, err)
	for _, k := range []string{"dead", "stuck"} {
		b.provider.FailNext(1)
		_, err = b.engine.Do(ctx, req("acct", k, 2))
		require.ErrorIs(t, err, workflow.ErrTransient)
	}
	_, err = b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET status = 'dead', last_error = 'given up' WHERE idempotency_key = 'dead'`)
	require.NoError(t, err)
	testflow.Sweepable(t, b.db.Pool)
}

func req(scope, key string, amount int) workflow.Request {
	return workflow.Request{Scope: scope, Key: key, Flow: testflow.Name, Method: "POST", Route: "/charges",
		Body: fmt.Appendf(nil, `{"amount":%d}`, amount)}
}

func TestKeysList(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keysInStates(t, b)

	lines := b.cli(t, "keys", "list", "-json").ok(t).lines(t)
	require.Len(t, lines, 3)
	status := map[string]string{}
	for _, l := range lines {
		sorted := append([]string(nil), documented...)
		sort.Strings(sorted)
		require.Equal(t, sorted, fields(l), "the documented fields, no more")
		status[l["key"].(string)] = l["status"].(string)
	}
	require.Equal(t, map[string]string{"done": "finished", "dead": "dead", "stuck": "stuck"}, status)

	dead := b.cli(t, "keys", "list", "-status", "dead", "-json").ok(t).lines(t)
	require.Len(t, dead, 1)
	require.Equal(t, "given up", dead[0]["last_error"])
	require.Nil(t, dead[0]["finished_at"])
	require.Len(t, b.cli(t, "keys", "list", "-status", "finished", "-scope", "acct", "-flow", testflow.Name, "-json").ok(t).lines(t), 1)
	require.Empty(t, b.cli(t, "keys", "list", "-scope", "other", "-json").ok(t).lines(t))

	human := b.cli(t, "keys", "list", "-status", "stuck").ok(t).stdout
	require.Regexp(t, `(?m)^SCOPE\s+KEY\s+STATUS\s+FLOW\s+RECOVERY POINT\s+ATTEMPTS\s+CREATED\s+LAST ERROR$`, human)
	require.Regexp(t, `(?m)^acct\s+stuck\s+stuck\s+charge3\s+reserve\s+1\s+\S+\s+.*503`, human)
	require.NotContains(t, human, "done")

	// Pages: the cursor goes to stderr, the next page follows from it.
	first := b.cli(t, "keys", "list", "-limit", "2", "-json").ok(t)
	require.Len(t, first.lines(t), 2)
	i := strings.Index(first.stderr, "-after ")
	require.Positive(t, i, first.stderr)
	cursor := strings.TrimSpace(first.stderr[i+len("-after "):])
	rest := b.cli(t, "keys", "list", "-limit", "2", "-after", cursor, "-json").ok(t)
	require.Len(t, rest.lines(t), 1)
	require.Empty(t, rest.stderr)
}

func TestKeysShow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keysInStates(t, b)
	show := b.cli(t, "keys", "show", "-json", "acct", "stuck").ok(t).lines(t)
	require.Len(t, show, 1)
	k := show[0]
	for _, f := range documented {
		require.Contains(t, k, f)
	}
	require.Equal(t, "stuck", k["status"])
	require.Equal(t, testflow.Pay, k["failed_phase"])
	hist := k["history"].([]any)
	require.Len(t, hist, 1)
	require.Equal(t, "released", hist[0].(map[string]any)["outcome"])
	require.Equal(t, "client", hist[0].(map[string]any)["by"])

	human := b.cli(t, "keys", "show", "acct", "stuck").ok(t).stdout
	require.Regexp(t, `(?m)^status:\s+stuck$`, human)
	require.Regexp(t, `(?m)^failed phase:\s+pay$`, human)
	require.Regexp(t, `(?m)^request:\s+POST /charges \{"amount":2\}$`, human)
	require.Regexp(t, `(?m)^1\s+client\s+\S+\s+started\s+reserve\s+released\s+pay\s+.*503`, human)
}

func TestKeysActions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keysInStates(t, b)

	red := b.cli(t, "keys", "redrive", "-json", "acct", "dead").ok(t).lines(t)
	require.Len(t, red, 1)
	require.Equal(t, "stuck", red[0]["status"], "re-driven: due at once")
	require.EqualValues(t, 0, red[0]["attempts"])
	again := b.cli(t, "keys", "redrive", "acct", "dead")
	require.Equal(t, 1, again.code)
	require.Contains(t, again.stderr, "not dead-lettered")

	before := testflow.State(t, b.db.Pool, "acct", "stuck")
	out := b.cli(t, "keys", "release", "acct", "stuck").ok(t).stdout
	require.Contains(t, out, `released key "stuck" in scope "acct"`)
	require.Equal(t, before.LockVersion+1, testflow.State(t, b.db.Pool, "acct", "stuck").LockVersion)
	notIn := b.cli(t, "keys", "release", "acct", "done")
	require.Equal(t, 1, notIn.code)
	require.Contains(t, notIn.stderr, "not in progress")

	notDone := b.cli(t, "keys", "purge", "acct", "stuck")
	require.Equal(t, 1, notDone.code)
	require.Contains(t, notDone.stderr, "not finished")
	purged := b.cli(t, "keys", "purge", "-json", "acct", "done").ok(t).lines(t)
	require.Equal(t, "done", purged[0]["key"])
	require.Equal(t, "finished", purged[0]["status"], "as it was")
	require.Equal(t, "", testflow.KeyRow(t, b.db.Pool, "acct", "done"))
	require.Contains(t, b.cli(t, "keys", "purge", "acct", "stuck").stderr, "not finished")
}

func TestStats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keysInStates(t, b)
	var got []string
	for _, l := range b.cli(t, "stats", "-json").ok(t).lines(t) {
		require.Equal(t, []string{"flow", "keys", "status"}, fields(l))
		got = append(got, fmt.Sprintf("%s %s %v", l["flow"], l["status"], l["keys"]))
	}
	require.Equal(t, []string{"charge3 dead 1", "charge3 finished 1", "charge3 stuck 1"}, got)
	human := b.cli(t, "stats").ok(t).stdout
	require.Regexp(t, `FLOW\s+IN PROGRESS\s+STUCK\s+DEAD\s+FINISHED`, human)
	require.Regexp(t, `charge3\s+0\s+1\s+1\s+1`, human)
}

// TestPartitions: partitions lists a day-partitioned key table's partitions with their
// bounds and states and how many are ahead, in both forms; on a plain key table it says
// it is not partitioned; after the partitions ahead are dropped it says too few.
func TestPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &bundle{db: pgtest.New(t)}
	require.Equal(t, "the key table is not partitioned (docs/PARTITIONS.md)\n", b.cli(t, "partitions").ok(t).stdout)
	require.Equal(t, []map[string]any{{"partitioned": false}}, b.cli(t, "partitions", "-json").ok(t).lines(t))

	st, err := store.NewInSchema(b.db.Schema)
	require.NoError(t, err)
	require.NoError(t, st.SetupPartitioned(ctx, b.db.Pool, store.PartitionDay, 0))
	parts, err := st.Partitions(ctx, b.db.Pool)
	require.NoError(t, err)
	var now time.Time
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&now))

	lines := b.cli(t, "partitions", "-json").ok(t).lines(t)
	require.Len(t, lines, 1)
	got := lines[0]
	require.Equal(t, true, got["partitioned"])
	require.Equal(t, 7.0, got["want"])
	require.Equal(t, false, got["low"])
	listed := got["partitions"].([]any)
	require.Len(t, listed, len(parts))
	ahead := 0
	for i, p := range parts {
		l := listed[i].(map[string]any)
		require.Equal(t, p.Name, l["name"])
		from, err := time.Parse(time.RFC3339Nano, l["from"].(string))
		require.NoError(t, err)
		require.True(t, p.From.Equal(from), "%s from %s", p.Name, l["from"])
		state := "current"
		switch {
		case !p.To.After(now):
			state = "past"
		case p.From.After(now):
			state = "ahead"
			ahead++
		}
		require.Equal(t, state, l["state"], p.Name)
	}
	require.Equal(t, float64(ahead), got["ahead"])
	require.GreaterOrEqual(t, ahead, 7)

	human := b.cli(t, "partitions").ok(t).stdout
	require.Regexp(t, `PARTITION\s+FROM\s+TO\s+STATE`, human)
	require.Regexp(t, parts[len(parts)-1].Name+`\s+`+parts[len(parts)-1].From.UTC().Format(time.RFC3339)+`\s+\S+\s+ahead`, human)
	require.Contains(t, human, fmt.Sprintf("%d partitions, %d ahead of now (the default creates 7 ahead: enough)", len(parts), ahead))

	for _, p := range parts {
		if p.From.After(now) {
			_, err := b.db.Pool.Exec(ctx, `DROP TABLE `+pgx.Identifier{b.db.Schema, p.Name}.Sanitize())
			require.NoError(t, err)
		}
	}
	require.Contains(t, b.cli(t, "partitions").ok(t).stdout, "0 ahead of now (the default creates 7 ahead: too few")
	require.Equal(t, true, b.cli(t, "partitions", "-json").ok(t).lines(t)[0]["low"])
}

func TestMissingKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, verb := range []string{"show", "redrive", "release", "purge"} {
		for _, j := range [][]string{nil, {"-json"}} {
			args := append(append([]string{"keys", verb}, j...), "acct", "nope")
			r := b.cli(t, args...)
			require.Equal(t, 1, r.code, verb)
			require.Equal(t, "idemflow: no key \"nope\" in scope \"acct\"\n", r.stderr, verb)
			require.Empty(t, r.stdout, verb)
		}
	}
}

func TestBadUsage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keysInStates(t, b)
	row := testflow.KeyRow(t, b.db.Pool, "acct", "dead")
	for name, args := range map[string][]string{
		"NoCommand":          {},
		"UnknownCommand":     {"frobnicate"},
		"KeysAlone":          {"keys"},
		"UnknownSubcommand":  {"keys", "fix"},
		"ShowOneArgument":    {"keys", "show", "acct"},
		"FlagAfterArguments": {"keys", "redrive", "acct", "dead", "-json"},
		"UnknownFlag":        {"keys", "list", "-colour"},
		"UnknownStatus":      {"keys", "list", "-status", "stale"},
		"BadLimit":           {"keys", "list", "-limit", "0"},
		"BadCursor":          {"keys", "list", "-after", "xyz"},
		"ListArguments":      {"keys", "list", "acct"},
		"MigrateWhat":        {"migrate", "sideways"},
		"StatsArguments":     {"stats", "now"},
	} {
		r := b.cli(t, args...)
		require.Equal(t, 2, r.code, "%s: %s", name, r.stderr)
		require.Contains(t, r.stderr, "usage: idemflow", name)
		require.Empty(t, r.stdout, name)
	}
	r := runBin(t, "keys", "list")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "-database-url (or $DATABASE_URL) is required")
	r = runBin(t, "-bogus", "keys", "list")
	require.Equal(t, 2, r.code)
	require.Equal(t, row, testflow.KeyRow(t, b.db.Pool, "acct", "dead"), "bad usage changes nothing")

	// A failure that is not the command line's is status 1.
	r = runBin(t, "-database-url", "postgres://127.0.0.1:1/none?connect_timeout=5", "stats")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "connect")
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	b := &bundle{db: db}
	require.Equal(t, "schema at version 0 of 4 (4 pending), as recorded in idemflow_schema_migrations\n", b.cli(t, "migrate", "status").ok(t).stdout)
	require.Equal(t, "applied 001_idemflow_keys\napplied 002_idemflow_keys_lean\napplied 003_idemflow_keys_history\napplied 004_idemflow_keys_status_check\nnow at version 4\n"+
		"schema at version 4 of 4 (up to date), as recorded in idemflow_schema_migrations\n", b.cli(t, "migrate", "up").ok(t).stdout)
	require.Equal(t, "schema at version 4 of 4 (up to date), as recorded in idemflow_schema_migrations\n", b.cli(t, "migrate", "up").ok(t).stdout, "nothing to do: only the status")
	require.Equal(t, []map[string]any{{"version": 3.0, "latest": 4.0, "key_table": true}}, b.cli(t, "migrate", "-json", "down").ok(t).lines(t))
	require.Equal(t, []map[string]any{{"version": 4.0, "latest": 4.0, "key_table": true, "applied": []any{4.0}}}, b.cli(t, "migrate", "-json", "up").ok(t).lines(t))
	require.Empty(t, b.cli(t, "keys", "list", "-json").ok(t).lines(t), "the table is there, empty")
}

// TestMigrationsExport: the export writes each tool's files, exactly ToolFS's, needs
// no database, and refuses to overwrite a file or an unknown format, writing nothing.
func TestMigrationsExport(t *testing.T) {
	t.Parallel()
	for _, tool := range migrations.Tools() {
		dir := filepath.Join(t.TempDir(), "out")
		r := runBin(t, "migrations", "export", "-format", string(tool), dir).ok(t)
		files, err := migrations.ToolFS(tool)
		require.NoError(t, err)
		names, err := fs.Glob(files, "*")
		require.NoError(t, err)
		require.Contains(t, r.stdout, fmt.Sprintf("wrote %d %s files to %s", len(names), tool, dir))
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.Len(t, entries, len(names), tool)
		for _, n := range names {
			want, err := fs.ReadFile(files, n)
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(dir, n))
			require.NoError(t, err)
			require.Equal(t, string(want), string(got), "%s: %s", tool, n)
		}

		again := runBin(t, "migrations", "export", "-format", string(tool), dir)
		require.Equal(t, 1, again.code, again.stderr)
		require.Contains(t, again.stderr, "already exists; nothing was written")
	}

	// The partitioned layout: the same file names, the first file partitioned
	// (migrations/tooltest applies these with each tool).
	dir := filepath.Join(t.TempDir(), "out")
	r := runBin(t, "migrations", "export", "-format", "tern", "-partition", "week", dir).ok(t)
	require.Contains(t, r.stdout, "tern files to "+dir+" (the key table partitioned by week): 001_idemflow_keys.sql, ")
	files, err := migrations.PartitionedToolFS(migrations.Tern, migrations.PartitionWeek)
	require.NoError(t, err)
	first, err := fs.ReadFile(files, "001_idemflow_keys.sql")
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(dir, "001_idemflow_keys.sql"))
	require.NoError(t, err)
	require.Equal(t, string(first), string(got))
	require.Contains(t, string(got), "PARTITION BY RANGE (created_at)")

	partial := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(partial, "003_idemflow_keys_history.up.sql"), []byte("mine"), 0o644))
	r = runBin(t, "migrations", "export", "-format", "golang-migrate", partial)
	require.Equal(t, 1, r.code, r.stderr)
	entries, err := os.ReadDir(partial)
	require.NoError(t, err)
	require.Len(t, entries, 1, "a file in the way: nothing written")

	for name, args := range map[string][]string{
		"UnknownFormat": {"migrations", "export", "-format", "flyway", t.TempDir()},
		"NoFormat":      {"migrations", "export", t.TempDir()},
		"NoDir":         {"migrations", "export", "-format", "goose"},
		"NoSubcommand":  {"migrations"},
		"BadPartition":  {"migrations", "export", "-format", "goose", "-partition", "month", t.TempDir()},
	} {
		r := runBin(t, args...)
		require.Equal(t, 2, r.code, "%s: %s", name, r.stderr)
		require.Contains(t, r.stderr, "usage: idemflow", name)
	}
}

// The paused holder: a child process that runs one request of the test flow and stops
// itself (SIGSTOP) at the start of the call phase, its key row written and its lease
// live, no transaction open. When continued it carries on and prints how its attempt
// ended.
const (
	envHolderDB       = "IDEMFLOW_CLI_HOLDER_DB_URL"
	envHolderProvider = "IDEMFLOW_CLI_HOLDER_PROVIDER_URL"
	envHolderKey      = "IDEMFLOW_CLI_HOLDER_KEY"
)

func init() { childproc.Register("holder", runHolder) }

// holderLine is what the holder prints: "paused", then how its attempt ended
// ("finished", "lease_lost" or "error: ...").
type holderLine struct {
	Event string `json:"event"`
}

func runHolder() {
	pause := func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
		if tx == nil && run.Attempt() == 1 {
			childproc.Emit(holderLine{Event: "paused"})
			childproc.Stop() // returns after SIGCONT
		}
		return nil
	}
	err := testflow.RunChild(context.Background(), os.Getenv(envHolderDB), os.Getenv(envHolderProvider), pause, req("acct", os.Getenv(envHolderKey), 9))
	switch {
	case err == nil:
		childproc.Emit(holderLine{Event: "finished"})
	case errors.Is(err, workflow.ErrLeaseLost):
		childproc.Emit(holderLine{Event: "lease_lost"})
	default:
		childproc.Emit(holderLine{Event: "error: " + err.Error()})
	}
}

// holder is a running paused holder.
type holder struct{ *childproc.Child }

func startHolder(t *testing.T, b *bundle, key string) *holder {
	t.Helper()
	c := childproc.Start(t, "^$", childproc.Program("holder"),
		envHolderDB+"="+b.db.URL, envHolderProvider+"="+b.provider.URL, envHolderKey+"="+key)
	var l holderLine
	c.Next(t, 2*time.Minute, &l)
	require.Equal(t, "paused", l.Event)
	c.Paused(t)
	return &holder{c}
}

// resume continues the holder and returns the line saying how its attempt ended.
func (h *holder) resume(t *testing.T) string {
	t.Helper()
	rest := h.Resume(t)
	require.Len(t, rest, 1, "one line after the pause: %q", rest)
	var l holderLine
	require.NoError(t, json.Unmarshal(rest[0], &l))
	return l.Event
}

// TestReleasePausedHolder: `idemflow keys release` on a key whose holder is paused
// (SIGSTOP) mid-flow lets a sweeper finish it, and the holder, continued, is fenced: its
// commit fails and the key has exactly one of each effect. Twice: with the sweep while
// the holder is still stopped, and with the holder continued before any sweep (then
// only the lock version bumped by the release fences it).
func TestReleasePausedHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	sweep := func() {
		t.Helper()
		n := sweepOnce(t, b)
		require.Equal(t, 1, n, "the sweeper finished the key")
	}
	for _, c := range []struct {
		key         string
		sweepPaused bool
	}{{"swept-while-paused", true}, {"resumed-before-sweep", false}} {
		h := startHolder(t, b, c.key)
		st := testflow.State(t, b.db.Pool, "acct", c.key)
		require.True(t, st.HasLease, "%s: the paused holder's lease is live", c.key)
		require.Zero(t, sweepOnce(t, b), "%s: a live lease is not swept", c.key)

		r := b.cli(t, "keys", "release", "-json", "acct", c.key).ok(t).lines(t)
		require.Equal(t, "stuck", r[0]["status"], c.key)
		require.Equal(t, st.LockVersion+1, testflow.State(t, b.db.Pool, "acct", c.key).LockVersion, c.key)

		if c.sweepPaused {
			sweep()
			require.Equal(t, "lease_lost", h.resume(t), "%s: the holder's commit is fenced", c.key)
		} else {
			require.Equal(t, "lease_lost", h.resume(t), "%s: the holder's commit is fenced", c.key)
			require.Equal(t, testflow.Effects{Ledger: 1}, mustEffects(t, b, c.key), c.key)
			sweep()
		}
		testflow.RequireOneEffect(t, b.db.Pool, b.provider, "acct", c.key)
		res, err := b.engine.Do(ctx, req("acct", c.key, 9))
		require.NoError(t, err)
		require.True(t, res.Replayed, c.key)
		show := b.cli(t, "keys", "show", "-json", "acct", c.key).ok(t).lines(t)[0]
		var outcomes []string
		for _, a := range show["history"].([]any) {
			m := a.(map[string]any)
			outcomes = append(outcomes, fmt.Sprint(m["by"], " ", m["outcome"]))
		}
		require.Equal(t, []string{"operator operator_released", "sweeper finished"}, outcomes, c.key)
	}
	require.Equal(t, 2, b.provider.Made(), "one payment per key")
}

func mustEffects(t *testing.T, b *bundle, key string) testflow.Effects {
	t.Helper()
	e, err := testflow.CountEffects(context.Background(), b.db.Pool, "acct", key)
	require.NoError(t, err)
	return e
}

// sweepOnce runs one sweeper pass with no grace and returns how many keys it finished.
func sweepOnce(t *testing.T, b *bundle) int {
	t.Helper()
	st, err := b.engine.Sweep(context.Background(), &workflow.SweeperConfig{Grace: -1})
	require.NoError(t, err)
	return st.Finished
}

// hostile is client text that would move the cursor, clear the screen or recolour the
// terminal if printed raw: ESC sequences, a 7-bit and an 8-bit CSI (U+009B), NEL
// (U+0085), DEL, a carriage return, a tab and a newline.
const hostile = "\x1b[2J\x1b[31mred\u009b1;1H\u0085x\x7f\r\t\ny\x07"

// requireNoControl fails when out holds a control character other than a newline, or
// is not UTF-8 (a raw byte 0x80..0x9F is a C1 control to some terminals).
func requireNoControl(t *testing.T, name, out string) {
	t.Helper()
	require.True(t, utf8.ValidString(out), "%s: not UTF-8: %q", name, out)
	for _, r := range out {
		if r != '\n' && (r < 0x20 || r >= 0x7f && r <= 0x9f) {
			require.Failf(t, "raw control character", "%s printed %U: %q", name, r, out)
		}
	}
}

// TestNoRawClientText: a key row written by another tool (or before the edge refused
// control characters) with control characters in its scope, key, flow, recovery
// point, request, last error, origin and history is printed by every command with
// those characters escaped, on stdout and stderr, as a table and as JSON, and the JSON
// still decodes to the stored text.
func TestNoRawClientText(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keysInStates(t, b)
	// acct/dead gets a scope and key the engine would refuse today (it can be listed,
	// not shown: InspectKey checks the key); acct/stuck keeps its name and gets
	// everything else.
	scope, key := "ac"+hostile, "k"+hostile
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE idemflow_keys SET scope = $1, idempotency_key = $2,
		flow = $3, last_error = $3 WHERE idempotency_key = 'dead'`, scope, key, "f"+hostile)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(context.Background(), `UPDATE idemflow_keys SET
		flow = $1, recovery_point = $1, last_error = $1, origin = $1, method = $1, route = $1, request_body = $2,
		history = jsonb_build_array(jsonb_build_object('attempt', 1, 'outcome', $1::text, 'phase', $1::text,
			'error', $1::text, 'by', $1::text, 'from', $1::text, 'phases', jsonb_build_array($1::text)))
		WHERE idempotency_key = 'stuck'`, "f"+hostile, []byte("{\x1b[2J\x9b\xff\xc2\x85"+hostile+"}"))
	require.NoError(t, err)
	for name, args := range map[string][]string{
		"List":         {"keys", "list"},
		"ListJSON":     {"keys", "list", "-json"},
		"ListDead":     {"keys", "list", "-status", "dead", "-limit", "1"},
		"Show":         {"keys", "show", "acct", "stuck"},
		"ShowJSON":     {"keys", "show", "-json", "acct", "stuck"},
		"ShowHostile":  {"keys", "show", scope, key},
		"Stats":        {"stats"},
		"StatsJSON":    {"stats", "-json"},
		"Redrive":      {"keys", "redrive", "acct", "stuck"},
		"Purge":        {"keys", "purge", "acct", "stuck"},
		"Missing":      {"keys", "show", scope, "nope"},
		"UnknownCmd":   {"keys", hostile},
		"UnknownState": {"keys", "list", "-status", hostile},
		"BadFlag":      {"keys", "list", "-" + hostile},
	} {
		r := b.cli(t, args...)
		requireNoControl(t, name+" stdout", r.stdout)
		requireNoControl(t, name+" stderr", r.stderr)
	}
	show := b.cli(t, "keys", "show", "-json", "acct", "stuck").ok(t).lines(t)
	require.Equal(t, "f"+hostile, show[0]["last_error"], "JSON escapes, it does not change the text")
	require.Equal(t, "f"+hostile, show[0]["history"].([]any)[0].(map[string]any)["error"])
	released := b.cli(t, "keys", "release", "acct", "stuck").ok(t)
	requireNoControl(t, "Release", released.stdout)
	require.Contains(t, released.stdout, `(stuck at f\x1b[2J\x1b[31mred\u009b1;1H\u0085x\x7f\r\t\ny\a, lock`)
	list := b.cli(t, "keys", "list", "-json", "-status", "dead").ok(t).lines(t)
	require.Equal(t, key, list[0]["key"])
	require.Equal(t, scope, list[0]["scope"])
	human := b.cli(t, "keys", "list", "-status", "dead").ok(t).stdout
	require.Contains(t, human, `ac\x1b[2J\x1b[31mred\u009b1;1H\u0085x\x7f\r\t\ny\a`, "scope, escaped as Go does")
	require.Regexp(t, `(?m)^ac\S+\s+k\S+\s+dead\s`, human, "one line, columns intact")
}

// TestNonsenseFlags: a negative duration or a count out of range is refused with a
// message that names the flag, exit status 2, and nothing printed or changed.
func TestNonsenseFlags(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keysInStates(t, b)
	row := testflow.KeyRow(t, b.db.Pool, "acct", "dead")
	for name, c := range map[string]struct {
		args []string
		flag string
	}{
		"NegativeAge":   {[]string{"keys", "list", "-older-than", "-5h"}, "-older-than"},
		"NegativeAge1":  {[]string{"keys", "list", "-status", "dead", "-older-than=-1ns"}, "-older-than"},
		"ZeroLimit":     {[]string{"keys", "list", "-limit", "0"}, "-limit"},
		"NegativeLimit": {[]string{"keys", "list", "-limit", "-3"}, "-limit"},
		"HugeLimit":     {[]string{"keys", "list", "-limit", "10001"}, "-limit"},
	} {
		r := b.cli(t, c.args...)
		require.Equal(t, 2, r.code, "%s: %s", name, r.stderr)
		require.Contains(t, r.stderr, c.flag, name)
		require.Empty(t, r.stdout, name)
	}
	require.Equal(t, row, testflow.KeyRow(t, b.db.Pool, "acct", "dead"), "nothing changed")
}

// TestKeysShowSealed: keys show (the CLI has no Sealer) prints a sealed request body
// and a sealed answer as "sealed" with their size, never their bytes; -json says so in
// request_sealed and response_sealed.
func TestKeysShowSealed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	var down atomic.Bool
	down.Store(true)
	sealing := testflow.Engine(t, b.db.Pool, &workflow.Config{Sealer: testflow.NewSealer(7)}, b.provider,
		func(_ context.Context, _ phases.DBTX, run *phases.Run) error {
			if down.Load() && run.Phase() == testflow.Pay {
				return errors.New("provider down")
			}
			return nil
		})
	req := workflow.Request{Scope: "acct", Flow: testflow.Name, Method: "POST", Route: "/charges", Body: []byte(`{"amount":9}`)}
	req.Key = "open"
	_, err := sealing.Do(ctx, req)
	require.ErrorIs(t, err, workflow.ErrTransient)
	down.Store(false)
	req.Key = "done"
	_, err = sealing.Do(ctx, req)
	require.NoError(t, err)

	human := b.cli(t, "keys", "show", "acct", "open").ok(t).stdout
	require.Regexp(t, `(?m)^request:\s+POST /charges \(sealed, \d+ bytes\)$`, human)
	human = b.cli(t, "keys", "show", "acct", "done").ok(t).stdout
	require.Regexp(t, `(?m)^response body:\s+\(sealed, \d+ bytes\)$`, human)
	require.Regexp(t, `(?m)^response headers:.*Content-Type`, human)
	require.NotContains(t, human, `"amount"`)

	open := b.cli(t, "keys", "show", "-json", "acct", "open").ok(t).lines(t)[0]
	require.Equal(t, true, open["request_sealed"])
	require.Positive(t, open["request_sealed_bytes"])
	require.Empty(t, open["request"])
	done := b.cli(t, "keys", "show", "-json", "acct", "done").ok(t).lines(t)[0]
	require.Equal(t, true, done["response_sealed"])
	require.Nil(t, done["response_body"])
}
