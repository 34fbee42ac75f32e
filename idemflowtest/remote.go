package idemflowtest

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path"
	"sync"
	"testing"
	"time"
)

// Remote is a fake external service for call phases, over HTTP: a POST to any path
// with an Idempotency-Key header makes at most one effect per key, however often and
// however concurrently it is asked, and answers every request with that key the same
// way: 201 {"id":"<path's last element>_<n>"} for an effect, 402 {"error":"declined"}
// for a request RemoteOpts.Decline refuses. A request without the header is answered
// 400 and makes nothing. Failures (FailNext, RemoteOpts.FailRate) are answered 503
// before anything is done, so that a retry with the same key can still succeed.
//
// A flow that passes its derived key (phases.Run.DerivedKey) makes one effect per
// call phase and key row, whatever crashes in between; a flow that makes up a new key
// per attempt shows a second effect after a crash between its call and the commit that
// records the call's result.
type Remote struct {
	// URL is the base URL, e.g. http://127.0.0.1:PORT.
	URL string

	opts   RemoteOpts
	server *httptest.Server

	mu       sync.Mutex
	effects  map[string]*Effect // by idempotency key
	order    []string           // keys in the order their effects were made
	requests map[string]int     // by idempotency key
	total    int
	failNext int
	failed   int
	perKey   map[string]*sync.Mutex // serialises concurrent requests with one key
	during   func(r *http.Request)
}

// RemoteOpts configure a Remote. The zero value means no latency, no failures and no
// declines.
type RemoteOpts struct {
	// Latency delays every request before it is answered.
	Latency time.Duration
	// FailRate is the share of requests, in [0, 1], answered 503 before anything is
	// done.
	FailRate float64
	// Decline, if set, says which requests are declined (402, remembered for the key
	// like an effect). It gets the request's path and body.
	Decline func(path string, body []byte) bool
}

// Effect is what a Remote did for one idempotency key.
type Effect struct {
	Key      string // the idempotency key it was made under
	ID       string // e.g. pay_000001; empty when declined
	Path     string // of the request that made it
	Body     []byte // of the request that made it
	Declined bool
}

// NewRemote starts a Remote, closed when the test ends. opts may be nil.
//
// In a crash matrix's child process (see Crash) NewRemote returns the parent's remote
// instead, with the same URL; its counts are the parent's to read, and the child's
// Remote reports none.
func NewRemote(t testing.TB, opts *RemoteOpts) *Remote {
	t.Helper()
	r := &Remote{effects: map[string]*Effect{}, requests: map[string]int{}, perKey: map[string]*sync.Mutex{}}
	if opts != nil {
		r.opts = *opts
	}
	if child != nil {
		r.URL = child.remote(t)
		return r
	}
	r.server = httptest.NewServer(r)
	r.URL = r.server.URL
	t.Cleanup(r.server.Close)
	shares.add(t, shareRemote, r.URL)
	return r
}

// ServeHTTP implements http.Handler: the remote's whole API.
func (r *Remote) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	key := req.Header.Get("Idempotency-Key")
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if req.Method != http.MethodPost || key == "" || err != nil {
		writeJSON(w, http.StatusBadRequest, `{"error":"bad_request"}`)
		return
	}
	r.mu.Lock()
	r.total++
	r.requests[key]++
	fail := r.failNext > 0 || r.opts.FailRate > 0 && rand.Float64() < r.opts.FailRate
	if r.failNext > 0 {
		r.failNext--
	}
	if fail {
		r.failed++
	}
	if r.perKey[key] == nil {
		r.perKey[key] = &sync.Mutex{}
	}
	lock, during := r.perKey[key], r.during
	r.mu.Unlock()

	if r.opts.Latency > 0 {
		timer := time.NewTimer(r.opts.Latency)
		select {
		case <-timer.C:
		case <-req.Context().Done():
			timer.Stop()
			return
		}
	}
	if during != nil {
		during(req)
	}
	if fail {
		writeJSON(w, http.StatusServiceUnavailable, `{"error":"unavailable"}`)
		return
	}
	lock.Lock()
	defer lock.Unlock()
	r.mu.Lock()
	e := r.effects[key]
	if e == nil {
		e = &Effect{Key: key, Path: req.URL.Path, Body: body}
		if r.opts.Decline != nil && r.opts.Decline(req.URL.Path, body) {
			e.Declined = true
		} else {
			e.ID = fmt.Sprintf("%s_%06d", path.Base(req.URL.Path), len(r.order)+1)
		}
		r.effects[key] = e
		r.order = append(r.order, key)
	}
	answer := *e
	r.mu.Unlock()
	if answer.Declined {
		writeJSON(w, http.StatusPaymentRequired, `{"error":"declined"}`)
		return
	}
	id, _ := json.Marshal(answer.ID)
	writeJSON(w, http.StatusCreated, `{"id":`+string(id)+`}`)
}

func writeJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// FailNext makes the next n requests fail with 503 before anything is done.
func (r *Remote) FailNext(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failNext = n
}

// Armed is the number of failures FailNext still has to inject.
func (r *Remote) Armed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failNext
}

// SetLatency changes RemoteOpts.Latency.
func (r *Remote) SetLatency(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.opts.Latency = d
}

// During sets a function run in the middle of every request, after the latency and
// before the answer, outside the remote's lock; nil removes it.
func (r *Remote) During(f func(req *http.Request)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.during = f
}

// Effect returns the effect made under an idempotency key, if any.
func (r *Remote) Effect(key string) (Effect, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.effects[key]
	if !ok {
		return Effect{}, false
	}
	return *e, true
}

// Effects returns every effect made, declines included, in the order they were made.
func (r *Remote) Effects() []Effect {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Effect, 0, len(r.order))
	for _, k := range r.order {
		out = append(out, *r.effects[k])
	}
	return out
}

// Made is the number of effects made, declines not included.
func (r *Remote) Made() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.effects {
		if !e.Declined {
			n++
		}
	}
	return n
}

// Requests is the number of requests received with an idempotency key, failed ones
// included.
func (r *Remote) Requests(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[key]
}

// Total is the number of requests received with any idempotency key, and how many of
// them failed.
func (r *Remote) Total() (requests, failed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total, r.failed
}
