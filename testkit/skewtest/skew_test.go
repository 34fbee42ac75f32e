// Package skewtest runs the previous release and this tree side by side on one schema
// (docs/OPERATIONS.md, "Upgrades": release N and N-1 in both directions). Each writes
// keys, crashing at every boundary between phases, and the other then answers them:
// retries, sweeps, replays and mismatches must all be the answers one build alone
// would give, with one effect per key. It needs the repository's history (the
// previous release is built from it) and is run by CI with IDEMFLOW_SKEW=1.
package skewtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

func TestMain(m *testing.M) { idemflowtest.Main(m) }

// tables hold the driver flow's effects.
const tables = `
CREATE TABLE skew_effects (scope text NOT NULL, key text NOT NULL, phase text NOT NULL);
CREATE TABLE skew_remote (derived_key text PRIMARY KEY, key text NOT NULL);
CREATE TABLE skew_remote_calls (derived_key text NOT NULL);`

// build is one build of the driver, run with env added to the environment.
type build struct {
	name, bin, url string
	env            []string
}

// answer is the driver's answer line.
type answer struct {
	Status   int    `json:"status"`
	Replayed bool   `json:"replayed"`
	Body     string `json:"body"`
	Err      string `json:"err"`
	Detail   string `json:"detail"`
}

// run runs the driver with args, SKEW_CRASH_AFTER=crash, and returns its stdout and
// exit status. A crash of "fail" is SKEW_FAIL_REMOTE=1 instead: the remote call fails.
func (b build) run(t *testing.T, crash string, args ...string) ([]byte, int) {
	t.Helper()
	cmd := exec.Command(b.bin, args...)
	cmd.Env = append(append(os.Environ(), b.env...), "DATABASE_URL="+b.url, "SKEW_CRASH_AFTER="+crash)
	if crash == "fail" {
		cmd.Env = append(append(os.Environ(), b.env...), "DATABASE_URL="+b.url, "SKEW_FAIL_REMOTE=1")
	}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		require.True(t, ok, "%s %v: %v", b.name, args, err)
		code = ee.ExitCode()
	}
	if code != 0 && code != 3 {
		t.Fatalf("%s %v: exit %d: %s", b.name, args, code, stderr.String())
	}
	return out.Bytes(), code
}

func (b build) do(t *testing.T, crash, key, body string) (answer, int) {
	t.Helper()
	out, code := b.run(t, crash, "do", key, body)
	var a answer
	if code == 0 {
		require.NoError(t, json.Unmarshal(out, &a), "%s: %s", b.name, out)
	}
	return a, code
}

func (b build) sweep(t *testing.T, crash string) map[string]float64 {
	t.Helper()
	out, _ := b.run(t, crash, "sweep")
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(out, &raw), "%s: %s", b.name, out)
	st := map[string]float64{}
	for k, v := range raw { // the counts; other members (Partitions, an object) are not
		var n float64
		if json.Unmarshal(v, &n) == nil {
			st[k] = n
		}
	}
	return st
}

// TestSkew runs every pairing of writer and reader among the previous release and
// this tree, with the writer crashing after each phase (or not at all) and the reader
// recovering by a retry or by a sweep.
func TestSkew(t *testing.T) {
	if os.Getenv("IDEMFLOW_SKEW") != "1" {
		t.Skip("set IDEMFLOW_SKEW=1 to build the previous release and run it beside this tree (CI does)")
	}
	prev, cur := buildBoth(t)
	db := pgtest.New(t)
	_, err := db.Pool.Exec(context.Background(), tables)
	require.NoError(t, err)
	prev.url, cur.url = db.URL, db.URL
	for _, pair := range [][2]build{{prev, cur}, {cur, prev}} {
		for _, at := range []string{"", "debit", "remote", "credit"} {
			for _, rec := range []string{"retry", "sweep"} {
				if at == "" && rec == "sweep" {
					continue
				}
				w, r := pair[0], pair[1]
				key := fmt.Sprintf("%s-then-%s/crash-after-%s/%s", w.name, r.name, cmpOr(at, "none"), rec)
				t.Run(key, func(t *testing.T) { skewCase(t, db, w, r, key, at, rec) })
			}
		}
		w, r := pair[0], pair[1]
		key := fmt.Sprintf("%s-then-%s/dead-lettered", w.name, r.name)
		t.Run(key, func(t *testing.T) { deadCase(t, db, w, r, key) })
	}
	// This tree with workflow.Config.HistoryOmitCleanFinish, which an operator turns on
	// once no process of the previous release is left: should one be, it still answers
	// such keys as its own (the row differs only by its empty history).
	omit := cur
	omit.name, omit.env = "current-history-omitted", []string{"SKEW_HISTORY_OMIT=1"}
	for _, at := range []string{"", "debit", "credit"} {
		key := fmt.Sprintf("%s-then-%s/crash-after-%s/retry", omit.name, prev.name, cmpOr(at, "none"))
		t.Run(key, func(t *testing.T) {
			skewCase(t, db, omit, prev, key, at, "retry")
			var history string
			require.NoError(t, db.Pool.QueryRow(context.Background(),
				`SELECT history::text FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = $1`, key).Scan(&history))
			if at == "" || at == "credit" {
				require.Equal(t, "[]", history, "the clean finish stored no entry")
			} else {
				require.NotEqual(t, "[]", history, "a resumed key stores its attempts' entries")
			}
		})
	}
	t.Run("fingerprint-version-3", func(t *testing.T) { v3Case(t, db, prev, cur) })
	t.Run("sealed-answer", func(t *testing.T) { sealedCase(t, db, prev, cur) })
	t.Run("sealed-request", func(t *testing.T) { sealedRequestCase(t, db, prev, cur) })
}

