package idemhttp_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/dunglas/httpsfv"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/workflow"
)

func keyHeader(values ...string) http.Header {
	return http.Header{idemhttp.KeyHeader: values}
}

func TestParseKeyHeader(t *testing.T) {
	t.Parallel()
	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		key, present, err := idemhttp.ParseKeyHeader(http.Header{"Other": {"x"}})
		require.NoError(t, err)
		require.False(t, present)
		require.Empty(t, key)
	})
	valid := []struct{ name, value, want string }{
		{"Token", "abc", "abc"},
		{"String", `"abc"`, "abc"},
		{"BareUUID", "8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{"QuotedUUID", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{"BareDigits", "42", "42"},
		{"TokenCharacters", "*a:b/c!#$%&'+-.^_`|~", "*a:b/c!#$%&'+-.^_`|~"},
		{"StringEscapes", `"a\"b\\c"`, `a"b\c`},
		{"StringWithSpaces", `"order 17, retry"`, "order 17, retry"},
		{"OuterWhitespace", " \t\"abc\" \t", "abc"},
		{"Longest", strings.Repeat("k", 255), strings.Repeat("k", 255)},
		{"LongestQuoted", `"` + strings.Repeat("k", 255) + `"`, strings.Repeat("k", 255)},
	}
	for _, c := range valid {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			key, present, err := idemhttp.ParseKeyHeader(keyHeader(c.value))
			require.NoError(t, err)
			require.True(t, present)
			require.Equal(t, c.want, key)
		})
	}
	invalid := []struct {
		name   string
		values []string
	}{
		{"Empty", []string{""}},
		{"EmptyString", []string{`""`}},
		{"TooLong", []string{strings.Repeat("k", 256)}},
		{"TooLongQuoted", []string{`"` + strings.Repeat("k", 256) + `"`}},
		{"ControlCharacter", []string{"a\x01b"}},
		{"QuotedControlCharacter", []string{"\"a\x01b\""}},
		{"InnerTab", []string{"a\tb"}},
		{"Delete", []string{"a\x7fb"}},
		{"NonASCII", []string{"clé"}},
		{"QuotedNonASCII", []string{`"clé"`}},
		{"TwoFields", []string{"a", "b"}},
		{"TwoEqualFields", []string{"a", "a"}},
		{"List", []string{`"a", "b"`}},
		{"BareList", []string{"a, b"}},
		{"InnerList", []string{`("a" "b")`}},
		{"Parameters", []string{`"a";x=1`}},
		{"TokenParameters", []string{"a;x=1"}},
		{"ByteSequence", []string{":YWJj=:"}},
		{"Boolean", []string{"?1"}},
		{"Dictionary", []string{"a=1"}},
		{"UnterminatedString", []string{`"abc`}},
		{"BadEscape", []string{`"a\nb"`}},
		{"QuoteInsideToken", []string{`ab"c`}},
		{"TrailingGarbage", []string{`"abc"x`}},
		{"InnerSpace", []string{"a b"}},
	}
	for _, c := range invalid {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			key, present, err := idemhttp.ParseKeyHeader(keyHeader(c.values...))
			require.ErrorIs(t, err, workflow.ErrInvalidKey)
			require.True(t, present)
			require.Empty(t, key)
		})
	}
}

// FuzzParseKeyHeader checks that parsing never panics, that an accepted key is valid,
// that it survives a round trip through its RFC 8941 string form, and that two header
// fields are always refused.
func FuzzParseKeyHeader(f *testing.F) {
	for _, seed := range []string{
		"abc", `"abc"`, "8e03978e-40d5-43e8-bc93-6894a57f9324", `"a\"b\\c"`, `"a", "b"`,
		`"a";x=1`, ":YWJj=:", "?1", "42", "a b", "a\x00b", "\"\xff\"", " \t\"k\"\t ",
		strings.Repeat("k", 255), strings.Repeat("k", 256), "", `"`, `\`, "*tok/en:x",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, present, err := idemhttp.ParseKeyHeader(keyHeader(v))
		require.True(t, present)
		_, _, twoErr := idemhttp.ParseKeyHeader(keyHeader(v, v))
		require.ErrorIs(t, twoErr, workflow.ErrInvalidKey, "two header fields are refused")
		if err != nil {
			require.ErrorIs(t, err, workflow.ErrInvalidKey)
			require.Empty(t, key)
			return
		}
		require.NoError(t, workflow.ValidateKey(key))
		s, err := httpsfv.Marshal(httpsfv.NewItem(key))
		require.NoError(t, err, "a valid key is a valid RFC 8941 string")
		again, present, err := idemhttp.ParseKeyHeader(keyHeader(s))
		require.NoError(t, err, "serialized as %s", s)
		require.True(t, present)
		require.Equal(t, key, again)
	})
}

// ParseKeyHeader looks KeyHeader up in the header map as it is, without canonicalizing
// it: it must be in canonical form, as net/http stores it.
func TestKeyHeaderCanonical(t *testing.T) {
	t.Parallel()
	require.Equal(t, http.CanonicalHeaderKey(idemhttp.KeyHeader), idemhttp.KeyHeader)
	h := http.Header{}
	h.Set("idempotency-key", "k1") // as a client sends it
	key, present, err := idemhttp.ParseKeyHeader(h)
	require.NoError(t, err)
	require.True(t, present)
	require.Equal(t, "k1", key)
}
