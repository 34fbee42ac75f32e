package attempt

import (
	"errors"
	"fmt"
	"strings"

	"github.com/idemflow/idemflow/phases"

	"github.com/idemflow/idemflow/internal/vocab"
)

// A pipelined phase's statement must be exactly one SQL statement that neither opens
// nor ends the transaction. In pgx's simple-protocol exec mode a batch is one query
// string, its statements joined by semicolons, so a text such as `INSERT …; COMMIT`
// would commit the claim, the key row's insert and the statements before it whatever
// the rest does; a quote or comment that does not end would swallow the engine's
// statements after it. The checks read the text as PostgreSQL's lexer does
// (src/backend/parser/scan.l) with standard_conforming_strings on, the only setting
// pgx sends the simple protocol with; the extended protocol's modes send each
// statement alone, and the server refuses a text of more than one there.

// sqlShape is what the checks read from a statement's text.
type sqlShape struct {
	// statements is how many statements the text holds: pieces between semicolons
	// outside quotes and comments that hold a token. Empty pieces (a trailing
	// semicolon) are nothing to the server and count for nothing.
	statements int
	// first and second are the first statement's first two words, when it starts
	// with a word (after blanks, comments and opening parentheses).
	first, second string
}

// readSQL reads sql's shape. It fails when a quoted string, quoted identifier,
// dollar-quoted string or block comment does not end; the shape then holds what was
// read before it.
func readSQL(sql string) (sqlShape, error) {
	var sh sqlShape
	inStmt := false // the current piece holds a token
	head := 0       // words read at the start of the first statement; -1 once past it
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case isSpace(c):
			i++
			continue
		case c == '-' && at(sql, i+1) == '-':
			i = lineEnd(sql, i)
			continue
		case c == '/' && at(sql, i+1) == '*':
			end, ok := blockCommentEnd(sql, i)
			if !ok {
				return sh, errors.New("a block comment does not end")
			}
			i = end
			continue
		case c == ';':
			inStmt = false
			i++
			continue
		}
		if !inStmt {
			inStmt = true
			sh.statements++
		}
		start := i
		var err error
		word := false
		switch {
		case c == '\'':
			i, err = quoteEnd(sql, i+1, '\'', false)
		case c == '"':
			i, err = quoteEnd(sql, i+1, '"', false)
		case (c == 'E' || c == 'e') && at(sql, i+1) == '\'':
			i, err = quoteEnd(sql, i+2, '\'', true)
		case c == '$':
			i, err = dollarEnd(sql, i)
		case identStart(c):
			i, word = identEnd(sql, i), true
		case isDigit(c) || c == '.' && isDigit(at(sql, i+1)):
			i = numberEnd(sql, i)
		default: // an operator's or punctuation's character
			i++
		}
		if err != nil {
			return sh, err
		}
		head = sh.headWord(head, sql[start:i], word)
	}
	return sh, nil
}

// headWord records tok, a token of the text, if it is one of the first statement's
// first two words, and returns how many of them were read (-1: no more to read).
func (sh *sqlShape) headWord(head int, tok string, word bool) int {
	switch {
	case head < 0 || sh.statements != 1:
		return -1
	case head == 0 && tok == "(":
		return 0
	case !word:
		return -1
	case head == 0:
		sh.first = tok
		return 1
	}
	sh.second = tok
	return -1
}

// txControl reports whether the statement opens or ends a transaction. In the phase's
// transaction a COMMIT would commit the claim, the key row's write and the statements
// before it whatever the statements after it do (an implicit transaction commits at
// each such command), BEGIN would leave it open, ROLLBACK or a savepoint's would undo
// the claim or fence while the rest runs.
func (sh sqlShape) txControl() bool {
	switch strings.ToUpper(sh.first) {
	case "BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE":
		return true
	case "PREPARE":
		return strings.EqualFold(sh.second, "TRANSACTION")
	}
	return false
}

