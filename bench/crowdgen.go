package main

// The crowd part's load generator (crowdCommand): one phase, baseline or crowd, in a
// process of its own. Each simulated client is one goroutine holding at most one
// HTTP/1.1 connection, as a client on a machine of its own would: it writes its
// request, reads the answer with the attempt's deadline set on the socket, keeps the
// connection after an answer (keep-alive, as net/http's client does) and closes it when
// it gives up (an HTTP/1.1 connection with an answer still owed cannot carry another
// request), so its retry opens a new one. Connections freed by finished charges are
// kept for new ones, as net/http's idle pool does.
//
// Why not net/http's client: the crowd simulates thousands of clients on one core, and
// net/http's Transport spends two goroutines per connection besides the caller's, a
// context timer per attempt and the pool's lock. Measured on this machine (docs/BENCHMARKS.md, "The crowd: where the time
// went"), the generator then left hundreds of the server's answers unread in its
// sockets past their clients' deadline and counted them as time-outs: it measured its
// own scheduling. -client transport keeps that client for comparison.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/testkit/cpumeter"
)

// crowdCounts is what the load generator counts in one phase.
type crowdCounts struct {
	Seconds     float64 `json:"seconds"`      // measured window
	Charges     int64   `json:"charges"`      // 201 answers in the window
	Started     int64   `json:"started"`      // charges begun in the window
	Dropped     int64   `json:"dropped"`      // arrivals not begun: -live charges under way
	RefusedRA   int64   `json:"refused_ra"`   // 503 with Retry-After
	RefusedNoRA int64   `json:"refused_nora"` // 5xx without Retry-After
	InProgress  int64   `json:"in_progress"`  // 409
	TimedOut    int64   `json:"timed_out"`    // attempts given up after the timeout
	Errors      int64   `json:"errors"`       // other transport errors (connection refused, reset)
	Other       int64   `json:"other"`        // other final answers (4xx)
	Dials       int64   `json:"dials"`        // connections opened in the window
	CPU         float64 `json:"cpu_us"`       // the generator's CPU in the window, µs
	// RunDelay is the time the generator's threads spent runnable but waiting for a
	// CPU in the window (the kernel's schedstat), µs: a generator that waits for CPU
	// reads its answers late.
	RunDelay float64 `json:"run_delay_us"`
	// Sched: how long the generator's goroutines waited, runnable, for the Go
	// scheduler in the window.
	Sched schedWaits `json:"sched"`
}

// crowdAttempter sends one attempt of a charge: the answer's status and whether it
// had Retry-After, or an error (timedOut: the attempt was given up at its deadline).
type crowdAttempter interface {
	attempt(ctx context.Context, key string, timeout time.Duration) (status int, retryAfter, timedOut bool, err error)
}

