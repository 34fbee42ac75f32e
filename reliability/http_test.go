package reliability

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// builtDirs hold the binaries built by buildCommands; TestMain removes them.
var (
	builtMu   sync.Mutex
	builtDirs []string
)

// commands are the programs the experiments run as real processes (paths relative to
// this package).
var commands = []string{"../examples/charges", "../examples/payouts", "../cmd/idemflow"}

// buildCommands builds every one of commands the first time a test needs one, in one
// go build: one invocation of the go command loads the workspace once and links the
// three binaries side by side (separate builds cost about twice the CPU).
var buildCommands = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "reliability-bin-")
	if err != nil {
		return "", err
	}
	builtMu.Lock()
	builtDirs = append(builtDirs, dir)
	builtMu.Unlock()
	args := append([]string{"build", "-o", dir + string(filepath.Separator)}, commands...)
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %v: %w\n%s", commands, err, out)
	}
	return dir, nil
})

// buildOnce returns a function that returns the path of the binary of the command in
// pkg (one of commands), built by buildCommands.
func buildOnce(pkg string) func() (string, error) {
	if !slices.Contains(commands, pkg) {
		panic("reliability: " + pkg + " is not one of the commands buildCommands builds")
	}
	return func() (string, error) {
		dir, err := buildCommands()
		if err != nil {
			return "", err
		}
		return filepath.Join(dir, filepath.Base(pkg)), nil
	}
}

// chargesBinary is examples/charges' binary.
var chargesBinary = buildOnce("../examples/charges")

// server is a running `charges serve`.
type server struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
	mu   sync.Mutex
	logs bytes.Buffer
}

func (s *server) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logs.Write(b)
}

func (s *server) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logs.String()
}

// startServer runs `charges serve` on the env's schema and provider, without its
// sweeper (the experiments sweep from the test process), with extra environment.
func (e *env) startServer(t testing.TB, env ...string) *server {
	t.Helper()
	return e.startServerWith(t, nil, env...)
}

// startServerWith is startServer with more flags, which override the defaults.
func (e *env) startServerWith(t testing.TB, flags []string, env ...string) *server {
	t.Helper()
	bin, err := chargesBinary()
	require.NoError(t, err)
	s := &server{done: make(chan struct{})}
	s.cmd = exec.Command(bin, append([]string{"serve", "-addr", "127.0.0.1:0", "-database-url", e.db.URL,
		"-provider-url", e.provider.URL, "-sweeper=false"}, flags...)...)
	s.cmd.Env = append(os.Environ(), env...)
	s.cmd.Stderr = s
	stdout, err := s.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, s.cmd.Start())
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			_, _ = s.Write([]byte(line + "\n"))
			if _, u, ok := strings.Cut(line, "listening on "); ok {
				ready <- u
			}
		}
	}()
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			<-s.done
		}
	})
	timer := time.NewTimer(time.Minute)
	defer timer.Stop()
	select {
	case s.url = <-ready:
	case <-s.done:
		t.Fatalf("charges serve exited before it was ready:\n%s", s.output())
	case <-timer.C:
		t.Fatalf("charges serve not ready after a minute:\n%s", s.output())
	}
	return s
}

// post sends a charge request to s and records the answer.
func (e *env) post(t testing.TB, client *http.Client, s *server, req workflow.Request) answer {
	t.Helper()
	return e.postTo(t, client, s.url, req)
}

// postTo sends req to the server at base and records the answer.
func (e *env) postTo(t testing.TB, client *http.Client, base string, req workflow.Request) answer {
	t.Helper()
	start := time.Now()
	hr, err := http.NewRequest(http.MethodPost, base+req.Route, bytes.NewReader(req.Body))
	require.NoError(t, err)
	hr.Header.Set("Authorization", "Bearer "+req.Scope)
	hr.Header.Set("Idempotency-Key", req.Key)
	hr.Header.Set("Content-Type", "application/json")
	a := answer{Via: "http", Start: start}
	resp, err := client.Do(hr)
	if err != nil {
		a.Retryable, a.Err = true, err.Error()
	} else {
		a.Body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		a.Status = resp.StatusCode
		a.Replayed = resp.Header.Get(idemhttp.ReplayedHeader) == "true"
		a.Retryable = resp.StatusCode == http.StatusConflict || resp.StatusCode >= 500 || err != nil
	}
	e.answers.record(req.Scope, req.Key, a)
	return a
}

// TestCrashMatrixHTTP crashes the charges HTTP server (examples/charges with
// CHARGES_CRASH_AFTER) after each phase, including after the response was stored and
// before it was written to the client, then finishes the key by the client's retry
// through another server, or by a sweeper. The client that lost its connection must
// get, on retry, the stored answer byte for byte. Backs invariants 1, 3, 5 and 6.
func TestCrashMatrixHTTP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEnv(t, pgtest.New(t))
	en := env.engine(env.pool(poolOpts{}), nil)
	sw := env.sweeper(en, nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	healthy := env.startServer(t)
	trials := scale(1, 4, 10)
	var keys [][2]string
	crashes, byRetry, bySweeper := 0, 0, 0
	amount := int64(1000)
	for _, phase := range []string{chargeflow.PhaseCreate, chargeflow.PhaseProvider, chargeflow.PhaseFinalize} {
		for _, rec := range []string{"retry", "sweeper"} {
			for trial := range trials {
				amount++
				key := fmt.Sprintf("http|%s|%s|%d", phase, rec, trial)
				req := request("acct", key, chargeflow.FlowName, amount)
				keys = append(keys, [2]string{"acct", key})
				crashing := env.startServer(t, "CHARGES_CRASH_AFTER="+phase)
				a := env.post(t, client, crashing, req)
				require.True(t, a.Retryable && a.Status == 0, "%s: the client lost its connection: %+v", key, a)
				<-crashing.done
				require.Equal(t, 3, crashing.cmd.ProcessState.ExitCode(), "%s: the crash fired:\n%s", key, crashing.output())
				crashes++

				st := env.state(t, "acct", key)
				require.True(t, st.Exists, key)
				switch rec {
				case "retry":
					if st.Status == "in_progress" {
						a := env.post(t, client, healthy, req)
						require.Equal(t, http.StatusConflict, a.Status, "%s: the lease of the dead server is live: %s", key, a.Body)
						env.expireLease(t, "acct", key)
					}
					a := env.post(t, client, healthy, req)
					require.Contains(t, []int{201, 402}, a.Status, "%s: %s", key, a.Body)
					byRetry++
				case "sweeper":
					env.expireLease(t, "acct", key)
					stats, err := sw.RunOnce(ctx)
					require.NoError(t, err)
					if st.Status == "in_progress" {
						require.Equal(t, 1, stats.Finished, "%s: %+v", key, stats)
						bySweeper++
					}
				}
				replay := env.post(t, client, healthy, req)
				require.True(t, replay.Replayed, "%s: %d %s", key, replay.Status, replay.Body)
			}
		}
	}
	r := env.check(t, checkOpts{keys: keys})
	require.Equal(t, len(keys), crashes)
	t.Logf("crash matrix http: trials=%d crashes=%d finished_by_retry=%d finished_by_sweeper=%d keys=%d duplicates=%d unfinished=%d",
		len(keys), crashes, byRetry, bySweeper, r.Keys, r.DuplicateEffects+r.DuplicatePayments, r.Unfinished)
}
