package attempt

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// sqlCases are statement texts with what PostgreSQL's lexer makes of them
// (standard_conforming_strings on): how many statements, or whether a quote or
// comment does not end. TestStatementsAsTheServerReads checks them against the server.
var sqlCases = []struct {
	sql        string
	statements int
	unended    bool
}{
	{sql: "SELECT 1", statements: 1},
	{sql: "SELECT 1;", statements: 1},
	{sql: "SELECT 1 ;  \n\t", statements: 1},
	{sql: "SELECT 1; -- done", statements: 1},
	{sql: "SELECT 1; /* done */", statements: 1},
	{sql: "SELECT 1;;", statements: 1},
	{sql: "; SELECT 1", statements: 1},
	{sql: "SELECT 1; SELECT 2", statements: 2},
	{sql: "SELECT 1;SELECT 2;", statements: 2},
	{sql: "SELECT 1; COMMIT", statements: 2},
	{sql: "SELECT 1; SELECT 2; SELECT 3", statements: 3},
	{sql: "", statements: 0},
	{sql: " \n ", statements: 0},
	{sql: ";", statements: 0},
	{sql: "-- only a comment", statements: 0},
	{sql: "/* only */ ; /* comments */", statements: 0},
	// string literals
	{sql: "SELECT 'a;b'", statements: 1},
	{sql: "SELECT 'it''s; fine'", statements: 1},
	{sql: `SELECT 'C:\'; SELECT 2`, statements: 2}, // a backslash is a character in a plain string
	{sql: `SELECT '\\'; SELECT 2`, statements: 2},
	{sql: "SELECT ''; SELECT 2", statements: 2},
	{sql: "SELECT 'a;b", unended: true},
	// E'' strings: a backslash escapes the quote
	{sql: `SELECT E'\';'`, statements: 1},
	{sql: `SELECT e'\'; SELECT 2'`, statements: 1},
	{sql: `SELECT E'\\'; SELECT 2`, statements: 2},
	{sql: `SELECT E'a''b;c'`, statements: 1},
	{sql: `SELECT E'\';`, unended: true},
	{sql: `SELECT 1 AS e, E'\';' AS f`, statements: 1},
	{sql: `SELECT typE'\'; SELECT 2`, statements: 2}, // not an E'' string: "typE" is one word
	{sql: `SELECT x'1F', b'01'; SELECT 2`, statements: 2},
	{sql: `SELECT N'a;b', U&'c;d'`, statements: 1},
	// a string continued after a newline keeps its kind
	{sql: "SELECT E'a'\n'\\'; SELECT 2'", statements: 1},
	{sql: "SELECT E'a' -- note\n  '\\''; SELECT 2", statements: 2},
	{sql: "SELECT 'a'\n'\\''; SELECT 2; '", statements: 1},
	{sql: "SELECT 'a' || '\\'; SELECT 2", statements: 2}, // no newline: not a continuation
	// quoted identifiers
	{sql: `SELECT 1 AS "a;b"`, statements: 1},
	{sql: `SELECT 1 AS "a"";b"`, statements: 1},
	{sql: `SELECT 1 AS "a\"; SELECT 2`, statements: 2},
	{sql: `SELECT 1 AS "a;b`, unended: true},
	// dollar quotes
	{sql: "SELECT $$a;b$$", statements: 1},
	{sql: "SELECT $tag$a;$$;b$tag$", statements: 1},
	{sql: "SELECT $tag$a;$TAG$;b$tag$; SELECT 2", statements: 2},
	{sql: "SELECT $a$x$ba$;$a$", statements: 1},
	{sql: "SELECT $_1$;$_1$", statements: 1},
	{sql: "SELECT $tag$a;b", unended: true},
	{sql: "SELECT $1::int; SELECT 2", statements: 2},
	{sql: "SELECT 1 AS a$b$; SELECT 2", statements: 2}, // a$b$ is an identifier
	// comments
	{sql: "SELECT 1 -- ;\n", statements: 1},
	{sql: "SELECT 1 -- ; SELECT 2", statements: 1},
	{sql: "SELECT 1 -- x\r; SELECT 2", statements: 2},
	{sql: "SELECT 1 /* ; */", statements: 1},
	{sql: "SELECT 1 /* /* ; */ ; */", statements: 1},
	{sql: "SELECT 1 /* /* ; */ */; SELECT 2", statements: 2},
	{sql: "SELECT 1 /*/ ; */", statements: 1},
	{sql: "SELECT 2 */* ; */ 3", statements: 1},
	{sql: "SELECT 1 /* /* ; */", unended: true},
	{sql: "SELECT '--', '/*'; SELECT 2", statements: 2},
	{sql: "SELECT $$--$$; SELECT 2", statements: 2},
	// a number, then E and a quote: an E'' string before PostgreSQL 15, "trailing
	// junk" since; read as the former, the stricter reading
	{sql: "SELECT 1.5e3, .5; SELECT 2", statements: 2},
	{sql: `SELECT 1e'\'; SELECT 2'`, statements: 1},
	{sql: `SELECT 1.5E'\'; SELECT 2'`, statements: 1},
	{sql: `SELECT $1E'\'; SELECT 2'`, statements: 1},
	{sql: "DO $$ BEGIN PERFORM 1; END $$", statements: 1},
}

