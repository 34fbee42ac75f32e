package workflow

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"

	"github.com/gowebpki/jcs"
)

// Stored fingerprints (the key row's bytea) come in two versions, told apart by length:
//
//	v1: 32 bytes, sha256 over RFC 8785 canonical JSON (fingerprintV1). Written by
//	    releases before v2; numbers were compared as float64, so it is only read.
//	v2: 33 bytes, the version byte 0x02 and then the sha256 over the exact canonical
//	    form (Fingerprint). Written for every new key.
const (
	fingerprintV1Len = sha256.Size
	fingerprintV2Len = 1 + sha256.Size
	fingerprintV2    = 0x02 // the first byte of a v2 fingerprint
)

// Fingerprint returns the fingerprint of a request, the value stored on its key: 33
// bytes, the version byte 0x02 and the sha256 of the method, the route and the body.
// A body that is one valid JSON value is hashed in an exact canonical form, so object
// key order, whitespace, string escapes and number spelling (1, 1.0, 1e0, 10e-1) don't
// matter, while any two numbers of different decimal value, however many digits they
// take, differ. Any other body, including JSON with duplicate member names, invalid
// UTF-8, nesting deeper than 64 levels or an exponent of more than 18 digits, is hashed
// as its bytes. The two cases are kept apart so that no raw body can collide with a
// JSON one.
func Fingerprint(method, route string, body []byte) []byte {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, s := range [2]string{method, route} {
		h.Write(binary.AppendUvarint(n[:0], uint64(len(s))))
		h.Write([]byte(s))
	}
	if canon, err := canonicalJSON(body); err == nil {
		h.Write([]byte{'J'})
		h.Write(canon)
	} else {
		h.Write([]byte{'R'})
		h.Write(body)
	}
	return h.Sum([]byte{fingerprintV2})
}

// FingerprintMatches reports whether stored, a fingerprint read from a key row, is the
// fingerprint of this request: a v2 fingerprint equal to Fingerprint's, or a v1
// fingerprint (32 bytes, written by releases before v2) equal to the one they computed.
// A stored value of any other length matches nothing. v1 compared numbers as float64,
// so a v1 row still matches a body whose numbers differ only beyond float64's
// precision; such rows age out with retention.
func FingerprintMatches(stored []byte, method, route string, body []byte) bool {
	switch len(stored) {
	case fingerprintV2Len:
		return bytes.Equal(stored, Fingerprint(method, route, body))
	case fingerprintV1Len:
		v1 := fingerprintV1(method, route, body)
		return bytes.Equal(stored, v1[:])
	}
	return false
}

// storedMatches is FingerprintMatches for an engine that already computed req's
// Fingerprint fp: only a v1 row costs a second hash.
func storedMatches(stored, fp []byte, req *Request) bool {
	if len(stored) == fingerprintV1Len {
		return FingerprintMatches(stored, req.Method, req.Route, req.Body)
	}
	return bytes.Equal(stored, fp)
}

// fingerprintV1 is the v1 fingerprint, kept to compare key rows written before v2: the
// sha256 of method, route and the body in RFC 8785 canonical form if it is JSON, or
// its bytes.
func fingerprintV1(method, route string, body []byte) [32]byte {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(route))
	h.Write([]byte{0})
	if canon, ok := canonicalJSONV1(body); ok {
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

func canonicalJSONV1(body []byte) ([]byte, bool) {
	if len(body) == 0 || !json.Valid(body) {
		return nil, false
	}
	canon, err := jcs.Transform(body)
	if err != nil {
		return nil, false // e.g. duplicate object keys: not canonicalisable, hash the bytes
	}
	return canon, true
}
