package migrations

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// statements splits a migration file into its SQL statements, in order, at the
// semicolons that end them: those outside comments (-- and nested /* */), string
// literals ('...', E'...' with backslash escapes), quoted identifiers and dollar-quoted
// bodies ($$...$$, $tag$...$tag$). Each statement keeps its own text (comments
// included) without the semicolon; parts with nothing but comments and blanks are
// dropped. Citus refuses some multi-statement queries that PostgreSQL runs, so the
// migrator sends a file one statement at a time.
func statements(src string) []string {
	var out []string
	start, i := 0, 0
	emit := func(end int) {
		if s := strings.TrimSpace(src[start:end]); hasCode(s) {
			out = append(out, s)
		}
	}
	for i < len(src) {
		switch c := src[i]; {
		case c == ';':
			emit(i)
			i++
			start = i
		case c == '-' && strings.HasPrefix(src[i:], "--"):
			i = lineEnd(src, i)
		case c == '/' && strings.HasPrefix(src[i:], "/*"):
			i = blockCommentEnd(src, i)
		case c == '\'':
			i = quotedEnd(src, i+1, '\'', precededByE(src, i))
		case c == '"':
			i = quotedEnd(src, i+1, '"', false)
		case c == '$':
			if tag, ok := dollarTag(src, i); ok {
				if end := strings.Index(src[i+len(tag):], tag); end >= 0 {
					i += len(tag) + end + len(tag)
				} else {
					i = len(src) // unterminated: the server reports it
				}
			} else {
				i++
			}
		default:
			i++
		}
	}
	emit(len(src))
	return out
}

// hasCode reports whether s holds anything but comments and white space.
func hasCode(s string) bool {
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "--"):
			i = lineEnd(s, i)
		case strings.HasPrefix(s[i:], "/*"):
			i = blockCommentEnd(s, i)
		case s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f':
			i++
		default:
			return true
		}
	}
	return false
}

// lineEnd returns the index just past the end of the line holding i.
func lineEnd(s string, i int) int {
	if n := strings.IndexByte(s[i:], '\n'); n >= 0 {
		return i + n + 1
	}
	return len(s)
}

// blockCommentEnd returns the index just past the /* */ comment opening at i; such
// comments nest in PostgreSQL.
func blockCommentEnd(s string, i int) int {
	depth := 0
	for i < len(s) {
		switch {
		case strings.HasPrefix(s[i:], "/*"):
			depth++
			i += 2
		case strings.HasPrefix(s[i:], "*/"):
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return len(s)
}

// quotedEnd returns the index just past the closing quote of a literal whose text
// starts at i; a doubled quote stands for itself, and with backslashes a backslash
// escapes the next byte.
func quotedEnd(s string, i int, quote byte, backslashes bool) int {
	for i < len(s) {
		switch c := s[i]; {
		case backslashes && c == '\\':
			i += 2
		case c == quote && i+1 < len(s) && s[i+1] == quote:
			i += 2
		case c == quote:
			return i + 1
		default:
			i++
		}
	}
	return len(s)
}

// precededByE reports whether the quote at i opens an escape string (E'...'): an E
// that does not end a longer identifier.
func precededByE(s string, i int) bool {
	if i == 0 || (s[i-1] != 'E' && s[i-1] != 'e') {
		return false
	}
	if i == 1 {
		return true
	}
	r, _ := utf8.DecodeLastRuneInString(s[:i-1])
	return !isIdentRune(r)
}

// dollarTag returns the dollar-quote delimiter ($$ or $tag$) opening at i, if one does:
// a $ that ends an identifier (a$b) or opens a parameter ($1) opens none.
func dollarTag(s string, i int) (string, bool) {
	if i > 0 {
		if r, _ := utf8.DecodeLastRuneInString(s[:i]); isIdentRune(r) {
			return "", false
		}
	}
	j := i + 1
	for j < len(s) && s[j] != '$' {
		r, size := utf8.DecodeRuneInString(s[j:])
		if !isIdentRune(r) || (j == i+1 && unicode.IsDigit(r)) {
			return "", false
		}
		j += size
	}
	if j >= len(s) {
		return "", false
	}
	return s[i : j+1], true
}

// isIdentRune reports whether r may continue an unquoted SQL identifier.
func isIdentRune(r rune) bool {
	return r == '_' || r == '$' || unicode.IsLetter(r) || unicode.IsDigit(r)
}
