// Command charges is a complete payments service built on idemflow: an HTTP API that
// creates charges through a three-phase flow (create_charge, provider_charge,
// finalize), a fake payment provider that dedupes on its own idempotency key, a worker
// that runs only the sweeper, and a demo that tells the whole story with real
// processes.
//
//	charges serve     the HTTP API, with an embedded sweeper
//	charges provider  the fake payment provider
//	charges worker    the sweeper alone: finishes charges whose client went away
//	charges demo      starts everything and shows each promise working
//
// Run `charges <command> -h` for a command's flags. With CHARGES_STATS_EVERY set to a
// duration (such as 5s), serve and worker print every that long a line
// "charges-stats {json}" on stderr: the live heap after the last GC, the goroutines
// and the pool's connections (the reliability suite's soak reads them).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

const usage = `usage: charges <command> [flags]

commands:
  serve     the HTTP API, with an embedded sweeper
  provider  the fake payment provider
  worker    the sweeper alone
  demo      start everything and show each promise working
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "serve":
		err = serve(ctx, args)
	case "provider":
		err = runProvider(ctx, args)
	case "worker":
		err = worker(ctx, args)
	case "demo":
		err = demo(ctx, args, os.Stdout)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(os.Stdout, usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "charges: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "charges %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// common are the flags serve and worker share.
type common struct {
	databaseURL   string
	providerURL   string
	sweepInterval time.Duration
	lease         time.Duration
	migrate       bool
	distribute    bool
	sweepGrace    time.Duration
	retention     time.Duration
	// partitionRemoval is -partition-removal: when the sweeper may remove partitions
	// of a partitioned key table.
	partitionRemoval workflow.DailyWindow
	// maxInFlight and admitWait are serve's -max-in-flight and -admit-wait (0: the
	// engine's defaults).
	maxInFlight int
	admitWait   time.Duration
	// hooks are more hooks for the engine, sweeperHooks for its sweeper: serve's
	// -telemetry.
	hooks        workflow.Hooks
	sweeperHooks workflow.SweeperHooks
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.databaseURL, "database-url", os.Getenv("DATABASE_URL"), "Postgres URL (default $DATABASE_URL; when empty, a throwaway server is started)")
	fs.StringVar(&c.providerURL, "provider-url", "", "payment provider base URL (default: start the fake provider in-process)")
	fs.DurationVar(&c.sweepInterval, "sweep-interval", time.Second, "how often the sweeper looks for stuck charges")
	fs.DurationVar(&c.lease, "lease", 30*time.Second, "how long an executor owns a key before another may take over")
	fs.BoolVar(&c.migrate, "migrate", true, "apply migrations at start (safe when several processes start at once)")
	fs.BoolVar(&c.distribute, "distribute", false, "on Citus: distribute charges by account and idemflow's keys by scope, colocated, after migrating (safe when several processes start at once)")
	fs.DurationVar(&c.sweepGrace, "sweep-grace", 0, "how old a stuck charge must be before the sweeper takes it (0: the sweeper default)")
	fs.DurationVar(&c.retention, "retention", 0, "how long the sweeper keeps finished keys, at least 1m (0: the sweeper default, 24h)")
	fs.TextVar(&c.partitionRemoval, "partition-removal", workflow.DailyWindow{}, "on a partitioned key table, when the sweeper may remove partitions past retention: HH:MM-HH:MM of the database clock, UTC (empty: any time)")
}

// env is what serve and worker run on.
type env struct {
	pool     *pgxpool.Pool
	engine   *workflow.Engine
	river    *river.Client[pgx.Tx] // inserts receipt jobs; works none
	provider string
	log      *slog.Logger
	cleanup  []func()
}

func (e *env) close() {
	for i := len(e.cleanup) - 1; i >= 0; i-- {
		e.cleanup[i]()
	}
}

// setup connects to (or starts) the database, migrates, starts the in-process provider
// if none is given, and builds the engine with the charges flow.
func setup(ctx context.Context, c *common, log *slog.Logger) (_ *env, err error) {
	e := &env{log: log}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	url := c.databaseURL
	if url == "" {
		srv, err := pgtest.Start(ctx)
		if err != nil {
			return nil, fmt.Errorf("start a throwaway Postgres: %w", err)
		}
		e.cleanup = append(e.cleanup, func() { _ = srv.Stop() })
		url = srv.URL
		fmt.Printf("database: %s\n", url)
	}
	pool, err := newPool(ctx, url, c.lease)
	if err != nil {
		return nil, err
	}
	e.cleanup = append(e.cleanup, pool.Close)
	e.pool = pool
	if c.migrate {
		if err := migrations.Migrate(ctx, pool); err != nil {
			return nil, err
		}
		if err := migrateCharges(ctx, pool); err != nil {
			return nil, err
		}
	}
	if c.distribute {
		if err := distribute(ctx, pool); err != nil {
			return nil, err
		}
	}
	e.provider = c.providerURL
	if e.provider == "" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("provider listen: %w", err)
		}
		hs := &http.Server{Handler: chargeflow.NewProvider(0, 0).Handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = hs.Serve(ln) }()
		e.cleanup = append(e.cleanup, func() { _ = hs.Close() })
		e.provider = "http://" + ln.Addr().String()
		fmt.Printf("provider: in-process at %s\n", e.provider)
	}
	cfg := &workflow.Config{Lease: c.lease, Logger: log, Hooks: workflow.JoinHooks(crashHooks(), c.hooks),
		MaxInFlight: c.maxInFlight, AdmitWait: c.admitWait}
	engine, err := workflow.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	if e.river, err = newRiver(pool, "", log); err != nil {
		return nil, err
	}
	client := &chargeflow.ProviderClient{BaseURL: e.provider, HTTP: &http.Client{Timeout: 10 * time.Second}}
	if err := engine.Register(chargeflow.FlowWithReceipts(client, enqueueReceipts(e.river))); err != nil {
		return nil, err
	}
	e.engine = engine
	sctx, stopStats := context.WithCancel(context.Background())
	e.cleanup = append(e.cleanup, stopStats)
	if err := startStats(sctx, pool, os.Stderr); err != nil {
		return nil, err
	}
	if err := startHeapProfiles(sctx); err != nil {
		return nil, err
	}
	return e, nil
}

// newPool opens the example's pool. Each connection has
// idle_in_transaction_session_timeout set to twice the lease: the server ends a
// transaction left idle by a hung or paused process (ending its claim and row locks
// with it), and no phase's transaction, which never outlives the lease, is cut short
// (docs/RELIABILITY.md). It is set by a SET after connecting rather than as a startup
// parameter, which pgbouncer refuses.
//
// Connections live ten minutes (plus up to two, spread) unless the URL says otherwise
// (pool_max_conn_lifetime): pgxpool keeps a connection's blocks of handles as long as a
// row that River's QueryRow returned still points into one, so a worker's heap grows
// with the connection's age; recycling bounds it (docs/OPERATIONS.md, "Memory").
func newPool(ctx context.Context, url string, lease time.Duration) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if !strings.Contains(url, "pool_max_conn_lifetime") {
		cfg.MaxConnLifetime = connLifetime
		cfg.MaxConnLifetimeJitter = connLifetimeJitter
	}
	idle := 2 * cmp.Or(lease, workflow.LeaseDefault)
	set := fmt.Sprintf("SET idle_in_transaction_session_timeout = %d", idle.Milliseconds())
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, set)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return pool, nil
}

// Connection lifetimes of newPool, unless the URL sets one.
const (
	connLifetime       = 10 * time.Minute
	connLifetimeJitter = 2 * time.Minute
)

// migrateCharges creates the example's own table and applies River's migrations (the
// receipts outbox), serialised like migrations.Migrate.
func migrateCharges(ctx context.Context, pool *pgxpool.Pool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('charges.migrate:' || current_schema(), 0))`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, chargeflow.Schema); err != nil {
		return fmt.Errorf("create charges table: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	return migrateRiver(ctx, pool)
}

// distribute makes charges and idemflow's keys Citus distributed tables, by account
// and scope, colocated: a charge and its key row live on one shard, so every phase's
// transaction stays on one node. Already distributed tables are left as they are.
func distribute(ctx context.Context, pool *pgxpool.Pool) error {
	err := migrations.Distribute(ctx, pool, &migrations.DistributeOptions{
		ColocateWith: chargeflow.Table,
		Tables:       []migrations.Table{{Name: chargeflow.Table, Column: chargeflow.DistributionColumn}},
	})
	if err != nil {
		return fmt.Errorf("-distribute: %w", err)
	}
	return nil
}

// crashHooks implement the CHARGES_CRASH_AFTER failpoint: the process exits at once,
// with no cleanup, right after the named phase completes; and CHARGES_KILL_AT, see
// killHooks.
func crashHooks() workflow.Hooks {
	phase := os.Getenv("CHARGES_CRASH_AFTER")
	if phase == "" {
		return killHooks(os.Getenv("CHARGES_KILL_AT"))
	}
	return workflow.Hooks{PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
		if err == nil && ev.Phase == phase {
			fmt.Fprintf(os.Stderr, "charges: CHARGES_CRASH_AFTER=%s: exiting now\n", phase)
			os.Exit(3)
		}
	}}
}

// sweeperConfig is the settings of the engine's sweeper (Engine.Start), from the flags.
func sweeperConfig(e *env, c *common) *workflow.SweeperConfig {
	return &workflow.SweeperConfig{Interval: c.sweepInterval, Grace: c.sweepGrace, Retention: c.retention,
		PartitionRemoval: c.partitionRemoval, Logger: e.log, Hooks: c.sweeperHooks}
}

func logger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
