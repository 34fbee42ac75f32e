package reliability

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/payouts/payout"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// natsServerBinary is the NATS server the consumer experiment starts for itself (the
// machine's shared server is never touched).
const natsServerBinary = "/usr/sbin/nats-server"

// payoutsBinary is examples/payouts' binary.
var payoutsBinary = buildOnce("../examples/payouts")

// natsServer is a NATS server with JetStream of one test's own, on a port and a store
// directory that survive its restarts.
type natsServer struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

func startNATS(t testing.TB) *natsServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	s := &natsServer{t: t, port: port, dir: t.TempDir()}
	s.start()
	t.Cleanup(func() { s.kill() })
	return s
}

func (s *natsServer) url() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

// start runs the server and waits until it accepts connections.
func (s *natsServer) start() {
	s.t.Helper()
	s.cmd = exec.Command(natsServerBinary, "-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-js", "-sd", s.dir)
	require.NoError(s.t, s.cmd.Start())
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(s.cmd, s.done)
	waitUntil(s.t, time.Minute, "the NATS server accepts connections", func() bool {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.port), time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
}

// kill SIGKILLs the server (by its pid) and waits until it is gone.
func (s *natsServer) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// consumerSlot keeps one `payouts consume` process running until stopped: a process
// that exits (killed, or unable to reach the broker) is started again.
type consumerSlot struct {
	mu      sync.Mutex
	cmd     *exec.Cmd
	starts  int
	stopped bool
	wg      sync.WaitGroup
}

func (c *consumerSlot) run(args []string) {
	c.wg.Go(func() {
		for {
			c.mu.Lock()
			if c.stopped {
				c.mu.Unlock()
				return
			}
			cmd := exec.Command(args[0], args[1:]...)
			if err := cmd.Start(); err != nil {
				c.mu.Unlock()
				return
			}
			c.cmd = cmd
			c.starts++
			c.mu.Unlock()
			_ = cmd.Wait()
			c.mu.Lock()
			c.cmd = nil // reaped: its pid is no longer ours to signal
			c.mu.Unlock()
			pause(nil, 20*time.Millisecond, 0) // before starting it again
		}
	})
}

// kill SIGKILLs the running process, if any, by its pid.
func (c *consumerSlot) kill() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return false
	}
	return syscall.Kill(c.cmd.Process.Pid, syscall.SIGKILL) == nil
}

func (c *consumerSlot) stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.kill()
	c.wg.Wait()
}

// TestConsumerFaults runs the payouts example (a JetStream consumer on idemflow, with
// its embedded sweeper) as two competing real processes on a NATS server of the
// test's own, publishes payouts (each publish retried under its message id until the
// broker acknowledges it), and meanwhile SIGKILLs consumers at random (they are
// started again) and restarts the NATS server (SIGKILL, then a start on the same port
// and store: every consumer's connection drops, deliveries in flight are redelivered).
// Every payout must end finished with one payout row, one ledger row and one bank
// transfer under its derived key, and the checker's invariants must hold.
func TestConsumerFaults(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(natsServerBinary); err != nil {
		if os.Getenv("IDEMFLOW_REQUIRE_NATS_SERVER") != "" {
			t.Fatalf("no %s to start a NATS server of the test's own, and IDEMFLOW_REQUIRE_NATS_SERVER is set", natsServerBinary)
		}
		t.Skipf("no %s to start a NATS server of the test's own (apt-get install nats-server)", natsServerBinary)
	}
	bin, err := payoutsBinary()
	require.NoError(t, err)
	env := newEnv(t, pgtest.New(t))
	ns := startNATS(t)
	bank := payout.NewBank(0)
	bankSrv := httptest.NewServer(bank.Handler())
	t.Cleanup(bankSrv.Close)
	js := payoutStream(t, ns)
	ctx := context.Background()

	args := []string{bin, "consume", "-database-url", env.db.URL, "-bank-url", bankSrv.URL, "-nats-url", ns.url(),
		"-create-stream=false", "-ack-wait", "2s", "-lease", "2s", "-sweep-interval", "100ms", "-sweep-grace", "1ms"}
	slots := []*consumerSlot{{}, {}}
	for _, s := range slots {
		s.run(args)
	}

	n, rounds := scale(40, 400, 2000), scale(4, 40, 200)
	keys, kills, restarts := publishPayouts(js, ns, slots, n, rounds)
	// Let the consumers (and their sweepers) finish everything.
	waitUntil(t, 5*time.Minute, "every payout finished", func() bool {
		var left int
		require.NoError(t, env.db.Pool.QueryRow(ctx, `SELECT $1::int - count(*) FILTER (WHERE status = 'finished') FROM idemflow_keys WHERE scope LIKE 'payouts/%'`, n).Scan(&left))
		return left == 0
	})
	for _, s := range slots {
		s.stop()
	}
	r := env.check(t, checkOpts{keys: keys})
	stats := bank.Stats()
	payoutRows := requirePayoutsOnce(t, env, stats, n)
	require.Positive(t, kills, "consumers were killed")
	require.Positive(t, restarts, "the NATS server was restarted")
	starts := 0
	for _, s := range slots {
		starts += s.starts
	}
	t.Logf("consumer faults: payouts=%d consumers_killed=%d nats_restarts=%d consumer_starts=%d bank_requests=%d bank_transfers=%d keys=%d duplicates=%d unfinished=%d",
		n, kills, restarts, starts, stats.Requests, len(stats.Transfers), r.Keys, r.DuplicateEffects+payoutRows-n, r.Unfinished)
}

