package chargeflow

import (
	crand "crypto/rand"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Provider is the fake payment provider. It dedupes on the Idempotency-Key header it
// receives: the same key, even concurrently, gets the same payment, never a second one.
type Provider struct {
	Latency  time.Duration // added to every payment request
	FailRate float64       // share of payment requests answered 503 before doing anything

	// run tells this provider process's payment ids from another's: the fake keeps its
	// payments in memory, so a restarted one numbers from 1 again, and its ids must not
	// repeat the last run's (a real provider's ids are unique).
	run string

	mu       sync.Mutex
	requests int
	payments int
	byKey    map[string]*keyStats
	perKey   map[string]*sync.Mutex // serialises concurrent requests with one key
}

type keyStats struct {
	Requests  int    `json:"requests"`
	PaymentID string `json:"payment_id,omitempty"`
	Declined  bool   `json:"declined,omitempty"`
}

// ProviderStats is the body of GET /v1/stats.
type ProviderStats struct {
	Requests int                  `json:"requests"`
	Payments int                  `json:"payments"`
	ByKey    map[string]*keyStats `json:"by_key"`
}

// NewProvider returns a provider with no payments. Its payment ids are
// pay_<run>_<n>: n counts this provider's payments from 1, and run, random, is new
// with each provider, so ids never repeat across restarts.
func NewProvider(latency time.Duration, failRate float64) *Provider {
	return &Provider{Latency: latency, FailRate: failRate, run: strings.ToLower(crand.Text()[:8]), byKey: map[string]*keyStats{}, perKey: map[string]*sync.Mutex{}}
}

// Handler serves POST /v1/payments and GET /v1/stats.
func (p *Provider) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payments", p.pay)
	mux.HandleFunc("GET /v1/stats", p.stats)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	return mux
}

func (p *Provider) pay(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.requests++
	if key != "" {
		if p.byKey[key] == nil {
			p.byKey[key] = &keyStats{}
			p.perKey[key] = &sync.Mutex{}
		}
		p.byKey[key].Requests++
	}
	fail := p.FailRate > 0 && rand.Float64() < p.FailRate
	p.mu.Unlock()

	if p.Latency > 0 {
		select {
		case <-time.After(p.Latency):
		case <-r.Context().Done():
			return
		}
	}
	if fail {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "provider_unavailable"})
		return
	}
	if key == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "missing_idempotency_key"})
		return
	}
	var req Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request"})
		return
	}

	p.mu.Lock()
	lock := p.perKey[key]
	p.mu.Unlock()
	lock.Lock()
	defer lock.Unlock()

	p.mu.Lock()
	st := p.byKey[key]
	if st.PaymentID == "" && !st.Declined {
		if req.Source == "card_declined" {
			st.Declined = true
		} else {
			p.payments++
			st.PaymentID = fmt.Sprintf("pay_%s_%06d", p.run, p.payments)
		}
	}
	declined, id := st.Declined, st.PaymentID
	p.mu.Unlock()

	if declined {
		writeJSON(w, http.StatusPaymentRequired, map[string]string{"error": "card_declined"})
		return
	}
	writeJSON(w, http.StatusCreated, map[string]string{"id": id})
}

func (p *Provider) stats(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	writeJSON(w, http.StatusOK, ProviderStats{Requests: p.requests, Payments: p.payments, ByKey: p.byKey})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
