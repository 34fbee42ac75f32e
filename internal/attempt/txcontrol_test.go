package attempt

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestTopTxControl: a Go-code tx phase's statement text is refused when any of its
// statements ends or opens the top-level transaction, whatever blanks, comments and
// parentheses come first and however the words are delimited; savepoints' statements
// and texts without transaction control pass, however many statements they hold.
func TestTopTxControl(t *testing.T) {
	t.Parallel()
	for _, c := range txControlCases {
		want := -1
		if c.control != "" {
			want = len(c.sql) - len(c.control)
		}
		if got := topTxControl(c.sql, false); got != want {
			t.Errorf("topTxControl(%q) = %d, want %d (%q)", c.sql, got, want, c.control)
		}
	}
}

// txControlCases are Go-code phase statement texts with the statement topTxControl
// finds in them. TestTopTxControlAsTheServerRuns runs them on a real server.
var txControlCases = []struct {
	sql     string
	control string // the statement topTxControl points at, "" for none
}{
	{sql: "INSERT INTO t VALUES (1)"},
	{sql: "  insert into t values (1)"},
	{sql: "INSERT INTO t VALUES (1);"},
	{sql: "INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)"},
	{sql: "SELECT 'x; COMMIT'; SELECT 2"},
	{sql: `SELECT "a; COMMIT"; SELECT 2`},
	{sql: "SELECT $$; COMMIT$$; SELECT 2"},
	{sql: "SELECT 1 -- ; COMMIT\n; SELECT 2"},
	{sql: "SELECT 1 /* ; COMMIT */; SELECT 2"},
	{sql: `SELECT E'\'; COMMIT; --'`},
	{sql: "SELECT 1; SELECT 'COMMIT /*"}, // unended: the server runs none of it
	{sql: ""},
	{sql: ";;"},
	{sql: "-- COMMIT"},
	{sql: "/* COMMIT */"},
	{sql: `SELECT 1 AS "COMMIT"`},
	{sql: `"commit"`},
	{sql: "committed"},
	{sql: "COMMIT$1"},
	{sql: "ending"},
	{sql: "SAVEPOINT a"},
	{sql: "RELEASE a"},
	{sql: "RELEASE SAVEPOINT a"},
	{sql: "ROLLBACK TO a"},
	{sql: "rollback to savepoint a"},
	{sql: "ROLLBACK WORK TO SAVEPOINT a"},
	{sql: "ROLLBACK TRANSACTION TO a"},
	{sql: "/* c */ ROLLBACK /* d */ TO a"},
	{sql: "SAVEPOINT a; INSERT INTO t VALUES (1); RELEASE a"},
	{sql: "PREPARE q AS SELECT 1"},
	{sql: "prepare q (int) AS SELECT $1; EXECUTE q(1)"},
	{sql: "DO $$ BEGIN COMMIT; END $$"}, // the server refuses its COMMIT inside a block
	{sql: "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"},
	{sql: "COMMIT", control: "COMMIT"},
	{sql: "commit", control: "commit"},
	{sql: "  COMMIT;", control: "COMMIT;"},
	{sql: "COMMIT AND CHAIN", control: "COMMIT AND CHAIN"},
	{sql: "COMMIT PREPARED 'x'", control: "COMMIT PREPARED 'x'"},
	{sql: "END", control: "END"},
	{sql: "end transaction", control: "end transaction"},
	{sql: "ABORT", control: "ABORT"},
	{sql: "ROLLBACK", control: "ROLLBACK"},
	{sql: "ROLLBACK;", control: "ROLLBACK;"},
	{sql: "ROLLBACK WORK", control: "ROLLBACK WORK"},
	{sql: "ROLLBACK TRANSACTION AND CHAIN", control: "ROLLBACK TRANSACTION AND CHAIN"},
	{sql: "ROLLBACK PREPARED 'x'", control: "ROLLBACK PREPARED 'x'"},
	{sql: "ROLLBACK WORK WORK TO a", control: "ROLLBACK WORK WORK TO a"},
	{sql: "ROLLBACK; SELECT 1", control: "ROLLBACK; SELECT 1"},
	{sql: "ROLLBACK/**/", control: "ROLLBACK/**/"},
	{sql: "BEGIN", control: "BEGIN"},
	{sql: "START TRANSACTION", control: "START TRANSACTION"},
	{sql: "PREPARE TRANSACTION 'x'", control: "PREPARE TRANSACTION 'x'"},
	{sql: "prepare/**/transaction 'x'", control: "prepare/**/transaction 'x'"},
	{sql: "/* c */ COMMIT", control: "COMMIT"},
	{sql: "-- c\nCOMMIT", control: "COMMIT"},
	{sql: "/* a /* b */ a */ABORT", control: "ABORT"},
	{sql: "( COMMIT", control: "( COMMIT"},
	{sql: "INSERT INTO t VALUES (1); COMMIT", control: "COMMIT"},
	{sql: "INSERT INTO t VALUES (1);COMMIT;INSERT INTO t VALUES (2)", control: "COMMIT;INSERT INTO t VALUES (2)"},
	{sql: "SELECT 'a;b'; /* x */ END", control: "END"},
	{sql: "SAVEPOINT a; ROLLBACK TO a; ROLLBACK", control: "ROLLBACK"},
	{sql: `SELECT E'\';'; COMMIT`, control: "COMMIT"},
}

