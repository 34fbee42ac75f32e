package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

var binary string // the charges binary, built once

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "charges-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "charges")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build charges:", err)
		os.Exit(1)
	}
	code := idemflowtest.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// process is a running charges subcommand.
type process struct {
	t    *testing.T
	cmd  *exec.Cmd
	url  string
	done chan struct{}
	mu   sync.Mutex
	logs strings.Builder // stdout and stderr, as they came
	out  strings.Builder // stdout alone (lines a writer of stderr cannot split)
}

// run starts `charges args...` and waits until it prints its "listening on" or
// "sweeping" line.
func run(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	p := &process{t: t, done: make(chan struct{})}
	p.cmd = exec.Command(binary, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = writerFunc(p.log)
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	ready := make(chan string, 1)
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			_, _ = p.log([]byte(line + "\n"))
			p.mu.Lock()
			p.out.WriteString(line + "\n")
			p.mu.Unlock()
			if _, u, ok := strings.Cut(line, "listening on "); ok {
				ready <- u
			} else if strings.Contains(line, "sweeping") {
				ready <- ""
			}
		}
	}()
	go func() {
		<-scanned // every line read before Wait closes the pipe (os/exec's order)
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.signal(syscall.SIGTERM)
		<-p.done
		if t.Failed() {
			t.Logf("%s logs:\n%s", args[0], p.output())
		}
	})
	select {
	case p.url = <-ready:
	case <-p.done:
		t.Fatalf("charges %s exited before it was ready:\n%s", args[0], p.output())
	}
	return p
}

func (p *process) log(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.Write(b)
}

func (p *process) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// stdout is what the process printed on its standard output.
func (p *process) stdout() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *process) signal(s syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(s)
	}
}

// exitCode waits for the process to end.
func (p *process) exitCode() int {
	<-p.done
	return p.cmd.ProcessState.ExitCode()
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// stack is a database schema, a provider and a server.
type stack struct {
	db       *idemflowtest.DB
	provider *process
	server   *process
}

// backend makes a stack's database: a schema straight on Postgres, or a database of its
// own through pgbouncer.
type backend func(testing.TB) *idemflowtest.DB

func direct(t testing.TB) *idemflowtest.DB { return idemflowtest.NewDB(t) }

func throughPgbouncer(t testing.TB) *idemflowtest.DB {
	p := pgtest.NewPooled(t).DB
	return &idemflowtest.DB{Pool: p.Pool, URL: p.URL, Schema: p.Schema}
}

func newStack(t *testing.T, db backend, providerArgs ...string) *stack {
	t.Helper()
	s := &stack{db: db(t)}
	s.provider = run(t, nil, append([]string{"provider", "-addr", "127.0.0.1:0"}, providerArgs...)...)
	s.server = s.serve(t, nil)
	return s
}

func (s *stack) serve(t *testing.T, env []string, extra ...string) *process {
	t.Helper()
	args := append([]string{"serve", "-addr", "127.0.0.1:0", "-sweeper=false",
		"-database-url", s.db.URL, "-provider-url", s.provider.url}, extra...)
	return run(t, env, args...)
}

type answer struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, base, account, key, body string) answer {
	t.Helper()
	a, err := tryPost(base, account, key, body)
	require.NoError(t, err)
	return a
}

func tryPost(base, account, key, body string) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	if account != "" {
		req.Header.Set("Authorization", "Bearer "+account)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}, err
}