func TestReadSQL(t *testing.T) {
	t.Parallel()
	for _, c := range sqlCases {
		sh, err := readSQL(c.sql)
		if c.unended {
			if err == nil {
				t.Errorf("readSQL(%q): no error, want an unended quote or comment", c.sql)
			}
			continue
		}
		if err != nil || sh.statements != c.statements {
			t.Errorf("readSQL(%q) = %d statements, %v; want %d", c.sql, sh.statements, err, c.statements)
		}
	}
}

// TestStatementsAsTheServerReads holds readSQL to the server's own lexer: each text
// of sqlCases is parsed (the protocol's Parse, which runs nothing) on a real server
// with standard_conforming_strings on, which refuses a text of more than one statement
// ("cannot insert multiple commands into a prepared statement") and one whose quote
// or comment does not end, before it looks up any name.
func TestStatementsAsTheServerReads(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	pc := conn.Conn().PgConn()
	require.Equal(t, "on", pc.ParameterStatus("standard_conforming_strings"))
	for _, c := range sqlCases {
		_, err := pc.Prepare(ctx, "", c.sql, nil)
		var pgErr *pgconn.PgError
		multiple := errors.As(err, &pgErr) && strings.Contains(pgErr.Message, "multiple commands")
		unended := errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Message, "unterminated")
		switch {
		case c.unended:
			assert.True(t, unended, "%q: the server read it whole (%v)", c.sql, err)
		case c.statements > 1:
			assert.True(t, multiple, "%q: the server read one statement (%v)", c.sql, err)
		default:
			assert.False(t, multiple || unended, "%q: the server read more than one statement: %v", c.sql, err)
		}
	}
}

// TestCheckStatement: a pipelined phase's statement is refused, for good, unless it
// is exactly one statement (one trailing semicolon and comments allowed) that neither
// opens nor ends the transaction; transaction control is found after any leading
// blanks, comments and parentheses, however the words are delimited.
func TestCheckStatement(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		sql     string
		refused bool
		managed bool // refused with phases.ErrTxManaged
		block   bool
	}{
		{sql: "INSERT INTO t VALUES (1)"},
		{sql: "INSERT INTO t VALUES (1);"},
		{sql: "INSERT INTO t VALUES (1); -- the row\n"},
		{sql: "INSERT INTO t VALUES ('x;y')"},
		{sql: "INSERT INTO t VALUES (1); COMMIT", refused: true},
		{sql: "INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)", refused: true},
		{sql: `INSERT INTO t VALUES (E'\';'); COMMIT`, refused: true},
		{sql: "INSERT INTO t VALUES (1) /*", refused: true},
		{sql: "INSERT INTO t VALUES ('1)", refused: true},
		{sql: "", refused: true},
		{sql: ";", refused: true},
		{sql: "COMMIT", refused: true, managed: true},
		{sql: "commit;", refused: true, managed: true},
		{sql: "COMMIT/* x */", refused: true, managed: true},
		{sql: "END--x\n", refused: true, managed: true},
		{sql: "-- note\rROLLBACK", refused: true, managed: true},
		{sql: "/* a /* b */ a */ ABORT", refused: true, managed: true},
		{sql: "( BEGIN", refused: true, managed: true},
		{sql: "start transaction", refused: true, managed: true},
		{sql: "SAVEPOINT s", refused: true, managed: true},
		{sql: "RELEASE s", refused: true, managed: true},
		{sql: "PREPARE/**/TRANSACTION 'x'", refused: true, managed: true},
		{sql: "PREPARE q AS SELECT 1"},
		{sql: `SELECT 1 AS "COMMIT"`},
		{sql: `"commit"`}, // a quoted identifier is no command (the server refuses the syntax)
		{sql: "DO $$ BEGIN COMMIT; END $$", block: true},
		{sql: "/* x */ CALL p()", block: true},
		{sql: "LOCK TABLE t", block: true},
		{sql: "declare c cursor for select 1", block: true},
	} {
		block, why, err := checkStatement(c.sql)
		if refused := why != ""; refused != c.refused {
			t.Errorf("checkStatement(%q) refused %v (%s), want %v", c.sql, refused, why, c.refused)
		}
		if managed := errors.Is(err, phases.ErrTxManaged); managed != c.managed {
			t.Errorf("checkStatement(%q): transaction control %v, want %v", c.sql, managed, c.managed)
		}
		if block != c.block {
			t.Errorf("checkStatement(%q): needs a block %v, want %v", c.sql, block, c.block)
		}
	}
}

// FuzzReadSQL: readSQL never panics, and a text it reads whole keeps its statements
// to itself when another follows it as pgx joins a simple-protocol batch ("\n;"): the
// join reads as one statement more.
func FuzzReadSQL(f *testing.F) {
	for _, c := range sqlCases {
		f.Add(c.sql)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		sh, err := readSQL(sql)
		if err != nil {
			return
		}
		joined, err := readSQL(sql + "\n;SELECT 1")
		if err != nil || joined.statements != sh.statements+1 {
			t.Fatalf("%q: %d statements, %d (%v) once joined with the next", sql, sh.statements, joined.statements, err)
		}
	})
}
