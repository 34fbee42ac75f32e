package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// serverSettings are the throwaway server's settings, passed as -c flags. fsync stays on
// so that benchmarks measure what production pays for a commit.
var serverSettings = []string{
	"listen_addresses=127.0.0.1",
	"unix_socket_directories=", // TCP only: no socket files, no permission questions
	"max_connections=300",      // many pools across parallel tests and child processes
	"shared_buffers=128MB",
	"fsync=on",
	"TimeZone=UTC",
	"max_parallel_workers_per_gather=0", // OLTP only; no dynamic shared memory surprises
}

// stopTimeout bounds a fast shutdown before the server is killed.
const stopTimeout = 30 * time.Second

// osUser is the unprivileged account the server runs as when this process is root.
type osUser struct {
	name     string
	uid, gid int
}

// localServer is a postgres process that this process started and owns.
type localServer struct {
	dir    string // temporary directory holding the data directory; removed by stop
	cmd    *exec.Cmd
	exited <-chan struct{} // closed when the process has exited and been reaped
	log    *os.File
	// final is the signal of the last stop; nil: SIGINT (pgbouncer's safe shutdown,
	// postgres's fast one). A throwaway postgres, whose directory goes with it, is
	// stopped with SIGQUIT: a fast shutdown's checkpoint writes out every dirty page
	// with fsync on, which on a loaded machine took longer than stopTimeout after a
	// long package (testkit/matrix's nightly tier) and failed a run whose tests passed.
	final os.Signal
}

// findBinDir returns the first directory that holds both initdb and postgres, looking in
// PATH (following symlinks), then `pg_config --bindir`, then /usr/lib/postgresql/*/bin
// newest version first. It returns "" and a description of where it looked otherwise.
func findBinDir() (dir, looked string) {
	var candidates []string
	for _, name := range []string{"initdb", "postgres", "pg_ctl"} {
		if p, err := exec.LookPath(name); err == nil {
			if real, err := filepath.EvalSymlinks(p); err == nil {
				p = real
			}
			candidates = append(candidates, filepath.Dir(p))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output(); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(out)))
	}
	candidates = append(candidates, debianBinDirs()...)
	for _, c := range candidates {
		if isExecutable(filepath.Join(c, "initdb")) && isExecutable(filepath.Join(c, "postgres")) {
			return c, ""
		}
	}
	return "", "PATH, `pg_config --bindir` and /usr/lib/postgresql/*/bin"
}

// debianBinDirs lists /usr/lib/postgresql/<version>/bin, newest version first.
func debianBinDirs() []string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(d string) []int {
		var v []int
		for _, part := range strings.Split(filepath.Base(filepath.Dir(d)), ".") {
			n, err := strconv.Atoi(part)
			if err != nil {
				return nil
			}
			v = append(v, n)
		}
		return v
	}
	slices.SortStableFunc(dirs, func(a, b string) int { return slices.Compare(version(b), version(a)) })
	return dirs
}

func isExecutable(path string) bool {
	_, err := exec.LookPath(path) // a path with a separator is checked as it is
	return err == nil
}

// startLocal initialises a data directory in a new temporary directory and runs a
// postgres server on it.
func startLocal(ctx context.Context, binDir string, extra []string) (*Server, error) {
	owner, err := serverUser()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: temporary directory: %w", err)
	}
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
	data := filepath.Join(dir, "data")
	if err := initdb(ctx, binDir, dir, data, owner); err != nil {
		return nil, err
	}
	// The free port is found before postgres binds it; another process can take it in
	// between, so a failure to bind is retried on a new port.
	for attempt := 1; ; attempt++ {
		srv, err := runPostgres(ctx, binDir, dir, data, owner, extra)
		if err == nil {
			ok = true
			return srv, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 {
			return nil, err
		}
	}
}

// serverUser returns the account to run the server as: nil (this process's own) unless
// this process is root, which PostgreSQL refuses to run as.
func serverUser() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root, PostgreSQL needs an unprivileged OS user "+
			"named postgres to run as (%v); create one (useradd --system postgres), "+
			"run the tests as another user, or set %s", err, EnvDatabaseURL)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, fmt.Errorf("pgtest: OS user postgres has a non-numeric uid %q", u.Uid)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, fmt.Errorf("pgtest: OS user postgres has a non-numeric gid %q", u.Gid)
	}
	return &osUser{name: u.Username, uid: uid, gid: gid}, nil
}

