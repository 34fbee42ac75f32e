// Package idemflowui is an operator's web page for idemflow's key table: an overview
// of unfinished keys and recent outcomes (and, on a partitioned key table, how many
// partitions exist ahead, with a warning when too few do), lists of keys by status (the
// dead-letter list with each key's failed phase and error class), one key with its
// request, recovery point, its call phases' derived keys, history and stored response,
// each status explained in place with a link to its runbook (Options.RunbookURL), and
// (with a write token) the
// re-drive of a dead-lettered key, the release of a stuck lease, the re-drive or
// release of many keys by flow, scope, recovery point or error text (counted first,
// then confirmed: never more keys are acted on than the operator confirmed), and the
// cancel of an unfinished key with a final answer the operator chooses (refused, until
// the operator says the remote side is reconciled, when a call phase may have run; the
// refusal shows the derived keys to reconcile with; the form says first what the
// cancel runs, the flow's compensation or none, and offers to skip it; see
// workflow.Engine.CancelKey and PreviewCancel). A
// read-only page says how to enable writes. The pages are rendered on the
// server with html/template; the style sheet is embedded; there is no JavaScript and
// nothing is loaded from elsewhere, so it works on a closed network.
//
// Mount it in an admin server:
//
//	ui, err := idemflowui.New(engine, &idemflowui.Options{
//		Prefix:     "/idemflow",
//		WriteToken: os.Getenv("IDEMFLOW_UI_WRITE_TOKEN"), // empty: read-only
//	})
//	if err != nil {
//		return err
//	}
//	mux.Handle("/idemflow/", ui)
//
// or run `idemflow ui -addr 127.0.0.1:8081` (see cmd/idemflow).
//
// Security. Every request is refused (403) before anything is read unless its Host
// header is localhost, an IP literal of the address the request came in on, or a name
// in Options.Hosts: a page the operator visits cannot rebind its own name to the
// listener's address and read the keys (DNS rebinding). Without a write token the pages
// only read: no button is shown and every POST is refused with 403. With one, an
// operator logs in once with the token and gets an HttpOnly, SameSite=Strict cookie
// holding a random session id; the handler keeps its sessions in memory, so logging
// out ends the session on the server (the old cookie and its CSRF token stop working)
// and a restart logs everyone out. With a read token (Options.ReadToken) every page
// needs a login, with the read token (a session that only reads) or the write token.
// Every state-changing request is a POST that must carry a write session's cookie and
// a CSRF token from the page's form (an HMAC of the session id under a secret made
// when the Handler is, compared in constant time), and must not come from another
// origin (Sec-Fetch-Site and Origin, as net/http's CrossOriginProtection checks them).
// Every action asks for confirmation on a page of its own that says what it will do.
// Request bodies, errors, scopes and keys are client-controlled and are always
// rendered as text by html/template. Every response carries a Content-Security-Policy
// that allows no script, no frames and forms only to the page's own origin, with
// X-Content-Type-Options nosniff and Referrer-Policy no-referrer.
//
// Bad input in a URL or form (an unknown status, a scope or key that is not valid, a
// value that is not UTF-8, a malformed cursor or age) is answered 400 with a message
// and changes nothing.
//
// Cost. The pages read through the engine's admin API and only through its indexed
// statements: GaugeKeys, ListKeys by status, InspectKey and CountOutcomes over a short
// window, and CheckPartitions, which reads the catalog only. None reads the whole table, so the overview's cost follows the unfinished
// keys and the keys that ended in the window, not the size of the table (see
// docs/BENCHMARKS.md).
//
// This package imports idemflow's workflow and store packages.
package idemflowui
