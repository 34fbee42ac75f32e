// Package fingerprint computes and compares a request's fingerprint: what a key row
// keeps of the request that claimed it (method, route and body, the body in an exact
// canonical form when it is JSON, or only the members a flow names), so that a retry
// that brings another request under the same key is told apart. Package workflow
// computes one per request (Of) before the look-up and compares it with a stored
// row's (Matches); workflow.Fingerprint is its public face.
//
//	ms, err := fingerprint.NewMembers(flow.FingerprintMembers) // nil: the whole request
//	fp, err := fingerprint.Of(ms, req.Method, req.Route, req.Body)
//	same := fingerprint.Matches(row.Fingerprint, fp, req.Method, req.Route, req.Body, ms)
//
// # Imports
//
// It imports internal/vocab, github.com/go-json-experiment/json/jsontext (the JSON
// tokenizer under the canonical form) and github.com/gowebpki/jcs (RFC 8785, only to
// compare fingerprints stored before v2), and none of idemflow's public packages.
package fingerprint
