package reliability

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemflow/idemflow/idemclient"
)

// shot is one HTTP attempt of an overload client.
type shot struct {
	at         time.Time // when it was sent
	status     int       // 0: no answer (timeout, connection)
	retryAfter bool
	took       time.Duration
	patient    bool
}

// final reports whether the answer ends the operation: 2xx, 4xx other than 409 and
// 429 (a replay is a 2xx).
func (s shot) final() bool {
	return s.status >= 200 && s.status < 500 && s.status != http.StatusConflict && s.status != http.StatusTooManyRequests
}

// refusal reports whether the answer is a load refusal: 503 or 409.
func (s shot) refusal() bool {
	return s.status == http.StatusServiceUnavailable || s.status == http.StatusConflict
}

// overloadRun is the record of one phase of the experiment.
type overloadRun struct {
	mu      sync.Mutex
	shots   []shot
	ops     [2]int // operations started, by kind (0: give up, 1: patient)
	finals  [2]int // operations that got a final answer, by kind
	badShot []string
	floor   []time.Duration // latencies of requests answered before the engine
}

func (r *overloadRun) record(s shot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shots = append(r.shots, s)
	if s.status != 0 && !s.final() && !(s.refusal() && s.retryAfter) {
		r.badShot = append(r.badShot, fmt.Sprintf("status %d retry-after=%v", s.status, s.retryAfter))
	}
}

// kind is 0 for a client that gives up, 1 for a patient one.
func kind(patient bool) int {
	if patient {
		return 1
	}
	return 0
}

// recorder is the transport under both kinds of clients: it records every attempt
// in the run of its request's context.
type recorder struct{ next http.RoundTripper }

type runKey struct{}

type runTag struct {
	run     *overloadRun
	patient bool
}

func (rt recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	tag, _ := req.Context().Value(runKey{}).(runTag)
	s := shot{at: time.Now(), patient: tag.patient}
	resp, err := rt.next.RoundTrip(req)
	if err == nil {
		// Read the answer here, so that took covers the whole of it.
		body, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rerr == nil {
			resp.Body = io.NopCloser(bytes.NewReader(body))
			s.status, s.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After") != ""
		} else {
			resp, err = nil, rerr
		}
	}
	s.took = time.Since(s.at)
	if tag.run != nil {
		tag.run.record(s)
	}
	return resp, err
}

// overloadClient sends charge requests to the servers in turn, from clients that give
// up (one try, a 2s timeout) and patient clients (idemclient: up to 6 tries with full
// jitter backoff and Retry-After, 10s an attempt).
type overloadClient struct {
	urls    []string
	next    atomic.Int64
	giveUp  *http.Client
	patient *http.Client
}

func newOverloadClient(urls []string) (*overloadClient, func()) {
	tr := &http.Transport{MaxIdleConnsPerHost: 4096}
	rec := recorder{next: tr}
	it, err := idemclient.NewTransport(rec, &idemclient.Config{MaxAttempts: 6, MaxElapsed: 30 * time.Second, AttemptTimeout: 10 * time.Second,
		BackoffMin: 100 * time.Millisecond, BackoffMax: 3 * time.Second})
	if err != nil {
		panic(err) // a constant configuration
	}
	return &overloadClient{urls: urls, giveUp: &http.Client{Transport: rec, Timeout: 2 * time.Second}, patient: &http.Client{Transport: it}}, tr.CloseIdleConnections
}

// operation runs one logical operation under a new key and reports whether it got a
// final answer.
func (c *overloadClient) operation(r *overloadRun, key string, amount int64, patient bool) bool {
	k := kind(patient)
	if r != nil {
		r.mu.Lock()
		r.ops[k]++
		r.mu.Unlock()
	}
	url := c.urls[int(c.next.Add(1))%len(c.urls)]
	body := fmt.Sprintf(`{"amount":%d,"currency":"usd","source":"tok_visa"}`, amount)
	ctx := context.WithValue(context.Background(), runKey{}, runTag{run: r, patient: patient})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+chargesRoute, bytes.NewReader([]byte(body)))
	req.Header.Set("Authorization", "Bearer acct")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	client := c.giveUp
	if patient {
		client = c.patient
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	ok := shot{status: resp.StatusCode}.final()
	if ok && r != nil {
		r.mu.Lock()
		r.finals[k]++
		r.mu.Unlock()
	}
	return ok
}

// floor sends, every 20ms until stop, a request without Idempotency-Key, answered
// 400 by idemhttp before the engine: the latency of the cheapest answer, the floor
// under a refusal's on this machine under this load.
func (c *overloadClient) floor(r *overloadRun, stop <-chan struct{}) {
	tk := time.NewTicker(20 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tk.C:
		}
		url := c.urls[int(c.next.Add(1))%len(c.urls)]
		req, _ := http.NewRequest(http.MethodPost, url+chargesRoute, bytes.NewReader([]byte(`{}`)))
		req.Header.Set("Authorization", "Bearer acct")
		start := time.Now()
		resp, err := c.giveUp.Do(req)
		if err != nil {
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusBadRequest {
			r.mu.Lock()
			r.floor = append(r.floor, time.Since(start))
			r.mu.Unlock()
		}
	}
}

// offer starts operations at rate per second for d, half of them patient, catching
// up on the schedule when the machine falls behind; it returns when the last one
// started, with a function that waits for every one to end.
func (c *overloadClient) offer(r *overloadRun, prefix string, rate float64, d time.Duration) func() {
	var wg sync.WaitGroup
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	stop := make(chan struct{})
	defer close(stop)
	go c.floor(r, stop)
	start := time.Now()
	total := int(rate * d.Seconds())
	for i := 0; i < total; {
		<-t.C
		due := min(total, int(rate*time.Since(start).Seconds()))
		for ; i < due; i++ {
			wg.Add(1)
			go func(n int) { // n, not i: the loop goes on changing i
				defer wg.Done()
				c.operation(r, fmt.Sprintf("%s-%d", prefix, n), int64(1+n%1000), n%2 == 1)
			}(i)
		}
	}
	return wg.Wait
}

// capacity measures the final answers per second of closed-loop patient clients.
func (c *overloadClient) capacity(prefix string, d time.Duration, workers int) float64 {
	var finals atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(end); i++ {
				if c.operation(nil, fmt.Sprintf("%s-cap-%d-%d", prefix, w, i), 1, true) {
					finals.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return float64(finals.Load()) / d.Seconds()
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(float64(len(ds))*p))]
}
