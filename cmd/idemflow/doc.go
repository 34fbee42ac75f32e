// Command idemflow is the operator's tool for idemflow's key table: list keys by
// status, inspect one with its history and stored response, re-drive a dead-lettered
// key, release a stuck key's lease, purge a finished key, re-drive or release many keys
// by filter, cancel a key with a final answer, count keys, list the partitions of a
// partitioned key table, migrate the schema, and export the migrations as a migration
// tool's files.
//
//	idemflow -database-url URL [-schema S] keys list [-status in_progress|stuck|dead|finished] [-flow F] [-scope S] [-older-than D] [-limit N] [-after CURSOR] [-json]
//	idemflow -database-url URL [-schema S] keys show [-json] SCOPE KEY
//	idemflow -database-url URL [-schema S] keys redrive [-json] SCOPE KEY
//	idemflow -database-url URL [-schema S] keys release [-json] SCOPE KEY
//	idemflow -database-url URL [-schema S] keys purge [-json] SCOPE KEY
//	idemflow -database-url URL [-schema S] keys bulk [-json] [-flow F] [-scope S] [-recovery-point P] [-error TEXT] [-all] [-limit N] [-dry-run|-yes] redrive|release
//	idemflow -database-url URL [-schema S] keys erase [-json] -scope S [-force] [-dry-run|-yes]
//	idemflow -database-url URL [-schema S] keys cancel [-json] -status N [-header 'Name: value']... [-body TEXT|-body-file FILE] [-force] [-skip-compensation] [-dry-run] SCOPE KEY
//	idemflow -database-url URL [-schema S] stats [-json]
//	idemflow -database-url URL [-schema S] partitions [-json]
//	idemflow -database-url URL [-schema S] migrate [-json] up|down|status
//	idemflow migrations export -format golang-migrate|goose|tern [-partition week|day|hour] DIR
//	idemflow -database-url URL [-schema S] ui [-addr 127.0.0.1:8081] [-write-token-file FILE] [-read-token-file FILE] [-allow-host NAME,...]
//
// Flags come before positional arguments, at each level. -database-url defaults to
// $DATABASE_URL. Output is a human table by default; -json prints one JSON object per
// line for scripts. The objects of keys list, redrive, release and purge have the
// fields scope, key, id, flow, status, recovery_point, attempts, last_error,
// created_at, updated_at and finished_at (null until finished); keys show adds the
// key's request, lease, stored response (response_status, and for a finished key
// response_header and response_body), origin, failed_phase and history (see
// workflow.KeyInfo and workflow.Attempt); stats prints one object per flow and status
// with flow, status and keys; migrate prints version and latest, key_table, tools (each
// migration tool's version table found in the schema: tool, table, version, dirty),
// and after up, adopted (the tool record it adopted) and applied (the versions run).
// Without -json, migrate up says what it adopted and applied, then the status: the
// version idemflow records and what each tool's table records.
//
// migrations export writes the migrations as a migration tool's files into DIR
// (created if need be) for teams that run the tool's own command; it needs no database
// and overwrites no file. With -partition it writes the partitioned key table
// (docs/PARTITIONS.md) in partitions of a week, a day or an hour: the first file
// creates the table partitioned and its first partitions, to a week ahead
// (migrations.PartitionedToolFS); every later file is the same as without.
//
// partitions lists a partitioned key table's partitions, oldest first, each with its
// bounds in UTC and its state (past, current, ahead, or detach pending), then how many
// exist ahead of the database's now against how many the default creates, saying
// "too few" below half of them. Its -json object has partitioned, ahead, want, low and
// partitions (each with name, from, to and state). On a key table that is not
// partitioned it says so ({"partitioned":false}) and exits 0.
//
// keys bulk selects the dead-lettered keys (redrive) or the keys in progress (release)
// that match every filter given, at most -limit (1000 by default), and acts on each
// alone (workflow.Engine.BulkKeys). It needs a filter, or -all. Without -yes it only
// counts them, prints "would redrive N keys" and exits 1 having changed nothing; with
// -dry-run it counts and exits 0; with -yes it acts. Its -json object has the fields
// matched, acted, changed, newer and more (see workflow.BulkResult).
//
// keys cancel finishes an unfinished key with the answer given (-status 2xx or 4xx,
// -header, -body or -body-file), stored and replayed like any other
// (workflow.Engine.CancelKey). The CLI's engine knows no flow, so it cannot tell
// whether one of the key's call phases reached the remote side: it refuses, printing
// the key's derived keys (ID:PHASE), until given -force, after the operator has
// reconciled with the remote side. Before it acts it prints what the cancel will run
// ("cancel key ... : " and workflow.CancelPreview.Effect); -dry-run prints only that.
// Nor can it run the flow's compensation (phases.Flow.Compensation), or tell whether
// the flow declares one: it refuses (workflow.ErrCompensationUnknown) until given
// -skip-compensation, which leaves the committed phases' writes as they are. To cancel
// with the compensation, cancel where the flow is registered: the service's operator
// page (idemflowui mounted in the service) or workflow.Engine.CancelKey.
//
// keys erase deletes every key of the scope -scope, with its request and answer, for a
// data subject's request (workflow.Engine.EraseScope). Keys in progress are left and
// counted unless -force is given, which erases them too and fences their holders.
// Without -yes it only counts, prints "would erase N keys" and exits 1 having changed
// nothing; with -dry-run it counts and exits 0; with -yes it erases. Its -json object
// has the fields erased, left and fenced (see workflow.EraseResult).
//
// Client text (scopes, keys, bodies, errors, history) is never printed raw: in tables
// every non-printable rune is escaped as strconv.Quote writes it (\x1b, \u009b, \n)
// and every invalid UTF-8 byte as \xNN, quotes and backslashes left as they are; in
// -json output the same runes are \uXXXX escapes that decode to the stored text.
// Error messages are escaped the same way.
//
// ui serves the operator's web page (package idemflowui) on -addr, loopback by
// default, until SIGINT or SIGTERM; it prints the address it serves on stderr. It is
// read-only unless given a write token: the contents of -write-token-file (whitespace
// around it trimmed), or else $IDEMFLOW_UI_WRITE_TOKEN (never a flag's value, which
// other users can see in the process list). A read token (-read-token-file, or else
// $IDEMFLOW_UI_READ_TOKEN) makes every page need a login. The page answers only the
// Host headers localhost, an IP literal of the address a request came in on, and the
// names given with -allow-host (repeated or comma-separated), on every listener, so
// that no other site can rebind its name to the page's address and read it. On an
// address other machines can reach (":8081", "0.0.0.0:8081", a non-loopback IP or a
// host name) ui refuses to start, with exit status 2, unless given -allow-host or a
// read token.
//
// Exit status: 0 on success, 1 on failure (a missing key among them, with a message
// that names it), 2 on bad usage (a negative -older-than or a -limit outside 1..10000
// among them, with a message that names the flag; nothing is read or changed).
//
// See docs/OPERATIONS.md for when to use which command.
//
// This command imports idemflow's workflow, store, migrations and idemflowui packages.
package main
