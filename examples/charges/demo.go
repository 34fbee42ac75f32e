package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// demo starts a database (unless DATABASE_URL is set), the provider, a server and a
// worker as separate processes, and shows each promise with real HTTP.
func demo(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	verbose := fs.Bool("v", false, "print the child processes' logs")
	distributed := fs.Bool("distribute", false, "DATABASE_URL is a Citus coordinator: distribute the tables (serve and worker -distribute), in a schema of the demo's own")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	d := &demoRun{out: out, verbose: *verbose}
	defer d.stopAll()

	self, err := os.Executable()
	if err != nil {
		return err
	}
	d.self = self

	d.say("Setting up: a database, the payment provider, an API server and a worker, each its own process.")
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		srv, err := pgtest.Start(ctx)
		if err != nil {
			return fmt.Errorf("start a throwaway Postgres (or set DATABASE_URL): %w", err)
		}
		defer srv.Stop() //nolint:errcheck // best effort at exit
		base = srv.URL
		d.say("  database: a throwaway PostgreSQL server")
	} else {
		d.say("  database: $DATABASE_URL")
	}
	dbURL, dropDatabase, err := freshDatabase(ctx, base, *distributed)
	if err != nil {
		return err
	}
	defer dropDatabase()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	d.pool = pool

	provider, err := d.start(ctx, "provider", nil, "provider", "-addr", "127.0.0.1:0")
	if err != nil {
		return err
	}
	providerAddr := strings.TrimPrefix(provider.url, "http://")
	common := []string{"-database-url", dbURL, "-provider-url", provider.url, "-lease", "2s"}
	if *distributed {
		common = append(common, "-distribute")
		d.say("  tables: charges distributed by account, idemflow_keys by scope, colocated (Citus)")
	}
	server, err := d.start(ctx, "server", nil, append([]string{"serve", "-addr", "127.0.0.1:0", "-sweeper=false"}, common...)...)
	if err != nil {
		return err
	}
	if _, err := d.start(ctx, "worker", nil, append([]string{"worker", "-sweep-interval", "200ms", "-sweep-grace", "1s"}, common...)...); err != nil {
		return err
	}
	api := &client{base: server.url, account: "acct_demo"}
	body := `{"amount":1299,"currency":"usd","source":"tok_visa"}`

	d.chargeAndReplay(ctx, api, body)
	d.duplicates(ctx, api, provider, body)
	d.reused(ctx, api)
	if err := d.crash(ctx, api, provider, common, body); err != nil {
		return err
	}
	if err := d.outage(ctx, api, provider, providerAddr, body); err != nil {
		return err
	}

	if *distributed {
		d.checkColocated(ctx)
	}
	return d.summary()
}

// chargeAndReplay shows a charge and its replay (steps 1 and 2).
func (d *demoRun) chargeAndReplay(ctx context.Context, api *client, body string) {
	// 1. A charge.
	d.say("\n1. A charge: POST /v1/charges with Idempotency-Key: demo-1")
	first, err := api.post(ctx, "demo-1", body)
	d.check("charge", "201", first.String(), err == nil && first.status == 201)
	d.say("   -> %s %s", first, first.body)
	d.firstPayment = paymentID(first.body)

	// 2. Its replay.
	d.say("\n2. The client retries the same request (its answer was lost)")
	again, err := api.post(ctx, "demo-1", body)
	same := err == nil && again.status == 201 && bytes.Equal(again.body, first.body) && again.header.Get("Idempotent-Replayed") == "true"
	d.check("replay", "201, same bytes, Idempotent-Replayed", again.String()+replayNote(again, first), same)
	d.say("   -> %s%s", again, replayNote(again, first))
}

// duplicates shows twenty concurrent copies of one request (step 3).
func (d *demoRun) duplicates(ctx context.Context, api *client, provider *proc, body string) {
	// 3. Twenty concurrent duplicates.
	d.say("\n3. Twenty copies of one request at once (Idempotency-Key: demo-2)")
	paymentsBefore, _ := providerPayments(ctx, provider.url)
	codes := map[int]int{}
	replayed := 0 // the 201s answered from the store (Idempotent-Replayed: true)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := api.post(ctx, "demo-2", body)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				codes[0]++
				return
			}
			codes[r.status]++
			if r.status == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "true" {
				replayed++
			}
		}()
	}
	wg.Wait()
	rows := d.count(ctx, `SELECT count(*) FROM charges WHERE idempotency_key = 'demo-2'`)
	paymentsAfter, _ := providerPayments(ctx, provider.url)
	ran := codes[201] - replayed // the copy that ran the charge
	mix := ran == 1 && codes[201]+codes[409] == 20
	d.check("20 concurrent duplicates", "1 charge, 1 payment, only 201/409",
		fmt.Sprintf("%d charge, %d payment, answers %v", rows, paymentsAfter-paymentsBefore, codes),
		rows == 1 && paymentsAfter-paymentsBefore == 1 && mix)
	d.check("why 201 or 409", "1 ran it; the rest replayed (201) or told to retry (409)",
		fmt.Sprintf("%d ran, %d replayed, %d while it ran", ran, replayed, codes[409]), mix)
	d.say("   -> answers by status %v; charges rows %d; provider payments %d", codes, rows, paymentsAfter-paymentsBefore)
	d.say("   Why the mix: %s", explainMix(ran, replayed, codes[409]))
}

