package reliability

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// provider is a fake payment provider that records everything: every request and the
// one payment it makes per idempotency key (the derived key). It serves the charges
// flow's API (POST /v1/payments, a source of "card_declined" is declined with 402) and
// the two-call flow's (POST /v1/authorize, POST /v1/capture). Each idempotency key gets
// at most one payment however often it is asked, so a duplicate charge can only show
// up as a second derived key for the same logical call: the checker looks for those.
type provider struct {
	*httptest.Server

	mu       sync.Mutex
	payments map[string]payment // derived key -> the payment made for it
	requests map[string]int     // derived key -> requests received
	total    int
	made     int
	failNext int
	failed   int
	latency  time.Duration
	// during, if set, runs in the middle of every payment request (after the latency),
	// outside the provider's lock: experiments sample the database from there.
	during func()
}

type payment struct {
	ID      string
	Derived string
	Amount  int64
}

func newProvider() *provider {
	p := &provider{payments: map[string]payment{}, requests: map[string]int{}}
	p.Server = httptest.NewServer(http.HandlerFunc(p.serve))
	return p
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	switch r.URL.Path {
	case "/v1/payments", "/v1/authorize", "/v1/capture":
	default:
		http.NotFound(w, r)
		return
	}
	var body struct {
		Amount int64  `json:"amount"`
		Source string `json:"source"`
	}
	if r.Method != http.MethodPost || key == "" || json.NewDecoder(r.Body).Decode(&body) != nil {
		writeJSON(w, http.StatusBadRequest, `{"error":"bad_request"}`)
		return
	}
	p.mu.Lock()
	p.total++
	p.requests[key]++
	fail := p.failNext > 0
	if fail {
		p.failNext--
		p.failed++
	}
	latency, during := p.latency, p.during
	p.mu.Unlock()
	if latency > 0 {
		t := time.NewTimer(latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	if during != nil {
		during()
	}
	if fail {
		writeJSON(w, http.StatusServiceUnavailable, `{"error":"provider_unavailable"}`)
		return
	}
	if body.Source == "card_declined" {
		writeJSON(w, http.StatusPaymentRequired, `{"error":"card_declined"}`)
		return
	}
	p.mu.Lock()
	pay, ok := p.payments[key]
	if !ok {
		p.made++
		prefix := "pay"
		if strings.HasSuffix(r.URL.Path, "capture") {
			prefix = "cap"
		} else if strings.HasSuffix(r.URL.Path, "authorize") {
			prefix = "auth"
		}
		pay = payment{ID: fmt.Sprintf("%s_%06d", prefix, p.made), Derived: key, Amount: body.Amount}
		p.payments[key] = pay
	}
	p.mu.Unlock()
	writeJSON(w, http.StatusCreated, fmt.Sprintf(`{"id":%q}`, pay.ID))
}

func writeJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

// FailNext makes the next n payment requests fail with 503 before doing anything.
func (p *provider) FailNext(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failNext = n
}

// Armed is the number of failures still to be injected.
func (p *provider) Armed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failNext
}

// SetLatency delays every payment request by d.
func (p *provider) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// SetDuring sets the function run in the middle of every payment request.
func (p *provider) SetDuring(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.during = f
}

// snapshot returns a copy of the payments made, by derived key, and the counters.
func (p *provider) snapshot() (payments map[string]payment, requests, made, failed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]payment, len(p.payments))
	for k, v := range p.payments {
		out[k] = v
	}
	return out, p.total, p.made, p.failed
}

// Made is the number of payments made.
func (p *provider) Made() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.made
}
