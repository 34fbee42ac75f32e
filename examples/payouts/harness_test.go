package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/payouts/payout"
	"github.com/idemflow/idemflow/idemflowtest"
)

// natsURL is the NATS server with JetStream the tests use: $NATS_URL, else the one
// .ci/run makes sure answers on 127.0.0.1:4222.
func natsURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// rig is one test's world: a schema, a bank, and a stream and durable consumer of its
// own (unique names, deleted when the test ends), so that parallel tests and reruns
// never see each other's messages.
type rig struct {
	t       testing.TB
	db      *idemflowtest.DB
	bank    *payout.Bank
	bankURL string
	js      jetstream.JetStream
	stream  string
	subject string
	durable string
}

func newRig(t testing.TB, failEvery int) *rig {
	t.Helper()
	nc, err := nats.Connect(natsURL(), nats.Timeout(5*time.Second), nats.Name("payouts-test"))
	if err != nil {
		t.Fatalf("no NATS server answers at %s (%v): these tests need a real NATS server with JetStream; start one with `nats-server -js -a 127.0.0.1 -p 4222` (.ci/run does) or set NATS_URL", natsURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	// A bound on a hang only, sized for a slow machine: it also spans the making of
	// the test's database below, which takes seconds when the cores are busy.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Fatalf("the NATS server at %s has no JetStream (%v): start it with -js", natsURL(), err)
	}
	id := randomID()
	r := &rig{
		t: t, db: idemflowtest.NewDB(t), bank: payout.NewBank(failEvery), js: js,
		stream: "PAYOUTS_" + strings.ToUpper(id), subject: "t" + id + ".payouts.requested", durable: "payouts",
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: r.stream, Subjects: []string{r.subject, r.subject + ".>"}, Duplicates: 2 * time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := js.DeleteStream(ctx, r.stream); err != nil {
			t.Errorf("delete stream %s: %v", r.stream, err)
		}
	})
	srv := httptest.NewServer(r.bank.Handler())
	t.Cleanup(srv.Close)
	r.bankURL = srv.URL
	return r
}

func randomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// publish publishes a payouts.requested message with the Nats-Msg-Id msgID and
// reports whether the broker dropped it as a duplicate of an earlier one.
func (r *rig) publish(msgID string, p payout.Requested) bool {
	r.t.Helper()
	body, err := json.Marshal(p)
	require.NoError(r.t, err)
	return r.publishRaw(msgID, body)
}

// publishRaw publishes body as it is.
func (r *rig) publishRaw(msgID string, body []byte) bool {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := r.js.Publish(ctx, r.subject, body, jetstream.WithMsgID(msgID))
	require.NoError(r.t, err)
	return ack.Duplicate
}

// consumerProc is a running `payouts consume` process.
type consumerProc struct {
	cmd   *exec.Cmd
	done  chan struct{}
	mu    sync.Mutex
	lines []string // stdout
	errs  strings.Builder
}

// consume starts a consumer on the rig's stream with the given fault environment and
// extra flags, and waits until it consumes (or, with a crash point, until it is ready
// or dead).
//
// The broker's ack wait is a minute unless a test that wants a redelivery (a withheld
// ack, a consumer killed mid-delivery) passes a short one: with 2 s, a consumer that
// a loaded machine stalled 2 s between storing an answer and acking it got the message
// again, and its replay was one more than the tests count (shown by a temporary 2.1 s
// sleep before the first ack: TestDuplicatesAreOnePayout and
// TestAnyPayoutIDIsPaidOnce each counted one replay too many).
func (r *rig) consume(env []string, extra ...string) *consumerProc {
	r.t.Helper()
	args := append([]string{"consume",
		"-database-url", r.db.URL, "-bank-url", r.bankURL, "-nats-url", natsURL(),
		"-stream", r.stream, "-subject", r.subject, "-consumer", r.durable, "-create-stream=false",
		"-ack-wait", "1m", "-lease", "2s", "-sweep-interval", "100ms", "-sweep-grace", "1ms",
	}, extra...)
	p := &consumerProc{cmd: exec.Command(binary, args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = &lockedWriter{mu: &p.mu, b: &p.errs}
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(r.t, err)
	require.NoError(r.t, p.cmd.Start())
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		once := sync.Once{}
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			if strings.HasPrefix(sc.Text(), "consumer: consuming") {
				once.Do(func() { close(ready) })
			}
		}
		_ = p.cmd.Wait()
		close(p.done)
	}()
	r.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			<-p.done
		}
		if r.t.Failed() {
			r.t.Logf("consumer %d stdout:\n%s\nstderr:\n%s", p.cmd.Process.Pid, strings.Join(p.output(), "\n"), p.stderr())
		}
	})
	select {
	case <-ready:
	case <-p.done:
		r.t.Fatalf("consumer exited before it was ready:\n%s", p.stderr())
	case <-time.After(time.Minute):
		r.t.Fatalf("consumer not ready within a minute:\n%s", p.stderr())
	}
	return p
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(b)
}

