package fingerprint

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

// v1 (32 bytes, any first byte) and v2 (0x02 and 32 bytes) are known; any other
// version byte or length is a newer format.
func TestKnown(t *testing.T) {
	v2 := Whole("POST", "/charges", []byte(`{"amount": 1}`))
	require.True(t, Known(v2))
	require.True(t, Known(bytes.Repeat([]byte{0x02}, 32)), "v1 is told by its length")
	for _, stored := range [][]byte{
		nil,
		{},
		append([]byte{0x03}, v2[1:]...),
		append([]byte{0x01}, v2[1:]...),
		append(v2, 0),
		v2[:31],
	} {
		require.False(t, Known(stored), "%x", stored)
	}
}
