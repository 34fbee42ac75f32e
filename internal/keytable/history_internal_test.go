package keytable

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// An entry goes to its statement as a JSON array of itself: an object is wrapped, an
// array of one is sent as it is, and no entry or no bound appends nothing.
func TestHistoryArgs(t *testing.T) {
	for _, c := range []struct {
		h    History
		want string
		keep int
	}{
		{History{Entry: []byte(`{"a":1}`), Keep: 3}, `[{"a":1}]`, 3},
		{History{Entry: []byte(`[{"a":1}]`), Keep: 3}, `[{"a":1}]`, 3},
		{History{Entry: []byte(`{"a":1}`)}, `[]`, 0},
		{History{Keep: 3}, `[]`, 0},
	} {
		got, keep := c.h.args()
		require.Equal(t, c.want, string(got))
		require.Equal(t, c.keep, keep)
	}
}

// The history expressions of the releases before this one: the whole appended array
// cut by a JSON path query on every write. TestHistoryKeepSame checks that today's,
// which cut only a full array, store the same array.
func prevHistoryKeep(h, keep string) string {
	n := `CASE WHEN $` + keep + `::int > 0 THEN $` + keep + `::int - 1 ELSE 2147483646 END`
	return `jsonb_path_query_array(` + h + `, '$[last - $n to last]', ('{"n":' || (` + n + `)::text || '}')::jsonb)`
}

func prevHistoryAppend(e, keep string) string {
	return prevHistoryKeep(`history || `+stamped(`$`+e+`::jsonb`), keep)
}

func prevHistoryNote(entry, keep, when string, extra ...[2]string) string {
	cond := `$` + keep + `::int > 0`
	if when != "" {
		cond += ` AND ` + when
	}
	return prevHistoryKeep(`history || `+stamped(`CASE WHEN `+cond+` THEN ('[' || (`+entry+`)::text || ']')::jsonb ELSE '[]'::jsonb END`, extra...), keep)
}

// TestHistoryKeepSame evaluates the history expressions of the statements (an append,
// an abandoned attempt's note, an operator's note with extra members) beside the
// previous releases' on histories of every length around the bound, with no entry,
// with one and with an object where an array belongs, and requires the same array: the same text and the same stored size (jsonb
// stores one value one way), at the same database time.
func TestHistoryKeepSame(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	entry := jsonAttempt(`'outcome'`, `'abandoned'`, `'reached'`, `recovery_point`)
	extra := [2]string{"lease_live", `to_jsonb(locked_until IS NOT NULL)`}
	exprs := []struct{ name, prev, now string }{
		{"append", prevHistoryAppend("1", "2"), historyAppend("1", "2")},
		{"abandoned", prevHistoryNote(entry, "2", `locked_until IS NOT NULL`), historyAbandoned("2")},
		{"operator", prevHistoryNote(entry, "2", "", extra), historyNote(entry, "2", "", extra)},
	}
	checked := 0
	for _, x := range exprs {
		sql := `SELECT p::text, n::text, pg_column_size(p), pg_column_size(n) FROM (SELECT ` + x.prev + ` AS p, ` + x.now + ` AS n
FROM (SELECT $3::jsonb AS history, 2 AS attempts, 'one'::text AS recovery_point,
	CASE WHEN $4 THEN now() END AS locked_until, $1::jsonb AS e) r) v`
		for length := range 7 {
			history := historyOf(length)
			for keep := -1; keep <= 7; keep++ {
				for _, e := range []string{`[]`, `[{"attempt":9,"outcome":"finished"}]`, `{"attempt":9}`} {
					for _, locked := range []bool{false, true} {
						var prev, now string
						var prevSize, nowSize int
						require.NoError(t, db.Pool.QueryRow(ctx, sql, e, keep, history, locked).Scan(&prev, &now, &prevSize, &nowSize))
						at := fmt.Sprintf("%s: %d entries, keep %d, entry %s, locked %v", x.name, length, keep, e, locked)
						require.Equal(t, prev, now, at)
						require.Equal(t, prevSize, nowSize, at)
						checked++
					}
				}
			}
		}
	}
	require.Equal(t, 3*7*9*3*2, checked)
}

// historyOf is a history of n entries, as the column holds it.
func historyOf(n int) string {
	entries := make([]string, n)
	for i := range entries {
		entries[i] = fmt.Sprintf(`{"attempt":%d,"outcome":"released","at":"2026-01-01T00:00:0%d+00:00","phases":["a","b"]}`, i+1, i)
	}
	return "[" + strings.Join(entries, ",") + "]"
}
