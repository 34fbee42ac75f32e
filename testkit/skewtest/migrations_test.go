package skewtest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// contractions are migrations allowed to remove or narrow something, each with why the
// previous release no longer needs it (docs/OPERATIONS.md, "Upgrades": such a
// migration comes a release after the last one that used what it removes).
var contractions = map[string]string{}

// nonAdditive matches statements that the previous release could trip over on the
// migrated schema: removing or renaming what it may name, changing a column's type,
// making a column required or adding a constraint its writes may not meet.
var nonAdditive = regexp.MustCompile(`(?is)\bDROP\s+(COLUMN|TABLE|INDEX|FUNCTION|VIEW|SCHEMA)\b|\bRENAME\b|` +
	`\bALTER\s+COLUMN\s+\S+\s+(SET\s+DATA\s+)?TYPE\b|\bSET\s+NOT\s+NULL\b|\bADD\s+CONSTRAINT\b|\bADD\s+(PRIMARY|UNIQUE|CHECK|FOREIGN)\b`)

// addColumn matches one ADD COLUMN clause; one that is NOT NULL without a DEFAULT makes
// the previous release's inserts fail.
var (
	addColumn = regexp.MustCompile(`(?is)\bADD\s+COLUMN\b[^,;]*`)
	notNull   = regexp.MustCompile(`(?i)\bNOT\s+NULL\b`)
	withDef   = regexp.MustCompile(`(?i)\bDEFAULT\b`)
)

// notAdditive returns what in stmt is not additive, or "".
func notAdditive(stmt string) string {
	if m := nonAdditive.FindString(stmt); m != "" {
		return m
	}
	for _, c := range addColumn.FindAllString(stmt, -1) {
		if notNull.MatchString(c) && !withDef.MatchString(c) {
			return c
		}
	}
	return ""
}

// TestMigrationsAdditive checks the key table's migrations against the previous
// release's: a released migration is never edited (a schema that applied it would not
// match the next), and a new one only adds (the previous release runs on the migrated
// schema during a rolling deploy), unless listed in contractions.
func TestMigrationsAdditive(t *testing.T) {
	if os.Getenv("IDEMFLOW_SKEW") != "1" {
		t.Skip("set IDEMFLOW_SKEW=1 to compare the migrations with the previous release's (CI does)")
	}
	root, commit := previousRelease(t)
	released := map[string]bool{}
	for _, path := range strings.Fields(git(t, root, "ls-tree", "--name-only", commit, "migrations/")) {
		if !strings.HasSuffix(path, ".sql") {
			continue
		}
		released[filepath.Base(path)] = true
		now, err := os.ReadFile(filepath.Join(root, path))
		require.NoError(t, err, "released migration %s is gone", path)
		if string(now) != git(t, root, "show", commit+":"+path) {
			t.Errorf("released migration %s was edited since %s: a schema that applied it would not match", path, commit)
		}
	}
	require.NotEmpty(t, released, "the previous release has no migrations")
	ups, err := filepath.Glob(filepath.Join(root, "migrations", "*.up.sql"))
	require.NoError(t, err)
	for _, up := range ups {
		name := filepath.Base(up)
		if released[name] || contractions[name] != "" {
			continue
		}
		sql, err := os.ReadFile(up)
		require.NoError(t, err)
		for _, stmt := range strings.Split(stripComments(string(sql)), ";") {
			if m := notAdditive(stmt); m != "" {
				t.Errorf("%s is not additive (%q in %q): the previous release may fail on the migrated schema; "+
					"see docs/OPERATIONS.md, Upgrades, and list it in contractions once nothing released uses what it removes",
					name, m, strings.TrimSpace(stmt))
			}
		}
	}
}

// stripComments removes SQL line comments.
func stripComments(sql string) string {
	var b strings.Builder
	for line := range strings.Lines(sql) {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i] + "\n"
		}
		b.WriteString(line)
	}
	return b.String()
}
