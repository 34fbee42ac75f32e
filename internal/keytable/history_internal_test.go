package keytable

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// An entry goes to its statement as a JSON array of itself: an object is wrapped, an
// array of one is sent as it is, and no entry or no bound appends nothing.
func TestHistoryArgs(t *testing.T) {
	for _, c := range []struct {
		h    History
		want string
		keep int
	}{
		{History{Entry: []byte(`{"a":1}`), Keep: 3}, `[{"a":1}]`, 3},
		{History{Entry: []byte(`[{"a":1}]`), Keep: 3}, `[{"a":1}]`, 3},
		{History{Entry: []byte(`{"a":1}`)}, `[]`, 0},
		{History{Keep: 3}, `[]`, 0},
	} {
		got, keep := c.h.args()
		require.Equal(t, c.want, string(got))
		require.Equal(t, c.keep, keep)
	}
}