// blockOnly reports whether the statement must run inside a transaction block: DO and
// CALL, whose COMMIT would commit an implicit transaction's claim and key row's write
// ahead of the statements after them (inside a block they may not commit), and LOCK
// and DECLARE, which the server refuses outside one.
func (sh sqlShape) blockOnly() bool {
	switch strings.ToUpper(sh.first) {
	case "DO", "CALL", "LOCK", "DECLARE":
		return true
	}
	return false
}

// checkStatement reads a pipelined phase's statement: whether it needs a transaction
// block (blockOnly), and why it is refused, if it is: its text is not exactly one
// statement, a quote or comment in it does not end, or it opens or ends a transaction.
func checkStatement(sql string) (block bool, why string, err error) {
	sh, err := readSQL(sql)
	switch {
	case err != nil:
		return false, err.Error() + ", so it would swallow the statements sent after it", nil
	case sh.statements == 0:
		return false, "holds no statement (only blanks, comments or semicolons)", nil
	case sh.statements > 1:
		return false, fmt.Sprintf("holds %d statements separated by semicolons; queue each statement on its own", sh.statements), nil
	case sh.txControl():
		return false, "would end or open the phase's transaction", phases.ErrTxManaged
	}
	return sh.blockOnly(), "", nil
}

// statementError is a pipelined phase's statement that the engine refused before
// anything of the phase was sent. A retry would be refused the same way, so it is
// permanent as the server's refusal of a syntax error is: errors.Is(err, ErrRefused).
type statementError struct {
	phase string
	index int
	sql   string
	why   string
	err   error // phases.ErrTxManaged for transaction control, or nil
}

func (e *statementError) Error() string {
	return fmt.Sprintf("pipelined phase %q: statement %d (%.80q) refused before anything was sent: %s", e.phase, e.index, e.sql, e.why)
}

func (e *statementError) Unwrap() error { return e.err }

// Is makes the refusal ErrRefused.
func (e *statementError) Is(target error) bool { return target == vocab.ErrRefused }

// quoteEnd returns the index after the quoted string or identifier whose body starts
// at i, quoted by q (a doubled q stands for itself). escapes: an E'…' string, where a
// backslash escapes the byte after it. A single-quoted string continues after a
// newline and a quote (quoteContinues), in the same mode.
func quoteEnd(sql string, i int, q byte, escapes bool) (int, error) {
	for i < len(sql) {
		switch c := sql[i]; {
		case escapes && c == '\\':
			i += 2
		case c == q && at(sql, i+1) == q:
			i += 2
		case c == q:
			next, ok := quoteContinues(sql, i+1)
			if q != '\'' || !ok {
				return i + 1, nil
			}
			i = next
		default:
			i++
		}
	}
	if q == '"' {
		return 0, errors.New("a quoted identifier does not end")
	}
	return 0, errors.New("a quoted string does not end")
}

// quoteContinues reports whether, after a single-quoted string that ended at i, the
// text goes on with blanks and line comments holding a newline, then a quote: the
// server reads the two as one string (scan.l's quotecontinue), whose body goes on
// after the index it returns.
func quoteContinues(sql string, i int) (int, bool) {
	newline := false
	for i < len(sql) {
		switch c := sql[i]; {
		case c == '\n' || c == '\r':
			newline = true
			i++
		case isSpace(c):
			i++
		case c == '-' && at(sql, i+1) == '-':
			i = lineEnd(sql, i)
			if i == len(sql) {
				return 0, false // a comment that the text ends in is not followed by a newline
			}
		case c == '\'' && newline:
			return i + 1, true
		default:
			return 0, false
		}
	}
	return 0, false
}

// dollarEnd returns the index after the token that starts with the $ at i: a
// dollar-quoted string ($tag$…$tag$), a parameter ($1) or a lone $.
func dollarEnd(sql string, i int) (int, error) {
	j := i + 1
	if isDigit(at(sql, j)) {
		for isDigit(at(sql, j)) {
			j++
		}
		return j, nil
	}
	if identStart(at(sql, j)) {
		for identStart(at(sql, j)) || isDigit(at(sql, j)) {
			j++
		}
	}
	if at(sql, j) != '$' {
		return i + 1, nil
	}
	delim := sql[i : j+1]
	end := strings.Index(sql[j+1:], delim)
	if end < 0 {
		return 0, fmt.Errorf("a dollar-quoted string (%s) does not end", delim)
	}
	return j + 1 + end + len(delim), nil
}