func get(t *testing.T, url, account string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+account)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func (s *stack) stats(t *testing.T) chargeflow.ProviderStats {
	t.Helper()
	resp, err := http.Get(s.provider.url + "/v1/stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	var st chargeflow.ProviderStats
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	return st
}

func (s *stack) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, s.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// derivedKey is the provider idempotency key the engine used for a charge's call.
func (s *stack) derivedKey(t *testing.T, account, key string) string {
	t.Helper()
	var id string
	require.NoError(t, s.db.Pool.QueryRow(context.Background(),
		`SELECT id::text FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2`, account, key).Scan(&id))
	return id + ":" + chargeflow.PhaseProvider
}

// requireCharged checks one succeeded charge and one provider payment for the key.
func (s *stack) requireCharged(t *testing.T, account, key string) {
	t.Helper()
	require.Equal(t, 1, s.count(t, `SELECT count(*) FROM charges WHERE account_id = $1 AND idempotency_key = $2`, account, key))
	require.Equal(t, 1, s.count(t, `SELECT count(*) FROM charges WHERE account_id = $1 AND idempotency_key = $2 AND status = 'succeeded'`, account, key))
	st := s.stats(t)
	byKey := st.ByKey[s.derivedKey(t, account, key)]
	require.NotNil(t, byKey, "the provider never saw the derived key")
	require.NotEmpty(t, byKey.PaymentID)
}

// expire moves the key's lease, backoff and creation time into the past, as the
// database clock would after waiting: the sweeper and retries may take it over now.
func (s *stack) expire(t *testing.T, account, key string) {
	t.Helper()
	idemflowtest.ExpireLease(t, s.db.Pool, account, key)
}

// eventually polls cond until it holds; it fails the test after a minute.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

const body = `{"amount":1299,"currency":"usd","source":"tok_visa"}`

func TestCharges(t *testing.T) { testCharges(t, direct) }

func testCharges(t *testing.T, db backend) {
	t.Parallel()
	s := newStack(t, db)
	api := s.server.url

	t.Run("SequentialDuplicate", func(t *testing.T) { testChargesSequentialDuplicate(t, s, api) })

	t.Run("ConcurrentDuplicates", func(t *testing.T) { testChargesConcurrentDuplicates(t, s, api) })

	t.Run("BodyMismatch", func(t *testing.T) {
		require.Equal(t, 201, post(t, api, "acct_a", "mm", body).status)
		var before string
		require.NoError(t, s.db.Pool.QueryRow(context.Background(), `SELECT to_jsonb(k)::text FROM idemflow_keys k WHERE scope = 'acct_a' AND idempotency_key = 'mm'`).Scan(&before))
		other := post(t, api, "acct_a", "mm", `{"amount":1,"currency":"usd","source":"tok_visa"}`)
		require.Equal(t, 422, other.status)
		require.Contains(t, other.header.Get("Content-Type"), "application/problem+json")
		var after string
		require.NoError(t, s.db.Pool.QueryRow(context.Background(), `SELECT to_jsonb(k)::text FROM idemflow_keys k WHERE scope = 'acct_a' AND idempotency_key = 'mm'`).Scan(&after))
		require.Equal(t, before, after)
		s.requireCharged(t, "acct_a", "mm")
	})

	t.Run("ReorderedJSONReplays", func(t *testing.T) {
		first := post(t, api, "acct_a", "reorder", body)
		require.Equal(t, 201, first.status)
		again := post(t, api, "acct_a", "reorder", "{ \"source\": \"tok_visa\",\n  \"currency\": \"usd\", \"amount\": 1299 }")
		require.Equal(t, 201, again.status)
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Equal(t, first.body, again.body)
	})

	t.Run("AccountsAreIndependent", func(t *testing.T) {
		a := post(t, api, "acct_x", "shared-key", body)
		b := post(t, api, "acct_y", "shared-key", `{"amount":5,"currency":"eur","source":"tok_visa"}`)
		require.Equal(t, 201, a.status)
		require.Equal(t, 201, b.status)
		require.Empty(t, b.header.Get("Idempotent-Replayed"))
		require.NotEqual(t, a.body, b.body)
		s.requireCharged(t, "acct_x", "shared-key")
		s.requireCharged(t, "acct_y", "shared-key")
	})

	t.Run("BadInputs", func(t *testing.T) { testChargesBadInputs(t, s, api) })

	t.Run("DeclineReplayed", func(t *testing.T) {
		declinedBody := `{"amount":700,"currency":"usd","source":"card_declined"}`
		first := post(t, api, "acct_a", "decline", declinedBody)
		require.Equal(t, 402, first.status, first.body)
		again := post(t, api, "acct_a", "decline", declinedBody)
		require.Equal(t, 402, again.status)
		require.Equal(t, first.body, again.body)
		require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
		require.Equal(t, 1, s.count(t, `SELECT count(*) FROM charges WHERE idempotency_key = 'decline' AND status = 'failed'`))
	})
}

func testChargesSequentialDuplicate(t *testing.T, s *stack, api string) {
	first := post(t, api, "acct_a", "seq", body)
	require.Equal(t, 201, first.status, first.body)
	require.Empty(t, first.header.Get("Idempotent-Replayed"))
	var c chargeflow.Charge
	require.NoError(t, json.Unmarshal([]byte(first.body), &c))
	require.Equal(t, "succeeded", c.Status)
	require.NotNil(t, c.ProviderPaymentID)
	require.Equal(t, "/v1/charges/"+c.ID, first.header.Get("Location"))

	second := post(t, api, "acct_a", "seq", body)
	require.Equal(t, 201, second.status)
	require.Equal(t, first.body, second.body)
	require.Equal(t, "true", second.header.Get("Idempotent-Replayed"))
	require.Equal(t, first.header.Get("Location"), second.header.Get("Location"))
	s.requireCharged(t, "acct_a", "seq")

	got := get(t, api+"/v1/charges/"+c.ID, "acct_a")
	require.Equal(t, 200, got.status)
	require.Equal(t, 404, get(t, api+"/v1/charges/"+c.ID, "acct_other").status, "another account's charge")
	list := get(t, api+"/v1/charges", "acct_a")
	require.Equal(t, 200, list.status)
	require.Contains(t, list.body, c.ID)
}

func testChargesConcurrentDuplicates(t *testing.T, s *stack, api string) {
	before := s.stats(t).Payments
	answers := make([]answer, 20)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i], _ = tryPost(api, "acct_a", "conc", body)
		}()
	}
	wg.Wait()
	created := 0
	for _, a := range answers {
		require.Contains(t, []int{201, 409}, a.status)
		if a.status == 409 {
			require.NotEmpty(t, a.header.Get("Retry-After"))
		}
		if a.status == 201 {
			created++
		}
	}
	require.GreaterOrEqual(t, created, 1)
	require.Equal(t, before+1, s.stats(t).Payments, "one provider payment")
	s.requireCharged(t, "acct_a", "conc")
}

