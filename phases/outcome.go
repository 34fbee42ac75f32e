package phases

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Response is the answer a flow gives. Once stored it is replayed byte for byte.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON returns a response with the JSON encoding of v and Content-Type
// application/json. Its signature lets a phase end with `return phases.JSON(201, v)`.
func JSON(status int, v any) (*Response, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode response: %w", err)
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	return &Response{Status: status, Header: h, Body: body}, nil
}

// TerminalError finishes a key with Response. In a tx phase the transaction's writes
// are rolled back and the response is stored on its own. Make one with Fail.
type TerminalError struct {
	Response *Response
}

// Fail returns an error that finishes the key with resp, for deterministic failures
// such as a declined card (402) or an invalid request (400). A resp of 5xx is treated
// as transient instead: 5xx answers are never stored.
func Fail(resp *Response) error { return &TerminalError{Response: resp} }

func (e *TerminalError) Error() string {
	if e.Response == nil {
		return "phase failed terminally without a response"
	}
	return fmt.Sprintf("phase failed terminally with status %d", e.Response.Status)
}

// RetryError marks a failure worth retrying later, with a suggested delay. Any error
// that is not a *TerminalError is transient; this type only adds After. Make one with
// RetryLater.
//
// It is a hint going into the engine, and is named apart from workflow.TransientError,
// the result coming out of Engine.Do that callers branch on (with errors.As, beside
// workflow.ErrTransient): that one keeps the name because it is the one users see on
// every transient failure, while this one is made by RetryLater and rarely named.
type RetryError struct {
	Err   error
	After time.Duration
}

// RetryLater wraps err as a transient failure and suggests retrying after d (0 lets
// the engine choose).
func RetryLater(err error, d time.Duration) error { return &RetryError{Err: err, After: d} }

func (e *RetryError) Error() string {
	if e.Err == nil {
		return "transient failure"
	}
	return e.Err.Error()
}

func (e *RetryError) Unwrap() error { return e.Err }

// PanicError is the transient error a panicking phase turns into.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("phase panicked: %v", e.Value) }

// ErrNoValue is returned by Slot.Get when the slot was never set.
var ErrNoValue = errors.New("phase data has no value")
