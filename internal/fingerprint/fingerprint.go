package fingerprint

// A request's fingerprint, in the order workflow's Engine.Do needs it: computed before the
// look-up (Of: the whole request, or a flow's member list), made of the body's
// canonical form, then compared with a stored row's (Matches). A flow's member list is
// validated when the flow is registered (the last part of this file).

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/gowebpki/jcs"

	"github.com/idemflow/idemflow/internal/vocab"
)

// Stored fingerprints (the key row's bytea) come in three versions, told apart by
// length and version byte:
//
//	v1: 32 bytes, sha256 over RFC 8785 canonical JSON (V1). Written by
//	    releases before v2; numbers were compared as float64, so it is only read.
//	v2: 33 bytes, the version byte 0x02 and then the sha256 over the exact canonical
//	    form (workflow.Fingerprint). Written for every new key of a flow without
//	    phases.Flow.FingerprintMembers.
//	v3: 73 bytes, the version byte 0x03, 8 bytes of the member list's hash, the
//	    sha256 over the chosen members and the sha256 v2 has (workflow.Fingerprint with members).
//	    Written only for flows that set phases.Flow.FingerprintMembers.
const (
	fingerprintV1Len = sha256.Size
	fingerprintV2Len = 1 + sha256.Size
	fingerprintV2    = 0x02 // the first byte of a v2 fingerprint
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
// (below). So two flows with different member lists never write equal fingerprints and
// an absent member differs from a null one. A build whose flow has
// the same list compares the first 41 bytes; one whose flow has another list, or none,
// compares the whole request by the last 32 (see Matches): a finished row keeps
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

// Of is the fingerprint of a request under a flow's member list, or version 2 for nil
// (see workflow.Fingerprint): it fails only with vocab.ErrBodyNotJSON.
func Of(ms *Members, method, route string, body []byte) ([]byte, error) {
	if ms == nil {
		return Whole(method, route, body), nil
	}
	return ms.fingerprint(method, route, body)
}

// Whole is the version 2 fingerprint (see workflow.Fingerprint).
func Whole(method, route string, body []byte) []byte {
	f := getFingerprinter()
	defer f.release()
	out := append(make([]byte, 0, fingerprintV2Len), fingerprintV2)
	if canon, err := f.canonical(body); err == nil {
		return f.wholeRequestSum(out, method, route, canon, true)
	}
	return f.wholeRequestSum(out, method, route, body, false)
}

// fingerprint is the v3 fingerprint of a request under the member list, or
// vocab.ErrBodyNotJSON.
func (ms *Members) fingerprint(method, route string, body []byte) ([]byte, error) {
	f := getFingerprinter()
	defer f.release()
	canon, err := f.canonical(body)
	if err != nil {
		return nil, vocab.ErrBodyNotJSON
	}
	f.h.Reset()
	f.writeLine(method, route)
	f.h.Write(ms.hash[:])
	for _, tokens := range ms.pointers {
		if v, ok := canonicalMember(canon, tokens); ok {
			f.writeTag('V')
			f.h.Write(v)
		} else {
			f.writeTag('A')
		}
	}
	out := append(make([]byte, 0, fingerprintV3Len), fingerprintV3)
	out = append(out, ms.hash[:fingerprintV3Prefix]...)
	out = f.h.Sum(out)
	return f.wholeRequestSum(out, method, route, canon, true), nil
}

// fingerprinter is the scratch space of one fingerprint, reused through a pool so that
// a request's fingerprint allocates only its result: the body's decoder and canonical
// form, and the hash.
type fingerprinter struct {
	c    canonicaliser
	d    jsontext.Decoder
	body bytes.Buffer // the body being decoded: the decoder reads it in place
	h    hash.Hash
	line []byte // what is written to h next
}

var fingerprinters = sync.Pool{New: func() any { return &fingerprinter{h: sha256.New()} }}

// maxPooledBytes bounds the buffers a pooled fingerprinter keeps, so that one large
// body does not hold its size in the pool.
const maxPooledBytes = 64 << 10

// allowDuplicateNames is the decoder's option: duplicate names are found after sorting,
// which is cheaper than the decoder's own check.
var allowDuplicateNames = []jsontext.Options{jsontext.AllowDuplicateNames(true)}

func getFingerprinter() *fingerprinter { return fingerprinters.Get().(*fingerprinter) }

// release returns f to the pool, holding no reference to the body.
func (f *fingerprinter) release() {
	f.body = bytes.Buffer{}
	f.d.Reset(&f.body)
	if cap(f.c.out) > maxPooledBytes {
		f.c.out = nil
	}
	if cap(f.c.tmp) > maxPooledBytes {
		f.c.tmp = nil
	}
	fingerprinters.Put(f)
}

// wholeRequestSum appends to out the sha256 of a v2 fingerprint: over the method, the
// route and the body's canonical form (isJSON) or its bytes.
func (f *fingerprinter) wholeRequestSum(out []byte, method, route string, body []byte, isJSON bool) []byte {
	f.h.Reset()
	f.writeLine(method, route)
	if isJSON {
		f.writeTag('J')
	} else {
		f.writeTag('R')
	}
	f.h.Write(body)
	return f.h.Sum(out)
}

// writeLine writes the method and the route to f.h, each preceded by its length.
func (f *fingerprinter) writeLine(method, route string) {
	f.line = binary.AppendUvarint(f.line[:0], uint64(len(method)))
	f.line = append(f.line, method...)
	f.line = binary.AppendUvarint(f.line, uint64(len(route)))
	f.line = append(f.line, route...)
	f.h.Write(f.line)
}

// writeTag writes one byte to f.h.
func (f *fingerprinter) writeTag(b byte) {
	f.line = append(f.line[:0], b)
	f.h.Write(f.line)
}

// The canonical form of a JSON body, which version 2 fingerprints hash. It is a
// compact, self-delimiting encoding of the decoded value, not JSON text; it is never
// stored or shown, only hashed. Two bodies have the same canonical form exactly when a
// strict decoder reads the same value from them:
//
//	null, true, false   'n', 't', 'f'
//	string              's' uvarint(len) bytes    the decoded UTF-8 bytes ("\u0041" is "A")
//	number              'd' sign digits 'e' exponent ';'
//	array               'a' element... 'e'
//	object              'o' (name value)... 'e'    name as a string, members sorted by name
//
// A number is its exact decimal value: sign '+' or '-', the significant digits without
// leading or trailing zeros, and the decimal exponent of the last digit, written as a
// base-10 integer ("12.50e1" is "d+125e0;", "-0.0" is zero, "d+0e0;"). So 1, 1.0,
// 1e0, 10e-1 and 0.1e1 are equal, and 9007199254740993 differs from
// 9007199254740992 however many digits it takes. No number is ever converted to a
// float.
//
// Members are sorted by the bytes of their decoded names in UTF-8, which is Unicode
// code point order (RFC 8785 sorts by UTF-16 code units; the two differ only between
// characters above U+FFFF and those from U+E000 to U+FFFF, and either is deterministic).
//
// A body is not canonicalisable, and is fingerprinted as its raw bytes instead, when it
// is not exactly one valid JSON value (RFC 8259), when it holds invalid UTF-8 or an
// unpaired surrogate escape, when an object has two members of the same decoded name
// (a strict decoder refuses such a body and a lax one keeps either member, so it has no
// single meaning to compare by), when it nests deeper than MaxCanonicalDepth, or when a
// number's exponent is written with more than maxExponentDigits significant digits.
// Raw bytes are never equal to a different body, so each of these cases is still exact;
// only respellings of such a body stop being recognised as the same request.

// MaxCanonicalDepth bounds how deeply arrays and objects may nest in a canonicalisable
// body. Reordering an object's members copies it once more for each enclosing object,
// so the bound also bounds that work.
const MaxCanonicalDepth = 64

// maxExponentDigits bounds the significant digits of a number's written exponent, so
// that the exponent and its adjustment for the digits' position fit an int64.
const maxExponentDigits = 18

// errNotCanonical means a body has no canonical form; it is hashed as bytes.
var errNotCanonical = errors.New("not canonicalisable JSON")

// canonicaliser writes the canonical form of one JSON body in a single pass over its
// tokens. Arrays and scalars are written as they come; an object's members are written
// in input order and put in name order when the object ends.
type canonicaliser struct {
	out     []byte
	tmp     []byte   // unescaped strings and objects being reordered
	frames  []frame  // open arrays and objects, innermost last
	members []member // members of the open objects, innermost object's last
}

// frame is one open array or object.
type frame struct {
	object   bool
	members  int  // index in canonicaliser.members of this object's first member
	wantName bool // the next string in this object is a member name
}

// member is one object member in canonicaliser.out: out[start:end], its decoded name
// out[name:nameEnd].
type member struct {
	start, name, nameEnd, end int
}

// canonical returns the canonical form of body, or errNotCanonical. It is f's until f
// is released.
func (f *fingerprinter) canonical(body []byte) ([]byte, error) {
	if !startsValue(body) {
		return nil, errNotCanonical // and no decoder's error to build
	}
	// UTF-8 (and surrogate escapes) are validated by the decoder.
	f.body = *bytes.NewBuffer(body)
	f.d.Reset(&f.body, allowDuplicateNames...)
	c := &f.c
	c.out = slices.Grow(c.out[:0], len(body)+16)
	c.frames, c.members = c.frames[:0], c.members[:0]
	for {
		if err := c.next(&f.d); err != nil {
			return nil, errNotCanonical
		}
		if len(c.frames) == 0 {
			break
		}
	}
	if _, err := f.d.ReadToken(); err != io.EOF { // exactly one value
		return nil, errNotCanonical
	}
	return c.out, nil
}

// startsValue reports whether body's first byte after JSON whitespace can start a JSON
// value: a quick refusal of most bodies that are not JSON.
func startsValue(body []byte) bool {
	i := 0
	for i < len(body) && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r') {
		i++
	}
	if i == len(body) {
		return false
	}
	switch c := body[i]; c {
	case '{', '[', '"', '-', 't', 'f', 'n':
		return true
	default:
		return c >= '0' && c <= '9'
	}
}