// payoutStream connects to ns (reconnecting for ever) and creates the PAYOUTS stream.
func payoutStream(t *testing.T, ns *natsServer) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(ns.url(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.Timeout(5*time.Second))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = js.CreateStream(cctx, jetstream.StreamConfig{Name: "PAYOUTS", Subjects: []string{"payouts.requested"}, Duplicates: 10 * time.Minute, Storage: jetstream.FileStorage})
	cancel()
	require.NoError(t, err)
	return js
}

// publishPayouts publishes n payouts in rounds; between two rounds a consumer is
// SIGKILLed or the broker restarted. A publish that fails (the broker is down) is
// sent again under its message id. It returns the payouts' keys and how many
// consumers were killed and broker restarts there were.
func publishPayouts(js jetstream.JetStream, ns *natsServer, slots []*consumerSlot, n, rounds int) (keys [][2]string, kills, restarts int) {
	for i := range n {
		if i%(n/rounds) == 0 {
			if round := i / (n / rounds); round%3 == 0 {
				ns.kill()
				restarts++
				ns.start()
			} else if slots[round%len(slots)].kill() {
				kills++
			}
		}
		id := fmt.Sprintf("payout-%d", i)
		keys = append(keys, [2]string{fmt.Sprintf("payouts/acct-%d", i%7), id}) // the consumer scopes by account
		body := fmt.Sprintf(`{"payout_id":%q,"account":"acct-%d","amount":%d,"currency":"usd"}`, id, i%7, 100+i)
		for {
			pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := js.Publish(pctx, "payouts.requested", []byte(body), jetstream.WithMsgID(id))
			cancel()
			if err == nil {
				break
			}
			pause(nil, 20*time.Millisecond, 0) // the broker restarts: publish again, same message id
		}
		pause(nil, 0, 10*time.Millisecond)
	}
	return keys, kills, restarts
}

// requirePayoutsOnce checks that each of the n payouts' key rows has its bank
// transfer, and that there is one transfer, one payout row and one ledger row per
// payout, every payout paid. It returns the payout rows.
func requirePayoutsOnce(t *testing.T, env *env, stats payout.BankStats, n int) int {
	t.Helper()
	ctx := context.Background()
	var rowIDs []string
	require.NoError(t, func() error {
		rows, err := env.db.Pool.Query(ctx, `SELECT id::text FROM idemflow_keys WHERE scope LIKE 'payouts/%'`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			rowIDs = append(rowIDs, id)
		}
		return rows.Err()
	}())
	for _, id := range rowIDs {
		require.Contains(t, stats.Transfers, id+":"+payout.PhaseTransfer, "a payout was never transferred")
	}
	require.Len(t, stats.Transfers, n, "one bank transfer per payout, no other")
	var payoutRows, ledgerRows, paid int
	require.NoError(t, env.db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM payouts), (SELECT count(*) FROM ledger),
		(SELECT count(DISTINCT payout_id) FROM payouts WHERE status = 'paid')`).Scan(&payoutRows, &ledgerRows, &paid))
	require.Equal(t, n, payoutRows, "one payout row per payout")
	require.Equal(t, n, ledgerRows, "one ledger row per payout")
	require.Equal(t, n, paid, "every payout paid")
	return payoutRows
}
