package keytable

import (
	"encoding/json"
	"strings"
)

// A key's history: a jsonb array of entries, one per attempt (and per operator
// action), oldest first, bounded to the newest few. Entries are appended by the
// statements that already end an attempt (finish, release, dead-letter, park), and by a
// takeover for the attempt before it when that one ended without a word (its lease
// expired: a crash, a pause, a partition). No statement of its own is ever sent for
// history, so it costs no round trip and no commit.
//
// What an entry holds is the engine's business (workflow.Attempt); this file only
// stamps each with the database time ("at") and keeps the array bounded.

// History is an entry to append to a key's history.
type History struct {
	// Entry is a JSON object, or a JSON array of one object (which is sent as it is,
	// saving a copy). Nil appends nothing (history is off).
	Entry []byte
	// Keep is how many entries the history keeps, the newest; the oldest go first.
	// Zero or less appends nothing.
	Keep int
}

// args are the statement arguments of h: its entries, a JSON array of the entry or
// none, as JSON text in every query exec mode (see sql.go), and the bound (0 when
// history is off: nothing is appended and nothing cut).
func (h History) args() (json.RawMessage, int) {
	if h.Keep <= 0 || len(h.Entry) == 0 {
		return json.RawMessage(`[]`), 0
	}
	if h.Entry[0] == '[' {
		return json.RawMessage(h.Entry), h.Keep
	}
	entries := make([]byte, 0, len(h.Entry)+2)
	entries = append(append(append(entries, '['), h.Entry...), ']')
	return json.RawMessage(entries), h.Keep
}

// No expression below calls a function that is not immutable inside a CASE or a
// COALESCE, nor one that is not immutable on a column: Citus refuses both in an
// UPDATE or INSERT on a distributed table. The one stable function, the stamp
// to_jsonb(statement_timestamp()), takes no column and stands outside any CASE; JSON
// is built from columns with immutable functions only (jsonb_object, jsonb_set, casts).

// stamped is the JSON array arr, of one entry or none, with the entry (if any) stamped
// "at" with the database time, and set with the further (key, expression) pairs
// extra: jsonb_set leaves an empty array as it is.
func stamped(arr string, extra ...[2]string) string {
	out := `jsonb_set(` + arr + `, '{0,at}', to_jsonb(statement_timestamp()))`
	for _, kv := range extra {
		out = `jsonb_set(` + out + `, '{0,` + kv[0] + `}', ` + kv[1] + `)`
	}
	return out
}

// historyAppend is the history column with the entries $e (a JSON array of the entry,
// or empty) stamped and appended, keeping the newest $keep (all when $keep is 0). $e
// counts as jsonb's || appends it: an array as its entries, anything else as one.
func historyAppend(e, keep string) string {
	added := `jsonb_array_length('[]'::jsonb || $` + e + `::jsonb)`
	return historyKeep(`history`, keep, added) + ` || ` + stamped(`$`+e+`::jsonb`)
}

// historyKeep is the history array h cut to the newest entries that, with added (an
// SQL expression: how many entries are appended after them, at most $keep) appended,
// make at most $keep; uncut when $keep is 0 or less. Cutting before the append keeps
// the entries cutting after it kept, byte for byte; and an array that stays within the
// bound, as a key's usually does, is taken as it is, without the JSON path query that
// copies every entry it keeps (a test compares the two ways).
func historyKeep(h, keep, added string) string {
	k := `$` + keep + `::int`
	return `CASE WHEN ` + k + ` <= 0 OR jsonb_array_length(` + h + `) + ` + added + ` <= ` + k + ` THEN ` + h + `
		WHEN ` + added + ` >= ` + k + ` THEN '[]'::jsonb
		ELSE jsonb_path_query_array(` + h + `, '$[last - $n to last]', ('{"n":' || (` + k + ` - ` + added + ` - 1)::text || '}')::jsonb) END`
}

// historyFirst is the history of a new row: the entries $e stamped.
func historyFirst(e string) string { return stamped(`$` + e + `::jsonb`) }

// historyNote is the history with the entry the immutable SQL expression entry builds
// (from the row as it was) appended, stamped and set with extra (see stamped), keeping
// the newest $keep; unchanged when $keep is 0. when, if not empty, is a further
// condition for appending.
func historyNote(entry, keep, when string, extra ...[2]string) string {
	cond := `$` + keep + `::int > 0`
	if when != "" {
		cond += ` AND ` + when
	}
	added := `CASE WHEN ` + cond + ` THEN 1 ELSE 0 END`
	return historyKeep(`history`, keep, added) + ` || ` +
		stamped(`CASE WHEN `+cond+` THEN ('[' || (`+entry+`)::text || ']')::jsonb ELSE '[]'::jsonb END`, extra...)
}

// jsonAttempt is an entry's fields as an immutable expression: a JSON object of the
// string pairs kv (SQL text expressions) and "attempt", the row's attempt count.
func jsonAttempt(kv ...string) string {
	return `jsonb_set(jsonb_object(ARRAY[` + strings.Join(kv, ", ") + `]), '{attempt}', attempts::text::jsonb)`
}

// historyAbandoned is, for a takeover, the history with the attempt before it recorded
// as abandoned when its lease had expired rather than been released (an attempt that
// released its lease wrote its own entry), keeping the newest $keep; unchanged when
// $keep is 0.
func historyAbandoned(keep string) string {
	return historyNote(jsonAttempt(`'outcome'`, `'abandoned'`, `'reached'`, `recovery_point`), keep, `locked_until IS NOT NULL`)
}
