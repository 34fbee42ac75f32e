package reliability

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/examples/charges/chargeflow"
	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/workflow"
)

// The kinds of timed requests.
const (
	latFresh = iota
	latReplay
	latBare
)

var latNames = []string{"fresh", "replay", "bare"}

// latRec is one timed request: when it began (since the load started), its kind and
// how long it took.
type latRec struct {
	at   time.Duration
	kind int
	took time.Duration
}

// recentKey is a key that got its final answer, for replays and mismatches.
type recentKey struct {
	req workflow.Request
	at  time.Time
}

// The soak's mix, in parts: fresh keys, replays of recently finished keys, fresh keys
// sent to both servers at once, a finished key with another body, the bare control.
var soakMix = []struct {
	op     string
	weight int
}{{"fresh", 50}, {"replay", 20}, {"dup", 8}, {"mismatch", 7}, {"bare", 15}}

// soakLoad is the soak's clients.
type soakLoad struct {
	s      *soak
	client *http.Client
	start  time.Time
	// ctx bounds the retries of every key: cancelled two minutes after the load
	// stopped offering new requests.
	ctx    context.Context
	cancel context.CancelFunc
	seq    atomic.Int64

	mu     sync.Mutex
	keys   [][2]string
	lats   []latRec // since the sampler last took them
	recent []recentKey
	next   int // where recent is written next, once full
	errs   []error

	submitted, fresh, replays, dups, mismatches, mismatch422, bare, bareOK, shed atomic.Int64
}

func newSoakLoad(s *soak) *soakLoad {
	tr := &http.Transport{MaxIdleConnsPerHost: 128}
	s.t.Cleanup(tr.CloseIdleConnections)
	ctx, cancel := context.WithCancel(context.Background())
	s.t.Cleanup(cancel)
	return &soakLoad{s: s, client: &http.Client{Transport: tr, Timeout: 10 * time.Second}, ctx: ctx, cancel: cancel}
}

func (l *soakLoad) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) < 50 {
		l.errs = append(l.errs, err)
	}
}

// post sends body under req's key to server i; it records nothing.
func (l *soakLoad) post(i int, req workflow.Request, route string, body []byte) answer {
	start := time.Now()
	a := answer{Via: "http", Start: start}
	hr, err := http.NewRequestWithContext(l.ctx, http.MethodPost, l.s.server(i)+route, bytes.NewReader(body))
	if err != nil {
		a.Retryable, a.Err = true, err.Error()
		return a
	}
	hr.Header.Set("Authorization", "Bearer "+req.Scope)
	if req.Key != "" {
		hr.Header.Set("Idempotency-Key", req.Key)
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(hr)
	if err == nil {
		a.Body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		a.Status = resp.StatusCode
		a.Replayed = resp.Header.Get(idemhttp.ReplayedHeader) == "true"
	}
	a.Retryable = err != nil || a.Status == http.StatusConflict || a.Status >= 500
	if err != nil {
		a.Status, a.Err = 0, err.Error()
	}
	return a
}

func (l *soakLoad) timed(kind int, a answer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lats = append(l.lats, latRec{at: a.Start.Sub(l.start), kind: kind, took: time.Since(a.Start)})
}

// newKey returns a fresh charge request and counts it as submitted.
func (l *soakLoad) newKey() workflow.Request {
	req := request("acct", fmt.Sprintf("soak-%d", l.seq.Add(1)), chargeflow.FlowName, int64(1+rand.IntN(10000)))
	l.mu.Lock()
	l.keys = append(l.keys, [2]string{req.Scope, req.Key})
	l.mu.Unlock()
	l.submitted.Add(1)
	return req
}

// untilFinal sends req, starting with server first and alternating, until it gets a
// final answer or the load's retries end; timed times its first attempt if that one
// is final and fresh.
func (l *soakLoad) untilFinal(req workflow.Request, first int, timed bool) {
	pause := 20 * time.Millisecond
	for i := 0; ; i++ {
		a := l.post((first+i)%2, req, req.Route, req.Body)
		if l.ctx.Err() != nil && a.Retryable {
			l.fail(fmt.Errorf("key %s: no final answer before the drain deadline; last %d %s", req.Key, a.Status, a.Err))
			return
		}
		l.s.env.answers.record(req.Scope, req.Key, a)
		if !a.Retryable {
			if timed && i == 0 && !a.Replayed {
				l.timed(latFresh, a)
			}
			l.remember(req)
			return
		}
		pause = backoff(l.ctx, pause)
	}
}

// backoff waits pause (a client's back-off, not synchronisation) and returns the next.
func backoff(ctx context.Context, pause time.Duration) time.Duration {
	t := time.NewTimer(pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return min(pause*2, 200*time.Millisecond)
}

func (l *soakLoad) remember(req workflow.Request) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := recentKey{req: req, at: time.Now()}
	if len(l.recent) < 512 {
		l.recent = append(l.recent, k)
		return
	}
	l.recent[l.next] = k
	l.next = (l.next + 1) % len(l.recent)
}

// pickRecent returns a key finished less than 30 s ago (well inside the retention:
// a replay must find it), if any.
func (l *soakLoad) pickRecent() (workflow.Request, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for range 8 {
		if len(l.recent) == 0 {
			break
		}
		k := l.recent[rand.IntN(len(l.recent))]
		if time.Since(k.at) < 30*time.Second {
			return k.req, true
		}
	}
	return workflow.Request{}, false
}

// do runs one operation of the mix.
func (l *soakLoad) do(op string) {
	switch op {
	case "replay", "mismatch":
		req, ok := l.pickRecent()
		if !ok {
			l.do("fresh")
			return
		}
		if op == "replay" {
			l.replay(req)
		} else {
			l.mismatch(req)
		}
	case "dup": // the same new key to both servers at once
		l.dups.Add(1)
		req := l.newKey()
		var wg sync.WaitGroup
		wg.Go(func() { l.untilFinal(req, 0, false) })
		wg.Go(func() { l.untilFinal(req, 1, false) })
		wg.Wait()
	case "bare":
		l.bare.Add(1)
		a := l.post(rand.IntN(2), workflow.Request{Scope: "acct"}, "/v1/bare", nil)
		switch {
		case a.Status == http.StatusCreated:
			l.bareOK.Add(1)
			l.timed(latBare, a)
		case !a.Retryable:
			l.fail(fmt.Errorf("bare control answered %d %s", a.Status, a.Body))
		}
	default:
		l.fresh.Add(1)
		l.untilFinal(l.newKey(), rand.IntN(2), true)
	}
}

// replay sends a finished key's request again, once: its answer must be the stored
// one, replayed (the checker compares the bytes), or retryable.
func (l *soakLoad) replay(req workflow.Request) {
	l.replays.Add(1)
	a := l.post(rand.IntN(2), req, req.Route, req.Body)
	l.s.env.answers.record(req.Scope, req.Key, a)
	switch {
	case a.Retryable:
	case !a.Replayed:
		l.fail(fmt.Errorf("replay of finished key %s answered %d %s, not replayed", req.Key, a.Status, a.Body))
	default:
		l.timed(latReplay, a)
	}
}

// mismatch sends a finished key with another body, once: it must be refused (422) or
// retryable, and change nothing (the audit checks that a finished row never changes).
// Its answer is not the key's, so it is not recorded for the checker.
func (l *soakLoad) mismatch(req workflow.Request) {
	l.mismatches.Add(1)
	body := []byte(fmt.Sprintf(`{"amount":%d,"currency":"usd","source":"tok_visa"}`, 20000+rand.IntN(10000)))
	a := l.post(rand.IntN(2), req, req.Route, body)
	switch {
	case a.Status == http.StatusUnprocessableEntity:
		l.mismatch422.Add(1)
	case !a.Retryable:
		l.fail(fmt.Errorf("mismatch on key %s answered %d %s, want 422", req.Key, a.Status, a.Body))
	}
}

// pick draws an operation from soakMix.
func pick() string {
	total := 0
	for _, m := range soakMix {
		total += m.weight
	}
	n := rand.IntN(total)
	for _, m := range soakMix {
		if n < m.weight {
			return m.op
		}
		n -= m.weight
	}
	return "fresh"
}

// offer sends the mix at rate operations per second for d (open loop: an operation
// that finds every client busy is shed and counted), then lets every started key get
// its final answer, giving up two minutes after the end.
func (l *soakLoad) offer(rate float64, d time.Duration) {
	jobs := make(chan string, 1024)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for op := range jobs {
				l.do(op)
			}
		})
	}
	tick := time.NewTicker(10 * time.Millisecond)
	end := time.NewTimer(d)
	last, owed := time.Now(), 0.0
