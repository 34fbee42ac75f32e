package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/payouts/payout"
	"github.com/idemflow/idemflow/testkit/cpumeter"
	"github.com/idemflow/idemflow/workflow"
)

// BenchmarkConsumer measures messages per second through the payouts consumer with
// idemflow (the flow: key row, three phases, replay-safe) against the same consumer
// doing the same work without it (payout.Bare: the same two transactions and bank
// call), side by side: rounds of each alternate within one run, on one database,
// broker and bank, each variant with its own subject and durable consumer. A round
// publishes its messages and ends when the last is acknowledged.
//
// Metrics: msg/s of each variant over all its rounds; the ratio; CPU per message of
// this process (both consumers, the bank) and of the database server's processes
// (testkit/cpumeter: getrusage, /proc/<pid>/stat of the postmaster and its children),
// and of the whole
// machine (/proc/stat: also NATS, and whatever else runs), over each variant's rounds;
// and the load average when the run started.
//
//	go test ./examples/payouts -run '^$' -bench Consumer -benchtime 4000x
func BenchmarkConsumer(b *testing.B) {
	r := newRig(b, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := pgxpool.ParseConfig(r.db.URL)
	require.NoError(b, err)
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	defer pool.Close()
	require.NoError(b, migrate(ctx, pool))

	const workers = 8
	bank := &payout.BankClient{BaseURL: r.bankURL, HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * workers}}}
	engine, err := workflow.New(pool, nil)
	require.NoError(b, err)
	require.NoError(b, engine.Register(payout.Flow(bank)))
	idem := &consumer{engine: engine, db: pool, scopePrefix: "payouts", stream: r.stream, out: io.Discard}

	variants := []*benchVariant{
		{name: "bare", handle: func(ctx context.Context, m jetstream.Msg) {
			if _, err := payout.Bare(ctx, pool, bank, m.Data()); err != nil {
				_ = m.Nak()
				return
			}
			_ = m.DoubleAck(ctx)
		}},
		{name: "idemflow", handle: idem.handle},
	}
	for _, v := range variants {
		v.subject = r.subject + "." + v.name
		v.start(ctx, b, r, workers)
	}
	meter := cpumeter.New(ctx, pool)
	for _, v := range variants {
		v.meter = meter
	}
	load := loadAverage()

	round := min(b.N, 250)
	b.ResetTimer()
	for sent := 0; sent < b.N; sent += round {
		n := min(round, b.N-sent)
		for _, v := range variants {
			v.round(ctx, b, r, sent, n)
		}
	}
	b.StopTimer()

	bare, with := variants[0], variants[1]
	for _, v := range variants {
		b.ReportMetric(v.rate(), v.name+"-msg/s")
		b.ReportMetric(v.procCPU.Seconds()*1e6/float64(v.msgs), v.name+"-proc-cpu-µs/msg")
		b.ReportMetric(v.machineCPU.Seconds()*1e6/float64(v.msgs), v.name+"-machine-cpu-µs/msg")
		b.ReportMetric(v.dbCPU.Seconds()*1e6/float64(v.msgs), v.name+"-db-cpu-µs/msg")
	}
	b.ReportMetric(with.rate()/bare.rate(), "ratio")
	b.ReportMetric(load, "load1")
	for _, v := range variants {
		n, err := r.count(`SELECT count(*) FROM ledger WHERE payout_id LIKE $1`, v.name+"-%")
		require.NoError(b, err)
		require.Equal(b, v.msgs, n, "%s: one ledger row per message", v.name)
	}
}

// benchVariant is one consumer of the benchmark.
type benchVariant struct {
	name    string
	subject string
	handle  func(context.Context, jetstream.Msg)
	handled atomic.Int64
	signal  chan struct{} // a message was handled

	meter *cpumeter.Meter

	msgs       int
	wall       time.Duration
	procCPU    time.Duration
	machineCPU time.Duration
	dbCPU      time.Duration
}

func (v *benchVariant) start(ctx context.Context, b *testing.B, r *rig, workers int) {
	v.signal = make(chan struct{}, 1)
	s := &stream{name: r.stream, subject: v.subject, durable: v.name, ackWait: time.Minute, maxDeliver: -1, workers: workers}
	ready := make(chan struct{})
	done := make(chan error, 1)
	var err error
	s.natsURL = natsURL()
	go func() {
		done <- s.consume(ctx, func(ctx context.Context, m jetstream.Msg) {
			v.handle(ctx, m)
			v.handled.Add(1)
			select {
			case v.signal <- struct{}{}:
			default:
			}
		}, func() { close(ready) })
	}()
	select {
	case <-ready:
	case err = <-done:
		b.Fatalf("%s consumer: %v", v.name, err)
	}
	b.Cleanup(func() {
		if err := <-done; err != nil {
			b.Errorf("%s consumer: %v", v.name, err)
		}
	})
}

// round publishes n messages to the variant and waits until all are handled.
func (v *benchVariant) round(ctx context.Context, b *testing.B, r *rig, from, n int) {
	target := v.handled.Load() + int64(n)
	cpu0, mach0, t0 := v.meter.Read(false), machineCPU(), time.Now()
	for i := range n {
		p := payoutN(from + i)
		p.PayoutID = v.name + "-" + strconv.Itoa(from+i)
		body := fmt.Sprintf(`{"payout_id":%q,"account":%q,"amount":%d,"currency":%q}`, p.PayoutID, p.Account, p.Amount, p.Currency)
		if _, err := r.js.PublishAsync(v.subject, []byte(body), jetstream.WithMsgID(p.PayoutID)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-r.js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishing did not complete")
	}
	deadline := time.After(5 * time.Minute)
	for v.handled.Load() < target {
		select {
		case <-v.signal:
		case <-deadline:
			b.Fatalf("%s: %d of %d handled", v.name, v.handled.Load()-target+int64(n), n)
		case <-ctx.Done():
			return
		}
	}
	v.wall += time.Since(t0)
	cpu1 := v.meter.Read(true)
	v.procCPU += cpu1.Client - cpu0.Client
	v.dbCPU += cpu1.Server - cpu0.Server
	v.machineCPU += machineCPU() - mach0
	v.msgs += n
}

func (v *benchVariant) rate() float64 { return float64(v.msgs) / v.wall.Seconds() }

// machineCPU is the busy CPU time of all cores so far, from /proc/stat (0 elsewhere).
func machineCPU() time.Duration {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0
	}
	fields := strings.Fields(sc.Text()) // cpu user nice system idle iowait irq softirq steal ...
	var busy int64
	for i, f := range fields[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(f, 10, 64)
		busy += n
	}
	return time.Duration(busy) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// loadAverage is the one-minute load average (0 where /proc/loadavg is missing).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return f
}
