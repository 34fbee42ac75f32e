package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/workflow"
)

// The middlewares' routes in the experiments, and their effect table: a plain
// handler's row is written on a connection of its own, idempotently (the documented
// way to live with a handler that may run again); a tx handler's row is written in the
// middleware's transaction, with no guard at all, so that a second commit would show.
const (
	mwPlainRoute = "/v1/mw/plain"
	mwTxRoute    = "/v1/mw/tx"
	mwSchema     = `CREATE TABLE mw_effects (
	scope    text   NOT NULL,
	idem_key text   NOT NULL,
	kind     text   NOT NULL,
	amount   bigint NOT NULL
);
CREATE UNIQUE INDEX mw_effects_plain ON mw_effects (scope, idem_key) WHERE kind = 'plain';`
)

// mwServer serves both middlewares on en, in this process. runs counts the plain
// handler's runs per key.
func (e *env) mwServer(t testing.TB, en *workflow.Engine) (*httptest.Server, func() map[string]int) {
	t.Helper()
	scope := func(r *http.Request) (string, error) {
		return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "), nil
	}
	plain, err := idemhttp.Middleware(en, &idemhttp.Config{Scope: scope})
	require.NoError(t, err)
	txm, err := idemhttp.TxMiddleware(en, &idemhttp.Config{Scope: scope})
	require.NoError(t, err)
	var mu sync.Mutex
	runs := map[string]int{}
	amount := func(r *http.Request) int64 {
		var b struct{ Amount int64 }
		_ = json.NewDecoder(r.Body).Decode(&b)
		return b.Amount
	}
	mux := http.NewServeMux()
	mux.Handle(mwPlainRoute, plain(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		runs[key]++
		mu.Unlock()
		if _, err := e.db.Pool.Exec(r.Context(), `INSERT INTO mw_effects (scope, idem_key, kind, amount) VALUES ($1, $2, 'plain', $3)
			ON CONFLICT DO NOTHING`, "acct", key, amount(r)); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable) // no effect: safe to run again
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"kind":"plain","key":%q}`, key)
	})))
	mux.Handle(mwTxRoute, txm(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if _, err := idemhttp.TxFromContext(r.Context()).Exec(r.Context(), `INSERT INTO mw_effects (scope, idem_key, kind, amount)
			VALUES ($1, $2, 'tx', $3)`, "acct", key, amount(r)); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"kind":"tx","key":%q}`, key)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string]int, len(runs))
		for k, v := range runs {
			out[k] = v
		}
		return out
	}
}

// TestMiddlewareFaults sends patient HTTP clients' requests through both middlewares
// (idemhttp.Middleware, a call phase around any handler, and idemhttp.TxMiddleware, the
// handler inside the transaction that stores its answer) while backends are
// terminated at random and COMMIT acknowledgements are lost. Every key must end
// finished with one effect row, every answer must be retryable or the stored bytes,
// and the history must fit one execution per key; the plain handler's runs beyond
// the first (allowed by its contract under these faults) are counted. Backs
// invariants 1, 3 and 5 for the HTTP layer.
func TestMiddlewareFaults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := newEnv(t, pgtest.New(t))
	proxy := env.proxy()
	en := env.engine(env.pool(poolOpts{via: proxy, maxConns: 8}), &workflow.Config{Lease: 5 * time.Second})
	srv, runs := env.mwServer(t, en)
	client := &http.Client{Timeout: 10 * time.Second}

	clients := startPatients(4, "mw", func(w, i int, key string) bool {
		route := mwPlainRoute
		if (w+i)%2 == 1 {
			route = mwTxRoute
		}
		body := fmt.Sprintf(`{"amount":%d}`, 1+(w*7919+i*104729)%10000)
		return !env.postTo(t, client, srv.URL, workflow.Request{Scope: "acct", Key: key, Route: route, Body: []byte(body)}).Retryable
	})
	terminated, armed := 0, 0
	until := time.Now().Add(time.Duration(scale(3, 20, 180)) * time.Second)
	more := chaosRounds(until, func() bool { return terminated > 0 && proxy.Dropped() > 0 })
	for more() {
		pause(nil, 20*time.Millisecond, 120*time.Millisecond)
		switch {
		case rand.IntN(2) == 0:
			n, err := env.terminate(ctx, 1)
			require.NoError(t, err)
			terminated += n
		case proxy.CommitDropsArmed() == 0:
			proxy.DropNextCommitAck()
			armed++
		}
	}
	keys, errs := clients.finish()
	proxy.Heal()
	r := env.check(t, checkOpts{keys: keys})
	require.Empty(t, errs)
	require.Positive(t, terminated, "backends were terminated")
	require.Positive(t, proxy.Dropped(), "commit acknowledgements were lost")
	reruns := 0
	for _, n := range runs() {
		reruns += n - 1
	}
	t.Logf("middleware faults: backends_terminated=%d commit_acks_lost=%d keys=%d plain_handler_reruns=%d duplicates=%d unfinished=%d %s",
		terminated, proxy.Dropped(), len(keys), reruns, r.DuplicateEffects+r.DuplicatePayments, r.Unfinished, r.History)
}
