package workflow_test

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

// FuzzFingerprintSemantic checks both directions of the fingerprint's promise on any
// JSON body: an equivalent spelling (object keys shuffled, whitespace added, numbers
// respelled with the same exact value, strings re-escaped) has the same fingerprint, and
// a change of meaning (one scalar value changed, a number by less than float64 can
// tell, a member added, a key renamed) a different one. pick chooses what changes; seed
// drives the shuffling.
func FuzzFingerprintSemantic(f *testing.F) {
	for _, seed := range []string{
		`{"amount":100,"currency":"usd","source":"tok_visa"}`,
		`{"b":[1,2,{"z":1,"a":2}],"a":"x","n":null,"t":true}`,
		`[1.5,-0,1e300,"\u00e9",false]`,
		`"just a string"`,
		`{"nested":{"deeper":{"k":true,"j":false}},"e":{},"l":[]}`,
		`123456789012345678901234567890`,
		`{"a<b>&":"\u2028\ud83d\ude00"}`,
		`{"amount":9007199254740993,"rate":10.0000000000000001,"tiny":-1e-999999999}`,
		`[]`,
		`{}`,
	} {
		f.Add([]byte(seed), uint16(0), uint64(1))
		f.Add([]byte(seed), uint16(3), uint64(7))
	}
	f.Fuzz(func(t *testing.T, body []byte, pick uint16, seed uint64) {
		v, ok := decodeStrict(body)
		if !ok {
			return // not canonicalisable JSON: hashed as bytes, covered by FuzzFingerprint
		}
		fp := func(b []byte) []byte { return workflow.WholeFingerprint("POST", "/r", b) }
		want := fp(body)
		rng := rand.New(rand.NewPCG(seed, uint64(pick)))

		same := respell(v, rng)
		require.Equal(t, want, fp(same), "an equivalent spelling has the same fingerprint: %q vs %q", body, same)

		changed, ok := mutate(v, int(pick))
		if !ok {
			return
		}
		other := respell(changed, rng)
		require.NotEqual(t, want, fp(other), "a change of meaning changes the fingerprint: %q vs %q", body, other)
	})
}

// respell writes v as JSON with shuffled object keys, random whitespace, numbers in
// another spelling of their exact value and strings escaped as \uXXXX at random.
func respell(v any, rng *rand.Rand) []byte {
	var b bytes.Buffer
	ws := func() {
		for range rng.IntN(3) {
			b.WriteByte(" \t\n\r"[rng.IntN(4)])
		}
	}
	var write func(v any)
	write = func(v any) {
		ws()
		switch x := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
			b.WriteByte('{')
			for i, k := range keys {
				if i > 0 {
					b.WriteByte(',')
				}
				ws()
				writeString(&b, k, rng)
				ws()
				b.WriteByte(':')
				write(x[k])
			}
			ws()
			b.WriteByte('}')
		case []any:
			b.WriteByte('[')
			for i, e := range x {
				if i > 0 {
					b.WriteByte(',')
				}
				write(e)
			}
			ws()
			b.WriteByte(']')
		case json.Number:
			b.WriteString(respellNumber(x, rng))
		case string:
			writeString(&b, x, rng)
		case bool:
			b.WriteString(strconv.FormatBool(x))
		case nil:
			b.WriteString("null")
		}
		ws()
	}
	write(v)
	return b.Bytes()
}

