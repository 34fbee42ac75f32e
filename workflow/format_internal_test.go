package workflow

import (
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
