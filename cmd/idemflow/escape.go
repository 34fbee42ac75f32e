package main

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Client text (scopes, keys, request bodies, errors, history) may hold anything: a row
// written before the edge refused control characters, or by another tool. The CLI never
// prints it raw, so that nothing a client sent can move the operator's cursor, clear
// the screen or recolour the terminal.
//
// The table form escapes, as Go's strconv.Quote does, every rune that is not printable
// (unicode.IsPrint) other than the ASCII space: C0 controls (\n, \t, \x1b, ...), DEL
// (\x7f), C1 controls (\u0085, \u009b, ...) and other invisible runes such as bidi
// overrides (\u202e); every byte that is not part of valid UTF-8 is written \xNN.
// Quotes and backslashes are left as they are, so the visible form is for reading;
// -json gives the exact text.
//
// The JSON form (-json) is what encoding/json writes (C0 as \u00XX, invalid UTF-8 as
// U+FFFD), with every other non-printable rune also written as a \uXXXX escape, so a
// decoder gets the same text back and a terminal gets no raw control.

// escape is s with every non-printable rune and invalid byte escaped (see above).
func escape(s string) string {
	if printable(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == ' ' || unicode.IsPrint(r):
			b.WriteString(s[i : i+n])
		case r < utf8.RuneSelf:
			b.WriteString(asciiEscape(byte(r)))
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
		i += n
	}
	return b.String()
}

// printable says whether s is valid UTF-8 of printable runes and spaces only.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c >= 0x7f {
			return utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return r != ' ' && !unicode.IsPrint(r) }) < 0
		}
	}
	return true
}

// asciiEscape is the escape of an ASCII control byte, as strconv.Quote writes it.
func asciiEscape(c byte) string {
	switch c {
	case '\a':
		return `\a`
	case '\b':
		return `\b`
	case '\f':
		return `\f`
	case '\n':
		return `\n`
	case '\r':
		return `\r`
	case '\t':
		return `\t`
	case '\v':
		return `\v`
	}
	return fmt.Sprintf(`\x%02x`, c)
}

// escapeJSON rewrites encoding/json's output so that no non-printable rune is left raw:
// each becomes a \uXXXX escape (two, a surrogate pair, above U+FFFF). encoding/json
// already escapes C0 (not DEL) and writes valid UTF-8, and outside strings it writes only ASCII,
// so every rune changed here is inside a string and the value decodes the same.
func escapeJSON(b []byte) []byte {
	if printable(string(b)) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		switch {
		case r < 0x7f || unicode.IsPrint(r) || r == utf8.RuneError:
			out = append(out, b[i:i+n]...)
		case r <= 0xffff:
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		}
		i += n
	}
	return out
}
