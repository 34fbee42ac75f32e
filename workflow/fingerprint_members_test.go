package workflow_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

// fpm is the part of Fingerprint with members for POST /charges that is equal for the same
// request under the list (its first 41 bytes), failing the test on an error.
func fpm(t *testing.T, body string, pointers ...string) []byte {
	return fpmAll(t, body, pointers...)[:41]
}

// fpmAll is the whole of Fingerprint with members for POST /charges.
func fpmAll(t *testing.T, body string, pointers ...string) []byte {
	t.Helper()
	fp, err := workflow.Fingerprint("POST", "/charges", []byte(body), pointers)
	require.NoError(t, err, "body %s", body)
	require.Len(t, fp, 73)
	return fp
}

// TestFingerprintMembersCanonical checks the version 3 fingerprint over chosen members:
// the chosen members compare in the canonical form of version 2 (key order, whitespace,
// string escapes and number spelling ignored, numbers by exact decimal value), members
// not chosen do not count, and an absent member is not a null one.
func TestFingerprintMembersCanonical(t *testing.T) {
	t.Parallel()
	chosen := []string{"/amount", "/card", "/items/1/sku", "/a~1b", "/m~0n"}
	const first = `{"amount":100,"card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"x"},{"sku":"y","n":1}],` +
		`"a/b":true,"m~n":"t","sent_at":"2026-12-01T18:00:00Z","trace":"abc"}`
	fp := fpm(t, first, chosen...)
	require.Equal(t, byte(0x03), fp[0])

	same := map[string]string{
		"respelled": `{ "m~n" : "\u0074", "a/b":true, "items":[{"sku":"x"},{"n":1.0,"sku":"y"}],` +
			`"card":{"exp":[1.2e1,2030.00],"last4":"4242"}, "amount":1e2, "sent_at":"2026-12-01T18:00:00Z","trace":"abc"}`,
		"other timestamp":      `{"amount":100,"card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"x"},{"sku":"y","n":1}],"a/b":true,"m~n":"t","sent_at":"2026-12-01T18:00:05Z","trace":"def"}`,
		"unchosen removed":     `{"amount":100,"card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"x"},{"sku":"y","n":1}],"a/b":true,"m~n":"t"}`,
		"other first item":     `{"amount":100,"card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"z"},{"sku":"y","n":2}],"a/b":true,"m~n":"t"}`,
		"unchosen added":       `{"amount":100,"card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"x"},{"sku":"y"}],"a/b":true,"m~n":"t","note":[1,{"q":null}]}`,
		"slash and tilde kept": `{"a/b":true,"m~n":"t","amount":100.000,"card":{"exp":[12,2030],"last4":"4242"},"items":[{},{"sku":"y"}],"a~1b":false,"m~0n":1}`,
	}
	for name, body := range same {
		require.Equal(t, fp, fpm(t, body, chosen...), "%s: %s", name, body)
	}

	differ := map[string]string{
		"amount":                `{"amount":101,"card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"x"},{"sku":"y"}],"a/b":true,"m~n":"t"}`,
		"amount beyond float64": `{"amount":100.00000000000000001,"card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"x"},{"sku":"y"}],"a/b":true,"m~n":"t"}`,
		"inside chosen object":  `{"amount":100,"card":{"last4":"4242","exp":[12,2031]},"items":[{"sku":"x"},{"sku":"y"}],"a/b":true,"m~n":"t"}`,
		"member added inside":   `{"amount":100,"card":{"last4":"4242","exp":[12,2030],"cvc":"1"},"items":[{"sku":"x"},{"sku":"y"}],"a/b":true,"m~n":"t"}`,
		"array element":         `{"amount":100,"card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"x"},{"sku":"w"}],"a/b":true,"m~n":"t"}`,
		"escaped slash":         `{"amount":100,"card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"x"},{"sku":"y"}],"a/b":false,"m~n":"t"}`,
		"escaped tilde":         `{"amount":100,"card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"x"},{"sku":"y"}],"a/b":true,"m~n":"u"}`,
		"chosen absent":         `{"card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"x"},{"sku":"y"}],"a/b":true,"m~n":"t"}`,
		"chosen null":           `{"amount":null,"card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"x"},{"sku":"y"}],"a/b":true,"m~n":"t"}`,
		"array too short":       `{"amount":100,"card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"y"}],"a/b":true,"m~n":"t"}`,
		"string for number":     `{"amount":"100","card":{"last4":"4242","exp":[12,2030]},"items":[{"sku":"x"},{"sku":"y"}],"a/b":true,"m~n":"t"}`,
	}
	for name, body := range differ {
		require.NotEqual(t, fp, fpm(t, body, chosen...), "%s: %s", name, body)
	}

	// Absent and null differ, whatever else the body has.
	require.NotEqual(t, fpm(t, `{}`, "/x"), fpm(t, `{"x":null}`, "/x"))
	require.NotEqual(t, fpm(t, `{"x":[]}`, "/x/0"), fpm(t, `{"x":[null]}`, "/x/0"))
	// A token into a scalar, an index not written as one, and "-" name nothing.
	require.Equal(t, fpm(t, `{}`, "/x/0"), fpm(t, `{"x":"abc"}`, "/x/0"))
	require.Equal(t, fpm(t, `{}`, "/x/01"), fpm(t, `{"x":[1,2]}`, "/x/01"))
	require.Equal(t, fpm(t, `{}`, "/x/-"), fpm(t, `{"x":[1,2]}`, "/x/-"))
	require.NotEqual(t, fpm(t, `{}`, "/x/-"), fpm(t, `{"x":{"-":1}}`, "/x/-"), `"-" is a name in an object`)
	// "~01" is "~1" unescaped, the name "a~1b", not "a/b" (RFC 6901 unescapes ~1 first).
	require.NotEqual(t, fpm(t, `{}`, "/a~01b"), fpm(t, `{"a~1b":1}`, "/a~01b"))
	require.Equal(t, fpm(t, `{}`, "/a~01b"), fpm(t, `{"a/b":1,"a~b":1}`, "/a~01b"))
	// The whole body, "", compares as version 2 does, and differs from it.
	require.Equal(t, fpm(t, `{"a":1,"b":[1.0]}`, ""), fpm(t, ` {"b":[1],"a":10e-1}`, ""))
	require.NotEqual(t, fpm(t, `{"a":1}`, ""), fpm(t, `{"a":1,"b":2}`, ""))
	require.NotEqual(t, workflow.WholeFingerprint("POST", "/charges", []byte(`{"a":1}`))[1:], fpm(t, `{"a":1}`, "")[9:])
	// The last 32 bytes are v2's hash of the whole request, for builds with another rule.
	require.Equal(t, workflow.WholeFingerprint("POST", "/charges", []byte(first))[1:], fpmAll(t, first, chosen...)[41:])
	require.Equal(t, workflow.WholeFingerprint("POST", "/charges", []byte(same["respelled"]))[1:], fpmAll(t, same["respelled"], chosen...)[41:])
	require.NotEqual(t, fpmAll(t, first, chosen...)[41:], fpmAll(t, same["other timestamp"], chosen...)[41:])
	// Method and route count.
	other, err := workflow.Fingerprint("PUT", "/charges", []byte(first), chosen)
	require.NoError(t, err)
	require.NotEqual(t, fp, other[:41])
}