// writeString writes s as a JSON string, escaping each character as \uXXXX (a
// surrogate pair outside the BMP) at random.
func writeString(b *bytes.Buffer, s string, rng *rand.Rand) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\' || r < 0x20 || rng.IntN(2) == 0:
			if r > 0xffff {
				r -= 0x10000
				b.WriteString(`\u` + hex4(0xd800+(r>>10)) + `\u` + hex4(0xdc00+(r&0x3ff)))
			} else {
				b.WriteString(`\u` + hex4(r))
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

func hex4(r rune) string {
	s := strconv.FormatInt(int64(r), 16)
	for len(s) < 4 {
		s = "0" + s
	}
	return s
}

// mutate returns a copy of v whose meaning differs: the pick-th scalar (in document
// order, keys sorted) changed, or, when v has no scalar, a member added. It reports
// false when it found nothing to change.
func mutate(v any, pick int) (any, bool) {
	var scalars int
	count(v, &scalars)
	if scalars == 0 {
		switch x := v.(type) {
		case map[string]any:
			out := map[string]any{}
			for k, e := range x {
				out[k] = e
			}
			key := "added"
			for out[key] != nil {
				key += "_"
			}
			out[key] = json.Number("1")
			return out, true
		case []any:
			return append(slices.Clone(x), json.Number("1")), true
		}
		return nil, false
	}
	target := pick % scalars
	if pick/scalars%2 == 1 {
		if out, ok := renameKey(v, target); ok {
			return out, true
		}
	}
	i := 0
	return change(v, target, &i), true
}

func count(v any, n *int) {
	switch x := v.(type) {
	case map[string]any:
		for _, k := range sortedKeys(x) {
			count(x[k], n)
		}
	case []any:
		for _, e := range x {
			count(e, n)
		}
	default:
		*n++
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// change returns a copy of v with the target-th scalar changed.
func change(v any, target int, i *int) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for _, k := range sortedKeys(x) {
			out[k] = change(x[k], target, i)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for j, e := range x {
			out[j] = change(e, target, i)
		}
		return out
	}
	me := *i
	*i++
	if me != target {
		return v
	}
	switch x := v.(type) {
	case json.Number:
		neg, digits, exp := exactDecimal(x)
		switch {
		case target%2 == 0: // add a unit 20 digits below the last: invisible to float64
			digits += strings.Repeat("0", 19) + "1"
			exp -= 20
		case digits == "":
			digits = "1"
		default:
			neg = !neg
		}
		return json.Number(formatDecimal(neg, digits, exp))
	case string:
		return x + "x"
	case bool:
		return !x
	default: // null
		return false
	}
}

// renameKey renames the key of the object member holding the target-th scalar, if that
// scalar is an object member.
func renameKey(v any, target int) (any, bool) {
	i := 0
	var walk func(v any) (any, bool)
	walk = func(v any) (any, bool) {
		switch x := v.(type) {
		case map[string]any:
			out := make(map[string]any, len(x))
			renamed := false
			for _, k := range sortedKeys(x) {
				e := x[k]
				switch e.(type) {
				case map[string]any, []any:
					ne, ok := walk(e)
					out[k] = ne
					renamed = renamed || ok
					continue
				}
				if i == target {
					nk := k + "_"
					for _, taken := x[nk]; taken; _, taken = x[nk] {
						nk += "_"
					}
					out[nk] = e
					renamed = true
				} else {
					out[k] = e
				}
				i++
			}
			return out, renamed
		case []any:
			out := make([]any, len(x))
			renamed := false
			for j, e := range x {
				switch e.(type) {
				case map[string]any, []any:
					ne, ok := walk(e)
					out[j] = ne
					renamed = renamed || ok
				default:
					out[j] = e
					i++
				}
			}
			return out, renamed
		}
		i++
		return v, false
	}
	return walk(v)
}

// exactDecimal returns the exact value of a JSON number: its sign, its significant
// digits without leading or trailing zeros ("" for zero), and the exponent of the last
// digit. The exponent must fit an int (decodeStrict checks it does).
func exactDecimal(n json.Number) (neg bool, digits string, exp int) {
	s := string(n)
	neg = strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		var err error
		if exp, err = strconv.Atoi(s[i+1:]); err != nil {
			panic(err)
		}
		s = s[:i]
	}
	if i := strings.IndexByte(s, '.'); i >= 0 {
		exp -= len(s) - i - 1
		s = s[:i] + s[i+1:]
	}
	s = strings.TrimLeft(s, "0")
	trimmed := strings.TrimRight(s, "0")
	exp += len(s) - len(trimmed)
	if trimmed == "" {
		return false, "", 0
	}
	return neg, trimmed, exp
}

// formatDecimal writes digits × 10^exp as a JSON number.
func formatDecimal(neg bool, digits string, exp int) string {
	if digits == "" {
		digits = "0"
	}
	s := digits + "e" + strconv.Itoa(exp)
	if neg {
		s = "-" + s
	}
	return s
}

// respellNumber writes n's exact value in one of several spellings: integer digits
// with trailing zeros, a decimal fraction with leading and trailing zeros, scientific
// notation with E or e and an explicit sign, a minus zero.
func respellNumber(n json.Number, rng *rand.Rand) string {
	neg, digits, exp := exactDecimal(n)
	sign := ""
	if neg || (digits == "" && rng.IntN(2) == 0) {
		sign = "-"
	}
	if digits == "" {
		return sign + []string{"0", "0.0", "0e0", "0.000E+12", "0e-3"}[rng.IntN(5)]
	}
	zeros := strings.Repeat("0", rng.IntN(3))
	e := []string{"e", "E", "e+", "E+"}[rng.IntN(4)]
	expo := func(x int) string {
		if x < 0 {
			return []string{"e", "E"}[rng.IntN(2)] + strconv.Itoa(x)
		}
		return e + strconv.Itoa(x)
	}
	switch rng.IntN(4) {
	case 0: // 0.00ddd0e(x)
		lead := strings.Repeat("0", rng.IntN(3))
		return sign + "0." + lead + digits + zeros + expo(exp+len(digits)+len(lead))
	case 1: // d.ddd0e(x)
		return sign + digits[:1] + "." + digits[1:] + "0" + zeros + expo(exp+len(digits)-1)
	case 2: // plain digits when the exponent is small, padded with zeros
		if exp >= 0 && exp <= 30 {
			return sign + digits + strings.Repeat("0", exp) + []string{"", ".0", ".00"}[rng.IntN(3)]
		}
		if exp < 0 && -exp <= 30 {
			point := len(digits) + exp
			if point > 0 {
				return sign + digits[:point] + "." + digits[point:] + zeros
			}
			return sign + "0." + strings.Repeat("0", -point) + digits + zeros
		}
	}
	return sign + digits + zeros + expo(exp-len(zeros))
}
