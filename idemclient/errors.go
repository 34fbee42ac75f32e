package idemclient

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Sentinels to branch on with errors.Is.
var (
	// ErrInvalidKey: a key is not 1 to MaxKeyLen bytes of printable ASCII, or a request
	// carries two different keys. Nothing was sent.
	ErrInvalidKey = errors.New("idemclient: invalid idempotency key")
	// ErrDeadLettered: the server gave up on the operation under the key (410). Every
	// *DeadLetteredError matches it.
	ErrDeadLettered = errors.New("idemclient: the server gave up on the operation under this key")
	// ErrExhausted: the attempts or the time allowed ran out before a final answer.
	// Every *ExhaustedError matches it.
	ErrExhausted = errors.New("idemclient: no final answer within the attempts and time allowed")
)

// DeadLetteredError is the end of an operation the server answered 410 Gone: an
// idemflow server sends it for a key it gave up on (the problem type
// key-dead-lettered), after too many failed attempts or when the answer could not be
// stored. The operation may have taken effect in part. Do not retry it, and do not
// send it again under a new key: ask the service's operators, who can re-drive it;
// after that the same key answers with the operation's result.
type DeadLetteredError struct {
	// Key is the request's idempotency key.
	Key string
	// Header and Body are the 410 answer's (the body up to 64 KiB): the problem
	// document says what happened.
	Header http.Header
	Body   []byte
}

func (e *DeadLetteredError) Error() string {
	return fmt.Sprintf("idemclient: key %q: 410 Gone: the server gave up on this operation; do not retry it or send it under a new key", e.Key)
}

// Is makes errors.Is(err, ErrDeadLettered) true.
func (e *DeadLetteredError) Is(target error) bool { return target == ErrDeadLettered }

// ExhaustedError is the end of an operation that had no final answer when
// Config.MaxAttempts or Config.MaxElapsed ran out, or when the server asked for a wait
// (Retry-After) longer than the time left. The operation may still finish on the
// server: retry it later with the same key (keep it in a Store) to get its answer.
type ExhaustedError struct {
	// Key is the request's idempotency key.
	Key string
	// Attempts is the number of attempts sent; Elapsed the time since the first began.
	Attempts int
	Elapsed  time.Duration
	// Status is the last answer's status, 0 when the last attempt got no answer (then
	// Err says why).
	Status int
	// RetryAfter is the last answer's Retry-After, 0 when it had none.
	RetryAfter time.Duration
	// Err is the last attempt's error when it got no answer.
	Err error
}

func (e *ExhaustedError) Error() string {
	last := fmt.Sprintf("status %d", e.Status)
	if e.Status == 0 {
		last = fmt.Sprintf("error: %v", e.Err)
	}
	if e.RetryAfter > 0 {
		last += fmt.Sprintf(", retry after %s", e.RetryAfter)
	}
	return fmt.Sprintf("idemclient: key %q: no final answer after %d attempts in %s (last %s); retry later with the same key",
		e.Key, e.Attempts, e.Elapsed.Round(time.Millisecond), last)
}

// Is makes errors.Is(err, ErrExhausted) true.
func (e *ExhaustedError) Is(target error) bool { return target == ErrExhausted }

// Unwrap returns the last attempt's error, if any.
func (e *ExhaustedError) Unwrap() error { return e.Err }
