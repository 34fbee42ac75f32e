package migrations_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/migrations"
)

func TestStatements(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		src  string
		want []string
	}{
		{"One", "SELECT 1", []string{"SELECT 1"}},
		{"Two", "SELECT 1;\nSELECT 2;\n", []string{"SELECT 1", "SELECT 2"}},
		{"CommentsOnly", "-- nothing; here\n/* nor; here */\n;\n", nil},
		{"LineComment", "-- a; b\nSELECT 1; -- c; d\nSELECT 2", []string{"-- a; b\nSELECT 1", "-- c; d\nSELECT 2"}},
		{"NestedBlockComment", "SELECT /* a /* b; */ c; */ 1; SELECT 2", []string{"SELECT /* a /* b; */ c; */ 1", "SELECT 2"}},
		{"String", "SELECT 'a;''b'; SELECT 2", []string{"SELECT 'a;''b'", "SELECT 2"}},
		{"EscapeString", `SELECT E'a\';b'; SELECT e'\\'; SELECT 3`, []string{`SELECT E'a\';b'`, `SELECT e'\\'`, "SELECT 3"}},
		{"NotAnEscapeString", `SELECT 'x\'; SELECT 2`, []string{`SELECT 'x\'`, "SELECT 2"}},
		{"QuotedIdentifier", `SELECT 1 AS "a;""b"; SELECT 2`, []string{`SELECT 1 AS "a;""b"`, "SELECT 2"}},
		{"DollarQuote", "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$\nBEGIN RETURN 1; END\n$$;\nSELECT 2",
			[]string{"CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$\nBEGIN RETURN 1; END\n$$", "SELECT 2"}},
		{"TaggedDollarQuote", "SELECT $fn$ a; $$ b; $fn$; SELECT 2", []string{"SELECT $fn$ a; $$ b; $fn$", "SELECT 2"}},
		{"Parameter", "SELECT $1; SELECT a$b$c FROM t; SELECT 3", []string{"SELECT $1", "SELECT a$b$c FROM t", "SELECT 3"}},
		{"ConstraintsApart", "-- c\nALTER TABLE t\n  ADD CONSTRAINT a CHECK (x ~ '^[a,b]{1,2}$') NOT VALID,\n  add constraint b CHECK (f(y, z)) NOT VALID;",
			[]string{"-- c\nALTER TABLE t ADD CONSTRAINT a CHECK (x ~ '^[a,b]{1,2}$') NOT VALID", "ALTER TABLE t add constraint b CHECK (f(y, z)) NOT VALID"}},
		{"OtherSubcommandsTogether", "ALTER TABLE t ADD CONSTRAINT a CHECK (x > 0), DROP COLUMN y",
			[]string{"ALTER TABLE t ADD CONSTRAINT a CHECK (x > 0), DROP COLUMN y"}},
		{"OneConstraint", "ALTER TABLE t ADD CONSTRAINT a CHECK (x IN (1, 2))", []string{"ALTER TABLE t ADD CONSTRAINT a CHECK (x IN (1, 2))"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, migrations.Statements(tc.src))
		})
	}
}

// TestStatementsOfTheFiles: every embedded file splits into the statements it holds,
// the function body of 001 whole.
func TestStatementsOfTheFiles(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	require.NoError(t, err)
	count := map[string]int{}
	for _, m := range all {
		count[m.Name+" up"] = len(migrations.Statements(m.Up))
		count[m.Name+" down"] = len(migrations.Statements(m.Down))
	}
	require.Equal(t, map[string]int{
		"idemflow_keys up": 4, "idemflow_keys down": 2,
		"idemflow_keys_lean up": 1, "idemflow_keys_lean down": 13,
		"idemflow_keys_status_check up": 1, "idemflow_keys_status_check down": 2,
		"idemflow_keys_history up": 2, "idemflow_keys_history down": 2,
	}, count)
	last := migrations.Statements(all[0].Up)[3]
	require.Contains(t, last, "CREATE FUNCTION idemflow_fence")
	require.Contains(t, last, "RETURN updated;\nEND\n$$")
}
