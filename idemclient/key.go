package idemclient

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Header names of the protocol, as an idemflow server sends and reads them. They are
// this package's own copies: idemclient imports none of the server's packages.
const (
	// KeyHeader carries the idempotency key of a request.
	KeyHeader = "Idempotency-Key"
	// ReplayedHeader is "true" on an answer replayed from an earlier attempt under the
	// same key.
	ReplayedHeader = "Idempotent-Replayed"
	// RetentionHeader says how many seconds the server keeps a finished key and its
	// answer.
	RetentionHeader = "Idempotency-Key-Retention"
)

// MaxKeyLen is the longest valid key, in bytes.
const MaxKeyLen = 255

// NewKey returns a new random key (a version 4 UUID): one per logical operation, made
// before its first attempt and sent unchanged on every retry. A key that must outlive
// the process is kept in a Store (PendingKey) or derived from the operation (KeyFrom).
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// KeyFrom derives a key from the identity of an operation, so that every process that
// runs the operation, before or after a restart, sends the same key without storing
// it: KeyFrom("renewal", "sub_123", "2026-10") is "renewal:sub_123:2026-10". The
// parts are joined by ':'; in each part every byte other than ASCII letters, digits
// and "-._~" is written %XX, so different lists of parts never give the same key and
// the key is a bare header token. A result over MaxKeyLen bytes, or an empty one, is
// replaced by "sha256/" and the hex SHA-256 of the joined parts (no encoded key holds
// a '/', so the two forms never meet).
//
// Name the kind of operation in the parts: keys are unique per account on the server,
// and two operations of one account that derive the same key get one answer. A server
// forgets a finished key after its retention (RetentionHeader, 24 hours by default):
// a derived key sent again after that starts the operation again.
func KeyFrom(part string, more ...string) string {
	var b strings.Builder
	escape(&b, part)
	for _, p := range more {
		b.WriteByte(':')
		escape(&b, p)
	}
	key := b.String()
	if key == "" || len(key) > MaxKeyLen {
		sum := sha256.Sum256([]byte(key))
		return "sha256/" + hex.EncodeToString(sum[:])
	}
	return key
}

// escape writes s to b with every byte but [A-Za-z0-9-._~] written %XX.
func escape(b *strings.Builder, s string) {
	const digits = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', strings.IndexByte("-._~", c) >= 0:
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(digits[c>>4])
			b.WriteByte(digits[c&0x0f])
		}
	}
}

// ValidateKey reports whether key is a valid idempotency key: 1 to MaxKeyLen bytes of
// printable ASCII (0x20 to 0x7E). The error wraps ErrInvalidKey.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte %#x at %d is not printable ASCII", ErrInvalidKey, c, i)
		}
	}
	return nil
}

// headerValue is key as an Idempotency-Key field value: bare when every byte is a
// token character, else an RFC 8941 string with '"' and '\' escaped.
func headerValue(key string) string {
	bare := true
	for i := 0; i < len(key) && bare; i++ {
		bare = isTokenChar(key[i])
	}
	if bare {
		return key
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if key[i] == '"' || key[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}

// isTokenChar reports whether c may appear in a bare key: an RFC 9110 tchar, ':' or
// '/'.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}

type keyContext struct{}

// WithKey returns a context that makes every request sent with it through a Transport
// carry key: the key of one logical operation. Send each attempt the caller makes
// itself (after an ExhaustedError, after a restart) with the same key. A request that
// sets KeyHeader itself must set it to the same key, or the Transport refuses it.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyContext{}, key)
}

// KeyFromContext returns the key WithKey attached to ctx, if any.
func KeyFromContext(ctx context.Context) (key string, ok bool) {
	key, ok = ctx.Value(keyContext{}).(string)
	return key, ok
}