func testChargesBadInputs(t *testing.T, s *stack, api string) {
	payments := s.stats(t).Payments
	cases := []struct {
		name, account, key, body string
		want                     int
	}{
		{"NoKey", "acct_b", "", body, 400},
		{"KeyTooLong", "acct_b", strings.Repeat("k", 256), body, 400},
		{"NoAccount", "", "k-noauth", body, 401},
		{"NegativeAmount", "acct_b", "k-neg", `{"amount":-5,"currency":"usd","source":"tok_visa"}`, 400},
		{"BadCurrency", "acct_b", "k-cur", `{"amount":5,"currency":"USD","source":"tok_visa"}`, 400},
		{"NoSource", "acct_b", "k-src", `{"amount":5,"currency":"usd","source":""}`, 400},
		{"NotJSON", "acct_b", "k-json", `amount=5`, 400},
		{"TooLarge", "acct_b", "k-big", `{"amount":5,"currency":"usd","source":"` + strings.Repeat("x", 1<<20) + `"}`, 413},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := post(t, api, c.account, c.key, c.body)
			require.Equal(t, c.want, a.status, a.body)
			require.Contains(t, a.header.Get("Content-Type"), "application/problem+json")
			if c.want == 400 && c.key != "" && len(c.key) <= 255 {
				again := post(t, api, c.account, c.key, c.body)
				require.Equal(t, a.status, again.status)
				require.Equal(t, a.body, again.body, "an invalid request's answer is deterministic")
			}
		})
	}
	require.Equal(t, 0, s.count(t, `SELECT count(*) FROM charges WHERE account_id IN ('acct_b', '')`), "nothing charged")
	require.Equal(t, 0, s.count(t, `SELECT count(*) FROM idemflow_keys WHERE idempotency_key IN ('k-noauth', 'k-big')`), "no key row for refused requests")
	require.Equal(t, payments, s.stats(t).Payments)
}

func TestProviderOutageThenSuccess(t *testing.T) { testProviderOutageThenSuccess(t, direct) }

func testProviderOutageThenSuccess(t *testing.T, db backend) {
	t.Parallel()
	s := newStack(t, db)
	addr := strings.TrimPrefix(s.provider.url, "http://")
	s.provider.signal(syscall.SIGKILL)
	s.provider.exitCode()

	down := post(t, s.server.url, "acct", "outage", body)
	require.Equal(t, 503, down.status, down.body)
	require.NotEmpty(t, down.header.Get("Retry-After"))
	require.Equal(t, 0, s.count(t, `SELECT count(*) FROM idemflow_keys WHERE response_status IS NOT NULL`), "a 503 is never stored")
	require.Equal(t, 1, s.count(t, `SELECT count(*) FROM charges WHERE idempotency_key = 'outage' AND status = 'pending'`))

	s.provider = run(t, nil, "provider", "-addr", addr)
	up := post(t, s.server.url, "acct", "outage", body)
	require.Equal(t, 201, up.status, up.body)
	require.Empty(t, up.header.Get("Idempotent-Replayed"))
	s.requireCharged(t, "acct", "outage")
	require.Equal(t, 1, s.stats(t).Payments)
}

func TestServerKilledMidCall(t *testing.T) { testServerKilledMidCall(t, direct) }

func testServerKilledMidCall(t *testing.T, db backend) {
	t.Parallel()
	s := newStack(t, db, "-latency", "1s")
	sent := make(chan error, 1)
	go func() {
		_, err := tryPost(s.server.url, "acct", "midcall", body)
		sent <- err
	}()
	eventually(t, "the provider to receive the call", func() bool { return s.stats(t).Requests > 0 })
	s.server.signal(syscall.SIGKILL)
	require.Error(t, <-sent, "the client lost its answer")
	require.Equal(t, 1, s.count(t, `SELECT count(*) FROM charges WHERE idempotency_key = 'midcall' AND status = 'pending'`))

	server := s.serve(t, nil)
	s.expire(t, "acct", "midcall")
	retry := post(t, server.url, "acct", "midcall", body)
	require.Equal(t, 201, retry.status, retry.body)
	s.requireCharged(t, "acct", "midcall")
	require.Equal(t, 1, s.stats(t).Payments, "the retry reused the derived key")
}