// TestFingerprintMembersListCounts checks that the member list is part of the
// fingerprint: two lists never give equal fingerprints, even where the members they
// name are equal (or all absent), and the order a list is written in does not matter.
func TestFingerprintMembersListCounts(t *testing.T) {
	t.Parallel()
	const body = `{"amount":100,"currency":"usd"}`
	a := fpm(t, body, "/amount")
	require.NotEqual(t, a, fpm(t, body, "/amount", "/nothing"), "an absent extra member still changes the list")
	require.NotEqual(t, a[1:9], fpm(t, body, "/amount", "/nothing")[1:9], "the list prefix tells the lists apart")
	require.NotEqual(t, fpm(t, `{}`, "/a"), fpm(t, `{}`, "/b"))
	require.Equal(t, fpm(t, body, "/currency", "/amount"), fpm(t, body, "/amount", "/currency"))
	require.Equal(t, a[:9], fpm(t, `{"amount":5}`, "/amount")[:9], "the prefix is the list's alone")
}

// TestFingerprintMembersRefused checks the errors: invalid pointer lists, and bodies
// that are not one canonicalisable JSON value (ErrBodyNotJSON, an ErrInvalidRequest).
func TestFingerprintMembersRefused(t *testing.T) {
	t.Parallel()
	for name, list := range map[string][]string{
		"no slash":         {"amount"},
		"bare tilde":       {"/a~"},
		"tilde 2":          {"/a~2b"},
		"twice":            {"/amount", "/amount"},
		"not UTF-8":        {"/\xff"},
		"too long":         {"/" + string(make([]byte, 1024))},
		"too many members": make([]string, 65),
	} {
		_, err := workflow.Fingerprint("POST", "/charges", []byte(`{}`), list)
		require.Error(t, err, name)
		require.NotErrorIs(t, err, workflow.ErrBodyNotJSON, name)
	}
	for _, none := range [][]string{nil, {}} { // no member list: version 2, for any body
		fp, err := workflow.Fingerprint("POST", "/charges", []byte(`amount=100`), none)
		require.NoError(t, err)
		require.Equal(t, workflow.WholeFingerprint("POST", "/charges", []byte(`amount=100`)), fp)
	}
	for _, body := range []string{``, `amount=100`, `{"amount":1,"amount":1}`, `{"a":1} {"a":1}`, "\"\xff\"", `[1e1234567890123456789]`} {
		_, err := workflow.Fingerprint("POST", "/charges", []byte(body), []string{"/amount"})
		require.ErrorIs(t, err, workflow.ErrBodyNotJSON, "body %q", body)
		require.ErrorIs(t, err, workflow.ErrInvalidRequest, "body %q", body)
	}
}

