package reliability

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/workflow"
)

// Child processes are this test binary re-executed with envChild set to a JSON
// childConfig: TestMain runs the child instead of the tests. A child SIGKILLs itself
// (a crash: no deferred functions, no connection cleanup) or SIGSTOPs itself (a pause:
// a zombie once the parent lets its lease run out) at a point of its run.
const envChild = "IDEMFLOW_REL_CHILD"

type childConfig struct {
	Mode        string // do: run Requests in order; sweep: sweeper passes until one takes nothing
	DBURL       string
	ProviderURL string
	Lease       time.Duration
	Params      map[string]string // run-time parameters of the child's pool
	AppName     string
	// Point is where the child kills or pauses itself (see points); Nth picks the
	// Nth time the point is reached (0 means the first).
	Point  string
	Action string // kill or stop
	Nth    int
	// Requests are run one after the other by mode do.
	Requests []workflow.Request
}

// childLine is one line a child prints on stdout.
type childLine struct {
	Event  string         // fired, answer, stats, done
	Point  string         `json:",omitempty"`
	Key    string         `json:",omitempty"`
	Answer *answer        `json:",omitempty"`
	Stats  *sweeper.Stats `json:",omitempty"`
}

// points fires at one named point of a run, the nth time it is reached: a call
// phase's start ("<phase>/before-call") and end ("<phase>/after-call"), a tx phase's
// start ("<phase>/start", before its transaction opens), the start of a new key's first
// tx phase's function ("<phase>/after-claim": the claim lock is held, the key row is
// not written, nothing of the phase ran; see prologue), its function's success before
// COMMIT ("<phase>/before-commit", before the key row's insert or update that rides
// with it), its commit ("<phase>/after-commit"), the commit that wrote a new key's row
// ("claimed"), a takeover by a retry ("taken-over") or a sweeper ("swept").
type points struct {
	point string
	nth   int
	fire  func(at string)
	mu    sync.Mutex
	seen  int
}

func newPoints(point string, nth int, fire func(at string)) *points {
	return &points{point: point, nth: nth, fire: fire}
}

// at fires if p is the point and this is the nth time it is reached.
func (ps *points) at(p string) {
	if p != ps.point {
		return
	}
	ps.mu.Lock()
	ps.seen++
	hit := ps.seen == max(ps.nth, 1)
	ps.mu.Unlock()
	if hit {
		ps.fire(p)
	}
}

// prologue is a first tx phase's prologue (see withFirstTxPrologue) that reaches
// "<phase>/after-claim". The engine has no hook there: the function of a new key's
// first tx phase is the first thing that runs once the claim gave it the key. A key
// taken over runs its first phase (if it must) at attempt 2 or later.
func (ps *points) prologue(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
	if run.Attempt() == 1 {
		ps.at(run.Phase() + "/after-claim")
	}
	return nil
}

// hooks are the engine hooks that reach the points.
func (ps *points) hooks() workflow.Hooks {
	return workflow.Hooks{
		PhaseStart: func(ctx context.Context, ev workflow.PhaseEvent) context.Context {
			if ev.Kind == phases.KindCall {
				ps.at(ev.Phase + "/before-call")
			} else {
				ps.at(ev.Phase + "/start")
			}
			return ctx
		},
		BeforeCommit: func(ctx context.Context, ev workflow.PhaseEvent) { ps.at(ev.Phase + "/before-commit") },
		PhaseEnd: func(ctx context.Context, ev workflow.PhaseEvent, err error) {
			if err != nil {
				return
			}
			if ev.Kind == phases.KindCall {
				ps.at(ev.Phase + "/after-call")
			} else {
				ps.at(ev.Phase + "/after-commit")
			}
		},
		Key: func(ctx context.Context, ev workflow.KeyEvent) {
			switch ev.Kind {
			case workflow.KeyClaimed:
				ps.at("claimed")
			case workflow.KeyTakenOver:
				ps.at("taken-over")
			case workflow.KeySwept:
				ps.at("swept")
			}
		},
	}
}

// stopHere stops this process (SIGSTOP) before the calling goroutine takes another
// step, and returns after SIGCONT. kill(getpid(), SIGSTOP) is not enough: the kernel
// may hand a process-directed signal to another thread, and on a loaded machine the
// calling thread runs on for milliseconds (through a whole transaction) before the
// group stop reaches it. A signal directed at the calling thread stops it on its way
// out of the system call.
func stopHere() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}

