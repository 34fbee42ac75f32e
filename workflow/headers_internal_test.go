package workflow

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
)

// TestStoredHeaders decodes stored response headers as encoding/json does, in the
// form jsonb writes them (read by decodeHeaders itself) and in any other (left to
// encoding/json): the same headers, or an error for the same inputs.
func TestStoredHeaders(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		stored string
		fast   bool // decodeHeaders reads it
	}{
		{`{}`, true},
		{`{"Content-Type": ["application/json"]}`, true},
		{`{"Link": ["<a>; rel=next", "<b>; rel=prev"], "ETag": ["\"x\""]}`, false},
		{`{"Link": ["<a>; rel=next", "<b>; rel=prev"], "Location": ["/v1/charges/ch_1"]}`, true},
		{` { "A" : [ ] , "B":["ü€"] } `, true},
		{`{"A": ["1"], "A": ["2"]}`, true},
		{`{"A": null}`, false},
		{`{"A": [null]}`, false},
		{`{"A": ["x\u0041"]}`, false},
		{"{\"A\": [\"\xff\"]}", false},
		{"{\"A\": [\"a\tb\"]}", false},
		{`{"A": ["x"]} x`, false},
		{`{"A": ["x"],}`, false},
		{`{"A": "x"}`, false},
		{`[]`, false},
		{`{"A": ["x"]`, false},
	} {
		want := map[string][]string{}
		wantErr := json.Unmarshal([]byte(c.stored), &want)
		status := 200
		resp, err := storedResponse(&keytable.Row{ResponseStatus: &status, ResponseHeaders: []byte(c.stored)})
		if wantErr != nil {
			require.Error(t, err, c.stored)
		} else {
			require.NoError(t, err, c.stored)
			require.Equal(t, want, map[string][]string(resp.Header), c.stored)
		}
		require.Equal(t, c.fast, decodeHeaders([]byte(c.stored), map[string][]string{}), c.stored)
	}
}
