package workflow

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Version 3 fingerprints cover only chosen members of a JSON body
// (phases.Flow.FingerprintMembers), each named by a JSON pointer (RFC 6901). A v3
// fingerprint is 73 bytes:
//
//	0x03                 the version byte
//	8 bytes              the start of the member list's hash
//	32 bytes             the sha256 of the chosen members
//	32 bytes             the sha256 of the whole request, as v2 (its last 32 bytes)
//
// The member list's hash is the sha256 of the sorted pointers, each preceded by its
// length as a uvarint. The chosen members' sha256 covers the method and the route (as
// v2), the whole list hash, and then for each pointer in sorted order 'A' if the body
// has no member there, or 'V' and the member's value in the canonical form v2 hashes
// (fingerprint_canon.go). So two flows with different member lists never write equal
// fingerprints and an absent member differs from a null one. A build whose flow has
// the same list compares the first 41 bytes; one whose flow has another list, or none,
// compares the whole request by the last 32 (see storedMatches): a finished row keeps
// no body to compare under another rule.
const (
	fingerprintV3       = 0x03
	fingerprintV3Prefix = 8
	fingerprintV3Len    = 1 + fingerprintV3Prefix + 2*sha256.Size
	// fingerprintV3Members is how many leading bytes of v3 fingerprints under the same
	// list are equal for the same request: up to the whole request's hash.
	fingerprintV3Members = 1 + fingerprintV3Prefix + sha256.Size
)

// Bounds of a member list, checked when a flow is registered.
const (
	maxFingerprintMembers = 64
	maxPointerBytes       = 1024
)

// ErrBodyNotJSON: the flow fingerprints chosen members (phases.Flow.FingerprintMembers)
// and the request body is not one canonicalisable JSON value (see Fingerprint: not
// JSON, invalid UTF-8, duplicate member names, nesting deeper than 64 levels, an
// exponent of more than 18 digits). It wraps ErrInvalidRequest; nothing was written.
var ErrBodyNotJSON = fmt.Errorf("%w: body is not a JSON value that can be fingerprinted by members", ErrInvalidRequest)

// memberSet is a validated, sorted member list and its hash.
type memberSet struct {
	pointers [][]string // the reference tokens of each pointer, unescaped, sorted by pointer
	hash     [sha256.Size]byte
}

// newMemberSet validates a flow's member list: 1 to 64 distinct JSON pointers, each
// "" (the whole body) or "/" followed by reference tokens separated by "/", in which
// "~" is only ever followed by "0" or "1", at most 1024 bytes of UTF-8. nil or empty
// means no list (nil, nil).
func newMemberSet(list []string) (*memberSet, error) {
	if len(list) == 0 {
		return nil, nil
	}
	if len(list) > maxFingerprintMembers {
		return nil, fmt.Errorf("FingerprintMembers: %d pointers, at most %d", len(list), maxFingerprintMembers)
	}
	sorted := slices.Clone(list)
	slices.Sort(sorted)
	ms := &memberSet{pointers: make([][]string, len(sorted))}
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for i, p := range sorted {
		if i > 0 && p == sorted[i-1] {
			return nil, fmt.Errorf("FingerprintMembers: pointer %q is listed twice", p)
		}
		tokens, err := parsePointer(p)
		if err != nil {
			return nil, fmt.Errorf("FingerprintMembers: pointer %q: %w", p, err)
		}
		ms.pointers[i] = tokens
		h.Write(binary.AppendUvarint(n[:0], uint64(len(p))))
		h.Write([]byte(p))
	}
	h.Sum(ms.hash[:0])
	return ms, nil
}

