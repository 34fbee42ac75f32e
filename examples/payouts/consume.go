package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemflow/idemflow/examples/payouts/payout"
	"github.com/idemflow/idemflow/idemmsg"
	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// Fault injection for the tests, read from the environment of a consume process.
const (
	// envCrashAt names a boundary where the process SIGKILLs itself the first time a
	// delivery reaches it: <phase>/before-commit, <phase>/after-commit (tx phases),
	// bank_transfer/before-call, bank_transfer/after-call, or ack/before (the answer
	// is stored, the ack not sent).
	envCrashAt = "PAYOUTS_CRASH_AT"
	// envWithholdAcks is a number of final answers not to acknowledge (nor nak), so
	// that the broker redelivers them after the ack wait.
	envWithholdAcks = "PAYOUTS_WITHHOLD_ACKS"
)

// stream is where the consumer reads from.
type stream struct {
	natsURL      string
	name         string
	subject      string
	durable      string
	createStream bool
	ackWait      time.Duration
	maxDeliver   int
	workers      int
}

func (s *stream) register(fs *flag.FlagSet) {
	url := os.Getenv("NATS_URL")
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	fs.StringVar(&s.natsURL, "nats-url", url, "NATS server URL (default $NATS_URL, else this)")
	fs.StringVar(&s.name, "stream", "PAYOUTS", "JetStream stream")
	fs.StringVar(&s.subject, "subject", "payouts.requested", "subject to consume")
	fs.StringVar(&s.durable, "consumer", "payouts", "durable consumer name, shared by competing consumers")
	fs.BoolVar(&s.createStream, "create-stream", true, "create the stream (with a 2m duplicate window) if it does not exist")
	fs.DurationVar(&s.ackWait, "ack-wait", 30*time.Second, "how long the broker waits for an ack before redelivering")
	fs.IntVar(&s.maxDeliver, "max-deliver", -1, "deliveries of one message before the broker gives up (-1: no limit)")
	fs.IntVar(&s.workers, "workers", 4, "messages handled at once")
}

// consumeCmd runs the consumer with an embedded sweeper until ctx ends.
func consumeCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	var s stream
	s.register(fs)
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "Postgres URL (default $DATABASE_URL; when empty, a throwaway server is started)")
	bankURL := fs.String("bank-url", "", "bank base URL (required)")
	scopePrefix := fs.String("scope-prefix", "payouts", "a payout's key is scoped by its account, under this prefix: <prefix>/<account>")
	lease := fs.Duration("lease", 30*time.Second, "how long a delivery owns a payout before another may take over")
	sweepInterval := fs.Duration("sweep-interval", time.Second, "how often the sweeper looks for unfinished payouts")
	sweepGrace := fs.Duration("sweep-grace", 0, "how old an unfinished payout must be before the sweeper takes it (0: the sweeper default of 5s)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *bankURL == "" {
		return errors.New("-bank-url is required (run `payouts bank`)")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	pool, closeDB, err := openDB(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer closeDB()
	if err := workflow.ValidateScope(*scopePrefix); err != nil || len(*scopePrefix) > 200 {
		return fmt.Errorf("-scope-prefix %q: want 1-200 bytes of text without control characters", *scopePrefix)
	}
	withhold, _ := strconv.Atoi(os.Getenv(envWithholdAcks))
	c := &consumer{db: pool, scopePrefix: *scopePrefix, stream: s.name, maxDeliver: s.maxDeliver, out: os.Stdout, crashAt: os.Getenv(envCrashAt)}
	c.withhold.Store(int64(withhold))
	c.engine, err = workflow.New(pool, &workflow.Config{Lease: *lease, Logger: log, Hooks: c.hooks()})
	if err != nil {
		return err
	}
	bank := &payout.BankClient{BaseURL: *bankURL, HTTP: &http.Client{Timeout: 10 * time.Second}}
	if err := c.engine.Register(payout.Flow(bank)); err != nil {
		return err
	}
	if err := c.engine.Start(ctx, &workflow.SweeperConfig{Interval: *sweepInterval, Grace: *sweepGrace, Logger: log}); err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.engine.Stop(sctx)
	}()
	return s.consume(ctx, c.handle, func() {
		fmt.Fprintf(c.out, "consumer: consuming %s from %s/%s\n", s.subject, s.name, s.durable)
	})
}