// FuzzFingerprintMembers checks that no body and pointer make Fingerprint with members fail
// other than by refusing them, and that re-encoding a JSON body (which reorders object
// keys and drops whitespace) never changes the chosen members' part.
func FuzzFingerprintMembers(f *testing.F) {
	for _, seed := range [][2]string{
		{`{"a":[{"b":1},{"b":[2,3]}],"c":"x"}`, "/a/1/b/0"},
		{`{"a/b":{"m~n":[null,true]}}`, "/a~1b/m~0n/1"},
		{`[1,[2,[3,{"":4}]]]`, "/1/1/1/"},
		{`"s"`, "/0"},
		{`{"a":1,"a":2}`, "/a"},
		{`not json`, ""},
	} {
		f.Add([]byte(seed[0]), seed[1])
	}
	f.Fuzz(func(t *testing.T, body []byte, pointer string) {
		list := []string{pointer, "/a/0", "/0/a"}
		got, err := workflow.Fingerprint("POST", "/r", body, list)
		if err != nil {
			return // an invalid or repeated pointer, or a body that is not JSON
		}
		require.Len(t, got, 73)
		v, ok := decodeStrict(body)
		if !ok {
			return
		}
		again, err := json.Marshal(v)
		require.NoError(t, err)
		re, err := workflow.Fingerprint("POST", "/r", again, list)
		require.NoError(t, err)
		require.Equal(t, got[:41], re[:41], "re-encoded JSON has the same members: %q vs %q", body, again)
		require.Equal(t, got[41:], re[41:], "and is the same request")
	})
}
