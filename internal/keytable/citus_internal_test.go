package keytable

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// The rules a statement on the key table keeps so that Citus runs it as a
// single-shard (router) statement when the table is distributed by scope. They are
// checked here on the texts a Store sends, against plain PostgreSQL's catalogue, so
// that they hold in CI without Citus.

// crossScope are the statements that read or change keys of many scopes: the
// operators' lists, counts and bulk scans, and the sweeps' scans and single statements. Every
// other statement works on one key and names it by scope.
var crossScope = []string{
	"counts", "gauges", "outcomes",
	"takeDue", "expire", "expireDead", "expireParked",
	"scanDue", "scanFinished", "scanFinishedRemovable", "scanDead", "scanParked", "bulkScan",
}

// oneScope are the statements on every key of one scope (the erasure of a scope): they
// name the scope ($1), so Citus routes them to that scope's shard.
var oneScope = []string{"eraseBatch", "eraseCount"}

// singleOnly are the statements that only ScanSingle sends: they match rows by ctid,
// which Citus refuses on a distributed table.
var singleOnly = []string{"takeDue", "expire", "expireDead", "expireParked"}

// noTable are the statements that read no table (the claim lock names the table only
// for its oid).
var noTable = []string{"claimLock", "pipe claimLock", "pipe claimLockFlushed"}

// calledName matches a function call: a name followed by an opening parenthesis.
var calledName = regexp.MustCompile(`([a-z_][a-z0-9_]*)\s*\(`)

// volatility returns, for each function name called in texts, the worst volatility
// of the functions of that name ('i', 's' or 'v'), from the server's catalogue.
func volatility(t *testing.T, texts map[string]string) map[string]byte {
	t.Helper()
	var names []string
	for _, sql := range texts {
		for _, m := range calledName.FindAllStringSubmatch(strings.ToLower(sql), -1) {
			names = append(names, m[1])
		}
	}
	db := pgtest.NewEmpty(t)
	rows, err := db.Pool.Query(context.Background(), `SELECT proname::text, max(provolatile::text)
FROM pg_proc WHERE proname = ANY($1) GROUP BY 1`, names)
	require.NoError(t, err)
	out := map[string]byte{}
	for rows.Next() {
		var name, v string
		require.NoError(t, rows.Scan(&name, &v))
		out[name] = v[0] // 'v' > 's' > 'i', so max is the worst
	}
	require.NoError(t, rows.Err())
	return out
}

// citusViolations returns what in the statement name, sql breaks a rule, given the
// catalogue's volatilities.
func citusViolations(name, sql string, vol map[string]byte) []string {
	var bad []string
	lower := strings.ToLower(sql)
	calls := func(part string, worst byte) {
		for _, m := range calledName.FindAllStringSubmatch(part, -1) {
			if v, ok := vol[m[1]]; ok && v >= worst {
				bad = append(bad, m[1]+"() is "+map[byte]string{'s': "not immutable", 'v': "volatile"}[v])
			}
		}
	}
	if strings.Contains(lower, "update ") {
		calls(lower, 'v') // Citus: functions in an UPDATE on a distributed table must not be VOLATILE
	}
	if strings.Contains(lower, "update ") || strings.Contains(lower, "insert into") {
		for _, part := range conditionals(lower) {
			calls(part, 's') // Citus: only IMMUTABLE functions in a CASE or COALESCE of a modification
		}
	}
	if i := strings.LastIndex(lower, "returning "); i >= 0 {
		calls(lower[i:], 's') // Citus: only IMMUTABLE functions in a RETURNING list
	}
	if regexp.MustCompile(`\bctid\b`).MatchString(lower) && !slices.Contains(singleOnly, name) {
		bad = append(bad, "ctid")
	}
	if slices.Contains(oneScope, name) && !regexp.MustCompile(`where scope = \$1\b`).MatchString(lower) {
		bad = append(bad, "does not name its scope ($1)")
	}
	if !slices.Contains(crossScope, name) && !slices.Contains(oneScope, name) && !slices.Contains(noTable, name) && !strings.HasPrefix(name, "list ") {
		insert := strings.HasPrefix(strings.TrimSpace(lower), "insert into") &&
			strings.Contains(lower, "(scope, idempotency_key") && regexp.MustCompile(`(values \(|select )\$1, \$2,`).MatchString(lower)
		byKey := strings.Contains(lower, "scope = $1 and idempotency_key = $2") ||
			strings.Contains(lower, "scope = $1 and idempotency_key = any($2::text[])")
		if !insert && !byKey {
			bad = append(bad, "does not name its key by scope ($1) and key ($2)")
		}
	}
	return bad
}