// runCrowd is the load generator: one phase, baseline (closed loops) or crowd (open
// loop at -rate), printed as one JSON line of crowdCounts.
func runCrowd(args []string) error {
	fs := flag.NewFlagSet(crowdCommand, flag.ContinueOnError)
	base := fs.String("url", "", "server base URL")
	mode := fs.String("mode", "baseline", "baseline or crowd")
	conc := fs.Int("conc", 32, "baseline: closed loops")
	rate := fs.Float64("rate", 0, "crowd: new charges per second")
	dur := fs.Duration("dur", 5*time.Second, "measured window")
	warm := fs.Duration("warmup", time.Second, "baseline: warm-up before the window")
	timeout := fs.Duration("timeout", time.Second, "crowd: an attempt is given up after this long")
	live := fs.Int("live", 4096, "crowd: charges under way at most")
	prefix := fs.String("prefix", "crowd", "key prefix")
	client := fs.String("client", "conn", "conn (a connection per client, read with a socket deadline) or transport (net/http's client)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	g := &crowdGen{prefix: *prefix}
	switch *client {
	case "conn":
		addr, ok := strings.CutPrefix(*base, "http://")
		if !ok {
			return fmt.Errorf("-url %q: want http://host:port", *base)
		}
		g.client = &crowdConns{addr: addr, dials: &g.c.dials, counting: &g.counting}
	case "transport":
		g.client = newCrowdTransport(*base, *live+*conc, &g.c.dials, &g.counting)
	default:
		return fmt.Errorf("-client %q: want conn or transport", *client)
	}
	var c crowdCounts
	var err error
	switch *mode {
	case "baseline":
		c, err = g.baseline(*conc, *warm, *dur)
	case "crowd":
		c, err = g.crowd(*rate, *dur, *timeout, *live)
	default:
		err = fmt.Errorf("-mode %q: want baseline or crowd", *mode)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(c)
}

// crowdGen sends the charges of one phase.
type crowdGen struct {
	prefix   string
	client   crowdAttempter
	next     atomic.Int64
	counting atomic.Bool // inside the measured window
	c        struct {
		charges, started, dropped, refusedRA, refusedNoRA, inProgress, timedOut, errors, other, dials atomic.Int64
	}
}

// count adds 1 to n when inside the window.
func (g *crowdGen) count(n *atomic.Int64) {
	if g.counting.Load() {
		n.Add(1)
	}
}

// charge makes one charge under a new key: attempts until one is answered finally or
// ctx ends, each bounded by timeout (0: none), retried at once after a refusal, a
// time-out or a transport error.
func (g *crowdGen) charge(ctx context.Context, timeout time.Duration) {
	key := g.prefix + "-" + strconv.FormatInt(g.next.Add(1), 10)
	g.count(&g.c.started)
	for ctx.Err() == nil {
		status, ra, timedOut, err := g.client.attempt(ctx, key, timeout)
		switch {
		case timedOut && ctx.Err() == nil:
			g.count(&g.c.timedOut)
		case ctx.Err() != nil:
			return
		case err != nil:
			g.count(&g.c.errors)
		case status == http.StatusCreated:
			g.count(&g.c.charges)
			return
		case status == http.StatusConflict:
			g.count(&g.c.inProgress)
		case status >= 500 && ra:
			g.count(&g.c.refusedRA)
		case status >= 500:
			g.count(&g.c.refusedNoRA)
		default:
			g.count(&g.c.other)
			return
		}
	}
}

// window runs the measured window of length dur, from now, and returns the counts.
func (g *crowdGen) window(dur time.Duration) crowdCounts {
	cpu0, delay0, sched0 := cpumeter.Self(), selfRunDelay(), schedCounts()
	g.counting.Store(true)
	start := time.Now()
	<-time.After(dur)
	g.counting.Store(false)
	c := &g.c
	return crowdCounts{Seconds: time.Since(start).Seconds(), Charges: c.charges.Load(), Started: c.started.Load(), Dropped: c.dropped.Load(),
		RefusedRA: c.refusedRA.Load(), RefusedNoRA: c.refusedNoRA.Load(), InProgress: c.inProgress.Load(),
		TimedOut: c.timedOut.Load(), Errors: c.errors.Load(), Other: c.other.Load(), Dials: c.dials.Load(),
		CPU:      float64(cpumeter.Self()-cpu0) / float64(time.Microsecond),
		RunDelay: float64(selfRunDelay()-delay0) / float64(time.Microsecond),
		Sched:    schedWaitsBetween(sched0, schedCounts())}
}

// baseline runs conc closed loops of patient clients: warm-up, then the window.
func (g *crowdGen) baseline(conc int, warm, dur time.Duration) (crowdCounts, error) {
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for ctx.Err() == nil {
				g.charge(ctx, 0)
			}
		})
	}
	<-time.After(warm)
	c := g.window(dur)
	stop()
	wg.Wait()
	return c, nil
}

