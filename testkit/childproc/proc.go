//go:build unix

package childproc

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Child is a running child process: the test binary re-executed.
type Child struct {
	cmd    *exec.Cmd
	lines  chan []byte
	stdin  io.WriteCloser
	stderr *bytes.Buffer
	exited chan struct{}
	err    error // of Wait, once exited is closed
}

// Start re-executes the test binary with -test.run=run and the extra environment
// variables env, and returns once it runs. run "^$" runs no test: the child's TestMain
// (or an init) then does the child's work. The child is killed when t ends if it has
// not exited by then.
func Start(t testing.TB, run string, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run="+run, "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	c := &Child{cmd: cmd, lines: make(chan []byte, 64), stderr: &bytes.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = &lockedWriter{buf: c.stderr}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatalf("childproc: stdin pipe: %v", err)
	}
	c.stdin = stdin
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("childproc: stdout pipe: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("childproc: start %s: %v", os.Args[0], err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			c.lines <- bytes.Clone(sc.Bytes())
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			c.wait()
		}
	})
	return c
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Stderr is what the child wrote to its standard error so far.
func (c *Child) Stderr() string {
	w := c.cmd.Stderr.(*lockedWriter)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// Send writes line and a newline to the child's standard input: a child that waits for
// the parent reads a line.
func (c *Child) Send(t testing.TB, line string) {
	t.Helper()
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		t.Fatalf("childproc: write to the child: %v", err)
	}
}

// wait waits for the child to exit, once, after its output is drained.
func (c *Child) wait() {
	select {
	case <-c.exited:
		return
	default:
	}
	for range c.lines { // drain, so that the reader ends
	}
	c.err = c.cmd.Wait()
	close(c.exited)
}

// Next decodes the child's next line of output into v, or fails the test if the child
// exits first or prints nothing within limit.
func (c *Child) Next(t testing.TB, limit time.Duration, v any) {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case l, ok := <-c.lines:
		if !ok {
			c.wait()
			t.Fatalf("childproc: the child exited (%v) without the expected line; stderr:\n%s", c.err, c.Stderr())
		}
		if err := json.Unmarshal(l, v); err != nil {
			t.Fatalf("childproc: the child printed %q: %v; stderr:\n%s", l, err, c.Stderr())
		}
	case <-timer.C:
		t.Fatalf("childproc: the child said nothing for %s; stderr:\n%s", limit, c.Stderr())
	}
}

// Rest waits for the child to exit and returns the lines it printed that were not read.
func (c *Child) Rest() [][]byte {
	var got [][]byte
	for l := range c.lines {
		got = append(got, l)
	}
	c.wait()
	return got
}

// Killed waits for the child to exit and reports whether SIGKILL ended it, with the
// lines it printed that were not read. It fails the test if the child exited in any
// other way than cleanly or by SIGKILL.
func (c *Child) Killed(t testing.TB) (bool, [][]byte) {
	t.Helper()
	got := c.Rest()
	if Signaled(c.err, syscall.SIGKILL) {
		return true, got
	}
	if c.err != nil {
		t.Fatalf("childproc: the child failed: %v; stderr:\n%s", c.err, c.Stderr())
	}
	return false, got
}

// Exit waits for the child to exit and returns the lines it printed that were not read,
// with the error of its Wait (nil for a clean exit).
func (c *Child) Exit() ([][]byte, error) {
	got := c.Rest()
	return got, c.err
}

// Paused waits until the child has stopped itself (Stop). The caller has read the
// line the child printed before it stopped.
func (c *Child) Paused(t testing.TB) {
	t.Helper()
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(c.cmd.Process.Pid, &ws, syscall.WUNTRACED, nil)
		if !errors.Is(err, syscall.EINTR) {
			if err != nil {
				t.Fatalf("childproc: wait for the child to stop: %v", err)
			}
			break
		}
	}
	if !ws.Stopped() {
		t.Fatalf("childproc: the child did not stop itself (status %v); stderr:\n%s", ws, c.Stderr())
	}
}

// Kill ends the child with SIGKILL from the parent, as a crash would, whether it runs,
// waits or is paused. Killed then reports how it ended.
func (c *Child) Kill(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(c.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("childproc: SIGKILL: %v", err)
	}
}

// Continue sends SIGCONT to a paused child and returns at once: the child carries on
// while the test goes on (Resume also waits for it to exit).
func (c *Child) Continue(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(c.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatalf("childproc: SIGCONT: %v", err)
	}
}

// Resume continues a paused child, waits for it to exit cleanly and returns the lines
// it printed that were not read.
func (c *Child) Resume(t testing.TB) [][]byte {
	t.Helper()
	c.Continue(t)
	got := c.Rest()
	if c.err != nil {
		t.Fatalf("childproc: the resumed child failed: %v; stderr:\n%s", c.err, c.Stderr())
	}
	return got
}

// Signaled reports whether err, from a child's Wait, says the signal sig ended it.
func Signaled(err error, sig syscall.Signal) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

type lockedWriter struct {
	mu  sync.Mutex
	buf *bytes.Buffer
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(b)
}