// next reads one token and writes its part of the canonical form.
func (c *canonicaliser) next(d *jsontext.Decoder) error {
	switch kind := d.PeekKind(); kind {
	case '{', '[':
		if _, err := d.ReadToken(); err != nil {
			return err
		}
		if len(c.frames) == MaxCanonicalDepth {
			return errNotCanonical
		}
		object := kind == '{'
		c.frames = append(c.frames, frame{object: object, members: len(c.members), wantName: object})
		tag := byte('a')
		if object {
			tag = 'o'
		}
		c.out = append(c.out, tag)
		return nil
	case '}', ']':
		if _, err := d.ReadToken(); err != nil {
			return err
		}
		f := c.frames[len(c.frames)-1]
		c.frames = c.frames[:len(c.frames)-1]
		if f.object && !c.sortMembers(f.members) {
			return errNotCanonical
		}
		c.out = append(c.out, 'e')
		c.valueDone()
		return nil
	}
	v, err := d.ReadValue() // a scalar: valid only until the next read
	if err != nil {
		return err
	}
	if top := len(c.frames) - 1; top >= 0 && c.frames[top].wantName {
		c.frames[top].wantName = false
		m := member{start: len(c.out)}
		if err := c.appendString(v); err != nil {
			return err
		}
		m.name, m.nameEnd = c.stringStart(m.start), len(c.out)
		c.members = append(c.members, m)
		return nil
	}
	switch v.Kind() {
	case '"':
		err = c.appendString(v)
	case '0':
		c.out, err = appendNumber(c.out, v)
	default: // null, true, false
		c.out = append(c.out, v[0])
	}
	c.valueDone()
	return err
}

