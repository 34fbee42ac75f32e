package workflow

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"strconv"

	"github.com/go-json-experiment/json/jsontext"
)

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
// single meaning to compare by), when it nests deeper than maxCanonicalDepth, or when a
// number's exponent is written with more than maxExponentDigits significant digits.
// Raw bytes are never equal to a different body, so each of these cases is still exact;
// only respellings of such a body stop being recognised as the same request.

// maxCanonicalDepth bounds how deeply arrays and objects may nest in a canonicalisable
// body. Reordering an object's members copies it once more for each enclosing object,
// so the bound also bounds that work.
const maxCanonicalDepth = 64

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

// canonicalJSON returns the canonical form of body, or errNotCanonical.
func canonicalJSON(body []byte) ([]byte, error) {
	if len(body) == 0 {
		return nil, errNotCanonical
	}
	// Duplicate names are found after sorting, which is cheaper than the decoder's own
	// check; UTF-8 (and surrogate escapes) are validated by the decoder.
	d := jsontext.NewDecoder(bytes.NewBuffer(body), jsontext.AllowDuplicateNames(true))
	c := &canonicaliser{out: make([]byte, 0, len(body)+16)}
	for {
		if err := c.next(d); err != nil {
			return nil, errNotCanonical
		}
		if len(c.frames) == 0 {
			break
		}
	}
	if _, err := d.ReadToken(); err != io.EOF { // exactly one value
		return nil, errNotCanonical
	}
	return c.out, nil
}

// next reads one token and writes its part of the canonical form.
func (c *canonicaliser) next(d *jsontext.Decoder) error {
	switch kind := d.PeekKind(); kind {
	case '{', '[':
		if _, err := d.ReadToken(); err != nil {
			return err
		}
		if len(c.frames) == maxCanonicalDepth {
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