loop:
	for {
		select {
		case <-end.C:
			break loop
		case now := <-tick.C:
			owed += rate * now.Sub(last).Seconds()
			last = now
			for ; owed >= 1; owed-- {
				select {
				case jobs <- pick():
				default:
					l.shed.Add(1)
				}
			}
		}
	}
	tick.Stop()
	close(jobs)
	drain := time.AfterFunc(2*time.Minute, l.cancel)
	wg.Wait()
	drain.Stop()
}

// capacity measures fresh requests per second of 8 clients in a closed loop for d.
func (l *soakLoad) capacity(d time.Duration) float64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	until := start.Add(d)
	for w := range 8 {
		wg.Go(func() {
			for time.Now().Before(until) {
				l.untilFinal(l.newKey(), w%2, false)
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}

// submittedKeys are the keys the load sent.
func (l *soakLoad) submittedKeys() [][2]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][2]string(nil), l.keys...)
}

// takeLats returns the timed requests since the last call.
func (l *soakLoad) takeLats() []latRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lats
	l.lats = nil
	return out
}

// soakCounts are the load's counters at the end.
type soakCounts struct {
	Submitted, Fresh, Replays, Dups, Mismatches, Mismatch422, Bare, BareOK, Shed int64
	Errs                                                                         []error
}

func (l *soakLoad) counts() soakCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return soakCounts{Submitted: l.submitted.Load(), Fresh: l.fresh.Load(), Replays: l.replays.Load(), Dups: l.dups.Load(),
		Mismatches: l.mismatches.Load(), Mismatch422: l.mismatch422.Load(), Bare: l.bare.Load(), BareOK: l.bareOK.Load(),
		Shed: l.shed.Load(), Errs: append([]error(nil), l.errs...)}
}

func (c soakCounts) String() string {
	return fmt.Sprintf("keys=%d fresh=%d replays=%d duplicates_sent=%d mismatches=%d mismatch_422=%d bare=%d bare_201=%d shed=%d client_errors=%d",
		c.Submitted, c.Fresh, c.Replays, c.Dups, c.Mismatches, c.Mismatch422, c.Bare, c.BareOK, c.Shed, len(c.Errs))
}

// require fails t unless every kind of operation ran and the clients saw nothing
// wrong.
func (c soakCounts) require(t testing.TB) {
	t.Helper()
	for _, err := range c.Errs {
		t.Errorf("soak client: %v", err)
	}
	require.Positive(t, c.Replays, "replays were sent")
	require.Positive(t, c.Dups, "overlapping duplicates were sent")
	require.Positive(t, c.Mismatch422, "mismatches were refused with 422")
	require.Positive(t, c.BareOK, "the bare control answered")
}
