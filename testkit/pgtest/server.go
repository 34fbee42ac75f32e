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

// StartTimeoutDefault bounds how long Start waits for a new server to accept connections:
// a bound on a hang (a server that exits fails at once), generous for a loaded machine.
const StartTimeoutDefault = 5 * time.Minute

// ErrNoServer is returned by Start when there is no way to get a PostgreSQL server: no
// TEST_DATABASE_URL, no local server binaries and no Fallback.
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
// no-op); otherwise a throwaway server from local PostgreSQL server binaries. It returns
// once the server accepts connections. Without either it returns an error wrapping
// ErrNoServer that says what to install. ctx bounds the start, not the server's life:
// call Stop when done. StartWith can add a Fallback (a container, say).
func Start(ctx context.Context) (*Server, error) { return StartWith(ctx, nil) }

// A Fallback starts a PostgreSQL server when TEST_DATABASE_URL is not set and no local
// server binaries are found; pgdocker.Start (module
// github.com/idemflow/idemflow/idemflowtest/pgdocker) is one, a postgres:15 container.
// settings are extra server settings ("name=value"). It returns a URL that connects as
// a superuser to the server's default database and a function that stops the server.
// The caller waits for the URL to accept connections (FallbackReadyTimeout), so the
// function may return as soon as the server is started.
type Fallback func(ctx context.Context, settings []string) (url string, stop func() error, err error)

// FallbackReadyTimeout bounds how long StartWith waits for a Fallback's server to accept
// connections once the Fallback returned (a container's image is pulled before that).
const FallbackReadyTimeout = 2 * time.Minute

// StartOptions adjust a server that StartWith starts itself.
type StartOptions struct {
	// Settings are extra server settings ("name=value", passed as -c flags after
	// pgtest's own, so they win), e.g. shared_preload_libraries=pg_stat_statements. They
	// are not applied to a TEST_DATABASE_URL server.
	Settings []string
	// Fallback, when set, starts the server if TEST_DATABASE_URL is not set and no local
	// server binaries are found.
	Fallback Fallback
}

// StartWith is Start with options; opts may be nil.
func StartWith(ctx context.Context, opts *StartOptions) (*Server, error) {
	if opts == nil {
		opts = &StartOptions{}
	}
	if u := os.Getenv(EnvDatabaseURL); u != "" {
		return startExternal(ctx, u)
	}
	dir, looked := findBinDir()
	if dir != "" {
		return startLocal(ctx, dir, opts.Settings)
	}
	if opts.Fallback != nil {
		return startFallback(ctx, opts.Fallback, opts.Settings)
	}
	return nil, fmt.Errorf("%w: %s is not set and no PostgreSQL server binaries were found "+
		"(looked for initdb and postgres in %s). "+
		"Install PostgreSQL server binaries (Debian/Ubuntu: apt-get install postgresql; "+
		"Fedora: dnf install postgresql-server; macOS: brew install postgresql@15), "+
		"set %s=postgres://user@host:port/db, or pass a fallback such as a container "+
		"(idemflowtest.MainWith with pgdocker.Start, module "+
		"github.com/idemflow/idemflow/idemflowtest/pgdocker)",
		ErrNoServer, EnvDatabaseURL, looked, EnvDatabaseURL)
}

// startFallback starts a server with fb and waits until it accepts connections; a
// server that does not is stopped.
func startFallback(ctx context.Context, fb Fallback, settings []string) (*Server, error) {
	url, stop, err := fb(ctx, settings)
	if err != nil {
		return nil, fmt.Errorf("pgtest: fallback server: %w", err)
	}
	if stop == nil {
		stop = func() error { return nil }
	}
	srv := &Server{URL: url, stop: stop}
	if err := waitReady(ctx, url, nil, FallbackReadyTimeout); err != nil {
		return nil, errors.Join(fmt.Errorf("pgtest: fallback server at %s: %w", redact(url), err), srv.Stop())
	}
	return srv, nil
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
