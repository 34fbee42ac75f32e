// Package idemclient is the client half of idemflow's protocol for Go callers: it
// sends each logical operation under one idempotency key, the same on every retry and
// after a restart, and retries until the server's final answer, with backoff and full
// jitter, honouring Retry-After. docs/API.md says what a server answers; this package
// acts on it.
//
// Transport is an http.RoundTripper: put it under any http.Client, including the one
// a generated API client takes (oapi-codegen's WithHTTPClient, ogen's WithClient).
// Attach the operation's key to the context (WithKey) or set the Idempotency-Key header
// (a generated client whose operation declares the header sets it). Every attempt
// carries the key and the same body bytes (req.GetBody, or the body read once).
// Config bounds the attempts and their time; the context bounds everything.
//
// What is retried: 409 (the first attempt still runs), 429 and 503 after their
// Retry-After (seconds or an HTTP-date); network errors, attempt timeouts and 500, 502
// and 504 after a backoff (an idemflow server never stores a 5xx, so the same key is
// safe). Never retried: 400, 401, 413, 422 and every other final answer, returned as it
// is (Replayed says whether it was replayed). A 410 ends with a *DeadLetteredError;
// running out of attempts or time with an *ExhaustedError, after which the operation
// is retried later with the same key.
//
// Redirects: the answer of the operation is the redirect itself (an idemflow server
// stores and replays a 303 like any answer). The http.Client's GET after a 301, 302 or
// 303 is a read of another resource: the Transport sends it once, without the key. A
// 307 or 308 repeats the operation (same method and body) at another URI, under the
// same key.
//
// Where keys come from:
//   - KeyFrom derives a key from the operation ("renewal", "sub_123", "2026-10"): every
//     process and every restart sends the same key, with nothing to store.
//   - NewKey makes a random key, which must be kept until the final answer: PendingKey
//     keeps it in a Store (FileStore in a directory; an SQL table in the test
//     TestSQLStore, store_sql_test.go, written with pgx). If that store is lost, the
//     pending operations get new keys and the server runs each of them again: a second
//     charge. Delete a key only after recording its operation's answer.
//
// Usage:
//
//	transport, err := idemclient.NewTransport(nil, nil) // http.DefaultTransport, the default policy
//	if err != nil {
//		return err
//	}
//	client := &http.Client{Transport: transport}
//
//	// One key per logical operation: the same on every attempt, and after a restart.
//	ctx = idemclient.WithKey(ctx, idemclient.KeyFrom("renewal", "sub_123", "2026-10"))
//	req, err := http.NewRequestWithContext(ctx, http.MethodPost, api+"/v1/charges", strings.NewReader(`{"amount":1299}`))
//	if err != nil {
//		return err
//	}
//	resp, err := client.Do(req)
//	switch {
//	case errors.Is(err, idemclient.ErrDeadLettered):
//		return err // 410: the server gave up; do not retry, not even under a new key
//	case errors.Is(err, idemclient.ErrExhausted):
//		return err // no final answer yet: retry later with the same key
//	case err != nil:
//		return err
//	}
//	defer resp.Body.Close()
//
// This package imports none of idemflow's packages (it has its own copies of the
// header names); it is usable against any server of the protocol. Its tests use
// testkit/pgtest for a real Postgres under the SQL store example.
package idemclient
