package payout

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
)

// Bank is a fake bank: POST /v1/transfers with an Idempotency-Key makes at most one
// transfer per key, however often and however concurrently it is asked. It can fail a
// share of requests (503, before doing anything). GET /v1/stats reports what it did.
type Bank struct {
	// FailEvery, when above 1, answers every FailEvery-th request 503 before doing
	// anything: a deterministic share of 1/FailEvery.
	FailEvery int

	mu        sync.Mutex
	seen      int
	failed    int
	transfers map[string]string // idempotency key -> transfer id
	asked     map[string]int    // idempotency key -> requests
}

// BankStats is the body of GET /v1/stats.
type BankStats struct {
	Requests  int               `json:"requests"`
	Failed    int               `json:"failed"`
	Transfers map[string]string `json:"transfers"` // idempotency key -> transfer id
	Asked     map[string]int    `json:"asked"`     // idempotency key -> requests
}

// NewBank returns a bank with no transfers.
func NewBank(failEvery int) *Bank {
	return &Bank{FailEvery: failEvery, transfers: map[string]string{}, asked: map[string]int{}}
}

// Handler serves the bank's API.
func (b *Bank) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/transfers", b.transfer)
	mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(b.Stats())
	})
	return mux
}

func (b *Bank) transfer(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		http.Error(w, "Idempotency-Key is required", http.StatusBadRequest)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seen++
	b.asked[key]++
	if b.FailEvery > 1 && b.seen%b.FailEvery == 0 {
		b.failed++
		http.Error(w, "bank unavailable", http.StatusServiceUnavailable)
		return
	}
	id, ok := b.transfers[key]
	if !ok {
		id = "tr_" + strconv.Itoa(len(b.transfers)+1)
		b.transfers[key] = id
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]string{"transfer": id})
}

// Stats is a copy of what the bank did.
func (b *Bank) Stats() BankStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := BankStats{Requests: b.seen, Failed: b.failed, Transfers: map[string]string{}, Asked: map[string]int{}}
	for k, v := range b.transfers {
		s.Transfers[k] = v
	}
	for k, v := range b.asked {
		s.Asked[k] = v
	}
	return s
}
