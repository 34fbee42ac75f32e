package phases

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// ProblemContentType is the Content-Type of the responses Problem makes.
const ProblemContentType = "application/problem+json"

// ErrInvalidProblem: Problem was given extension members it cannot use (a standard
// member's name, or a value that does not encode as JSON). Returned as an ordinary
// error, it makes the attempt transient: nothing is stored.
var ErrInvalidProblem = errors.New("invalid problem details")

// problemMembers are the standard members Problem sets itself.
var problemMembers = []string{"type", "title", "status", "detail"}

// Problem returns an RFC 9457 problem details response: status, Content-Type
// application/problem+json, and a body with the members type (defaults to
// "about:blank"), title (defaults to the status's text), status, detail (left out
// when empty) and the extension members of extra (nil for none; "instance" is one).
// The body's members are in name order, so that the same call makes the same bytes.
// Its signature lets a phase end with
//
//	return phases.Problem(http.StatusPaymentRequired, "", "card declined", reason, nil)
//
// which stores the answer with the phase's writes, like JSON; FailProblem makes the
// same answer as a failure that rolls them back.
//
// Errors: ErrInvalidProblem when extra names a standard member (type, title, status,
// detail) or holds a value that does not encode as JSON.
func Problem(status int, typ, title, detail string, extra map[string]any) (*Response, error) {
	members := make(map[string]any, len(extra)+4)
	for k, v := range extra {
		members[k] = v
	}
	for _, k := range problemMembers {
		if _, ok := extra[k]; ok {
			return nil, fmt.Errorf("phases: %w: extra member %q is a standard member", ErrInvalidProblem, k)
		}
	}
	if typ == "" {
		typ = "about:blank"
	}
	if title == "" {
		title = http.StatusText(status)
	}
	members["type"], members["title"], members["status"] = typ, title, status
	if detail != "" {
		members["detail"] = detail
	}
	body, err := json.Marshal(members)
	if err != nil {
		return nil, fmt.Errorf("phases: %w: %w", ErrInvalidProblem, err)
	}
	h := http.Header{}
	h.Set("Content-Type", ProblemContentType)
	return &Response{Status: status, Header: h, Body: body}, nil
}

// FailProblem is Fail with the response Problem makes: it finishes the key with that
// problem details answer and rolls back a tx phase's writes, as in
//
//	return nil, phases.FailProblem(http.StatusBadRequest, "", "invalid request", err.Error(), nil)
//
// A status of 5xx is transient, as with Fail. When Problem fails (ErrInvalidProblem)
// FailProblem returns its error, which is transient: nothing is stored.
func FailProblem(status int, typ, title, detail string, extra map[string]any) error {
	resp, err := Problem(status, typ, title, detail, extra)
	if err != nil {
		return err
	}
	return Fail(resp)
}
