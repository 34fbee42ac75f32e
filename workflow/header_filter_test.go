package workflow

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/attempt"
	"github.com/idemflow/idemflow/internal/keytable"
)

// noPool is a Pool for engines that never reach the database.
type noPool struct{ Pool }

// neverStored are the headers no configuration can have replayed.
var neverStored = []string{"Set-Cookie", "Date", "Authorization", "Proxy-Authenticate", "Www-Authenticate", "Proxy-Authorization"}

// FuzzStoredHeaders checks the filter a response's headers pass before they are stored
// and replayed: only allow-listed names are kept, never Set-Cookie, Date or
// authentication headers (not even when configured), and a kept header keeps all its
// values, in order, through the stored encoding. names and values are newline-separated
// and paired up.
func FuzzStoredHeaders(f *testing.F) {
	f.Add("Content-Type\nSet-Cookie\nlocation\nDATE\nX-Custom\nEtag", "application/json\ns=1\n/x/1\nMon, 02 Jan 2006 15:04:05 GMT\nc\n\"v1\"")
	f.Add("set-cookie\nSet-Cookie\nWWW-Authenticate\nauthorization", "a\nb\nBearer\nBasic x")
	f.Add("Link\nLink\nCache-Control", "<a>; rel=next\n<b>; rel=prev\nno-store")
	f.Add("Content-Type \nX Y\n\x00\nÉtag", "a\nb\nc\nd")
	f.Add("Retry-After\nLast-Modified", "120\nWed, 21 Oct 2015 07:28:00 GMT")

	defaults, err := New(noPool{}, nil)
	require.NoError(f, err)
	custom, err := New(noPool{}, &Config{StoredHeaders: []string{"x-custom", "Set-Cookie", "date", "Authorization", "Location"}})
	require.NoError(f, err)

	f.Fuzz(func(t *testing.T, names, values string) {
		ns, vs := strings.Split(names, "\n"), strings.Split(values, "\n")
		h := http.Header{}
		byCanonical := map[string][]string{} // canonical name -> the input names
		for i, n := range ns {
			v := ""
			if i < len(vs) {
				v = vs[i]
			}
			if !utf8.ValidString(v) {
				return // header values are stored as JSON strings, which hold UTF-8
			}
			if _, seen := h[n]; !seen {
				byCanonical[http.CanonicalHeaderKey(n)] = append(byCanonical[http.CanonicalHeaderKey(n)], n)
			}
			h[n] = append(h[n], v)
		}
		for _, e := range []*Engine{defaults, custom} {
			headers, err := attempt.StoredHeaders(h, e.keeps)
			require.NoError(t, err)
			status := 201
			resp, err := storedResponse(&keytable.Row{ResponseStatus: &status, ResponseHeaders: headers, ResponseBody: []byte("b")})
			require.NoError(t, err)
			for k, v := range resp.Header {
				require.True(t, e.keeps(k), "%q is neither allow-listed nor a header of the body", k)
				require.NotContains(t, neverStored, k)
				inputs := slices.Sorted(slices.Values(byCanonical[k]))
				var want []string
				for _, in := range inputs {
					want = append(want, h[in]...)
				}
				require.Equal(t, want, v, "all values of %q, names merged in order", k)
			}
			for ck, inputs := range byCanonical {
				if e.keeps(ck) {
					require.Contains(t, resp.Header, ck, "allow-listed %q (from %q) is kept", ck, inputs)
				}
			}
		}
	})
}
