package idemclient

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewKey(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		k := NewKey()
		require.NoError(t, ValidateKey(k))
		require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, k)
		require.Equal(t, k, headerValue(k), "a bare token")
		require.False(t, seen[k])
		seen[k] = true
	}
}

func TestKeyFrom(t *testing.T) {
	t.Parallel()
	require.Equal(t, "sub_123:2026-10", KeyFrom("sub_123", "2026-10"))
	require.Equal(t, "charge%3Aa:b", KeyFrom("charge:a", "b"))
	require.Equal(t, "%25%20%2F%00%C3%A9", KeyFrom("% /\x00é"))
	require.Equal(t, ":", KeyFrom("", ""))

	hashed := KeyFrom("")
	require.Equal(t, "sha256/e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", hashed)
	long := KeyFrom(strings.Repeat("x", 300))
	require.True(t, strings.HasPrefix(long, "sha256/"))
	require.Len(t, long, len("sha256/")+64)
	require.NotEqual(t, long, KeyFrom(strings.Repeat("x", 301)))
	require.Equal(t, strings.Repeat("y", 255), KeyFrom(strings.Repeat("y", 255)), "255 bytes is still a plain key")

	// Different lists of parts never meet, and every result is a valid bare key.
	lists := [][]string{
		{"a:b", "c"}, {"a", "b:c"}, {"a", "b", "c"}, {"a%3Ab", "c"}, {"a/b"}, {"sha256", strings.Repeat("0", 64)},
		{""}, {"", ""}, {"a b"}, {"a+b"}, {"\xff"}, {strings.Repeat("é", 200)},
	}
	seen := map[string][]string{}
	for _, parts := range lists {
		k := KeyFrom(parts[0], parts[1:]...)
		require.NoError(t, ValidateKey(k), "%q", parts)
		require.Equal(t, k, headerValue(k), "%q gives a bare token", parts)
		require.NotContains(t, seen, k, "%q and %q give the same key", parts, seen[k])
		seen[k] = parts
		require.Equal(t, k, KeyFrom(parts[0], parts[1:]...), "deterministic")
	}
}

func TestValidateKey(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", " ", "~", strings.Repeat("k", 255), `"quoted" \ key`} {
		require.NoError(t, ValidateKey(ok), "%q", ok)
	}
	for _, bad := range []string{"", strings.Repeat("k", 256), "tab\t", "new\nline", "é", "\x7f"} {
		require.ErrorIs(t, ValidateKey(bad), ErrInvalidKey, "%q", bad)
	}
}

func TestWithKey(t *testing.T) {
	t.Parallel()
	_, ok := KeyFromContext(context.Background())
	require.False(t, ok)
	k, ok := KeyFromContext(WithKey(context.Background(), "op-1"))
	require.True(t, ok)
	require.Equal(t, "op-1", k)
}
