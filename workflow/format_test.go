package workflow_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/idemmsg"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// newerFormats are rows as a newer build could write them, planted by rewriting a row
// this build wrote: finished, or released in progress at the flow's second phase.
var newerFormats = []struct {
	name     string
	finished bool
	plant    string // SQL run on the key row ($1, $2)
}{
	{"current format (control)", true, ``},
	{"current format in progress (control)", false, ``},
	// 33 bytes as v2, but the version byte of a later version.
	{"fingerprint version 3", true, `UPDATE idemflow_keys SET fingerprint = '\x03'::bytea || sha256(fingerprint)`},
	{"fingerprint version 3 in progress", false, `UPDATE idemflow_keys SET fingerprint = '\x03'::bytea || sha256(fingerprint)`},
	{"fingerprint of another length", true, `UPDATE idemflow_keys SET fingerprint = '\x04'::bytea || sha256(fingerprint) || sha256(fingerprint)`},
	// A later migration would widen the status check; this schema's is dropped.
	{"status", false, `ALTER TABLE idemflow_keys DROP CONSTRAINT idemflow_keys_status;
		UPDATE idemflow_keys SET status = 'paused'`},
	{"recovery point", false, `UPDATE idemflow_keys SET recovery_point = 'refund'`},
	// Format 2 of both is this release's (a Sealer's: TestSealedBodyWithoutSealer).
	{"phase data format", false, `UPDATE idemflow_keys SET phase_data = phase_data || '{"idemflow:format": 3}'`},
	{"stored response format", true, `UPDATE idemflow_keys SET response_headers = response_headers || '{"idemflow:format": 3}'`},
}

// TestNewerFormatLeftAlone plants a key row in each format a newer build could write
// and checks that every way this build meets the row answers retryable and changes
// nothing: Engine.Do (the same request and another body: never ErrMismatch), Resume,
// the HTTP handler (503 with Retry-After, never 422 or 410), idemmsg's decision (retry),
// sweeps of both scans that may dead-letter at once (take nothing), and the admin calls that change
// a key (refused). The controls, rows in this build's format, are answered as usual.
func TestNewerFormatLeftAlone(t *testing.T) {
	for _, k := range newerFormats {
		t.Run(k.name, func(t *testing.T) {
			ctx := context.Background()
			fail := false
			b := setup(t, setupOpts{before: func(ctx context.Context, tx phases.DBTX, run *phases.Run) error {
				if fail && run.Phase() == testflow.Pay {
					return errors.New("provider down")
				}
				return nil
			}})
			h, err := idemhttp.Handler(b.engine, testflow.Name, &idemhttp.Config{
				Scope: func(*http.Request) (string, error) { return "acct", nil }})
			require.NoError(t, err)
			post := func(body string) *httptest.ResponseRecorder {
				r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(body))
				r.Header.Set(idemhttp.KeyHeader, "k1")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			const body = `{"amount": 700}`
			fail = !k.finished
			first := post(body)
			if k.finished {
				require.Equal(t, http.StatusCreated, first.Code, first.Body.String())
			} else {
				require.Equal(t, http.StatusServiceUnavailable, first.Code, first.Body.String())
				require.Equal(t, testflow.Reserve, state(t, b.db, "acct", "k1").RecoveryPoint)
			}
			fail = false
			if k.plant == "" {
				checkAnsweredAsUsual(t, b, post, body, first)
				return
			}
			_, err = b.db.Pool.Exec(ctx, k.plant)
			require.NoError(t, err)
			testflow.Sweepable(t, b.db.Pool)
			before := keyRow(t, b.db, "acct", "k1")
			req := workflow.Request{Scope: "acct", Key: "k1", Flow: testflow.Name, Method: "POST", Route: "/charges", Body: []byte(body)}
			checkLeftAlone(t, b, req, post)
			require.Equal(t, before, keyRow(t, b.db, "acct", "k1"), "the row changed")
		})
	}
}

// checkLeftAlone checks every way of meeting the key of req, whose row a newer build
// wrote.
func checkLeftAlone(t *testing.T, b *bundle, req workflow.Request, post func(string) *httptest.ResponseRecorder) {
	ctx := context.Background()
	newer := func(what string, err error) {
		t.Helper()
		require.ErrorIs(t, err, workflow.ErrNewerFormat, what)
		require.NotErrorIs(t, err, workflow.ErrMismatch, what)
		require.NotErrorIs(t, err, workflow.ErrDeadLettered, what)
	}
	out := b.engine.Run(ctx, req)
	newer("Run", out.Err)
	require.Equal(t, workflow.OutcomeFailed, out.Outcome)
	_, err := b.engine.Do(ctx, req)
	newer("Do", err)
	d := idemmsg.Decide(out)
	require.Equal(t, idemmsg.Retry, d.Action, "idemmsg")
	require.Equal(t, workflow.NewerFormatRetryAfter, d.Delay, "idemmsg")
	other := req
	other.Body = []byte(`{"amount": 1}`)
	_, err = b.engine.Do(ctx, other)
	newer("Do with another body", err)
	_, err = b.engine.Resume(ctx, req.Scope, req.Key)
	newer("Resume", err)

	for _, body := range []string{string(req.Body), `{"amount": 1}`} {
		w := post(body)
		require.Equal(t, http.StatusServiceUnavailable, w.Code, "HTTP, body %s: %s", body, w.Body.String())
		require.Equal(t, "5", w.Header().Get("Retry-After"), "HTTP")
	}

	perKey := b.newEngine(t, setupOpts{cfg: &workflow.Config{Scan: workflow.ScanPerKey}})
	for _, e := range []*workflow.Engine{b.engine, perKey} {
		st, err := e.Sweep(ctx, &workflow.SweeperConfig{MaxAttempts: 1, Grace: -1})
		require.NoError(t, err)
		require.Equal(t, workflow.SweepStats{}, st, "the sweep (scan %q) took the key", e.Config().Scan)
	}

	newer("ReleaseKey", b.engine.ReleaseKey(ctx, req.Scope, req.Key))
	newer("PurgeKey", b.engine.PurgeKey(ctx, req.Scope, req.Key))
	newer("Redrive", b.engine.Redrive(ctx, req.Scope, req.Key))
	_, err = b.engine.InspectKey(ctx, req.Scope, req.Key)
	require.NoError(t, err, "InspectKey reads any row")
}

// checkAnsweredAsUsual checks the control: a row in this build's format is replayed
// (finished) or resumed by a sweep and then replayed (in progress).
func checkAnsweredAsUsual(t *testing.T, b *bundle, post func(string) *httptest.ResponseRecorder, body string, first *httptest.ResponseRecorder) {
	ctx := context.Background()
	if first.Code != http.StatusCreated {
		testflow.Sweepable(t, b.db.Pool)
		st, err := b.engine.Sweep(ctx, &workflow.SweeperConfig{MaxAttempts: 1, Grace: -1})
		require.NoError(t, err)
		require.Equal(t, 1, st.Finished, "the sweep finished the key")
	}
	w := post(body)
	require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
	require.Equal(t, "true", w.Header().Get(idemhttp.ReplayedHeader))
	require.Equal(t, http.StatusUnprocessableEntity, post(`{"amount": 1}`).Code, "another body")
}
