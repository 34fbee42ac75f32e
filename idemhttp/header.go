package idemhttp

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/dunglas/httpsfv"

	"github.com/idemflow/idemflow/workflow"
)

// HTTP header names used by Handler and the middlewares.
const (
	// KeyHeader carries the client's idempotency key.
	KeyHeader = "Idempotency-Key"
	// ReplayedHeader is set to "true" on a response replayed from an earlier attempt.
	ReplayedHeader = "Idempotent-Replayed"
	// RetentionHeader is sent on every answer under a key: how many seconds the key
	// and its stored answer are kept after the key finished (Config.Retention). On a
	// partitioned key table (docs/PARTITIONS.md) the retention counts from the key's
	// creation instead: a key is kept at least that long after its first attempt.
	RetentionHeader = "Idempotency-Key-Retention"
)

// ParseKeyHeader reads the Idempotency-Key header from h. present reports whether the
// header was sent at all. The value may be an RFC 8941 string ("8e03978e-40d5") or a
// bare token (8e03978e-40d5: one or more RFC 9110 token characters, ':' or '/', so that
// UUIDs and ULIDs need no quotes). The key must then pass workflow.ValidateKey.
//
// The error wraps workflow.ErrInvalidKey when the header is sent more than once, holds
// a list, has parameters, is any other kind of structured value, or the key is invalid.
// A missing header is not an error: key is "" and present is false.
func ParseKeyHeader(h http.Header) (key string, present bool, err error) {
	values := h[KeyHeader] // h.Values(KeyHeader) without canonicalizing the canonical name (every keyed request passes here)
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", true, fmt.Errorf("%w: %d %s header fields, want one", workflow.ErrInvalidKey, len(values), KeyHeader)
	}
	v := strings.Trim(values[0], " \t")
	if strings.HasPrefix(v, `"`) {
		key, err = parseQuotedKey(v)
	} else {
		key, err = parseBareKey(v)
	}
	if err != nil {
		return "", true, err
	}
	if err := workflow.ValidateKey(key); err != nil {
		return "", true, err
	}
	return key, true, nil
}

// parseQuotedKey parses an RFC 8941 sf-string item without parameters.
func parseQuotedKey(v string) (string, error) {
	item, err := httpsfv.UnmarshalItem([]string{v})
	if err != nil {
		return "", fmt.Errorf("%w: not a single RFC 8941 string (%v)", workflow.ErrInvalidKey, err)
	}
	s, ok := item.Value.(string)
	if !ok {
		return "", fmt.Errorf("%w: not an RFC 8941 string", workflow.ErrInvalidKey)
	}
	if item.Params != nil && len(item.Params.Names()) > 0 {
		return "", fmt.Errorf("%w: parameters are not allowed", workflow.ErrInvalidKey)
	}
	return s, nil
}

// parseBareKey accepts a run of token characters: RFC 9110 tchar plus ':' and '/', the
// characters of an RFC 8941 token, without its rule on the first character.
func parseBareKey(v string) (string, error) {
	if v == "" {
		return "", fmt.Errorf("%w: empty", workflow.ErrInvalidKey)
	}
	for i := 0; i < len(v); i++ {
		if !isKeyTokenChar(v[i]) {
			return "", fmt.Errorf("%w: byte %#x at %d: quote a key that is not a bare token (RFC 8941 string)", workflow.ErrInvalidKey, v[i], i)
		}
	}
	return v, nil
}

func isKeyTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}