// parsePointer returns the unescaped reference tokens of a JSON pointer (RFC 6901).
func parsePointer(p string) ([]string, error) {
	switch {
	case len(p) > maxPointerBytes:
		return nil, fmt.Errorf("%d bytes, at most %d", len(p), maxPointerBytes)
	case !utf8.ValidString(p):
		return nil, errors.New("not UTF-8")
	case p == "":
		return []string{}, nil
	case p[0] != '/':
		return nil, errors.New(`not a JSON pointer: it must be empty or start with "/"`)
	}
	tokens := strings.Split(p[1:], "/")
	for i, t := range tokens {
		for j := 0; j < len(t); j++ {
			if t[j] == '~' && (j+1 == len(t) || (t[j+1] != '0' && t[j+1] != '1')) {
				return nil, errors.New(`"~" must be followed by "0" (for "~") or "1" (for "/")`)
			}
		}
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return tokens, nil
}

// ruleFingerprint is the fingerprint of a request under a member list, or v2 for nil.
func ruleFingerprint(ms *memberSet, method, route string, body []byte) ([]byte, error) {
	if ms == nil {
		return Fingerprint(method, route, body), nil
	}
	return ms.fingerprint(method, route, body)
}

// fingerprint is the v3 fingerprint of a request under the member list, or
// ErrBodyNotJSON.
func (ms *memberSet) fingerprint(method, route string, body []byte) ([]byte, error) {
	canon, err := canonicalJSON(body)
	if err != nil {
		return nil, ErrBodyNotJSON
	}
	h := sha256.New()
	writeRequestLine(h, method, route)
	h.Write(ms.hash[:])
	for _, tokens := range ms.pointers {
		if v, ok := canonicalMember(canon, tokens); ok {
			h.Write([]byte{'V'})
			h.Write(v)
		} else {
			h.Write([]byte{'A'})
		}
	}
	out := append(make([]byte, 0, fingerprintV3Len), fingerprintV3)
	out = append(out, ms.hash[:fingerprintV3Prefix]...)
	out = h.Sum(out)
	return append(out, wholeRequestSum(method, route, canon, true)...), nil
}

// sameList reports whether a v3 fingerprint was written under this member list.
func (ms *memberSet) sameList(stored []byte) bool {
	return len(stored) == fingerprintV3Len && stored[0] == fingerprintV3 &&
		bytes.Equal(stored[1:1+fingerprintV3Prefix], ms.hash[:fingerprintV3Prefix])
}

// FingerprintMembers returns the version 3 fingerprint that an engine stores for a
// request of a flow whose phases.Flow.FingerprintMembers is pointers: 73 bytes, the
// version byte 0x03 and hashes over the method, the route, the member list and the
// canonical form (see Fingerprint) of the members the pointers name, an absent member
// told apart from a null one, and over the whole request, as Fingerprint. Two requests
// are the same under the list when the first 41 bytes of their fingerprints are equal;
// the last 32 tell whether they are the same as a whole. It fails
// if the list is invalid (see phases.Flow.FingerprintMembers; nil or empty is invalid
// here) or with ErrBodyNotJSON.
func FingerprintMembers(method, route string, body []byte, pointers []string) ([]byte, error) {
	if len(pointers) == 0 {
		return nil, errors.New("workflow: FingerprintMembers: no pointers")
	}
	ms, err := newMemberSet(pointers)
	if err != nil {
		return nil, fmt.Errorf("workflow: %w", err)
	}
	return ms.fingerprint(method, route, body)
}

// canonicalMember finds the value that tokens name in canon, a canonical form, and
// returns its canonical form, or false if there is none: a name an object does not
// have, an index past an array's end or not written as one ("0", or digits without a
// leading zero; "-" names no element), or a token applied to a string, number, true,
// false or null.
func canonicalMember(canon []byte, tokens []string) ([]byte, bool) {
	v := canon[:canonicalEnd(canon, 0)]
	for _, t := range tokens {
		var ok bool
		switch v[0] {
		case 'o':
			v, ok = objectMember(v, t)
		case 'a':
			v, ok = arrayElement(v, t)
		}
		if !ok {
			return nil, false
		}
	}
	return v, true
}

// objectMember returns the value of obj's member named name.
func objectMember(obj []byte, name string) ([]byte, bool) {
	i := 1
	for obj[i] != 'e' {
		l, n := binary.Uvarint(obj[i+1:])
		s := i + 1 + n
		key := obj[s : s+int(l)]
		i = s + int(l)
		end := canonicalEnd(obj, i)
		if string(key) == name {
			return obj[i:end], true
		}
		i = end
	}
	return nil, false
}

// arrayElement returns the element of arr at the index token t.
func arrayElement(arr []byte, t string) ([]byte, bool) {
	if t == "" || (len(t) > 1 && t[0] == '0') || strings.Trim(t, "0123456789") != "" {
		return nil, false
	}
	idx, err := strconv.Atoi(t)
	if err != nil {
		return nil, false
	}
	i := 1
	for k := 0; arr[i] != 'e'; k++ {
		end := canonicalEnd(arr, i)
		if k == idx {
			return arr[i:end], true
		}
		i = end
	}
	return nil, false
}

// canonicalEnd returns where the value that starts at c[i] ends in a canonical form.
func canonicalEnd(c []byte, i int) int {
	switch c[i] {
	case 's':
		l, n := binary.Uvarint(c[i+1:])
		return i + 1 + n + int(l)
	case 'd':
		return i + bytes.IndexByte(c[i:], ';') + 1
	case 'a':
		i++
		for c[i] != 'e' {
			i = canonicalEnd(c, i)
		}
		return i + 1
	case 'o':
		i++
		for c[i] != 'e' {
			i = canonicalEnd(c, i) // the name
			i = canonicalEnd(c, i) // the value
		}
		return i + 1
	}
	return i + 1 // 'n', 't', 'f'
}