// valueDone notes that a whole value was written: in an object, a name comes next.
func (c *canonicaliser) valueDone() {
	if top := len(c.frames) - 1; top >= 0 && c.frames[top].object {
		c.frames[top].wantName = true
	}
}

// stringStart returns where the bytes of the string written at pos begin, after its
// tag and length.
func (c *canonicaliser) stringStart(pos int) int {
	_, n := binary.Uvarint(c.out[pos+1:])
	return pos + 1 + n
}

// appendString writes the JSON string literal raw as its decoded value.
func (c *canonicaliser) appendString(raw []byte) error {
	s := raw[1 : len(raw)-1]
	if bytes.IndexByte(s, '\\') >= 0 {
		var err error
		if c.tmp, err = jsontext.AppendUnquote(c.tmp[:0], raw); err != nil {
			return err
		}
		s = c.tmp
	}
	c.out = append(c.out, 's')
	c.out = binary.AppendUvarint(c.out, uint64(len(s)))
	c.out = append(c.out, s...)
	return nil
}

// sortMembers puts the members of the object that just ended, c.members[first:], in
// name order in c.out and forgets them. It reports false if two have the same name.
func (c *canonicaliser) sortMembers(first int) bool {
	ms := c.members[first:]
	c.members = c.members[:first]
	if len(ms) < 2 {
		return true
	}
	start := ms[0].start
	for i := range ms[:len(ms)-1] {
		ms[i].end = ms[i+1].start
	}
	ms[len(ms)-1].end = len(c.out)
	byName := func(a, b member) int { return bytes.Compare(c.out[a.name:a.nameEnd], c.out[b.name:b.nameEnd]) }
	sorted := slices.IsSortedFunc(ms, byName)
	if !sorted {
		slices.SortFunc(ms, byName)
	}
	for i := 1; i < len(ms); i++ {
		if byName(ms[i-1], ms[i]) == 0 {
			return false
		}
	}
	if sorted {
		return true
	}
	c.tmp = c.tmp[:0]
	for _, m := range ms {
		c.tmp = append(c.tmp, c.out[m.start:m.end]...)
	}
	copy(c.out[start:], c.tmp)
	return true
}