// runChildIfAsked runs this process as a child if it was started as one, and reports
// whether it was.
func runChildIfAsked() bool {
	raw := os.Getenv(envChild)
	if raw == "" {
		return false
	}
	var cfg childConfig
	out := json.NewEncoder(os.Stdout)
	var outMu sync.Mutex
	emit := func(l childLine) {
		outMu.Lock()
		defer outMu.Unlock()
		_ = out.Encode(l)
	}
	fail := func(msg string, err error) {
		fmt.Fprintf(os.Stderr, "reliability child: %s: %v\n", msg, err)
		os.Exit(2)
	}
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fail("config", err)
	}
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(cfg.DBURL)
	if err != nil {
		fail("pool config", err)
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = cfg.AppName
	for k, v := range cfg.Params {
		pcfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		fail("connect", err)
	}
	pts := newPoints(cfg.Point, cfg.Nth, func(at string) {
		emit(childLine{Event: "fired", Point: at})
		switch cfg.Action {
		case "kill":
			runtime.LockOSThread() // see stopHere: the calling thread is hit first
			_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGKILL)
			select {} // the signal is on its way
		case "stop":
			stopHere()
		}
	})
	e, err := workflow.New(pool, &workflow.Config{Lease: cfg.Lease, Hooks: pts.hooks()})
	if err != nil {
		fail("engine", err)
	}
	if err := registerFlows(e, cfg.ProviderURL, &http.Client{Timeout: 10 * time.Second}, pts.prologue); err != nil {
		fail("register", err)
	}
	switch cfg.Mode {
	case "do":
		for _, req := range cfg.Requests {
			res, err := e.Do(ctx, req)
			a := fromDo(res, err, "child")
			emit(childLine{Event: "answer", Key: req.Key, Answer: &a})
		}
	case "sweep":
		s, err := sweeper.New(e, &sweeper.Config{Grace: -1})
		if err != nil {
			fail("sweeper", err)
		}
		var total sweeper.Stats
		for {
			st, err := s.RunOnce(ctx)
			if err != nil {
				fail("pass", err)
			}
			total.Taken += st.Taken
			total.Finished += st.Finished
			total.Released += st.Released
			total.LeaseLost += st.LeaseLost
			total.DeadLettered += st.DeadLettered
			total.GivenBack += st.GivenBack
			if st.Taken == 0 {
				break
			}
		}
		emit(childLine{Event: "stats", Stats: &total})
	default:
		fail("mode", errors.New(cfg.Mode))
	}
	emit(childLine{Event: "done"})
	pool.Close()
	os.Exit(0)
	return true
}

// child is a running child process.
type child struct {
	t      testing.TB
	cmd    *exec.Cmd
	lines  chan childLine
	stderr *bytes.Buffer
	exited chan struct{}
	state  *os.ProcessState
	err    error
}

// childApp is the application_name of the sessions of the env's children.
func (e *env) childApp() string { return e.appName + "_child" }

// startChild starts a child with cfg (the env's database and provider filled in).
func (e *env) startChild(t testing.TB, cfg childConfig) *child {
	t.Helper()
	if cfg.DBURL == "" {
		cfg.DBURL = e.db.URL
	}
	cfg.ProviderURL = e.provider.URL
	cfg.AppName = e.childApp()
	raw, err := json.Marshal(cfg)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+string(raw))
	c := &child{t: t, cmd: cmd, lines: make(chan childLine, 64), stderr: &bytes.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = c.stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var l childLine
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				c.lines <- l
			}
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

// wait waits for the child to exit (once).
func (c *child) wait() {
	select {
	case <-c.exited:
		return
	default:
	}
	for range c.lines { // drain, so that the reader ends
	}
	c.err = c.cmd.Wait()
	c.state = c.cmd.ProcessState
	close(c.exited)
}

// next returns the child's next line, or fails the test if it exits first or nothing
// comes within limit.
func (c *child) next(t testing.TB, limit time.Duration) childLine {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case l, ok := <-c.lines:
		if !ok {
			c.wait()
			t.Fatalf("child exited (%v) without the expected line; stderr:\n%s", c.err, c.stderr)
		}
		return l
	case <-timer.C:
		t.Fatalf("child said nothing for %s; stderr:\n%s", limit, c.stderr)
	}
	return childLine{}
}

// killed waits for the child and reports whether it was SIGKILLed (it kills itself
// only at its point) and what it answered before.
func (c *child) killed(t testing.TB) (bool, []childLine) {
	t.Helper()
	var got []childLine
	for l := range c.lines {
		got = append(got, l)
	}
	c.wait()
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		ws := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true, got
		}
	}
	require.NoError(t, c.err, "child failed; stderr:\n%s", c.stderr)
	return false, got
}

// paused waits until the child reports it reached its point and has stopped itself.
func (c *child) paused(t testing.TB) {
	t.Helper()
	l := c.next(t, 2*time.Minute)
	require.Equal(t, "fired", l.Event, "stderr:\n%s", c.stderr)
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(c.cmd.Process.Pid, &ws, syscall.WUNTRACED, nil)
		if !errors.Is(err, syscall.EINTR) {
			require.NoError(t, err)
			break
		}
	}
	require.True(t, ws.Stopped(), "the child stopped itself (status %v)", ws)
}

// resume continues a paused child and returns what it printed until it exited cleanly.
func (c *child) resume(t testing.TB) []childLine {
	t.Helper()
	require.NoError(t, syscall.Kill(c.cmd.Process.Pid, syscall.SIGCONT))
	var got []childLine
	for l := range c.lines {
		got = append(got, l)
	}
	c.wait()
	require.NoError(t, c.err, "stderr:\n%s", c.stderr)
	return got
}

// recordChildAnswers records the answers a child printed.
func (e *env) recordChildAnswers(scope string, lines []childLine) {
	for _, l := range lines {
		if l.Event == "answer" && l.Answer != nil {
			e.answers.record(scope, l.Key, *l.Answer)
		}
	}
}