func initdb(ctx context.Context, binDir, dir, data string, owner *osUser) error {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"),
		"--pgdata", data, "--username", "postgres", "--auth", "trust",
		"--encoding", "UTF8", "--no-locale",
		"--no-sync", // the files are synced by the first checkpoint; the server runs with fsync on
	)
	cmd.Dir = dir
	cmd.Env = childEnv()
	cmd.SysProcAttr = toolProcAttr(owner)
	out, err := cmd.CombinedOutput()
	if err != nil {
		hint := ""
		if owner != nil {
			hint = fmt.Sprintf("\n(initdb runs as OS user %s, which must be able to reach %s; "+
				"if that is under a private directory, set TMPDIR=/tmp)", owner.name, dir)
		}
		return fmt.Errorf("pgtest: %s/initdb: %w\n%s%s", binDir, err, tail(out), hint)
	}
	return nil
}

var errPortTaken = errors.New("port taken")

// runPostgres starts postgres on a free port and waits until it accepts connections.
// extra settings follow pgtest's own.
func runPostgres(ctx context.Context, binDir, dir, data string, owner *osUser, extra []string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	logPath := filepath.Join(data, "pgtest.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pgtest: server log: %w", err)
	}
	args := []string{"-D", data, "-p", strconv.Itoa(port)}
	for _, s := range append(append([]string(nil), serverSettings...), extra...) {
		args = append(args, "-c", s)
	}
	cmd := exec.Command(filepath.Join(binDir, "postgres"), args...)
	cmd.SysProcAttr = serverProcAttr(owner)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	l, err := runReady(ctx, cmd, dir, logFile, logPath, url, binDir+"/postgres", port)
	if err != nil {
		return nil, err
	}
	l.final = syscall.SIGQUIT // its directory is removed with it: no shutdown checkpoint
	return &Server{URL: url, stop: l.stop}, nil
}

// startLocked starts cmd from a goroutine locked to its OS thread and keeps that thread
// until the process exits: on Linux the server's parent-death signal is tied to the
// thread that started it, not to the process. The returned channel is closed once the
// process has exited and been reaped.
func startLocked(cmd *exec.Cmd) (<-chan struct{}, error) {
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait() // a fast shutdown exits 0; anything else shows in the log
		close(exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}

// stop shuts the server down and removes its directory.
func (l *localServer) stop() error {
	err := l.stopProcess()
	if cerr := l.log.Close(); cerr != nil && !errors.Is(cerr, os.ErrClosed) {
		err = errors.Join(err, cerr)
	}
	if rerr := os.RemoveAll(l.dir); rerr != nil {
		err = errors.Join(err, fmt.Errorf("pgtest: remove %s: %w", l.dir, rerr))
	}
	return err
}

// stopProcess asks for a shutdown (l.final, or SIGINT: for postgres a fast one, which
// aborts sessions, checkpoints and exits) and kills the process if it has not exited
// within stopTimeout.
func (l *localServer) stopProcess() error {
	select {
	case <-l.exited:
		return nil
	default:
	}
	sig := l.final
	if sig == nil {
		sig = os.Interrupt
	}
	if err := l.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		_ = l.cmd.Process.Kill()
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-l.exited:
		return nil
	case <-timer.C:
		_ = l.cmd.Process.Kill()
		<-l.exited
		return fmt.Errorf("pgtest: postgres did not shut down within %s; killed it", stopTimeout)
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	return port, ln.Close()
}

// childEnv is this process's environment without libpq and locale variables, so that
// neither a PGDATA/PGPORT nor a locale leaks into the throwaway server; messages are in
// English so that they can be recognised.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

// tail returns roughly the last 4 KiB of b, from a line start.
func tail(b []byte) string {
	const limit = 4096
	if len(b) > limit {
		b = b[len(b)-limit:]
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return strings.TrimRight(string(b), "\n")
}

func tailFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	return tail(b)
}
