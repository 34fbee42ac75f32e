package reliability

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/idemflow/idemflow/idemflowtest"
)

// provider is the experiments' fake payment provider: an idemflowtest.Remote, which
// records every request and makes at most one payment per idempotency key (the derived
// key), however often it is asked. It serves the charges flow's API (POST /v1/payments;
// a source of "card_declined" is declined with 402) and the two-call flow's (POST
// /v1/authorize, POST /v1/capture). A duplicate charge can only show up as a second
// derived key for the same logical call: the checker looks for those.
type provider struct{ *idemflowtest.Remote }

// payment is a payment the provider made.
type payment struct{ ID string }

func newProvider(t testing.TB) *provider {
	return &provider{idemflowtest.NewRemote(t, &idemflowtest.RemoteOpts{Decline: func(_ string, body []byte) bool {
		var b struct{ Source string }
		return json.Unmarshal(body, &b) == nil && b.Source == "card_declined"
	}})}
}

// SetDuring sets the function run in the middle of every payment request (after the
// latency, outside the provider's lock); nil removes it.
func (p *provider) SetDuring(f func()) {
	if f == nil {
		p.During(nil)
		return
	}
	p.During(func(*http.Request) { f() })
}

// snapshot returns the payments made, by derived key, and the counters.
func (p *provider) snapshot() (payments map[string]payment, requests, made, failed int) {
	payments = map[string]payment{}
	for _, e := range p.Effects() {
		if e.Declined {
			continue
		}
		payments[e.Key] = payment{ID: e.ID}
	}
	requests, failed = p.Total()
	return payments, requests, len(payments), failed
}