// crowd offers new charges open-loop at rate per second for dur, each attempt given
// up after timeout; at most live charges under way.
func (g *crowdGen) crowd(rate float64, dur, timeout time.Duration, live int) (crowdCounts, error) {
	if rate <= 0 {
		return crowdCounts{}, errors.New("-rate must be positive")
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var under atomic.Int64
	done := make(chan crowdCounts, 1)
	go func() { done <- g.window(dur) }()
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var begun int64
	for range tick.C {
		elapsed := time.Since(start)
		if elapsed >= dur {
			break
		}
		for due := int64(rate * elapsed.Seconds()); begun < due; begun++ {
			if under.Load() >= int64(live) {
				g.count(&g.c.dropped)
				continue
			}
			under.Add(1)
			wg.Go(func() {
				defer under.Add(-1)
				g.charge(ctx, timeout)
			})
		}
	}
	c := <-done
	stop()
	wg.Wait()
	return c, nil
}

// crowdConns is the generator's client: HTTP/1.1 on connections it holds itself, one
// per attempt under way, idle ones kept newest first for the next attempt.
type crowdConns struct {
	addr     string
	dials    *atomic.Int64
	counting *atomic.Bool
	mu       sync.Mutex
	idle     []*crowdConn
}

// crowdConn is one connection and its reader.
type crowdConn struct {
	net.Conn
	r *bufio.Reader
}

// crowdPatience bounds an attempt that has no timeout (the baseline's patient
// clients), so that a lost answer cannot hang the phase.
const crowdPatience = 30 * time.Second

// attempt sends one attempt of the charge under key on an idle connection or a new
// one, the whole exchange (dial included) bounded by timeout. The connection is kept
// after a complete answer, closed after anything else.
func (cs *crowdConns) attempt(ctx context.Context, key string, timeout time.Duration) (int, bool, bool, error) {
	deadline := time.Now().Add(cmpOr(timeout, crowdPatience))
	c, err := cs.get(deadline)
	if err != nil {
		return 0, false, isTimeout(err), err
	}
	status, ra, keep, err := c.exchange(cs.addr, key, deadline)
	if err != nil {
		c.Close()
		return 0, false, isTimeout(err), err
	}
	if keep {
		cs.put(c)
	} else {
		c.Close()
	}
	return status, ra, false, nil
}

// get takes the newest idle connection, or dials one by deadline.
func (cs *crowdConns) get(deadline time.Time) (*crowdConn, error) {
	cs.mu.Lock()
	if n := len(cs.idle); n > 0 {
		c := cs.idle[n-1]
		cs.idle = cs.idle[:n-1]
		cs.mu.Unlock()
		return c, nil
	}
	cs.mu.Unlock()
	nc, err := (&net.Dialer{Deadline: deadline}).Dial("tcp", cs.addr)
	if err != nil {
		return nil, err
	}
	if cs.counting.Load() {
		cs.dials.Add(1)
	}
	return &crowdConn{Conn: nc, r: bufio.NewReader(nc)}, nil
}

// put keeps c for the next attempt.
func (cs *crowdConns) put(c *crowdConn) {
	cs.mu.Lock()
	cs.idle = append(cs.idle, c)
	cs.mu.Unlock()
}

// exchange writes the charge request under key and reads the whole answer, by
// deadline; keep is false when the server asked to close the connection.
func (c *crowdConn) exchange(host, key string, deadline time.Time) (status int, retryAfter, keep bool, err error) {
	if err := c.SetDeadline(deadline); err != nil {
		return 0, false, false, err
	}
	req := make([]byte, 0, 256+len(chargeBody))
	req = append(req, "POST "+chargeRoute+" HTTP/1.1\r\nHost: "+host+"\r\nContent-Type: application/json\r\n"+
		refusalScope+": acct_crowd\r\n"+idemhttp.KeyHeader+": "...)
	req = append(req, key...)
	req = append(req, "\r\nContent-Length: "...)
	req = strconv.AppendInt(req, int64(len(chargeBody)), 10)
	req = append(req, "\r\n\r\n"...)
	req = append(req, chargeBody...)
	if _, err := c.Write(req); err != nil {
		return 0, false, false, err
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return 0, false, false, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After") != "", !resp.Close, err
}

// crowdTransport is net/http's client, the generator's before it held connections
// itself; kept to compare (-client transport).
type crowdTransport struct {
	base   string
	client *http.Client
}

// newCrowdTransport is net/http's client with an idle pool of maxIdle connections,
// counting its dials in dials while counting is set.
func newCrowdTransport(base string, maxIdle int, dials *atomic.Int64, counting *atomic.Bool) *crowdTransport {
	d := &net.Dialer{Timeout: 5 * time.Second}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err == nil && counting.Load() {
			dials.Add(1)
		}
		return c, err
	}
	return &crowdTransport{base: base, client: &http.Client{Transport: &http.Transport{
		MaxIdleConns: maxIdle, MaxIdleConnsPerHost: maxIdle, IdleConnTimeout: time.Minute, DialContext: dial}}}
}

// attempt sends one attempt of the charge under key, given up after timeout (0: none).
func (t *crowdTransport) attempt(ctx context.Context, key string, timeout time.Duration) (int, bool, bool, error) {
	actx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		actx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, t.base+chargeRoute, strings.NewReader(string(chargeBody)))
	if err != nil {
		return 0, false, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(refusalScope, "acct_crowd")
	req.Header.Set(idemhttp.KeyHeader, key)
	resp, err := t.client.Do(req)
	if err != nil {
		return 0, false, actx.Err() != nil && ctx.Err() == nil, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After") != "", actx.Err() != nil && ctx.Err() == nil, err
}

// isTimeout reports whether err is a deadline's.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// cmpOr is d, or def when d is not positive.
func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// selfRunDelay is the time this process's threads have spent runnable, waiting for
// a CPU, so far (the second field of /proc/self/task/*/schedstat; 0 where there is
// none). Threads that have exited are not counted; Go keeps its threads.
func selfRunDelay() time.Duration {
	paths, _ := filepath.Glob("/proc/self/task/*/schedstat")
	var sum time.Duration
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) >= 2 {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			sum += time.Duration(n)
		}
	}
	return sum
}

