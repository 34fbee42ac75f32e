package workflow

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"hash"

	"github.com/gowebpki/jcs"
)

// Stored fingerprints (the key row's bytea) come in three versions, told apart by
// length and version byte:
//
//	v1: 32 bytes, sha256 over RFC 8785 canonical JSON (fingerprintV1). Written by
//	    releases before v2; numbers were compared as float64, so it is only read.
//	v2: 33 bytes, the version byte 0x02 and then the sha256 over the exact canonical
//	    form (Fingerprint). Written for every new key of a flow without
//	    phases.Flow.FingerprintMembers.
//	v3: 73 bytes, the version byte 0x03, 8 bytes of the member list's hash, the
//	    sha256 over the chosen members and the sha256 v2 has (FingerprintMembers,
//	    fingerprint_members.go). Written only for flows that set
//	    phases.Flow.FingerprintMembers.
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
	if canon, err := canonicalJSON(body); err == nil {
		return append([]byte{fingerprintV2}, wholeRequestSum(method, route, canon, true)...)
	}
	return append([]byte{fingerprintV2}, wholeRequestSum(method, route, body, false)...)
}

// wholeRequestSum is the sha256 of a v2 fingerprint: over the method, the route and
// the body's canonical form (isJSON) or its bytes.
func wholeRequestSum(method, route string, body []byte, isJSON bool) []byte {
	h := sha256.New()
	writeRequestLine(h, method, route)
	if isJSON {
		h.Write([]byte{'J'})
	} else {
		h.Write([]byte{'R'})
	}
	h.Write(body)
	return h.Sum(make([]byte, 0, sha256.Size))
}

// writeRequestLine writes the method and the route to h, each preceded by its length.
func writeRequestLine(h hash.Hash, method, route string) {
	var n [binary.MaxVarintLen64]byte
	for _, s := range [2]string{method, route} {
		h.Write(binary.AppendUvarint(n[:0], uint64(len(s))))
		h.Write([]byte(s))
	}
}

// fingerprintMatches reports whether stored, a fingerprint read from a key row, is the
// fingerprint of this request: a v2 fingerprint equal to Fingerprint's, or a v1
// fingerprint (32 bytes, written by releases before v2) equal to the one they computed.
// A stored value of any other length matches nothing, and so does a v3 fingerprint,
// which only a flow's member list can compute (see FingerprintMembers). v1 compared numbers as float64,
// so a v1 row still matches a body whose numbers differ only beyond float64's
// precision; such rows age out with retention.
func fingerprintMatches(stored []byte, method, route string, body []byte) bool {
	switch len(stored) {
	case fingerprintV2Len:
		return bytes.Equal(stored, Fingerprint(method, route, body))
	case fingerprintV1Len:
		v1 := fingerprintV1(method, route, body)
		return bytes.Equal(stored, v1[:])
	}
	return false
}

// storedMatches reports whether stored, the fingerprint of a key row of req's flow,
// method and route, was written for the same request as req, whose fingerprint under
// the flow's member list ms (nil: none) is fp. A row fingerprinted under the same rule
// (v2 without a list; v3 under the same list, by its first fingerprintV3Members bytes,
// the chosen members) is compared by its fingerprint, a v1 row
// by v1's rule. A row fingerprinted under another rule (the flow's member list was set,
// changed or removed since it was written, or differs on another build of the fleet)
// is compared by the whole request, exactly as v2 compares it: an identical request,
// however respelled, matches, and any other does not.
func storedMatches(stored, fp []byte, req *Request, ms *memberSet) bool {
	switch {
	case bytes.Equal(stored, fp):
		return true
	case len(stored) == fingerprintV1Len:
		return fingerprintMatches(stored, req.Method, req.Route, req.Body)
	case ms != nil && ms.sameList(stored):
		return bytes.Equal(stored[:fingerprintV3Members], fp[:fingerprintV3Members])
	case !fingerprintFormat(stored):
		return false
	}
	return bytes.Equal(stored[len(stored)-sha256.Size:], fp[len(fp)-sha256.Size:])
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
