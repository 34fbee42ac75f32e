package attempt

import "testing"

// TestSkipComments: the checks of a pipelined phase's statements (sqlShape's
// txControl and blockOnly) read the command after leading blanks, parentheses and
// comments, nested block comments included, as the server reads them.
func TestSkipComments(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		sql     string
		control bool
		block   bool
	}{
		{"COMMIT", true, false},
		{"  -- note\n commit", true, false},
		{"/* note */ COMMIT", true, false},
		{"/* outer /* inner */ still outer */ COMMIT", true, false},
		{"/* a /* b /* c */ b */ a */ DO $$ BEGIN END $$", false, true},
		{"/* /* x */ */ LOCK TABLE t", false, true},
		{"( /* x */ CALL p()", false, true},
		{"/* unterminated /* */ COMMIT", false, false},
		{"INSERT INTO t VALUES (1) /* COMMIT */", false, false},
		{"SELECT '/* COMMIT */'", false, false},
	} {
		sh, _ := readSQL(c.sql)
		if got := sh.txControl(); got != c.control {
			t.Errorf("txControl(%q) = %v, want %v", c.sql, got, c.control)
		}
		if got := sh.blockOnly(); got != c.block {
			t.Errorf("blockOnly(%q) = %v, want %v", c.sql, got, c.block)
		}
	}
}
