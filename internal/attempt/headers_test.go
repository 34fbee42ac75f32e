package attempt

import (
	"encoding/json"
	"net/textproto"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// marshalledHeaders is StoredHeaders as encoding/json writes it: the kept headers
// merged into a map under their canonical names (the names as written taken in
// sorted order), then json.Marshal. StoredHeaders must write the same bytes.
func marshalledHeaders(t testing.TB, h map[string][]string, keeps func(string) bool) string {
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range h {
			if !yield(k) {
				return
			}
		}
	})
	kept := map[string][]string{}
	for _, k := range names {
		if ck := textproto.CanonicalMIMEHeaderKey(k); keeps(ck) {
			kept[ck] = append(kept[ck], h[k]...)
		}
	}
	b, err := json.Marshal(kept)
	require.NoError(t, err)
	return string(b)
}

// keepAllBut keeps every header but X-Drop.
func keepAllBut(canonical string) bool { return canonical != "X-Drop" }

// TestStoredHeadersAsMarshalled: the stored headers are json.Marshal's of the merged
// map, byte for byte, whatever the names' case, order, escapes and empty lists.
func TestStoredHeadersAsMarshalled(t *testing.T) {
	t.Parallel()
	for _, h := range []map[string][]string{
		nil,
		{},
		{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_1"}},
		{"location": {"/a"}, "Location": {"/b"}, "LOCATION": {"/c"}, "Content-Type": {"text/plain"}},
		{"X-Drop": {"gone"}, "Link": {"<a>; rel=next", "<b>; rel=prev"}, "Etag": {`"x"`}},
		{"X-Empty": {}, "x-empty": nil, "X-Nil": nil, "X-One": {}, "x-one": {"1"}},
		{"X-Escapes": {"<a> & \"b\" \\ \n\t\x00", "invalid \xff utf-8, \u2028 é 世界"}, "X-Ünicode": {""}},
		{"x y": {"space"}, "": {"no name"}, "X-Drop": nil},
	} {
		got, err := StoredHeaders(h, keepAllBut)
		require.NoError(t, err)
		require.Equal(t, marshalledHeaders(t, h, keepAllBut), string(got), "%q", h)
	}
}

// FuzzStoredHeadersAsMarshalled is TestStoredHeadersAsMarshalled on any names and
// values (newline-separated, paired up; a value "-" leaves its name's list empty).
func FuzzStoredHeadersAsMarshalled(f *testing.F) {
	f.Add("Content-Type\nLocation", "application/json\n/v1/charges/ch_1")
	f.Add("link\nLink\nLINK\nX-Drop\nx-one", "<a>\n<b>\n-\nd\n-")
	f.Add("X-A\n\x00\nÉtag", "a\"b\n<&>\n\xff")
	f.Fuzz(func(t *testing.T, names, values string) {
		ns, vs := strings.Split(names, "\n"), strings.Split(values, "\n")
		h := map[string][]string{}
		for i, n := range ns {
			if i < len(vs) && vs[i] == "-" {
				h[n] = append(h[n], []string{}...)
				continue
			}
			v := ""
			if i < len(vs) {
				v = vs[i]
			}
			h[n] = append(h[n], v)
		}
		got, err := StoredHeaders(h, keepAllBut)
		require.NoError(t, err)
		require.Equal(t, marshalledHeaders(t, h, keepAllBut), string(got))
	})
}

// BenchmarkStoredHeaders is a charge's answer's headers as stored (Direct) and as
// encoding/json would store them (Marshal), for comparison:
//
//	go test -run '^$' -bench StoredHeaders ./internal/attempt/
func BenchmarkStoredHeaders(b *testing.B) {
	h := map[string][]string{"Content-Type": {"application/json"}, "Location": {"/v1/charges/0f8c2d4e-5b1a-4c3d-9e7f-1a2b3c4d5e6f"}}
	keeps := func(ck string) bool { return ck == "Content-Type" || ck == "Location" }
	b.Run("Direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := StoredHeaders(h, keeps); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			marshalledHeaders(b, h, keeps)
		}
	})
}