// sealedRequestCase marks a key left in progress by a crash as an engine with
// workflow.Config.Sealer stores it (phase data format 2, the request body sealed) and
// meets it with both builds, neither of which has a Sealer. This tree answers a retry
// newer_format and its sweep takes nothing, leaving the row as it was. The previous
// release (v0.3.0) predates the format: it would resume the key with the sealed bytes
// as its body, which is why a Sealer is set only once no such process is left
// (docs/OPERATIONS.md); here its phases fail on them and it answers nothing final.
func sealedRequestCase(t *testing.T, db *pgtest.DB, prev, cur build) {
	const key, body = "sealed-request", `{"amount": 700}`
	ctx := context.Background()
	_, code := cur.do(t, "debit", key, body)
	require.Equal(t, 3, code, "current did not crash after debit")
	idemflowtest.ExpireLease(t, db.Pool, "acct", key)
	_, err := db.Pool.Exec(ctx, `UPDATE idemflow_keys SET phase_data = phase_data || '{"idemflow:format": 2}',
		request_body = '\x5345414c4544ff00' WHERE scope = 'acct' AND idempotency_key = $1`, key)
	require.NoError(t, err)
	row := func() string {
		var s string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT to_jsonb(k)::text FROM idemflow_keys k
			WHERE scope = 'acct' AND idempotency_key = $1`, key).Scan(&s))
		return s
	}
	before := row()
	a, _ := cur.do(t, "", key, body)
	require.Equal(t, "newer_format", a.Err, "current without a Sealer: %+v", a)
	out, _ := cur.run(t, "", "resume", key)
	require.NoError(t, json.Unmarshal(out, &a))
	require.Equal(t, "newer_format", a.Err, "current's Resume without a Sealer: %+v", a)
	st := cur.sweep(t, "")
	require.Zero(t, st["Taken"]+st["Finished"]+st["Released"]+st["DeadLettered"], "current's sweep took the key: %v", st)
	require.Equal(t, before, row(), "current changed the row")

	a, _ = prev.do(t, "", key, body)
	require.NotEqual(t, 201, a.Status, "previous on a sealed request: %+v", a)
	require.False(t, a.Replayed)
	t.Logf("the previous release on a sealed request body: %s (%s)", a.Err, a.Detail)
}

// sealedCase marks a finished key's answer sealed (response format 2, as an engine
// with workflow.Config.Sealer stores it) and retries it on both builds, neither of
// which has a Sealer: this tree answers newer_format (retry later), the previous
// release fails on it; neither replays the sealed bytes, and the row is unchanged.
func sealedCase(t *testing.T, db *pgtest.DB, prev, cur build) {
	const key, body = "sealed-answer", `{"amount": 700}`
	ctx := context.Background()
	a, _ := cur.do(t, "", key, body)
	require.Equal(t, 201, a.Status, "%+v", a)
	_, err := db.Pool.Exec(ctx, `UPDATE idemflow_keys SET response_headers = response_headers || '{"idemflow:format": 2}',
		response_body = '\x5345414c4544' WHERE scope = 'acct' AND idempotency_key = $1`, key)
	require.NoError(t, err)
	row := func() string {
		var s string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT to_jsonb(k)::text FROM idemflow_keys k
			WHERE scope = 'acct' AND idempotency_key = $1`, key).Scan(&s))
		return s
	}
	before := row()
	a, _ = cur.do(t, "", key, body)
	require.Equal(t, "newer_format", a.Err, "current without a Sealer: %+v", a)
	a, _ = prev.do(t, "", key, body)
	require.NotEmpty(t, a.Err, "previous on a sealed answer: %+v", a)
	require.False(t, a.Replayed)
	require.NotContains(t, a.Body, "SEALED")
	t.Logf("the previous release on a sealed answer: %s (%s)", a.Err, a.Detail)
	require.Equal(t, before, row(), "neither build changed the row")
	requireOneEffect(t, db, key)
}

