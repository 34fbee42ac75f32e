package workflow_test

import (
	"encoding/json"
	"testing"

	"github.com/gowebpki/jcs"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

func TestFingerprint(t *testing.T) {
	t.Parallel()
	fp := func(method, route, body string) [32]byte { return workflow.Fingerprint(method, route, []byte(body)) }
	base := fp("POST", "/v1/charges", `{"amount":100,"currency":"usd"}`)

	same := map[string][32]byte{
		"KeyOrder":     fp("POST", "/v1/charges", `{"currency":"usd","amount":100}`),
		"Whitespace":   fp("POST", "/v1/charges", " {\n\t\"amount\" : 100 , \"currency\":\"usd\"}\n"),
		"NumberFormat": fp("POST", "/v1/charges", `{"amount":1e2,"currency":"usd"}`),
		"Escapes":      fp("POST", "/v1/charges", `{"amount":100,"currency":"\u0075sd"}`),
	}
	for name, got := range same {
		require.Equal(t, base, got, name)
	}
	different := map[string][32]byte{
		"Value":        fp("POST", "/v1/charges", `{"amount":101,"currency":"usd"}`),
		"ExtraField":   fp("POST", "/v1/charges", `{"amount":100,"currency":"usd","x":null}`),
		"Type":         fp("POST", "/v1/charges", `{"amount":"100","currency":"usd"}`),
		"Route":        fp("POST", "/v1/refunds", `{"amount":100,"currency":"usd"}`),
		"Method":       fp("PUT", "/v1/charges", `{"amount":100,"currency":"usd"}`),
		"Empty":        fp("POST", "/v1/charges", ``),
		"RouteSplice":  fp("POST", "/v1/charges\x00", `{"amount":100,"currency":"usd"}`),
		"ArrayOrder":   fp("POST", "/v1/charges", `[1,2]`),
		"NotJSONBytes": fp("POST", "/v1/charges", `{"amount":100,"currency":"usd"`),
	}
	for name, got := range different {
		require.NotEqual(t, base, got, name)
	}
	require.NotEqual(t, fp("POST", "/", `[1,2]`), fp("POST", "/", `[2,1]`))
	require.NotEqual(t, fp("POST", "/", `not json`), fp("POST", "/", `not  json`), "raw bodies are compared as bytes")
}

// FuzzFingerprint checks that re-encoding a JSON body (which reorders object keys and
// drops whitespace) never changes its fingerprint, and that changing it does.
func FuzzFingerprint(f *testing.F) {
	for _, seed := range []string{
		`{"amount":100,"currency":"usd","source":"tok_visa"}`,
		`{"b":[1,2,{"z":1,"a":2}],"a":"x"}`,
		`[1.5, -0, 1e300, "\u00e9"]`,
		`"just a string"`,
		`{"nested":{"deeper":{"k":true,"j":false}}}`,
		`not json at all`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got := workflow.Fingerprint("POST", "/r", body)
		require.Equal(t, got, workflow.Fingerprint("POST", "/r", body), "deterministic")
		var v any
		if json.Unmarshal(body, &v) != nil {
			return
		}
		again, err := json.Marshal(v)
		if err != nil {
			return
		}
		if _, err := jcs.Transform(body); err != nil {
			return // not canonicalisable (duplicate keys, invalid UTF-8): hashed as bytes
		}
		require.Equal(t, got, workflow.Fingerprint("POST", "/r", again), "re-encoded JSON is the same request: %q vs %q", body, again)
		require.NotEqual(t, got, workflow.Fingerprint("POST", "/other", body), "the route is part of the request")
	})
}