// explainMix says why concurrent copies of one request got 201 or 409: ran copies
// ran the charge, replayed ones arrived after it had finished and got its stored
// answer, and inProgress ones arrived while it ran.
func explainMix(ran, replayed, inProgress int) string {
	return fmt.Sprintf("%d copy ran the charge (201). %d arrived after it had finished and were answered "+
		"from the store, byte for byte (201, Idempotent-Replayed: true). %d arrived while it was still "+
		"running and were told to retry with the same key (409 key-in-progress, with Retry-After); a "+
		"retry gets the stored 201. Which copies land in which group depends on timing, so the mix "+
		"changes from run to run; the one charge and the one payment do not.", ran, replayed, inProgress)
}

// reused shows the key of the first charge reused for another body (step 4).
func (d *demoRun) reused(ctx context.Context, api *client) {
	// 4. A key reused with another body.
	d.say("\n4. The key demo-1 reused for a different amount")
	other, err := api.post(ctx, "demo-1", `{"amount":500,"currency":"usd","source":"tok_visa"}`)
	d.check("key reused, other body", "422", other.String(), err == nil && other.status == 422)
	d.say("   -> %s %s", other, other.body)
}

// crash shows a server killed mid-flow and the worker finishing its key (step 5).
func (d *demoRun) crash(ctx context.Context, api *client, provider *proc, common []string, body string) error {
	// 5. A server killed mid-flow, finished by the worker.
	d.say("\n5. A second server that dies right after the provider charged the card (CHARGES_CRASH_AFTER=provider_charge)")
	doomed, err := d.start(ctx, "doomed-server", []string{"CHARGES_CRASH_AFTER=" + chargeflow.PhaseProvider},
		append([]string{"serve", "-addr", "127.0.0.1:0", "-sweeper=false", "-migrate=false"}, common...)...)
	if err != nil {
		return err
	}
	paymentsBefore, _ := providerPayments(ctx, provider.url)
	crashed, err := (&client{base: doomed.url, account: "acct_demo"}).post(ctx, "demo-3", body)
	exitCode := doomed.wait(10 * time.Second)
	d.say("   -> the client saw: %v; the server exited with code %d", describe(crashed, err), exitCode)
	finished := d.waitFor(ctx, 30*time.Second, `SELECT count(*) FROM charges WHERE idempotency_key = 'demo-3' AND status = 'succeeded'`)
	paymentsAfter, _ := providerPayments(ctx, provider.url)
	d.check("server killed mid-flow", "worker finishes it, 1 payment",
		fmt.Sprintf("exit %d, finished %v, %d payment", exitCode, finished, paymentsAfter-paymentsBefore),
		exitCode == 3 && finished && paymentsAfter-paymentsBefore == 1)
	retry, err := api.post(ctx, "demo-3", body)
	d.check("client retries after the crash", "201 replayed", retry.String()+replayNote(retry, reply{}),
		err == nil && retry.status == 201 && retry.header.Get("Idempotent-Replayed") == "true")
	d.say("   -> the worker finished it; the client's retry gets %s%s", retry, replayNote(retry, reply{}))
	return nil
}