func TestCrashAfterEachPhaseFinishedByWorker(t *testing.T) {
	testCrashAfterEachPhaseFinishedByWorker(t, direct)
}

func testCrashAfterEachPhaseFinishedByWorker(t *testing.T, db backend) {
	t.Parallel()
	for _, phase := range []string{chargeflow.PhaseCreate, chargeflow.PhaseProvider, chargeflow.PhaseFinalize} {
		t.Run(phase, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, db)
			doomed := s.serve(t, []string{"CHARGES_CRASH_AFTER=" + phase})
			_, err := tryPost(doomed.url, "acct", "crash", body)
			require.Error(t, err, "the server died before answering")
			require.Equal(t, 3, doomed.exitCode())

			s.expire(t, "acct", "crash")
			run(t, nil, "worker", "-database-url", s.db.URL, "-provider-url", s.provider.url,
				"-sweep-interval", "50ms", "-migrate=false")
			eventually(t, "the worker to finish the charge", func() bool {
				return s.count(t, `SELECT count(*) FROM idemflow_keys WHERE scope = 'acct' AND idempotency_key = 'crash' AND status = 'finished'`) == 1
			})
			s.requireCharged(t, "acct", "crash")
			require.Equal(t, 1, s.stats(t).Payments)

			replay := post(t, s.server.url, "acct", "crash", body)
			require.Equal(t, 201, replay.status)
			require.Equal(t, "true", replay.header.Get("Idempotent-Replayed"))
		})
	}
}

// TestThroughPgbouncer runs the acceptance cases and the demo with every server and
// worker behind pgbouncer in transaction mode, in the query exec mode the README
// documents for it.
func TestThroughPgbouncer(t *testing.T) {
	t.Parallel()
	pgtest.RequirePgbouncer(t)
	t.Run("Charges", func(t *testing.T) { testCharges(t, throughPgbouncer) })
	t.Run("ProviderOutageThenSuccess", func(t *testing.T) { testProviderOutageThenSuccess(t, throughPgbouncer) })
	t.Run("ServerKilledMidCall", func(t *testing.T) { testServerKilledMidCall(t, throughPgbouncer) })
	t.Run("CrashAfterEachPhaseFinishedByWorker", func(t *testing.T) {
		testCrashAfterEachPhaseFinishedByWorker(t, throughPgbouncer)
	})
	t.Run("ReceiptOutbox", func(t *testing.T) { testReceiptOutbox(t, throughPgbouncer) })
	t.Run("Demo", func(t *testing.T) {
		t.Parallel()
		p, err := pgtest.SharedPgbouncer(context.Background())
		require.NoError(t, err)
		cmd := exec.Command(binary, "demo")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+p.URLFor("postgres", pgtest.PooledExecMode))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "the demo through pgbouncer:\n%s", out)
		require.Contains(t, string(out), "steps behaved")
		requireDemoExplains(t, string(out))
	})
}

// requireDemoExplains checks what the demo says of two puzzles: why its twenty
// duplicates got 201 or 409 (one ran the charge, the others were replayed after it
// finished or arrived while it ran, adding up to twenty, in the summary too), and
// that the restarted provider's payment id is not step 1's.
func requireDemoExplains(t *testing.T, out string) {
	t.Helper()
	m := regexp.MustCompile(`Why the mix: (\d+) copy ran the charge \(201\)\. (\d+) arrived after it had finished .*?\(201, Idempotent-Replayed: true\)\. (\d+) arrived while it was still running .*?\(409 key-in-progress`).FindStringSubmatch(out)
	require.NotNil(t, m, "the demo explains the mix of 201 and 409:\n%s", out)
	ran, _ := strconv.Atoi(m[1])
	replayed, _ := strconv.Atoi(m[2])
	inProgress, _ := strconv.Atoi(m[3])
	require.Equal(t, 1, ran, "one copy ran the charge")
	require.Equal(t, 20, ran+replayed+inProgress, "every copy is explained")
	require.Regexp(t, `why 201 or 409 +1 ran it; .*`+fmt.Sprintf("%d ran, %d replayed, %d while it ran", ran, replayed, inProgress)+` +ok`, out)
	ids := regexp.MustCompile(`step 1: (pay_\w+), step 6: (pay_\w+) +ok`).FindStringSubmatch(out)
	require.NotNil(t, ids, "the summary compares the payment ids:\n%s", out)
	require.NotEqual(t, ids[1], ids[2], "a restarted provider's ids do not repeat")
}
