package migrations

import (
	"regexp"
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
			out = append(out, constraintsApart(s)...)
		}
	}
	for i < len(src) {
		if src[i] == ';' {
			emit(i)
			i++
			start = i
			continue
		}
		i = skip(src, i)
	}
	emit(len(src))
	return out
}

// alterTable matches the head of an ALTER TABLE statement: its target and the rest.
var alterTable = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+((?:ONLY\s+)?[A-Za-z_][A-Za-z0-9_.]*)\s+(.*)$`)

// constraintsApart splits an ALTER TABLE statement whose subcommands all add a
// constraint into one ALTER TABLE a constraint, in order: Citus refuses an ALTER TABLE
// that adds a constraint beside other subcommands on a distributed table, and a
// released migration file is never edited (002's down file adds thirteen in one). In
// one transaction the two forms leave the same table. Any other statement is returned
// as it is; leading comments stay with the first part.
func constraintsApart(stmt string) []string {
	at := codeStart(stmt)
	m := alterTable.FindStringSubmatch(stmt[at:])
	if m == nil {
		return []string{stmt}
	}
	parts := topLevelCommas(m[2])
	if len(parts) < 2 {
		return []string{stmt}
	}
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		p = strings.TrimSpace(p)
		if !hasPrefixFold(p, "ADD CONSTRAINT") {
			return []string{stmt}
		}
		out = append(out, "ALTER TABLE "+m[1]+" "+p)
	}
	out[0] = stmt[:at] + out[0]
	return out
}

// codeStart returns the index of s's first byte that is neither a comment nor white
// space.
func codeStart(s string) int {
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "--"):
			i = lineEnd(s, i)
		case strings.HasPrefix(s[i:], "/*"):
			i = blockCommentEnd(s, i)
		case s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f':
			i++
		default:
			return i
		}
	}
	return len(s)
}

// topLevelCommas splits s at the commas outside parentheses, comments, string
// literals, quoted identifiers and dollar-quoted bodies.
func topLevelCommas(s string) []string {
	var out []string
	start, depth := 0, 0
	for i := 0; i < len(s); {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
		i = skip(s, i)
	}
	return append(out, s[start:])
}

// skip returns the index just past what starts at s[i]: a comment, a string literal, a
// quoted identifier or a dollar-quoted body whole (to the end of s when it is not
// closed: the server reports that), any other byte alone.
func skip(s string, i int) int {
	switch c := s[i]; {
	case c == '-' && strings.HasPrefix(s[i:], "--"):
		return lineEnd(s, i)
	case c == '/' && strings.HasPrefix(s[i:], "/*"):
		return blockCommentEnd(s, i)
	case c == '\'':
		return quotedEnd(s, i+1, '\'', precededByE(s, i))
	case c == '"':
		return quotedEnd(s, i+1, '"', false)
	case c == '$':
		tag, ok := dollarTag(s, i)
		if !ok {
			return i + 1
		}
		if end := strings.Index(s[i+len(tag):], tag); end >= 0 {
			return i + len(tag) + end + len(tag)
		}
		return len(s)
	}
	return i + 1
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// hasCode reports whether s holds anything but comments and white space.
func hasCode(s string) bool { return codeStart(s) < len(s) }

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