// outage shows a provider outage and the retry that succeeds once it is back (step 6).
func (d *demoRun) outage(ctx context.Context, api *client, provider *proc, providerAddr, body string) error {
	// 6. A provider outage and the retry that succeeds.
	d.say("\n6. The provider goes down")
	provider.kill()
	down, err := api.post(ctx, "demo-4", body)
	d.check("provider outage", "503 with Retry-After, not stored", down.String()+" Retry-After: "+down.header.Get("Retry-After"),
		err == nil && down.status == 503 && down.header.Get("Retry-After") != "")
	d.say("   -> %s Retry-After: %s %s", down, down.header.Get("Retry-After"), down.body)
	d.say("   The provider comes back; the client retries")
	provider, err = d.start(ctx, "provider", nil, "provider", "-addr", providerAddr)
	if err != nil {
		return err
	}
	// The worker's sweeper may take the released key before the client's retry comes
	// (its backoff and grace are short here): the retry is then answered 409 while the
	// sweep runs it, and the client waits Retry-After and retries, as a client should.
	up, err := api.post(ctx, "demo-4", body)
	for retries := 0; err == nil && up.status == http.StatusConflict && retries < 20; retries++ {
		wait, _ := strconv.Atoi(up.header.Get("Retry-After"))
		d.say("   -> %s: the worker's sweeper is finishing it; the client retries after %d s (Retry-After)", up, max(wait, 1))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(max(wait, 1)) * time.Second):
		}
		up, err = api.post(ctx, "demo-4", body)
	}
	rows := d.count(ctx, `SELECT count(*) FROM charges WHERE idempotency_key = 'demo-4' AND status = 'succeeded'`)
	payments, _ := providerPayments(ctx, provider.url)
	d.check("retry after the outage", "201, 1 charge, 1 payment", fmt.Sprintf("%s, %d charge, %d payment", up, rows, payments),
		err == nil && up.status == 201 && rows == 1 && payments == 1)
	d.say("   -> %s %s", up, up.body)
	id := paymentID(up.body)
	d.check("payment ids across provider restarts", "unique", fmt.Sprintf("step 1: %s, step 6: %s", d.firstPayment, id),
		id != "" && d.firstPayment != "" && id != d.firstPayment)
	if id != "" {
		d.say("   (%s is the restarted provider's first payment, made once for demo-4 under its", id)
		d.say("   derived key; its id differs from step 1's %s, as a real provider's would.)", d.firstPayment)
	}
	return nil
}

