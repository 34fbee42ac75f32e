package reliability

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stretchr/testify/require"
)

// procStats is one CHARGES_STATS_EVERY line of a charges process (examples/charges
// stats.go).
type procStats struct {
	At         time.Time `json:"at"`
	HeapLive   uint64    `json:"heap_live"`
	Goroutines uint64    `json:"goroutines"`
	PoolTotal  int32     `json:"pool_total"`
	PoolInUse  int32     `json:"pool_in_use"`
}

// soakProc is a running `charges serve` or `charges worker`.
type soakProc struct {
	cmd  *exec.Cmd
	url  string // serve's base URL
	done chan struct{}

	mu      sync.Mutex
	last    procStats
	lines   int      // stats lines read
	tail    []string // the last lines of other output, for failure messages
	partial []byte
}

// Write takes the process's stderr: stats lines update last, others go to tail.
func (p *soakProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		line := string(p.partial[:i])
		p.partial = p.partial[i+1:]
		if raw, ok := strings.CutPrefix(line, "charges-stats "); ok {
			var st procStats
			if json.Unmarshal([]byte(raw), &st) == nil {
				p.last, p.lines = st, p.lines+1
				continue
			}
		}
		p.tail = append(p.tail, line)
		if len(p.tail) > 50 {
			p.tail = p.tail[len(p.tail)-50:]
		}
	}
	p.partial = bytes.Clone(p.partial)
	return len(b), nil
}

// latest returns the process's last stats line, and whether it is younger than max.
func (p *soakProc) latest(max time.Duration) (procStats, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last, p.lines > 0 && time.Since(p.last.At) < max
}

func (p *soakProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

// soakSlots are the soak's processes: two servers, then two workers.
var soakSlots = []string{"srv0", "srv1", "sw0", "sw1"}

// startProc starts the charges process of slot on the env's schema and provider and
// waits until it is ready. The process is killed when the test ends, if still running.
func (s *soak) startProc(slot string) (*soakProc, error) {
	bin, err := chargesBinary()
	if err != nil {
		return nil, err
	}
	args := []string{"worker", "-retention", s.cfg.retention.String(), "-sweep-interval", "1s", "-mail-url", s.mail.URL}
	ready := "worker: sweeping"
	if strings.HasPrefix(slot, "srv") {
		args, ready = []string{"serve", "-addr", "127.0.0.1:0", "-sweeper=false", "-bare-control"}, "listening on "
	}
	args = append(args, "-database-url", s.env.db.URL, "-provider-url", s.env.provider.URL, "-lease", s.cfg.lease.String())
	p := &soakProc{done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), envStatsEvery+"=1s")
	if strings.HasPrefix(slot, "sw") {
		// Heap profiles every quarter of the run (the quarters the heap line compares),
		// for `go tool pprof -base` when a worker's heap grows (docs/RELIABILITY.md).
		p.cmd.Env = append(p.cmd.Env, envHeapProfileDir+"="+filepath.Join(s.cfg.out, "heap-"+slot),
			envHeapProfileEvery+"="+(s.cfg.duration/4).String())
	}
	p.cmd.Stderr = p
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	readyc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if i := strings.Index(line, ready); i >= 0 {
				readyc <- strings.TrimSpace(line[i+len(ready):])
			}
		}
	}()
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	s.t.Cleanup(func() { p.stop(syscall.SIGKILL) })
	timer := time.NewTimer(time.Minute)
	defer timer.Stop()
	select {
	case p.url = <-readyc:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before it was ready:\n%s", slot, p.output())
	case <-timer.C:
		p.stop(syscall.SIGKILL)
		return nil, fmt.Errorf("%s not ready after a minute:\n%s", slot, p.output())
	}
}

// envStatsEvery is examples/charges' CHARGES_STATS_EVERY, and the heap profiles'
// variables are its CHARGES_HEAP_PROFILE_DIR and CHARGES_HEAP_PROFILE_EVERY.
const (
	envStatsEvery       = "CHARGES_STATS_EVERY"
	envHeapProfileDir   = "CHARGES_HEAP_PROFILE_DIR"
	envHeapProfileEvery = "CHARGES_HEAP_PROFILE_EVERY"
)

// stop signals the process, unless it has exited, and waits for it.
func (p *soakProc) stop(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	<-p.done
}

// startProcs starts the four processes.
func (s *soak) startProcs() {
	for _, slot := range soakSlots {
		p, err := s.startProc(slot)
		require.NoError(s.t, err)
		s.mu.Lock()
		s.procs[slot] = p
		s.mu.Unlock()
	}
}

// stopProcs stops them (SIGTERM: a clean shutdown) once the load has drained.
func (s *soak) stopProcs() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		p.stop(syscall.SIGTERM)
	}
}

// server returns the base URL of server i, as it is now.
func (s *soak) server(i int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[soakSlots[i]].url
}

// killWindow is when a killed server's keys were waiting: from the kill until its
// restart was ready and its leases had run out.
type killWindow struct{ from, to time.Duration }

// killer SIGKILLs a server every killEvery, alternating between the two, and restarts
// it, until stop closes.
func (s *soak) killer(stop <-chan struct{}) {
	for i := 0; ; i++ {
		if !pause(stop, s.cfg.killEvery, 0) { // the schedule of the kills, not synchronisation
			return
		}
		slot := soakSlots[i%2]
		s.mu.Lock()
		old := s.procs[slot]
		s.mu.Unlock()
		from := time.Since(s.start)
		old.stop(syscall.SIGKILL)
		p, err := s.startProc(slot)
		if err != nil {
			s.load.fail(fmt.Errorf("restart %s: %w", slot, err))
			return
		}
		s.mu.Lock()
		s.procs[slot] = p
		w := killWindow{from: from, to: time.Since(s.start) + s.cfg.lease + 5*time.Second}
		s.windows = append(s.windows, w)
		err = s.appendRow(s.killsPath(), []string{"from_s", "to_s"}, formatRow([]float64{w.from.Seconds(), w.to.Seconds()}))
		s.mu.Unlock()
		if err != nil {
			s.load.fail(fmt.Errorf("kills: %w", err))
		}
	}
}

// kills is how many servers were killed.
func (s *soak) kills() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.windows)
}
