package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDatabaseURL names the environment variable that points the tests at an existing
// server instead of a throwaway one.
const EnvDatabaseURL = "TEST_DATABASE_URL"

// StartTimeoutDefault bounds how long Start waits for a new server to accept connections.
const StartTimeoutDefault = 60 * time.Second

// ErrNoServer is returned by Start when there is no way to get a PostgreSQL server: no
// TEST_DATABASE_URL, no local server binaries and no Docker daemon.
var ErrNoServer = errors.New("pgtest: no PostgreSQL server available")

// Server is a PostgreSQL server for tests or a demo.
type Server struct {
	// URL connects as a superuser to the server's default database, e.g.
	// postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable.
	URL string

	stop     func() error // nil for a server pgtest does not own
	stopOnce sync.Once
	stopErr  error
}

// Start returns a server: the one at TEST_DATABASE_URL when that is set (Stop is then a
// no-op); otherwise a throwaway server from local PostgreSQL server binaries; otherwise a
// postgres:15 container when a Docker daemon answers. It returns once the server accepts
// connections. Without any of the three it returns an error wrapping ErrNoServer that says
// what to install. ctx bounds the start, not the server's life: call Stop when done.
func Start(ctx context.Context) (*Server, error) { return StartWith(ctx, nil) }

// StartOptions adjust a server that StartWith starts itself.
type StartOptions struct {
	// Settings are extra server settings ("name=value", passed as -c flags after
	// pgtest's own, so they win), e.g. shared_preload_libraries=pg_stat_statements. They
	// are not applied to a TEST_DATABASE_URL server.
	Settings []string
}

// StartWith is Start with options; opts may be nil.
func StartWith(ctx context.Context, opts *StartOptions) (*Server, error) {
	var extra []string
	if opts != nil {
		extra = opts.Settings
	}
	if u := os.Getenv(EnvDatabaseURL); u != "" {
		return startExternal(ctx, u)
	}
	dir, looked := findBinDir()
	if dir != "" {
		return startLocal(ctx, dir, extra)
	}
	srv, err := startDocker(ctx, extra)
	if err == nil {
		return srv, nil
	}
	if !errors.Is(err, errNoDocker) {
		return nil, err
	}
	return nil, fmt.Errorf("%w: %s is not set, no PostgreSQL server binaries were found "+
		"(looked for initdb and postgres in %s) and %v. "+
		"Install PostgreSQL server binaries (Debian/Ubuntu: apt-get install postgresql; "+
		"Fedora: dnf install postgresql-server; macOS: brew install postgresql@15), "+
		"start a Docker daemon, or set %s=postgres://user@host:port/db",
		ErrNoServer, EnvDatabaseURL, looked, err, EnvDatabaseURL)
}

// Stop stops a server that Start created: a throwaway server is shut down (fast
// shutdown, then killed if it lingers) and its directory removed; a container is
// removed. For TEST_DATABASE_URL it does nothing. Stop is idempotent: later calls return
// the first call's result.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		if s.stop != nil {
			s.stopErr = s.stop()
		}
	})
	return s.stopErr
}

// exec runs one or more SQL statements (simple protocol, no arguments) on a new
// connection to the server's URL.
func (s *Server) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql); err != nil {
		return err
	}
	return nil
}

func startExternal(ctx context.Context, connString string) (*Server, error) {
	if err := ping(ctx, connString, 10*time.Second); err != nil {
		return nil, fmt.Errorf("pgtest: %s=%s: %w", EnvDatabaseURL, redact(connString), err)
	}
	return &Server{URL: connString}, nil
}

// ping makes one connection attempt.
func ping(ctx context.Context, connString string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return err
	}
	err = conn.Ping(ctx)
	if cerr := conn.Close(ctx); err == nil {
		err = cerr
	}
	return err
}

// waitReady polls until the server accepts a connection, the process behind it exits
// (exited is closed; nil when there is no such process), ctx ends or limit passes.
func waitReady(ctx context.Context, connString string, exited <-chan struct{}, limit time.Duration) error {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ping(ctx, connString, 2*time.Second)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for server: %w (last attempt: %v)", ctx.Err(), err)
		case <-exited:
			return errExited
		case <-deadline.C:
			return fmt.Errorf("server not ready after %s: %w", limit, err)
		case <-tick.C:
		}
	}
}

var errExited = errors.New("server process exited")

// redact hides a password in a URL-form connection string.
func redact(connString string) string {
	u, err := url.Parse(connString)
	if err != nil || u.Scheme == "" {
		return "(connection string)"
	}
	return u.Redacted()
}
