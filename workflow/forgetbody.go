package workflow

import "github.com/idemflow/idemflow/phases"

// storedBody is the request body stored on a new key of f: none when f forgets it
// (phases.Flow.ForgetBody).
func storedBody(f phases.Flow, body []byte) []byte {
	if f.ForgetBody {
		return []byte{}
	}
	return body
}