// v3Case gives a finished key the version 3 fingerprint a flow with
// phases.Flow.FingerprintMembers writes and retries it on both builds. This tree's
// driver, whose flow has no member list, compares the whole body: an identical retry
// replays, another body is a mismatch. A previous release that reads version 3 answers
// alike; one that predates it (v0.3.0) answers the identical retry 422, which is why
// the option must stay off until no such process is left (docs/OPERATIONS.md).
func v3Case(t *testing.T, db *pgtest.DB, prev, cur build) {
	const key, body = "fingerprint-version-3", `{"amount": 700}`
	a, _ := cur.do(t, "", key, body)
	require.Equal(t, 201, a.Status, "%+v", a)
	fp, err := workflow.Fingerprint("POST", "/skew", []byte(body), []string{"/amount"})
	require.NoError(t, err)
	_, err = db.Pool.Exec(context.Background(),
		`UPDATE idemflow_keys SET fingerprint = $2 WHERE scope = 'acct' AND idempotency_key = $1`, key, fp)
	require.NoError(t, err)

	a, _ = cur.do(t, "", key, `{"amount":7e2}`)
	require.Equal(t, answer{Status: 201, Replayed: true, Body: a.Body}, a, "current on an identical retry")
	a, _ = cur.do(t, "", key, `{"amount": 1}`)
	require.Equal(t, "mismatch", a.Err, "current on another body: %+v", a)

	root, commit := previousRelease(t)
	readsV3 := exec.Command("git", "-C", root, "cat-file", "-e", commit+":workflow/fingerprint_members.go").Run() == nil
	a, _ = prev.do(t, "", key, body)
	if readsV3 {
		require.Equal(t, answer{Status: 201, Replayed: true, Body: a.Body}, a, "previous on an identical retry")
	} else {
		require.Equal(t, "mismatch", a.Err, "previous (before version 3) on an identical retry: %+v", a)
		t.Logf("the previous release answers an identical retry of a version 3 key %q: the option stays off while it runs", a.Err)
	}
	requireOneEffect(t, db, key)
}

// deadCase: w's attempt and sweep fail on the remote and dead-letter key; both builds
// answer it dead; r re-drives it and its sweep finishes it; then both replay it.
func deadCase(t *testing.T, db *pgtest.DB, w, r build, key string) {
	const body = `{"amount": 700}`
	a, _ := w.do(t, "fail", key, body)
	require.Equal(t, "transient", a.Err, "%s with the remote failing: %+v", w.name, a)
	idemflowtest.ExpireLease(t, db.Pool, "acct", key)
	st := w.sweep(t, "fail")
	require.Equal(t, 1.0, st["DeadLettered"], "%s's sweep: %v", w.name, st)
	for _, b := range []build{w, r} {
		a, _ := b.do(t, "", key, body)
		require.Equal(t, "dead", a.Err, "%s on a dead-lettered key: %+v", b.name, a)
	}
	out, _ := r.run(t, "", "redrive", key)
	var ra answer
	require.NoError(t, json.Unmarshal(out, &ra), "%s", out)
	require.Equal(t, answer{}, ra, "%s's re-drive", r.name)
	st = r.sweep(t, "")
	require.Equal(t, 1.0, st["Finished"], "%s's sweep after the re-drive: %v", r.name, st)
	replayedBody(t, w, r, key, body)
	requireOneEffect(t, db, key)
}

// skewCase runs one case: w writes key, crashing after phase at (never when ""), and
// r recovers it by rec; then both answer it.
func skewCase(t *testing.T, db *pgtest.DB, w, r build, key, at, rec string) {
	const body = `{"amount": 700}`
	a, code := w.do(t, at, key, body)
	if at == "" {
		require.Equal(t, 0, code)
		require.Equal(t, answer{Status: 201, Body: a.Body}, a, "%s answered a new key", w.name)
	} else {
		require.Equal(t, 3, code, "%s did not crash after %s", w.name, at)
		// The crashed writer's lease is live: the reader turns the retry away, unless
		// the key finished before the crash.
		a, _ = r.do(t, "", key, body)
		if at == "credit" {
			require.Equal(t, answer{Status: 201, Replayed: true, Body: a.Body}, a, "%s on a finished key", r.name)
		} else {
			require.Equal(t, "in_progress", a.Err, "%s on a live lease: %+v", r.name, a)
		}
		idemflowtest.ExpireLease(t, db.Pool, "acct", key)
		switch {
		case rec == "retry":
			a, _ = r.do(t, "", key, body)
			require.Equal(t, answer{Status: 201, Replayed: at == "credit", Body: a.Body}, a, "%s resuming by retry", r.name)
		case at != "credit":
			st := r.sweep(t, "")
			require.Equal(t, 1.0, st["Finished"], "%s's sweep: %v", r.name, st)
		}
	}
	want := replayedBody(t, w, r, key, body)
	require.Contains(t, want, `"amount":700`)
	for _, b := range []build{w, r} {
		a, _ := b.do(t, "", key, `{"amount": 1}`)
		require.Equal(t, "mismatch", a.Err, "%s on another body: %+v", b.name, a)
	}
	requireOneEffect(t, db, key)
}

