package workflow

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// The format member is read only as a top-level member of the object: a header value
// or a slot value that spells it is data, not a version.
func TestJSONFormat(t *testing.T) {
	cases := []struct {
		obj     string
		version int
		ok      bool
	}{
		{`{}`, 1, true},
		{``, 1, true},
		{`{"Content-Type": ["application/json"]}`, 1, true},
		{`{"X-Note": ["idemflow:format"]}`, 1, true},
		{`{"slot": {"idemflow:format": 9}}`, 1, true},
		{`{"idemflow:format": 1}`, 1, true},
		{`{"idemflow:format": 2, "Content-Type": ["text/plain"]}`, 2, true},
		{`{"idemflow:format": "2"}`, 0, false},
		{`{"idemflow:format": 0}`, 0, false},
		{`{"idemflow:format": 1.5}`, 0, false},
		{`["idemflow:format"]`, 0, false},
	}
	for _, c := range cases {
		v, ok := jsonFormat([]byte(c.obj))
		require.Equal(t, c.ok, ok, "%s", c.obj)
		if ok {
			require.Equal(t, c.version, v, "%s", c.obj)
		}
	}
}

// v1 (32 bytes, any first byte) and v2 (0x02 and 32 bytes) are known; any other
// version byte or length is a newer format.
func TestFingerprintFormat(t *testing.T) {
	v2 := wholeFingerprint("POST", "/charges", []byte(`{"amount": 1}`))
	require.True(t, fingerprintFormat(v2))
	require.True(t, fingerprintFormat(bytes.Repeat([]byte{0x02}, 32)), "v1 is told by its length")
	for _, stored := range [][]byte{
		nil,
		{},
		append([]byte{0x03}, v2[1:]...),
		append([]byte{0x01}, v2[1:]...),
		append(v2, 0),
		v2[:31],
	} {
		require.False(t, fingerprintFormat(stored), "%x", stored)
	}
}
