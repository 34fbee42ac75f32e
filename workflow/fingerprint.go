package workflow

import (
	"crypto/sha256"
	"encoding/json"

	"github.com/gowebpki/jcs"
)

// Fingerprint is the sha256 of a request's method, route and body. A body that is
// valid JSON is hashed in its RFC 8785 canonical form, so key order, whitespace and
// number spelling don't matter; any other body is hashed as its bytes. The two cases
// are kept apart so that no raw body can collide with a JSON one.
func Fingerprint(method, route string, body []byte) [32]byte {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(route))
	h.Write([]byte{0})
	if canon, ok := canonicalJSON(body); ok {
		h.Write([]byte("json\x00"))
		h.Write(canon)
	} else {
		h.Write([]byte("raw\x00"))
		h.Write(body)
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

func canonicalJSON(body []byte) ([]byte, bool) {
	if len(body) == 0 || !json.Valid(body) {
		return nil, false
	}
	canon, err := jcs.Transform(body)
	if err != nil {
		return nil, false // e.g. duplicate object keys: not canonicalisable, hash the bytes
	}
	return canon, true
}