func (p *consumerProc) output() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

func (p *consumerProc) stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.errs.String()
}

// count is the number of stdout lines that contain every one of parts.
func (p *consumerProc) count(parts ...string) int {
	n := 0
	for _, l := range p.output() {
		all := true
		for _, s := range parts {
			all = all && strings.Contains(l, s)
		}
		if all {
			n++
		}
	}
	return n
}

// killed waits for the process to end and checks that SIGKILL ended it.
func (p *consumerProc) killed(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the consumer did not die:\n%s", p.stderr())
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, "not killed by SIGKILL: %v\n%s", p.cmd.ProcessState, p.stderr())
}

// eventually polls cond on the database and the broker until it holds, or fails the
// test after two minutes.
func (r *rig) eventually(what string, cond func() (bool, error)) {
	r.t.Helper()
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		select {
		case <-tick.C:
		case <-deadline.C:
			r.t.Fatalf("timed out waiting for %s (last error: %v)", what, last)
		}
	}
}

func (r *rig) count(sql string, args ...any) (int, error) {
	var n int
	err := r.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n)
	return n, err
}

// settled waits until every payout has its ledger row and its key is finished, no
// key is left unfinished, and (when acked) the broker has nothing pending or unacked.
func (r *rig) settled(ps []payout.Requested, acked bool) {
	r.t.Helper()
	accounts, ids := columns(ps)
	r.eventually("every payout settled", func() (bool, error) {
		done, err := r.count(`SELECT count(DISTINCT (l.account_id, l.payout_id)) FROM ledger l
			JOIN unnest($1::text[], $2::text[]) AS p(account, id) ON l.account_id = p.account AND l.payout_id = p.id`, accounts, ids)
		if err != nil || done < len(ps) {
			return false, err
		}
		open, err := r.count(`SELECT count(*) FROM idemflow_keys WHERE status <> 'finished'`)
		if err != nil || open > 0 {
			return false, err
		}
		if !acked {
			return true, nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := r.js.Consumer(ctx, r.stream, r.durable)
		if err != nil {
			return false, err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return false, err
		}
		if info.NumPending > 0 || info.NumAckPending > 0 {
			return false, fmt.Errorf("%d pending, %d unacked", info.NumPending, info.NumAckPending)
		}
		return true, nil
	})
}

func columns(ps []payout.Requested) (accounts, ids []string) {
	for _, p := range ps {
		accounts, ids = append(accounts, p.Account), append(ids, p.PayoutID)
	}
	return accounts, ids
}

// requireExactlyOnce checks each payout's effects: one payout row (paid), one ledger
// row, its key under the account's scope, and at the bank one transfer under the
// payout's derived key; and that the bank made no transfer beyond those.
func (r *rig) requireExactlyOnce(ps []payout.Requested) {
	r.t.Helper()
	ctx := context.Background()
	stats := r.bank.Stats()
	for _, p := range ps {
		n, err := r.count(`SELECT count(*) FROM ledger WHERE account_id = $1 AND payout_id = $2`, p.Account, p.PayoutID)
		require.NoError(r.t, err)
		require.Equal(r.t, 1, n, "ledger rows of payout %q of %q", p.PayoutID, p.Account)
		n, err = r.count(`SELECT count(*) FROM payouts WHERE account_id = $1 AND payout_id = $2 AND status = 'paid'`, p.Account, p.PayoutID)
		require.NoError(r.t, err)
		require.Equal(r.t, 1, n, "paid payout rows of %q of %q", p.PayoutID, p.Account)
		var rowID string
		require.NoError(r.t, r.db.Pool.QueryRow(ctx,
			`SELECT id::text FROM idemflow_keys WHERE scope = $1 AND idempotency_key = $2 AND status = 'finished'`,
			payout.Scope("payouts", p.Account), payout.Key(p.PayoutID)).Scan(&rowID))
		key := rowID + ":" + payout.PhaseTransfer
		tr, ok := stats.Transfers[key]
		require.True(r.t, ok, "no bank transfer under the derived key of payout %q of %q", p.PayoutID, p.Account)
		var ledgerTr string
		require.NoError(r.t, r.db.Pool.QueryRow(ctx, `SELECT transfer_id FROM ledger WHERE account_id = $1 AND payout_id = $2`,
			p.Account, p.PayoutID).Scan(&ledgerTr))
		require.Equal(r.t, tr, ledgerTr, "the ledger names the one bank transfer")
	}
	require.Len(r.t, stats.Transfers, len(ps), "one bank transfer per payout, no other")
	n, err := r.count(`SELECT count(*) FROM payouts`)
	require.NoError(r.t, err)
	require.Equal(r.t, len(ps), n, "no payout recorded twice")
}

func payoutN(i int) payout.Requested {
	return payout.Requested{PayoutID: fmt.Sprintf("po_%03d", i), Account: "acct_" + fmt.Sprint(i%3), Amount: int64(100 + i), Currency: "eur"}
}
