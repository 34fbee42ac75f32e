package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEscape: every control character, C1 as a rune or as a raw byte, invalid UTF-8
// and invisible runes come out escaped; printable text, quotes and backslashes as they
// are.
func TestEscape(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"acct_42 order-7":          "acct_42 order-7",
		`{"a":"b\"c"}`:             `{"a":"b\"c"}`,
		"née €5":                   "née €5",
		"\x00\x07\x08\t\n\v\f\r":   `\x00\a\b\t\n\v\f\r`,
		"\x1b[31mred\x1b[0m":       `\x1b[31mred\x1b[0m`,
		"a\x7fb":                   `a\x7fb`,
		"\u0085\u009b2J\u0080":     `\u0085\u009b2J\u0080`,
		"\x9b2J\x85\xff\xc2":       `\x9b2J\x85\xff\xc2`,
		"abc\u202edef\u200b\u00a0": `abc\u202edef\u200b\u00a0`,
		"\U000e0001":               `\U000e0001`,
	} {
		require.Equal(t, want, escape(in), "%q", in)
	}
}

// TestEscapeJSON: the JSON form leaves no raw DEL, C1 or invisible rune, and decodes to
// the same text.
func TestEscapeJSON(t *testing.T) {
	t.Parallel()
	in := "a\x1b[2J\x7f\u0085\u009b\u202e\U000e0001 \"é\\"
	b, err := json.Marshal(map[string]string{"k": in})
	require.NoError(t, err)
	out := escapeJSON(b)
	require.Equal(t, `{"k":"a\u001b[2J\u007f\u0085\u009b\u202e\udb40\udc01 \"é\\"}`, string(out))
	var back map[string]string
	require.NoError(t, json.Unmarshal(out, &back))
	require.Equal(t, in, back["k"])
}
