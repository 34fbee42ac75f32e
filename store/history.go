package store

import "encoding/json"

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
	// Entry is a JSON object. Nil appends nothing (history is off).
	Entry []byte
	// Keep is how many entries the history keeps, the newest; the oldest go first.
	// Zero or less appends nothing.
	Keep int
}

// args are the statement arguments of h: the entry (NULL for none), as JSON text in
// every query exec mode (see sql.go), and the bound.
func (h History) args() (any, int) {
	if h.Keep <= 0 || len(h.Entry) == 0 {
		return nil, 0
	}
	return json.RawMessage(h.Entry), h.Keep
}

// historyAppend is the history column with the entry $e (a JSON object, or NULL for
// none) appended, stamped "at" with the database time, keeping the newest $keep.
func historyAppend(e, keep string) string {
	return `CASE WHEN $` + e + `::jsonb IS NULL THEN history ELSE ` +
		historyKeep(`history || ($`+e+`::jsonb || jsonb_build_object('at', statement_timestamp()))`, keep) + ` END`
}

// historyKeep is the history array h cut to its newest $keep entries.
func historyKeep(h, keep string) string {
	return `jsonb_path_query_array(` + h + `, '$[last - $n to last]', jsonb_build_object('n', $` + keep + `::int - 1))`
}

// historyFirst is the history of a new row: the one entry $e, or none.
func historyFirst(e string) string {
	return `CASE WHEN $` + e + `::jsonb IS NULL THEN '[]'::jsonb ELSE
		jsonb_build_array($` + e + `::jsonb || jsonb_build_object('at', statement_timestamp())) END`
}

// historyNote is the history with the entry the SQL expression entry builds (from the
// row as it was) appended and stamped, keeping the newest $keep; unchanged when $keep
// is 0. when, if not empty, is a further condition for appending.
func historyNote(entry, keep, when string) string {
	cond := `$` + keep + `::int > 0`
	if when != "" {
		cond += ` AND ` + when
	}
	return `CASE WHEN ` + cond + ` THEN ` +
		historyKeep(`history || (`+entry+` || jsonb_build_object('at', statement_timestamp()))`, keep) + ` ELSE history END`
}

// historyAbandoned is, for a takeover, the history with the attempt before it recorded
// as abandoned when its lease had expired rather than been released (an attempt that
// released its lease wrote its own entry), keeping the newest $keep; unchanged when
// $keep is 0.
func historyAbandoned(keep string) string {
	return historyNote(`jsonb_build_object('attempt', attempts, 'outcome', 'abandoned', 'reached', recovery_point)`,
		keep, `locked_until IS NOT NULL`)
}