// appendNumber writes the JSON number literal num, which the decoder has validated, as
// its exact decimal value. It fails only if the exponent has more than
// maxExponentDigits significant digits.
func appendNumber(out, num []byte) ([]byte, error) {
	neg := num[0] == '-'
	if neg {
		num = num[1:]
	}
	mant, exp := num, []byte(nil)
	if i := bytes.IndexAny(num, "eE"); i >= 0 {
		mant, exp = num[:i], num[i+1:]
	}
	intPart, frac := mant, []byte(nil)
	if i := bytes.IndexByte(mant, '.'); i >= 0 {
		intPart, frac = mant[:i], mant[i+1:]
	}
	e, ok := parseExponent(exp)
	if !ok {
		return out, errNotCanonical
	}

	// The digits of intPart and frac together, times 10^(e - len(frac)); strip their
	// leading and trailing zeros, moving the exponent for the trailing ones.
	out = append(out, 'd', '+')
	sign := len(out) - 1
	start := len(out)
	out = append(append(out, intPart...), frac...)
	digits := out[start:]
	lead := 0
	for lead < len(digits) && digits[lead] == '0' {
		lead++
	}
	end := len(digits)
	for end > lead && digits[end-1] == '0' {
		end--
	}
	if lead == end { // zero, whatever its sign
		return append(out[:start], "0e0;"...), nil
	}
	if neg {
		out[sign] = '-'
	}
	e += int64(len(digits)-end) - int64(len(frac))
	n := copy(digits, digits[lead:end])
	out = append(out[:start+n], 'e')
	out = strconv.AppendInt(out, e, 10)
	return append(out, ';'), nil
}

