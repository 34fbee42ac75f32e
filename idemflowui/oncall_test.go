package idemflowui_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowui"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

// A page served by an engine that does not register the key's flow (the CLI's
// `idemflow ui`) cannot tell which phases are calls: it says so, shows the form of
// the derived keys under the key's ID, and still shows the dead-letter list's failed
// phase; with the default RunbookURL the runbook links point at docs/OPERATIONS.md.
func TestOnCallWithoutTheFlow(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.Dead(t, "acct", "dead")
	bare, err := workflow.New(f.DB.Pool, nil)
	require.NoError(t, err)
	h, err := idemflowui.New(bare, nil)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := client(t)
	get := func(path string) page {
		t.Helper()
		r, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		require.NoError(t, err)
		p := do(t, c, r)
		require.Equal(t, http.StatusOK, p.status, p.body)
		return p
	}
	info, err := bare.InspectKey(t.Context(), "acct", "dead")
	require.NoError(t, err)
	id := info.ID
	key := get("/key?scope=acct&key=dead")
	require.Contains(t, key.body, `id="flow-unknown"`)
	require.Contains(t, key.body, `<code class="derived-key">`+id+`:PHASE</code>`)
	require.Contains(t, key.body, `href="`+idemflowui.RunbookURLDefault+`#runbook-dead-lettered-keys"`)
	require.NotContains(t, key.body, `id="derived-keys"`)

	list := get("/keys?status=dead")
	require.Contains(t, list.body, `<code class="failed-phase">`+testflow.Pay+`</code>`)
	require.Contains(t, list.body, `>phase error</td>`)
}
