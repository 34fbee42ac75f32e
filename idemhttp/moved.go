package idemhttp

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/idemflow/idemflow/workflow"
)

// MovedKeyPrefix begins the key a request is stored under when it repeats, at the
// address a stored 307 or 308 named, the request that answer was stored for (see
// Middleware): MovedKeyPrefix + the unpadded base64url SHA-256 of the client's key, a
// NUL byte and the request's route. Operators find such a request's key row under it.
const MovedKeyPrefix = "~moved~"

// run runs req for r. When the key was used for a different request whose stored
// answer is a 307 Temporary Redirect or 308 Permanent Redirect to r (the same method,
// a Location that resolves to r's path and query), r is that request repeated where
// it was sent, the same operation: it is run under movedKey instead of being answered
// 422, so that following the redirect, and every retry of the operation that follows
// it again, gets one answer. Any other mismatch is answered 422 as before.
//
// late, if not nil, reads the body once the engine admits the first attempt
// (workflow.Engine.RunReading); the later ones have it.
func (f *front) run(ctx context.Context, r *http.Request, req workflow.Request, late *lateBody) *workflow.Result {
	var out *workflow.Result
	if late != nil {
		out = f.e.RunReading(ctx, req, late.read)
		req.Body = late.body
	} else {
		out = f.e.Run(ctx, req)
	}
	if out.Outcome != workflow.OutcomeMismatch {
		return out
	}
	info, err := f.e.InspectKey(ctx, req.Scope, req.Key)
	switch {
	case errors.Is(err, workflow.ErrNotFound): // forgotten since: a new request
		return f.e.Run(ctx, req)
	case err != nil:
		// Whether r follows a redirect is unknown: a retryable answer, never a 422
		// that could send the client to a new key.
		return &workflow.Result{Outcome: workflow.OutcomeFailed, Err: err}
	case !redirectedHere(info, r, req.Route):
		return out
	}
	req.Key = movedKey(req.Key, req.Route)
	return f.e.Run(ctx, req)
}

// redirectedHere reports whether info, a key's row, holds a 307 or 308 answer to a
// request of r's method at another route whose Location resolves to r's path and
// query (on r's host, when it names one).
func redirectedHere(info *workflow.KeyInfo, r *http.Request, route string) bool {
	if info.Status != workflow.KeysFinished || info.Method != r.Method || info.Route == route ||
		(info.ResponseStatus != http.StatusTemporaryRedirect && info.ResponseStatus != http.StatusPermanentRedirect) {
		return false
	}
	var location string
	for k, v := range info.ResponseHeader {
		if strings.EqualFold(k, "Location") && len(v) == 1 {
			location = v[0]
		}
	}
	loc, err := url.Parse(location)
	if location == "" || err != nil {
		return false
	}
	base := &url.URL{Path: "/"}
	if strings.HasPrefix(info.Route, "/") { // the default route: a path and query
		if b, err := url.Parse(info.Route); err == nil {
			base = b
		}
	}
	target := base.ResolveReference(loc)
	if target.Host != "" && !strings.EqualFold(target.Host, r.Host) {
		return false
	}
	return target.EscapedPath() == r.URL.EscapedPath() && target.RawQuery == r.URL.RawQuery
}

// movedKey is the key of a request that repeats, at route, the request key was first
// used for: valid (printable ASCII, 50 bytes), the same on every retry.
func movedKey(key, route string) string {
	sum := sha256.Sum256([]byte(key + "\x00" + route))
	return MovedKeyPrefix + base64.RawURLEncoding.EncodeToString(sum[:])
}