// checkColocated checks, on Citus, that charges and idemflow's keys are distributed
// tables in one colocation group, and that the demo's charges landed on their shards.
func (d *demoRun) checkColocated(ctx context.Context) {
	d.say("\n7. On Citus: where the tables are")
	var tables, groups, shards int
	err := d.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT colocationid),
			(SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'charges'::regclass)
		FROM pg_dist_partition WHERE logicalrelid IN ('charges'::regclass, 'idemflow_keys'::regclass)`).Scan(&tables, &groups, &shards)
	got := fmt.Sprintf("%d distributed, %d colocation group, %d shards each", tables, groups, shards)
	if err != nil {
		got = err.Error()
	}
	d.check("distributed, colocated", "2 distributed, 1 colocation group", got, err == nil && tables == 2 && groups == 1)
	d.say("   -> %s", got)
}

type demoRun struct {
	out     io.Writer
	verbose bool
	self    string
	pool    *pgxpool.Pool
	procs   []*proc
	results [][4]string
	failed  int
	// firstPayment is the provider's payment id of step 1's charge.
	firstPayment string
}

func (d *demoRun) say(format string, args ...any) { fmt.Fprintf(d.out, format+"\n", args...) }

func (d *demoRun) check(step, want, got string, ok bool) {
	verdict := "ok"
	if !ok {
		verdict = "FAILED"
		d.failed++
	}
	d.results = append(d.results, [4]string{step, want, got, verdict})
}

func (d *demoRun) summary() error {
	d.say("\nSummary")
	tw := tabwriter.NewWriter(d.out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tEXPECTED\tGOT\tRESULT")
	for _, r := range d.results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r[0], r[1], r[2], r[3])
	}
	tw.Flush()
	if d.failed > 0 {
		for _, p := range d.procs {
			d.say("\n--- %s log ---\n%s", p.name, p.logs())
		}
		return fmt.Errorf("%d of %d steps misbehaved", d.failed, len(d.results))
	}
	d.say("\nAll %d steps behaved.", len(d.results))
	return nil
}

func (d *demoRun) count(ctx context.Context, sql string) int {
	var n int
	if err := d.pool.QueryRow(ctx, sql).Scan(&n); err != nil {
		return -1
	}
	return n
}

// waitFor polls until sql counts at least one row, or the timeout passes.
func (d *demoRun) waitFor(ctx context.Context, timeout time.Duration, sql string) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if d.count(ctx, sql) > 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
	return false
}

func (d *demoRun) stopAll() {
	for _, p := range d.procs {
		p.stop()
	}
}

// proc is a child process that announces "listening on http://ADDR" (or "sweeping").
type proc struct {
	name string
	cmd  *exec.Cmd
	url  string
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan struct{}
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buf.Write(b)
}

func (p *proc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buf.String()
}

func (d *demoRun) start(ctx context.Context, name string, env []string, args ...string) (*proc, error) {
	p := &proc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(d.self, args...)
	p.cmd.Env = append(os.Environ(), env...)
	var errw io.Writer = p
	if d.verbose {
		errw = io.MultiWriter(p, prefixed(d.out, name))
	}
	p.cmd.Stderr = errw
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	d.procs = append(d.procs, p)
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(p, line)
			if _, u, ok := strings.Cut(line, "listening on "); ok {
				ready <- u
			} else if strings.Contains(line, "sweeping") {
				ready <- ""
			}
		}
	}()
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	select {
	case u := <-ready:
		p.url = u
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before it was ready:\n%s", name, p.logs())
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("%s was not ready within 60s:\n%s", name, p.logs())
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// wait waits for the process to exit and returns its exit code (-1 if it did not).
func (p *proc) wait(timeout time.Duration) int {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		return -1
	}
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.kill()
	}
}

type prefixWriter struct {
	w    io.Writer
	name string
}

func prefixed(w io.Writer, name string) io.Writer { return &prefixWriter{w: w, name: name} }

func (p *prefixWriter) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line != "" {
			fmt.Fprintf(p.w, "   [%s] %s", p.name, line)
		}
	}
	return len(b), nil
}

// client is a charges API client for one account.
type client struct {
	base    string
	account string
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) String() string {
	if r.status == 0 {
		return "no answer"
	}
	return fmt.Sprintf("%d %s", r.status, http.StatusText(r.status))
}

func (c *client) post(ctx context.Context, key, body string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/charges", strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Authorization", "Bearer "+c.account)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: bytes.TrimSpace(b)}, err
}

func replayNote(r, first reply) string {
	note := ""
	if r.header.Get("Idempotent-Replayed") == "true" {
		note = " (Idempotent-Replayed: true"
		if first.body != nil {
			if bytes.Equal(r.body, first.body) {
				note += ", identical bytes"
			} else {
				note += ", DIFFERENT bytes"
			}
		}
		note += ")"
	}
	return note
}

func describe(r reply, err error) string {
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			return "connection lost (" + ue.Err.Error() + ")"
		}
		return err.Error()
	}
	return r.String()
}

// paymentID is the provider_payment_id of a charge's body, or "".
func paymentID(body []byte) string {
	var c struct {
		ID *string `json:"provider_payment_id"`
	}
	if json.Unmarshal(body, &c) != nil || c.ID == nil {
		return ""
	}
	return *c.ID
}

func providerPayments(ctx context.Context, base string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/stats", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var st chargeflow.ProviderStats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return 0, err
	}
	return st.Payments, nil
}

// freshDatabase creates a database of its own on the server at base and returns a URL
// for it (base's, with the database's name), and a function that drops it. A database
// rather than a schema, so that the demo also runs behind a pooler that refuses the
// search_path a schema would need (pgbouncer). Where base's user may not create
// databases, or inSchema asks (on Citus, whose workers a new database would not
// reach), it makes a schema of its own instead.
func freshDatabase(ctx context.Context, base string, inSchema bool) (string, func(), error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "charges_demo_" + hex.EncodeToString(b[:])
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", nil, fmt.Errorf("DATABASE_URL must be a postgres:// URL")
	}
	pool, err := pgxpool.New(ctx, base)
	if err != nil {
		return "", nil, err
	}
	if inSchema {
		return freshSchema(ctx, pool, base, name)
	}
	var pgErr *pgconn.PgError
	_, err = pool.Exec(ctx, "CREATE DATABASE "+name)
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient privilege
		return freshSchema(ctx, pool, base, name)
	case err != nil:
		pool.Close()
		return "", nil, fmt.Errorf("create demo database: %w", err)
	}
	u.Path = "/" + name
	return u.String(), dropper(pool, "DROP DATABASE "+name+" WITH (FORCE)"), nil
}

// dropper returns a function that runs drop on pool, best effort, and closes pool.
func dropper(pool *pgxpool.Pool, drop string) func() {
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, drop)
		pool.Close()
	}
}

// freshSchema creates the schema name on pool's database and returns a URL whose
// search_path is that schema, and a function that drops it.
func freshSchema(ctx context.Context, pool *pgxpool.Pool, base, name string) (string, func(), error) {
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		pool.Close()
		return "", nil, fmt.Errorf("create demo schema: %w", err)
	}
	u, _ := url.Parse(base) // parsed by the caller
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String(), dropper(pool, "DROP SCHEMA "+name+" CASCADE"), nil
}