// blockCommentEnd returns the index after the block comment that starts at i; block
// comments nest. False when it does not end.
func blockCommentEnd(sql string, i int) (int, bool) {
	depth := 0
	for ; i+1 < len(sql); i++ {
		switch {
		case sql[i] == '/' && sql[i+1] == '*':
			depth++
			i++
		case sql[i] == '*' && sql[i+1] == '/':
			depth--
			i++
			if depth == 0 {
				return i + 1, true
			}
		}
	}
	return 0, false
}

// lineEnd returns the index of the newline that ends the line comment at i, or the
// text's end.
func lineEnd(sql string, i int) int {
	if j := strings.IndexAny(sql[i:], "\n\r"); j >= 0 {
		return i + j
	}
	return len(sql)
}

// identEnd returns the index after the identifier or keyword at i.
func identEnd(sql string, i int) int {
	for i++; i < len(sql); i++ {
		if c := sql[i]; !identStart(c) && !isDigit(c) && c != '$' {
			break
		}
	}
	return i
}

// numberEnd returns the index after the number at i: digits, a fraction, an exponent
// with digits. What follows starts a token of its own (an E and a quote after a
// number start an E'…' string, the stricter reading).
func numberEnd(sql string, i int) int {
	for isDigit(at(sql, i)) {
		i++
	}
	if at(sql, i) == '.' && at(sql, i+1) != '.' {
		for i++; isDigit(at(sql, i)); i++ {
		}
	}
	if c := at(sql, i); c == 'e' || c == 'E' {
		j := i + 1
		if s := at(sql, j); s == '+' || s == '-' {
			j++
		}
		if isDigit(at(sql, j)) {
			for i = j; isDigit(at(sql, i)); i++ {
			}
		}
	}
	return i
}

// at is sql[i], or 0 past its end.
func at(sql string, i int) byte {
	if i < len(sql) {
		return sql[i]
	}
	return 0
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// identStart reports whether c can start an identifier: a letter, an underscore or a
// byte of a multibyte character.
func identStart(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || c >= 0x80
}

// topTxControl returns the index in sql, a statement text of a Go-code tx phase, of
// its first statement that ends or opens the top-level transaction, or -1 if none
// does: BEGIN, START TRANSACTION, COMMIT (and COMMIT PREPARED), END, ABORT, ROLLBACK
// (and ROLLBACK PREPARED) unless it is ROLLBACK [WORK | TRANSACTION] TO, and PREPARE
// TRANSACTION. A savepoint's statements (SAVEPOINT, RELEASE, ROLLBACK TO) end no
// transaction; blanks, comments and opening parentheses before a statement's first
// word are skipped, as in checkStatement. backslash: plain '…' strings read backslash
// escapes, as the server does with standard_conforming_strings off. A quote or comment
// that does not end stops the reading: the server refuses such a text as a whole
// before it runs any of it, in every protocol.
//
// A text without a semicolon is one statement, so one whose first byte (after blanks)
// starts a word other than those keywords holds no transaction control; that is the
// hot path's case and costs a scan for ';' and one word.
func topTxControl(sql string, backslash bool) int {
	if !mayHoldTxControl(sql) {
		return -1
	}
	head, start := headStart, -1
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case isSpace(c):
			i++
			continue
		case c == '-' && at(sql, i+1) == '-':
			i = lineEnd(sql, i)
			continue
		case c == '/' && at(sql, i+1) == '*':
			end, ok := blockCommentEnd(sql, i)
			if !ok {
				return -1
			}
			i = end
			continue
		case c == ';':
			if head.pending() {
				return start
			}
			head, start = headStart, -1
			i++
			continue
		}
		if start < 0 {
			start = i
		}
		from := i
		end, word, err := tokenEnd(sql, i, backslash)
		if err != nil {
			return -1
		}
		i = end
		if head = head.next(sql[from:i], word); head == headControl {
			return start
		}
	}
	if head.pending() {
		return start
	}
	return -1
}