// schedLatencies is the Go runtime's histogram of the time goroutines spent runnable
// before they ran (runtime/metrics /sched/latencies:seconds) so far.
func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return s[0].Value.Float64Histogram()
}

// schedWaits is, between two readings of schedLatencies, the goroutine wake-ups and
// the fraction of them that waited over 100 ms before they ran, and the 99th
// percentile of the waits (the lower bound of its bucket).
type schedWaits struct {
	Wakeups int64         `json:"wakeups"`
	Over    float64       `json:"over_100ms"`
	P99     time.Duration `json:"p99_ns"`
}

// schedWaitsBetween is the schedWaits between two readings a and b of the counts of
// schedLatencies' buckets, in the same program (whose buckets this process's own
// reading gives).
func schedWaitsBetween(a, b []uint64) schedWaits {
	h := schedLatencies()
	if h == nil || len(a) != len(b) || len(b) != len(h.Counts) {
		return schedWaits{}
	}
	counts := make([]uint64, len(b))
	var total, over uint64
	for i := range counts {
		counts[i] = b[i] - a[i]
		total += counts[i]
		if h.Buckets[i] >= 0.1 {
			over += counts[i]
		}
	}
	w := schedWaits{Wakeups: int64(total)}
	if total == 0 {
		return w
	}
	w.Over = float64(over) / float64(total)
	var seen uint64
	for i, n := range counts {
		seen += n
		if float64(seen) >= 0.99*float64(total) {
			w.P99 = time.Duration(max(h.Buckets[i], 0) * float64(time.Second))
			break
		}
	}
	return w
}

// schedCounts is the counts of schedLatencies' buckets so far.
func schedCounts() []uint64 {
	if h := schedLatencies(); h != nil {
		return h.Counts
	}
	return nil
}