// parseExponent returns the value of a number's exponent digits (with an optional
// sign; none means 0), and false if it has more than maxExponentDigits significant
// digits.
func parseExponent(exp []byte) (int64, bool) {
	neg := false
	if len(exp) > 0 && (exp[0] == '-' || exp[0] == '+') {
		neg = exp[0] == '-'
		exp = exp[1:]
	}
	exp = bytes.TrimLeft(exp, "0")
	if len(exp) > maxExponentDigits {
		return 0, false
	}
	var e int64
	for _, c := range exp {
		e = e*10 + int64(c-'0')
	}
	if neg {
		e = -e
	}
	return e, true
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

// Matches reports whether stored, the fingerprint of a key row of the request's flow,
// method and route, was written for the same request (method, route, body), whose
// fingerprint under the flow's member list ms (nil: none) is fp. A row fingerprinted under the same rule
// (v2 without a list; v3 under the same list, by its first fingerprintV3Members bytes,
// the chosen members) is compared by its fingerprint, a v1 row
// by v1's rule. A row fingerprinted under another rule (the flow's member list was set,
// changed or removed since it was written, or differs on another build of the fleet)
// is compared by the whole request, exactly as v2 compares it: an identical request,
// however respelled, matches, and any other does not.
func Matches(stored, fp []byte, method, route string, body []byte, ms *Members) bool {
	switch {
	case bytes.Equal(stored, fp):
		return true
	case len(stored) == fingerprintV1Len:
		return MatchesWhole(stored, method, route, body)
	case ms != nil && ms.sameList(stored):
		return bytes.Equal(stored[:fingerprintV3Members], fp[:fingerprintV3Members])
	case !Known(stored):
		return false
	}
	return bytes.Equal(stored[len(stored)-sha256.Size:], fp[len(fp)-sha256.Size:])
}

// Known reports whether this build knows the version of a stored
// fingerprint: v1 (32 bytes), v2 (the byte 0x02 and a sha256) or v3 (41 bytes from
// 0x03). A later version starts with its own version byte and is never 32 bytes long.
func Known(stored []byte) bool {
	switch len(stored) {
	case fingerprintV1Len:
		return true
	case fingerprintV2Len:
		return stored[0] == fingerprintV2
	case fingerprintV3Len:
		return stored[0] == fingerprintV3
	}
	return false
}

// MatchesWhole reports whether stored, a fingerprint read from a key row, is the
// fingerprint of this request: a v2 fingerprint equal to Fingerprint's, or a v1
// fingerprint (32 bytes, written by releases before v2) equal to the one they computed.
// A stored value of any other length matches nothing, and so does a v3 fingerprint,
// which only a flow's member list can compute (see workflow.Fingerprint). v1 compared numbers as float64,
// so a v1 row still matches a body whose numbers differ only beyond float64's
// precision; such rows age out with retention.
func MatchesWhole(stored []byte, method, route string, body []byte) bool {
	switch len(stored) {
	case fingerprintV2Len:
		return bytes.Equal(stored, Whole(method, route, body))
	case fingerprintV1Len:
		v1 := V1(method, route, body)
		return bytes.Equal(stored, v1[:])
	}
	return false
}

// sameList reports whether a v3 fingerprint was written under this member list.
func (ms *Members) sameList(stored []byte) bool {
	return len(stored) == fingerprintV3Len && stored[0] == fingerprintV3 &&
		bytes.Equal(stored[1:1+fingerprintV3Prefix], ms.hash[:fingerprintV3Prefix])
}

// V1 is the v1 fingerprint, kept to compare key rows written before v2: the
// sha256 of method, route and the body in RFC 8785 canonical form if it is JSON, or
// its bytes.
func V1(method, route string, body []byte) [32]byte {
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

// Member lists, validated when a flow is registered.

// Members is a validated, sorted member list and its hash.
type Members struct {
	pointers [][]string // the reference tokens of each pointer, unescaped, sorted by pointer
	hash     [sha256.Size]byte
}

// NewMembers validates a flow's member list: 1 to 64 distinct JSON pointers, each
// "" (the whole body) or "/" followed by reference tokens separated by "/", in which
// "~" is only ever followed by "0" or "1", at most 1024 bytes of UTF-8. nil or empty
// means no list (nil, nil).
func NewMembers(list []string) (*Members, error) {
	if len(list) == 0 {
		return nil, nil
	}
	if len(list) > maxFingerprintMembers {
		return nil, fmt.Errorf("FingerprintMembers: %d pointers, at most %d", len(list), maxFingerprintMembers)
	}
	sorted := slices.Clone(list)
	slices.Sort(sorted)
	ms := &Members{pointers: make([][]string, len(sorted))}
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