// mayHoldTxControl is topTxControl's exact pre-check: false when sql holds no
// semicolon (so one statement at most) and starts, after blanks, with a word that
// opens no transaction control statement.
func mayHoldTxControl(sql string) bool {
	if strings.IndexByte(sql, ';') >= 0 {
		return true
	}
	i := 0
	for i < len(sql) && isSpace(sql[i]) {
		i++
	}
	if i == len(sql) {
		return false
	}
	if !identStart(sql[i]) {
		return true // a comment, a parenthesis: read it all
	}
	return txHeadWord(headStart, sql[i:identEnd(sql, i)]) != headOther
}

// txHead is how much of a statement's head topTxControl has read.
type txHead int8

const (
	headStart        txHead = iota // no token of the statement yet (or only parentheses)
	headRollback                   // ROLLBACK: TO, WORK or TRANSACTION may follow
	headRollbackWork               // ROLLBACK WORK or ROLLBACK TRANSACTION: TO may follow
	headPrepare                    // PREPARE: TRANSACTION may follow
	headOther                      // not transaction control: read on to the next statement
	headControl                    // transaction control
)

// pending reports whether the statement is transaction control if it ends here: a
// ROLLBACK not followed by TO.
func (h txHead) pending() bool { return h == headRollback || h == headRollbackWork }

// next is the head after tok, a token of the statement (word: a keyword or
// identifier).
func (h txHead) next(tok string, word bool) txHead {
	switch {
	case h == headOther:
		return headOther
	case h == headStart && tok == "(":
		return headStart
	case !word && h.pending():
		return headControl
	case !word:
		return headOther
	}
	return txHeadWord(h, tok)
}

// txHeadWord is the head after the word w.
func txHeadWord(h txHead, w string) txHead {
	switch h {
	case headStart:
		switch {
		case oneOf(w, "BEGIN", "START", "COMMIT", "END", "ABORT"):
			return headControl
		case strings.EqualFold(w, "ROLLBACK"):
			return headRollback
		case strings.EqualFold(w, "PREPARE"):
			return headPrepare
		}
		return headOther
	case headRollback, headRollbackWork:
		switch {
		case strings.EqualFold(w, "TO"):
			return headOther
		case h == headRollback && oneOf(w, "WORK", "TRANSACTION"):
			return headRollbackWork
		}
		return headControl
	case headPrepare:
		if strings.EqualFold(w, "TRANSACTION") {
			return headControl
		}
	}
	return headOther
}

// oneOf reports whether w is one of the keywords, in any case.
func oneOf(w string, keywords ...string) bool {
	for _, k := range keywords {
		if len(w) == len(k) && strings.EqualFold(w, k) {
			return true
		}
	}
	return false
}

// tokenEnd returns the index after the token that starts at i (not a blank, comment
// or semicolon), and whether it is a word, as readSQL reads it. backslash: a plain
// '…' string reads backslash escapes.
func tokenEnd(sql string, i int, backslash bool) (int, bool, error) {
	c := sql[i]
	switch {
	case c == '\'':
		end, err := quoteEnd(sql, i+1, '\'', backslash)
		return end, false, err
	case c == '"':
		end, err := quoteEnd(sql, i+1, '"', false)
		return end, false, err
	case (c == 'E' || c == 'e') && at(sql, i+1) == '\'':
		end, err := quoteEnd(sql, i+2, '\'', true)
		return end, false, err
	case c == '$':
		end, err := dollarEnd(sql, i)
		return end, false, err
	case identStart(c):
		return identEnd(sql, i), true, nil
	case isDigit(c) || c == '.' && isDigit(at(sql, i+1)):
		return numberEnd(sql, i), false, nil
	}
	return i + 1, false, nil // an operator's or punctuation's character
}
