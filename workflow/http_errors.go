package workflow

import "errors"

// errNotFinal: a phase answered with a status that is not a final answer (1xx,
// including 101 Switching Protocols). It is never stored or replayed; the attempt
// fails like one without a response, and the key is released.
var errNotFinal = errors.New("status is not a final response")