// TestTopTxControlAsTheServerRuns holds topTxControl to the server: each text of
// txControlCases runs (simple protocol, as one query string) inside a transaction
// block that has the savepoints a, b and c, on a real server. A text after which the
// block is over, or is another transaction, must be one topTxControl points at. The
// converse need not hold: a text it refuses may fail (COMMIT PREPARED inside a block)
// or be a no-op there (BEGIN), and it is refused all the same.
func TestTopTxControlAsTheServerRuns(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	pc := conn.Conn().PgConn()
	_, err = pc.Exec(ctx, "CREATE TEMP TABLE t (x int)").ReadAll()
	require.NoError(t, err)
	for _, c := range txControlCases {
		var before, after int64
		_, err := pc.Exec(ctx, "BEGIN; SAVEPOINT a; SAVEPOINT b; SAVEPOINT c").ReadAll()
		require.NoError(t, err)
		require.NoError(t, conn.QueryRow(ctx, "SELECT txid_current()").Scan(&before))
		_, _ = pc.Exec(ctx, c.sql).ReadAll() // errors allowed: the status says what happened
		st := pc.TxStatus()
		ended := st == 'I'
		if st == 'T' {
			require.NoError(t, conn.QueryRow(ctx, "SELECT txid_current()").Scan(&after))
			ended = after != before
		}
		if ended && c.control == "" {
			t.Errorf("%q ended or opened the transaction (status %q), but topTxControl finds nothing", c.sql, st)
		}
		_, _ = pc.Exec(ctx, "ROLLBACK").ReadAll()
	}
	_, _ = pc.Exec(ctx, "ROLLBACK PREPARED 'x'").ReadAll() // in case a server allows them
}

// TestTopTxControlBackslash: with standard_conforming_strings off a backslash escapes
// a quote in a plain string too, so the same text may hide a COMMIT from one reading
// and show it to the other; the check reads a text with a backslash both ways.
func TestTopTxControlBackslash(t *testing.T) {
	t.Parallel()
	on := `SELECT '\'; COMMIT; --'`        // standard_conforming_strings on: a COMMIT
	off := "SELECT '\\'' ; COMMIT ; --'\n" // off: a COMMIT; on: one string
	if topTxControl(on, false) < 0 || topTxControl(on, true) >= 0 {
		t.Errorf("%q: the readings disagree with the server's", on)
	}
	if topTxControl(off, false) >= 0 || topTxControl(off, true) < 0 {
		t.Errorf("%q: the readings disagree with the server's", off)
	}
}

// FuzzTopTxControl: topTxControl never panics, points at a statement's start, and
// finds nothing where readSQL reads a single statement that is no transaction control
// and starts with a word.
func FuzzTopTxControl(f *testing.F) {
	for _, c := range sqlCases {
		f.Add(c.sql)
	}
	f.Add("INSERT INTO t VALUES (1); /* x */ ROLLBACK WORK")
	f.Fuzz(func(t *testing.T, sql string) {
		for _, backslash := range []bool{false, true} {
			at := topTxControl(sql, backslash)
			if at < -1 || at >= len(sql) {
				t.Fatalf("%q: %d out of range", sql, at)
			}
		}
		sh, err := readSQL(sql)
		if err == nil && sh.statements == 1 && sh.first != "" && !sh.txControl() && topTxControl(sql, false) >= 0 {
			t.Fatalf("%q: one statement without control, found control", sql)
		}
	})
}

// BenchmarkCheckGoStatement: the check on a Go-code phase's typical statement, a
// 150-byte INSERT with arguments (the hot path: no semicolon), and on one that ends
// in a semicolon and a comment (read whole).
func BenchmarkCheckGoStatement(b *testing.B) {
	insert := `INSERT INTO payments (account_id, idem_key, amount_cents, currency, status, created_at) VALUES ($1, $2, $3, $4, 'pending', now()) RETURNING id`
	for _, c := range []struct{ name, sql string }{
		{"Insert", insert},
		{"InsertSemicolon", insert + "; -- the payment"},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.sql)))
			for b.Loop() {
				if goTxControl(c.sql) >= 0 {
					b.Fatal("control found")
				}
			}
		})
	}
}