// openDB connects to url, or to a throwaway server when it is empty, and applies
// idemflow's migrations and the consumer's schema.
func openDB(ctx context.Context, url string) (*pgxpool.Pool, func(), error) {
	stop := func() {}
	if url == "" {
		srv, err := pgtest.Start(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("start a throwaway Postgres: %w", err)
		}
		stop = func() { _ = srv.Stop() }
		url = srv.URL
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	closeAll := func() { pool.Close(); stop() }
	if err := migrate(ctx, pool); err != nil {
		closeAll()
		return nil, nil, err
	}
	return pool, closeAll, nil
}

// migrate applies idemflow's migrations and the consumer's schema; competing
// consumers starting at once take turns on an advisory lock.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := migrations.Migrate(ctx, pool); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('payouts.schema:' || current_schema(), 0))`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, payout.Schema)
		return err
	})
}

// consume reads s until ctx ends, handing each delivery to handle on one of s.workers
// goroutines. handle acknowledges (or not) the delivery itself.
func (s *stream) consume(ctx context.Context, handle func(context.Context, jetstream.Msg), ready func()) error {
	nc, err := nats.Connect(s.natsURL, nats.Name("payouts-consumer"))
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", s.natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if s.createStream {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: s.name, Subjects: []string{s.subject}, Duplicates: 2 * time.Minute})
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("create stream %s: %w", s.name, err)
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, s.name, jetstream.ConsumerConfig{
		Durable: s.durable, FilterSubject: s.subject,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: s.ackWait, MaxDeliver: s.maxDeliver,
	})
	if err != nil {
		return fmt.Errorf("consumer %s on %s: %w", s.durable, s.name, err)
	}
	work := make(chan jetstream.Msg)
	var wg sync.WaitGroup
	for range max(s.workers, 1) {
		wg.Go(func() {
			for m := range work {
				handle(ctx, m)
			}
		})
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case work <- m:
		case <-ctx.Done(): // not acked: the broker redelivers it
		}
	}, jetstream.PullMaxMessages(2*max(s.workers, 1)))
	if err != nil {
		close(work)
		wg.Wait()
		return err
	}
	ready()
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	close(work)
	wg.Wait()
	return nil
}

// consumer runs deliveries through the engine and acknowledges them as idemmsg says.
type consumer struct {
	engine      *workflow.Engine
	db          *pgxpool.Pool // where dead letters are recorded
	scopePrefix string        // a payout's scope is payout.Scope(scopePrefix, account)
	stream      string        // the stream's name, for a delivery without metadata
	maxDeliver  int           // the broker's limit of deliveries (<= 0: none)
	out         io.Writer
	outMu       sync.Mutex
	crashAt     string
	withhold    atomic.Int64
}

// handle runs one delivery and acks, naks with a delay or gives up on it. The ack is
// sent only after the answer is stored: a crash before it makes the broker redeliver,
// and the redelivery replays. A payout's key and scope are derived from its payout id
// and account (payout.Key, payout.Scope), so that every message Parse accepts has a
// valid key and the same payout id from two accounts is two payouts.
func (c *consumer) handle(ctx context.Context, m jetstream.Msg) {
	meta, _ := m.Metadata()
	delivered := uint64(0)
	if meta != nil {
		delivered = meta.NumDelivered
	}
	req, err := payout.Parse(m.Data())
	if err != nil { // no payout id to key it by: no redelivery can do better
		c.giveUp(ctx, m, meta, "?", err)
		return
	}
	d := idemmsg.Handle(ctx, c.engine, idemmsg.Message{
		Scope: payout.Scope(c.scopePrefix, req.Account), Key: payout.Key(req.PayoutID), Flow: payout.FlowName, Payload: m.Data(),
	})
	replayed := d.Action == idemmsg.Ack && d.Result.Replayed
	switch {
	case d.Action == idemmsg.Ack:
		c.die("ack/before")
		if c.withhold.Add(-1) >= 0 {
			c.report("withheld ack payout=%s delivered=%d", show(req.PayoutID), delivered)
			return
		}
		err = m.DoubleAck(ctx)
	case d.Action == idemmsg.Retry && c.maxDeliver > 0 && delivered >= uint64(c.maxDeliver):
		// The broker will not deliver it again: keep it, or it is lost.
		c.giveUp(ctx, m, meta, show(req.PayoutID), fmt.Errorf("no delivery left after %d: %w", delivered, d.Err))
		return
	case d.Action == idemmsg.Retry:
		err = m.NakWithDelay(d.Delay)
	default:
		c.giveUp(ctx, m, meta, show(req.PayoutID), d.Err)
		return
	}
	c.report("delivery payout=%s delivered=%d action=%v replayed=%v delay=%v err=%q ack_err=%v",
		show(req.PayoutID), delivered, d.Action, replayed, d.Delay, errString(d.Err), err)
}

