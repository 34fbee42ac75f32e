package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// The receipts outbox: the finalize phase inserts a River job in its own transaction
// (InsertTx with the phase's transaction as a pgx.Tx), so a receipt job exists if and
// only if the charge's success committed, and the worker process's River client
// mails it.

// receiptArgs is the River job that mails a charge's receipt.
type receiptArgs struct {
	ChargeID  string `json:"charge_id"`
	AccountID string `json:"account_id"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
}

// Kind is the job's stable name in River's table.
func (receiptArgs) Kind() string { return "receipt" }

// enqueueReceipts is the flow's outbox: an insert of a receipt job in the finalize
// phase's transaction.
func enqueueReceipts(client *river.Client[pgx.Tx]) chargeflow.Receipts {
	return func(ctx context.Context, tx pgx.Tx, account string, c chargeflow.Charge) error {
		args := receiptArgs{ChargeID: c.ID, AccountID: account, Amount: c.Amount, Currency: c.Currency}
		_, err := client.InsertTx(ctx, tx, args, nil)
		return err
	}
}

// newRiver returns a River client on pool. Without a mail URL it only inserts jobs
// (serve, and the flow's finalize anywhere); with one it also works the receipt queue
// once started (worker).
func newRiver(pool *pgxpool.Pool, mailURL string, log *slog.Logger) (*river.Client[pgx.Tx], error) {
	cfg := &river.Config{Logger: log}
	if mailURL != "" {
		workers := river.NewWorkers()
		mailer := &receiptWorker{mailURL: mailURL, http: &http.Client{Timeout: 10 * time.Second}}
		if err := river.AddWorkerSafely(workers, mailer); err != nil {
			return nil, err
		}
		cfg.Workers = workers
		// A mail is a short HTTP call; River fetches at most MaxWorkers jobs a fetch, at
		// most one fetch a FetchPollInterval when nothing wakes it. With 2 the queue
		// worked about 20 receipts a second per worker, and the hour-long soak's two
		// workers fell behind its two servers' 70 charges a second (docs/RELIABILITY.md,
		// the soaks of 2026-12-07).
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 20}}
		cfg.FetchPollInterval = 100 * time.Millisecond
	}
	client, err := river.NewClient(riverpgxv5.New(pool), cfg)
	if err != nil {
		return nil, fmt.Errorf("river client: %w", err)
	}
	return client, nil
}

// migrateRiver applies River's migrations beside the example's own: one per
// transaction (a later one uses an enum value an earlier one adds, which Postgres
// allows only once that is committed), each under the lock migrateCharges takes, so
// that processes starting at once take turns.
func migrateRiver(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := rivermigrate.New(riverpgxv5.New(nil), nil)
	if err != nil {
		return err
	}
	for {
		var applied int
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('charges.migrate:' || current_schema(), 0))`); err != nil {
				return err
			}
			//lint:ignore SA1019 one migration per transaction (MaxSteps 1), under the lock: not the batching the deprecation warns of
			res, err := m.MigrateTx(ctx, tx, rivermigrate.DirectionUp, &rivermigrate.MigrateOpts{MaxSteps: 1})
			if err != nil {
				return err
			}
			applied = len(res.Versions)
			return nil
		})
		if err != nil {
			return fmt.Errorf("river migrations: %w", err)
		}
		if applied == 0 {
			return nil
		}
	}
}

// receiptWorker mails receipts. The mail service dedupes on the receipt's key, so a
// job retried after a crash sends one mail.
type receiptWorker struct {
	river.WorkerDefaults[receiptArgs]
	mailURL string
	http    *http.Client
}

func (w *receiptWorker) Work(ctx context.Context, job *river.Job[receiptArgs]) error {
	body, _ := json.Marshal(job.Args)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.mailURL+"/v1/mail", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "receipt:"+job.Args.ChargeID)
	resp, err := w.http.Do(req)
	if err != nil {
		return fmt.Errorf("mail: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("mail answered %d", resp.StatusCode)
	}
	return nil
}

// mailbox is a fake mail service: POST /v1/mail sends (once per Idempotency-Key) and
// GET /v1/mail counts what was sent.
type mailbox struct {
	mu   sync.Mutex
	sent map[string]int // key -> requests
}

// mailStats is the body of GET /v1/mail: requests per key.
type mailStats struct {
	Sent map[string]int `json:"sent"`
}

func newMailbox() *mailbox { return &mailbox{sent: map[string]int{}} }

func (m *mailbox) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/mail", func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if key == "" {
			http.Error(w, "Idempotency-Key is required", http.StatusBadRequest)
			return
		}
		m.mu.Lock()
		m.sent[key]++
		m.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("GET /v1/mail", func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		defer m.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(mailStats{Sent: m.sent})
	})
	return mux
}

// startMailbox serves a fake mail service on a free loopback port until stop.
func startMailbox() (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("mail listen: %w", err)
	}
	hs := &http.Server{Handler: newMailbox().handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = hs.Close() }, nil
}

// killHooks implement the CHARGES_KILL_AT failpoint, "<phase>/before-commit" or
// "<phase>/after-commit" of a tx phase: the process SIGKILLs itself there, the first
// time a charge reaches it.
func killHooks(at string) workflow.Hooks {
	if at == "" {
		return workflow.Hooks{}
	}
	die := func(point string) {
		if point == at {
			fmt.Fprintf(os.Stderr, "charges: CHARGES_KILL_AT=%s: SIGKILL\n", at)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
	return workflow.Hooks{
		BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) { die(ev.Phase + "/before-commit") },
		PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
			if err == nil && ev.Kind == phases.KindTx {
				die(ev.Phase + "/after-commit")
			}
		},
	}
}
