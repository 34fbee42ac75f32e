package runstate

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDataAsMarshal encodes phase data of every kind as json.Marshal does, byte for
// byte, whether plainData writes it or json.Marshal does.
func TestDataAsMarshal(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		data  map[string]json.RawMessage
		plain bool // plainData writes it
	}{
		{map[string]json.RawMessage{}, true},
		{map[string]json.RawMessage{"b": json.RawMessage(`1`), "a": json.RawMessage(`"x"`), "idemflow:format": json.RawMessage(`2`)}, true},
		{map[string]json.RawMessage{"charge": json.RawMessage(`{"id":"ch_1","amount":1999,"ok":true,"n":null,"l":[1,2.5e3]}`)}, true},
		{map[string]json.RawMessage{"a": json.RawMessage(`"üé"`)}, true},
		{map[string]json.RawMessage{"a": json.RawMessage(`"ü€"`)}, false}, // 0xe2 may start U+2028
		{map[string]json.RawMessage{"a": json.RawMessage(`{ "x" : 1 }`)}, false},
		{map[string]json.RawMessage{"a": json.RawMessage(`"<b>&"`)}, false},
		{map[string]json.RawMessage{"a": json.RawMessage("\"\u2028\"")}, false},
		{map[string]json.RawMessage{"<a>": json.RawMessage(`1`)}, false},
		{map[string]json.RawMessage{"a\"b": json.RawMessage(`1`), "ü": json.RawMessage(`2`)}, false},
		{map[string]json.RawMessage{"a": nil}, false},
		{map[string]json.RawMessage{"a": json.RawMessage(`{`)}, false},
		{map[string]json.RawMessage{"a": json.RawMessage(`1 2`)}, false},
		{nil, false},
	} {
		want, wantErr := json.Marshal(c.data)
		got, err := (&Run{data: c.data}).Data()
		if wantErr != nil {
			require.Error(t, err, "%v", c.data)
		} else {
			require.NoError(t, err, "%v", c.data)
			require.Equal(t, string(want), string(got), "%v", c.data)
		}
		_, plain := plainData(c.data)
		require.Equal(t, c.plain, plain, "%v", c.data)
	}
	many := map[string]json.RawMessage{}
	for i := range 20 {
		many[strings.Repeat("k", 20-i)] = json.RawMessage(`[1]`)
	}
	want, _ := json.Marshal(many)
	got, err := (&Run{data: many}).Data()
	require.NoError(t, err)
	require.Equal(t, string(want), string(got))
}
