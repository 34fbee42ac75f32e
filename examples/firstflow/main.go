// Command firstflow is the service of docs/FIRST-FLOW.md: one idempotent endpoint,
// POST /v1/withdrawals, whose flow debits an account (a tx phase), asks a bank for the
// transfer (a call phase with a derived key) and records the outcome (a tx phase),
// giving the money back when the bank refuses. Its main shows the engine's life in a
// process: Start, then on SIGTERM Stop, Drain and the HTTP server's Shutdown.
//
//	DATABASE_URL=postgres://... BANK_URL=http://... ADDR=127.0.0.1:8080 go run ./examples/firstflow
//
// It expects its tables (Schema) to exist; it migrates idemflow's own. Its tests run it
// against a real PostgreSQL and idemflowtest's fake remote as the bank.
package main

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/workflow"
)

func main() {
	// SIGTERM (what an orchestrator sends before it kills) and Ctrl-C end ctx.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	if err := run(ctx, log, os.Getenv); err != nil {
		log.Error("firstflow: exiting", "err", err)
		os.Exit(1)
	}
}

// run serves until ctx ends, then shuts down.
func run(ctx context.Context, log *slog.Logger, getenv func(string) string) error {
	pool, err := pgxpool.New(ctx, getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.Migrate(ctx, pool); err != nil {
		return err
	}
	// The lease outlasts the longest phase: the bank client's timeout (30s) plus the
	// margin by which a call phase's context ends before the lease (at most 5s).
	engine, err := workflow.New(pool, &workflow.Config{Lease: time.Minute, Logger: log})
	if err != nil {
		return err
	}
	b := &bank{url: getenv("BANK_URL"), http: &http.Client{Timeout: 30 * time.Second}}
	if err := engine.Register(withdrawalFlow(b)); err != nil {
		return err
	}
	withdraw, err := idemhttp.Handler(engine, flowName, &idemhttp.Config{Scope: account, RequireKey: true})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/withdrawals", withdraw)

	ln, err := net.Listen("tcp", cmp.Or(getenv("ADDR"), "127.0.0.1:8080"))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	// The sweeper: finishes the keys whose client went away, in every process.
	if err := engine.Start(ctx, nil); err != nil {
		srv.Close()
		return err
	}
	log.Info("firstflow: listening", "addr", ln.Addr().String())
	select {
	case <-ctx.Done():
	case err := <-served:
		return err
	}
	return shutdown(engine, srv, log)
}

// shutdown stops the process in order, within a grace period shorter than what the
// orchestrator waits before SIGKILL: the sweeper first (it takes no more keys), then
// the engine drains (no new attempt, no new call phase; attempts in a tx phase finish)
// while the HTTP server closes its listener and waits for its handlers. Keys still
// held when the grace ends are released, fenced, for another process to resume.
func shutdown(engine *workflow.Engine, srv *http.Server, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	log.Info("firstflow: draining")
	stopped := engine.Stop(ctx)
	drained := make(chan error, 1)
	go func() { drained <- engine.Drain(ctx) }()
	err := srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = srv.Close() // the drain released the keys of the requests still open
	}
	err = errors.Join(stopped, <-drained, err)
	if err == nil {
		log.Info("firstflow: drained")
	}
	return err
}

// account is the request's scope: the authenticated account. This example trusts a
// header; a real service takes it from its authentication, never from what the
// client claims.
func account(r *http.Request) (string, error) {
	if a := r.Header.Get("X-Account"); a != "" {
		return a, nil
	}
	return "", errors.New("not authenticated")
}
