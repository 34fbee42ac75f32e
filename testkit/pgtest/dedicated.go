package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemflow/idemflow/migrations"
)

// Dedicated is a throwaway server that belongs to one test rather than to the whole
// process, so that the test can crash it (an immediate shutdown, as `pg_ctl -m
// immediate` does) and start it again on the same data directory and port: the server
// then runs crash recovery from its WAL, as after a power cut. It needs local
// PostgreSQL server binaries; TEST_DATABASE_URL and a Fallback are not used.
type Dedicated struct {
	// URL connects as a superuser to the server's default database. It stays the same
	// across restarts.
	URL string

	binDir string
	dir    string // temporary directory holding data; removed by Stop
	data   string
	port   int
	owner  *osUser

	mu      sync.Mutex
	cur     *localServer // nil while the server is down
	stopped bool
}

// StartDedicated initialises a new data directory and starts a server on it. The error
// wraps ErrNoServer when there are no local server binaries. Call Stop when done.
func StartDedicated(ctx context.Context) (*Dedicated, error) {
	binDir, looked := findBinDir()
	if binDir == "" {
		return nil, fmt.Errorf("%w: no PostgreSQL server binaries (looked in %s); a dedicated server needs them", ErrNoServer, looked)
	}
	owner, err := serverUser()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-dedicated-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: temporary directory: %w", err)
	}
	d := &Dedicated{binDir: binDir, dir: dir, data: filepath.Join(dir, "data"), owner: owner}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	if owner != nil {
		if err := os.Chown(dir, owner.uid, owner.gid); err != nil {
			return nil, fmt.Errorf("pgtest: hand %s to OS user %s: %w", dir, owner.name, err)
		}
	}
	if err := initdb(ctx, binDir, dir, d.data, owner); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("pgtest: find a free port: %w", err)
		}
		d.port = port
		d.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
		err = d.start(ctx)
		if err == nil {
			ok = true
			return d, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			return nil, err
		}
	}
}

// start runs postgres on d's data directory and port and waits until it accepts
// connections. d.mu must not be held by another start.
func (d *Dedicated) start(ctx context.Context) error {
	logPath := filepath.Join(d.dir, "server.log") // outside data: kept across restarts
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("pgtest: server log: %w", err)
	}
	if d.owner != nil {
		_ = os.Chown(logPath, d.owner.uid, d.owner.gid)
	}
	args := []string{"-D", d.data, "-p", strconv.Itoa(d.port)}
	for _, s := range serverSettings {
		args = append(args, "-c", s)
	}
	cmd := exec.Command(filepath.Join(d.binDir, "postgres"), args...)
	cmd.SysProcAttr = serverProcAttr(d.owner)
	l, err := runReady(ctx, cmd, d.dir, logFile, logPath, d.URL, "dedicated postgres", d.port)
	if err != nil {
		return err
	}
	l.final = syscall.SIGQUIT // its directory is removed with it: no shutdown checkpoint
	d.mu.Lock()
	d.cur = l
	d.mu.Unlock()
	return nil
}

func containsBindFailure(log string) bool {
	return strings.Contains(log, "could not bind") || strings.Contains(log, "Address already in use")
}

// Crash stops the server the way `pg_ctl stop -m immediate` does: SIGQUIT to the
// postmaster, which quits every backend at once without a checkpoint. Open connections
// break; committed transactions survive (fsync is on) and the rest are lost. Crash
// returns once the postmaster has exited. It fails if the server is not running.
func (d *Dedicated) Crash() error {
	d.mu.Lock()
	l := d.cur
	d.cur = nil
	d.mu.Unlock()
	if l == nil {
		return errors.New("pgtest: crash: the dedicated server is not running")
	}
	defer l.log.Close()
	if err := l.cmd.Process.Signal(syscall.SIGQUIT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("pgtest: SIGQUIT postgres: %w", err)
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-l.exited:
		return nil
	case <-timer.C:
		_ = l.cmd.Process.Kill()
		<-l.exited
		return fmt.Errorf("pgtest: postgres ignored SIGQUIT for %s; killed it", stopTimeout)
	}
}

// Restart starts the server again on the same data directory and port after Crash,
// and returns once it accepts connections (crash recovery done).
func (d *Dedicated) Restart(ctx context.Context) error {
	d.mu.Lock()
	running, stopped := d.cur != nil, d.stopped
	d.mu.Unlock()
	switch {
	case stopped:
		return errors.New("pgtest: restart: the dedicated server was stopped for good")
	case running:
		return errors.New("pgtest: restart: the dedicated server is running")
	}
	return d.start(ctx)
}

// Running reports whether the server is up (started and not crashed).
func (d *Dedicated) Running() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cur != nil
}

// Stop shuts the server down if it runs and removes its directory. It is idempotent.
func (d *Dedicated) Stop() error {
	d.mu.Lock()
	l := d.cur
	d.cur = nil
	already := d.stopped
	d.stopped = true
	d.mu.Unlock()
	if already {
		return nil
	}
	var err error
	if l != nil {
		err = l.stopProcess()
		_ = l.log.Close()
	}
	if rerr := os.RemoveAll(d.dir); rerr != nil {
		err = errors.Join(err, fmt.Errorf("pgtest: remove %s: %w", d.dir, rerr))
	}
	return err
}

// NewDedicated starts a dedicated server for t, stopped when t ends, with one fresh
// migrated schema on it, like New. It skips t when there are no local server binaries
// (a dedicated server cannot come from TEST_DATABASE_URL or a Fallback).
func NewDedicated(t testing.TB) (*Dedicated, *DB) {
	t.Helper()
	// A bound on a hang: initdb alone took over two minutes under the stress run.
	ctx, cancel := context.WithTimeout(context.Background(), sharedStartTimeout)
	defer cancel()
	d, err := StartDedicated(ctx)
	if errors.Is(err, ErrNoServer) {
		t.Skipf("%v", err)
	}
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("%v", err)
		}
	})
	schema := "t_" + randomHex(8)
	if err := d.exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create schema %s: %v", schema, err)
	}
	db := &DB{URL: withSearchPath(d.URL, schema), Schema: schema}
	db.Pool = db.NewPool(t)
	if err := migrations.Migrate(ctx, db.Pool); err != nil {
		t.Fatalf("pgtest: migrate schema %s: %v", schema, err)
	}
	return d, db
}

func (d *Dedicated) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, d.URL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}