// replayedBody checks that both builds replay key, by retry and by Resume, with the
// same bytes, and returns them.
func replayedBody(t *testing.T, w, r build, key, body string) string {
	t.Helper()
	var want string
	for _, b := range []build{w, r, w, r} {
		a, _ := b.do(t, "", key, body)
		require.Equal(t, 201, a.Status, "%s replaying: %+v", b.name, a)
		require.True(t, a.Replayed, "%s replaying", b.name)
		out, _ := b.run(t, "", "resume", key)
		var ra answer
		require.NoError(t, json.Unmarshal(out, &ra))
		require.Equal(t, a, ra, "%s: Resume and Do answer alike", b.name)
		if want == "" {
			want = a.Body
		}
		require.Equal(t, want, a.Body, "%s replays other bytes", b.name)
	}
	return want
}

// requireOneEffect checks that key debited and credited once, and that the remote
// kept one call of it (it dedupes on the derived key, which both builds must make
// alike).
func requireOneEffect(t *testing.T, db *pgtest.DB, key string) {
	t.Helper()
	var debits, credits, remote int
	err := db.Pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM skew_effects WHERE key = $1 AND phase = 'debit'),
		(SELECT count(*) FROM skew_effects WHERE key = $1 AND phase = 'credit'),
		(SELECT count(*) FROM skew_remote WHERE key = $1)`, key).Scan(&debits, &credits, &remote)
	require.NoError(t, err)
	require.Equal(t, [3]int{1, 1, 1}, [3]int{debits, credits, remote}, "debits, credits, remote charges")
}

// buildBoth builds the driver from the previous release (from the repository's
// history; IDEMFLOW_SKEW_PREVIOUS overrides the commit) and from this tree.
func buildBoth(t *testing.T) (prev, cur build) {
	root, commit := previousRelease(t)
	dir := t.TempDir()
	old := filepath.Join(dir, "previous")
	require.NoError(t, os.MkdirAll(filepath.Join(old, "testkit", "skewtest", "driver"), 0o755))
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, commit, old)
	out, err := archive.CombinedOutput()
	require.NoError(t, err, "git archive %s: %s", commit, out)
	src, err := os.ReadFile(filepath.Join(root, "testkit", "skewtest", "driver", "main.go"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(old, "testkit", "skewtest", "driver", "main.go"), src, 0o644))
	// From v0.4.0 the release carries the driver's sweep.go that fits its own API.
	if _, err := os.Stat(filepath.Join(old, "testkit", "skewtest", "driver", "sweep.go")); errors.Is(err, fs.ErrNotExist) {
		require.NoError(t, os.WriteFile(filepath.Join(old, "testkit", "skewtest", "driver", "sweep.go"), []byte(previousSweep), 0o644))
	}
	// Settings the previous release has not: this tree's options.go names them.
	require.NoError(t, os.WriteFile(filepath.Join(old, "testkit", "skewtest", "driver", "options.go"), []byte(previousOptions), 0o644))
	prev = build{name: "previous", bin: filepath.Join(dir, "driver-previous")}
	cur = build{name: "current", bin: filepath.Join(dir, "driver-current")}
	goBuild(t, old, prev.bin)
	goBuild(t, root, cur.bin)
	t.Logf("previous release %s and this tree built", commit)
	return prev, cur
}

// previousSweep is the driver's sweep.go for a previous release without one of its own
// (v0.3.0), whose sweeper was built with sweeper.New (from v0.4.0 the engine runs it,
// Engine.Sweep, and the release has the file).
const previousSweep = `package main

import (
	"context"

	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/workflow"
)

func sweep(ctx context.Context, e *workflow.Engine) (sweeper.Stats, error) {
	s, err := sweeper.New(e, &sweeper.Config{Grace: -1, MaxAttempts: 1})
	if err != nil {
		return sweeper.Stats{}, err
	}
	return s.RunOnce(ctx)
}
`

// previousOptions is the driver's options.go for the previous release: none of this
// tree's settings.
const previousOptions = `package main

import "github.com/idemflow/idemflow/workflow"

func options(*workflow.Config) {}
`

func goBuild(t *testing.T, dir, bin string) {
	cmd := exec.Command("go", "build", "-o", bin, "./testkit/skewtest/driver")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build in %s: %s", dir, out)
}

func git(t *testing.T, dir string, args ...string) string {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	require.NoError(t, err, "git %v", args)
	return string(out)
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