// caseOrCoalesce matches the words that open and close the conditional expressions.
var caseOrCoalesce = regexp.MustCompile(`\b(case|end|coalesce)\b`)

// conditionals returns the text of every outermost CASE ... END and coalesce(...) in
// sql (lower case).
func conditionals(sql string) []string {
	var out []string
	for at := 0; ; {
		loc := caseOrCoalesce.FindStringIndex(sql[at:])
		if loc == nil {
			return out
		}
		start := at + loc[0]
		end := len(sql)
		if sql[start:at+loc[1]] == "coalesce" {
			depth := 0
			for i := at + loc[1]; i < len(sql); i++ {
				if sql[i] == '(' {
					depth++
				} else if sql[i] == ')' {
					if depth--; depth == 0 {
						end = i + 1
						break
					}
				}
			}
		} else if sql[start:at+loc[1]] == "case" {
			depth := 0
			for _, m := range caseOrCoalesce.FindAllStringIndex(sql[start:], -1) {
				switch sql[start+m[0] : start+m[1]] {
				case "case":
					depth++
				case "end":
					depth--
				}
				if depth == 0 {
					end = start + m[1]
					break
				}
			}
		} else {
			at += loc[1]
			continue
		}
		out = append(out, sql[start:end])
		at = end
	}
}

// TestCitusRules checks every statement a Store sends, in every schema form, against
// the rules. A list's statements filter by scope only when asked; they are
// multi-shard reads, which Citus runs as they are.
func TestCitusRules(t *testing.T) {
	t.Parallel()
	inSchema, err := newInSchema("tenant data")
	require.NoError(t, err)
	all := texts(New())
	for name, sql := range texts(inSchema) {
		all["schema "+name] = sql
	}
	vol := volatility(t, all)
	require.Equal(t, byte('s'), vol["statement_timestamp"], "the catalogue says what is stable")
	for name, sql := range all {
		require.Empty(t, citusViolations(strings.TrimPrefix(name, "schema "), sql, vol), "%s:\n%s", name, sql)
	}

	t.Run("MutationsAreCaught", func(t *testing.T) {
		for _, m := range []struct{ name, sql, want string }{
			{"advance", strings.Replace(sqlAdvance, "locked_until = statement_timestamp()", "locked_until = clock_timestamp()", 1), "clock_timestamp() is volatile"},
			{"takeover", strings.Replace(sqlTakeover, "RETURNING ", "RETURNING statement_timestamp(), ", 1), "statement_timestamp() is not immutable"},
			{"takeover", sqlTakeover + ", gen_random_uuid()", "gen_random_uuid() is volatile"},
			{"takeKey", strings.Replace(sqlTakeKey, "lock_version = $3", "ctid = $3", 1), "ctid"},
			{"release", strings.Replace(sqlRelease, "scope = $1 AND ", "", 1), "does not name its key by scope ($1) and key ($2)"},
			{"giveBack", strings.Replace(sqlGiveBack, "locked_until = NULL", "locked_until = CASE WHEN true THEN statement_timestamp() END", 1), "statement_timestamp() is not immutable"},
		} {
			require.Contains(t, citusViolations(m.name, m.sql, volatility(t, map[string]string{m.name: m.sql})), m.want, m.sql)
		}
	})
}