// giveUp records m as a dead letter, then terminates it: the broker stops delivering
// it, and an operator can list and replay it (payouts dead-letters). If the record
// cannot be written, m is naked instead, to be given up on again on its redelivery:
// a message is never terminated without its record.
func (c *consumer) giveUp(ctx context.Context, m jetstream.Msg, meta *jetstream.MsgMetadata, payoutID string, cause error) {
	dl := payout.DeadLetter{Stream: c.stream, Subject: m.Subject(), MsgID: []byte(m.Headers().Get(jetstream.MsgIDHeader)), Data: m.Data(), Reason: errString(cause)}
	if meta != nil {
		dl.Stream, dl.StreamSeq, dl.Delivered = meta.Stream, meta.Sequence.Stream, meta.NumDelivered
	}
	if err := payout.RecordDeadLetter(ctx, c.db, dl); err != nil {
		nerr := m.NakWithDelay(time.Second)
		c.report("delivery payout=%s delivered=%d action=retry dead_letter=failed err=%q ack_err=%v", payoutID, dl.Delivered, err.Error(), nerr)
		return
	}
	err := m.Term()
	c.report("delivery payout=%s delivered=%d action=terminate dead_letter=%s/%d err=%q ack_err=%v",
		payoutID, dl.Delivered, dl.Stream, dl.StreamSeq, errString(cause), err)
}

// show is a payout id as the consumer prints it: as it is when it is its own key
// (printable ASCII) without spaces, else quoted, so that no control character reaches
// the terminal.
func show(payoutID string) string {
	if payout.Key(payoutID) == payoutID && !strings.ContainsRune(payoutID, ' ') {
		return payoutID
	}
	return strconv.Quote(payoutID)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (c *consumer) report(format string, args ...any) {
	c.outMu.Lock()
	defer c.outMu.Unlock()
	fmt.Fprintf(c.out, format+"\n", args...)
}

// hooks report keys the sweeper took and kill the process at the crash point.
func (c *consumer) hooks() workflow.Hooks {
	return workflow.Hooks{
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if ev.Kind == phases.KindCall {
				c.die(ev.Phase + "/before-call")
			}
			return ctx
		},
		BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) { c.die(ev.Phase + "/before-commit") },
		PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
			switch {
			case err != nil:
			case ev.Kind == phases.KindCall:
				c.die(ev.Phase + "/after-call")
			default:
				c.die(ev.Phase + "/after-commit")
			}
		},
		Key: func(ctx context.Context, ev workflow.KeyEvent) {
			if ev.Kind == workflow.OutcomeSwept {
				c.report("swept payout=%s recovery_point=%s", ev.Key, ev.RecoveryPoint)
			}
		},
	}
}

// die SIGKILLs the process if at is the crash point: no deferred function runs and no
// connection is closed cleanly, as in a real crash.
func (c *consumer) die(at string) {
	if c.crashAt == "" || at != c.crashAt {
		return
	}
	fmt.Fprintf(os.Stderr, "payouts: crash point %s: SIGKILL\n", at)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
