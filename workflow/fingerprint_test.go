package workflow_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

func TestFingerprint(t *testing.T) {
	t.Parallel()
	fp := func(method, route, body string) []byte { return workflow.WholeFingerprint(method, route, []byte(body)) }
	base := fp("POST", "/v1/charges", `{"amount":100,"currency":"usd"}`)
	require.Len(t, base, 33)
	require.Equal(t, byte(0x02), base[0], "v2 fingerprints start with their version")

	same := map[string][]byte{
		"KeyOrder":     fp("POST", "/v1/charges", `{"currency":"usd","amount":100}`),
		"Whitespace":   fp("POST", "/v1/charges", " {\n\t\"amount\" : 100 , \"currency\":\"usd\"}\n"),
		"NumberFormat": fp("POST", "/v1/charges", `{"amount":1e2,"currency":"usd"}`),
		"Escapes":      fp("POST", "/v1/charges", `{"amount":100,"currency":"\u0075sd"}`),
		"EscapedName":  fp("POST", "/v1/charges", `{"\u0061mount":100,"currency":"usd"}`),
	}
	for name, got := range same {
		require.Equal(t, base, got, name)
	}
	different := map[string][]byte{
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
	require.NotEqual(t, fp("A\x00B", "C", `{}`), fp("A", "B\x00C", `{}`), "method and route are length-prefixed")
}

// TestFingerprintExact checks invariant 10: bodies that a strict decoder tells apart
// have different fingerprints, and spellings of one value the same.
func TestFingerprintExact(t *testing.T) {
	t.Parallel()
	fp := func(body string) []byte { return workflow.WholeFingerprint("POST", "/r", []byte(body)) }
	requireSame := func(t *testing.T, bodies ...string) {
		t.Helper()
		for _, b := range bodies[1:] {
			require.Equal(t, fp(bodies[0]), fp(b), "%s and %s are the same value", bodies[0], b)
		}
	}
	requireDistinct := func(t *testing.T, bodies ...string) {
		t.Helper()
		for i, a := range bodies {
			for _, b := range bodies[i+1:] {
				require.NotEqual(t, fp(a), fp(b), "%s and %s are different values", a, b)
			}
		}
	}

	t.Run("BigIntegers", func(t *testing.T) {
		requireDistinct(t, `{"amount":9007199254740992}`, `{"amount":9007199254740993}`)
		requireDistinct(t, `123456789012345678901234567890`, `123456789012345678901234567891`)
		requireSame(t, `{"amount":9007199254740993}`, `{"amount":9.007199254740993e15}`, `{"amount":90071992547409930e-1}`)
	})
	t.Run("Decimals", func(t *testing.T) {
		requireDistinct(t, `{"amount":10}`, `{"amount":10.0000000000000001}`)
		requireDistinct(t, `0.1`, `0.10000000000000001`, `0.1000000000000000055511151231257827`)
		requireSame(t, `10.0000000000000001`, `1.00000000000000001e1`, `100000000000000001e-16`)
	})
	t.Run("NumberSpelling", func(t *testing.T) {
		requireSame(t, `1`, `1.0`, `1e0`, `10e-1`, `0.1e1`, `1E+0`, `100e-2`, `0.001e3`, `1.000e00`)
		requireSame(t, `[0]`, `[-0]`, `[0.0]`, `[-0.0e5]`, `[0e-7]`, `[0E+0]`)
		requireSame(t, `-12.5`, `-125e-1`, `-0.125e2`, `-1250.00E-2`)
		requireDistinct(t, `1`, `-1`, `10`, `0.1`, `0`, `1.5`, `15`, `"1"`, `true`)
	})
	t.Run("HugeExponents", func(t *testing.T) {
		requireSame(t, `1e999999999`, `10e999999998`, `0.01e1000000001`)
		requireDistinct(t, `1e999999999`, `1e999999998`, `1e-999999999`, `2e999999999`)
		requireSame(t, `1e100000000000000000`, `10e99999999999999999`) // 18 exponent digits
		requireHashedAsBytes(t, `1e1000000000000000000`)               // 19: hashed as bytes
		requireHashedAsBytes(t, `[1e-99999999999999999999999999]`)
	})
	t.Run("KeyOrderAndWhitespace", func(t *testing.T) {
		requireSame(t, `{"a":1,"b":{"y":[1,{"q":1,"p":2}],"x":null}}`,
			"{ \"b\" : { \"x\":null, \"y\":[ 1 ,{\"p\":2,\"q\":1} ] } ,\r\n\t\"a\":1 }")
		requireDistinct(t, `{"a":1,"b":2}`, `{"a":2,"b":1}`, `{"a":1}`, `[1,2]`, `{"ab":12}`, `{"a":{"b":2}}`)
	})
	t.Run("Strings", func(t *testing.T) {
		requireSame(t, `"\u0041"`, `"A"`)
		requireSame(t, `{"\u00e9t\u00E9":"\ud83d\ude00"}`, `{"été":"😀"}`)
		requireSame(t, `"\/\b"`, `"/\u0008"`)
		requireDistinct(t, `"A"`, `"a"`, `"A "`, `""`, `null`, `{"A":null}`)
		requireDistinct(t, `["ab","c"]`, `["a","bc"]`, `["abc"]`)
	})
	t.Run("DuplicateNames", func(t *testing.T) {
		// Not canonicalisable: each body is hashed as its bytes, so it equals no other.
		for _, body := range []string{`{"a":1,"a":1}`, `{"a":1,"\u0061":2}`, `[{"x":{"k":1,"j":2,"k":3}}]`} {
			requireHashedAsBytes(t, body)
		}
		requireDistinct(t, `{"a":1,"a":2}`, `{"a":2,"a":1}`, `{"a":1}`, `{"a":2}`)
	})
	t.Run("DeepNesting", func(t *testing.T) {
		deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
		requireSame(t, deep(workflow.MaxCanonicalDepth), " "+deep(workflow.MaxCanonicalDepth))
		requireHashedAsBytes(t, deep(workflow.MaxCanonicalDepth+1))
		requireHashedAsBytes(t, deep(10000))
		requireHashedAsBytes(t, strings.Repeat(`{"a":`, 100000)) // unclosed
		requireHashedAsBytes(t, strings.Repeat("[", 1<<20))
	})
	t.Run("InvalidUTF8", func(t *testing.T) {
		requireHashedAsBytes(t, "\"\xff\"")
		requireHashedAsBytes(t, "{\"a\xc3\":1}")
		requireHashedAsBytes(t, `"\ud800"`) // an unpaired surrogate is not U+FFFD
		requireDistinct(t, "\"\xff\"", `"\ufffd"`, `"\ud800"`)
	})
	t.Run("NotOneValue", func(t *testing.T) {
		for _, body := range []string{`1 2`, `{} x`, `{}{}`, `[1,]`, `01`, `1.`, `.5`, `+1`, `NaN`, `{"a" 1}`, "\xef\xbb\xbf{}"} {
			requireHashedAsBytes(t, body)
		}
	})
}

// requireHashedAsBytes checks that body is fingerprinted as its bytes, not as JSON:
// whitespace before it changes its fingerprint.
func requireHashedAsBytes(t *testing.T, body string) {
	t.Helper()
	fp := workflow.WholeFingerprint("POST", "/r", []byte(body))
	require.NotEqual(t, fp, workflow.WholeFingerprint("POST", "/r", []byte(" "+body)), "%.40q is hashed as bytes", body)
}

func TestFingerprintMatches(t *testing.T) {
	t.Parallel()
	body := []byte(`{"amount":100,"currency":"usd"}`)
	respelled := []byte(`{"currency":"\u0075sd", "amount":1e2}`)
	other := []byte(`{"amount":101,"currency":"usd"}`)
	v1 := workflow.FingerprintV1("POST", "/r", body)
	v2 := workflow.WholeFingerprint("POST", "/r", body)

	for name, stored := range map[string][]byte{"V1": v1[:], "V2": v2} {
		t.Run(name, func(t *testing.T) {
			require.True(t, workflow.FingerprintMatches(stored, "POST", "/r", body))
			require.True(t, workflow.FingerprintMatches(stored, "POST", "/r", respelled))
			require.False(t, workflow.FingerprintMatches(stored, "POST", "/r", other))
			require.False(t, workflow.FingerprintMatches(stored, "POST", "/other", body))
			require.False(t, workflow.FingerprintMatches(stored, "PUT", "/r", body))
		})
	}
	t.Run("UnknownForms", func(t *testing.T) {
		wrongVersion := append([]byte{0x03}, v2[1:]...)
		for _, stored := range [][]byte{nil, {}, v2[1:], wrongVersion, append(v2, 0), v1[:31], append(v1[:], 0)} {
			require.False(t, workflow.FingerprintMatches(stored, "POST", "/r", body), "%x", stored)
		}
	})
	t.Run("VersionsDiffer", func(t *testing.T) {
		require.NotEqual(t, v1[:], v2[1:], "v2 hashes another encoding than v1")
	})
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
		`[9007199254740993, 10.0000000000000001, 1e999999999]`,
		`not json at all`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got := workflow.WholeFingerprint("POST", "/r", body)
		require.Equal(t, got, workflow.WholeFingerprint("POST", "/r", body), "deterministic")
		v, ok := decodeStrict(body)
		if !ok {
			return // not canonicalisable: hashed as bytes
		}
		again, err := json.Marshal(v) // json.Number keeps its literal
		require.NoError(t, err)
		require.Equal(t, got, workflow.WholeFingerprint("POST", "/r", again), "re-encoded JSON is the same request: %q vs %q", body, again)
		require.NotEqual(t, got, workflow.WholeFingerprint("POST", "/other", body), "the route is part of the request")
	})
}

// decodeStrict decodes body, numbers as json.Number, if Fingerprint canonicalises it:
// one JSON value of valid UTF-8 without duplicate member names (jsontext's default
// checks), nested at most MaxCanonicalDepth deep, whose numbers' exponents are small
// enough for a respelling to move them a little (at most 16 significant digits).
func decodeStrict(body []byte) (any, bool) {
	if !json.Valid(body) || !jsontext.Value(body).IsValid() {
		return nil, false
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return nil, false
	}
	return v, canonicalisable(v, 0)
}

func canonicalisable(v any, depth int) bool {
	switch x := v.(type) {
	case map[string]any:
		for _, e := range x {
			if !canonicalisable(e, depth+1) {
				return false
			}
		}
		return depth < workflow.MaxCanonicalDepth
	case []any:
		for _, e := range x {
			if !canonicalisable(e, depth+1) {
				return false
			}
		}
		return depth < workflow.MaxCanonicalDepth
	case json.Number:
		s := string(x)
		i := strings.IndexAny(s, "eE")
		return i < 0 || len(strings.TrimLeft(strings.TrimLeft(s[i+1:], "+-"), "0")) <= 16
	}
	return true
}
