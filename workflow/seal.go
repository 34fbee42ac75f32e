package workflow

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/store"
)

// Sealer seals what a key stores of an answer (its body) and opens it again before the
// answer is replayed, so that the key table never holds the answer in plain text: an
// encryption with a key the database does not hold (AES-GCM with a key from a KMS),
// or a redaction that keeps what a replay needs. Set it as Config.Sealer.
//
// Seal returns what is stored for the answer body plain of the key (scope, key); Open
// returns the body Seal was given. Open must return exactly those bytes (replays are
// byte for byte) and should fail on a value sealed for another key (pass scope and key
// as additional authenticated data). Both are called concurrently. An error of Seal
// fails the attempt as a transient failure (the key is released and retried); an error
// of Open is the answer of the retry (nothing is replayed, the row is unchanged).
//
// Only answers are sealed, not request bodies: a flow whose resumption does not need
// the body keeps none (phases.Flow.ForgetBody). Keys finished before the Sealer was
// set stay in plain text until their retention ends; those finished with it cannot be
// replayed by a process without it, which answers ErrNewerFormat (retry later) and
// leaves them alone. A release before v0.4.0 fails on them with an error (it cannot
// decode their headers) and replays nothing: set a Sealer only once no such process
// runs on the key table (docs/OPERATIONS.md, "Upgrades").
type Sealer interface {
	Seal(ctx context.Context, scope, key string, plain []byte) ([]byte, error)
	Open(ctx context.Context, scope, key string, sealed []byte) ([]byte, error)
}

// responseSealed is the stored response format of a sealed answer: its headers carry
// store.FormatMember 2 and its body is what Sealer.Seal returned.
const responseSealed = 2

// sealResponse seals r's body when the engine has a Sealer, marking its headers.
func (e *Engine) sealResponse(ctx context.Context, scope, key string, r store.StoredResponse) (store.StoredResponse, error) {
	if e.cfg.Sealer == nil {
		return r, nil
	}
	var h map[string]json.RawMessage
	if err := json.Unmarshal(r.Headers, &h); err != nil {
		return r, fmt.Errorf("seal answer: %w", err)
	}
	h[store.FormatMember] = json.RawMessage(fmt.Sprint(responseSealed))
	headers, err := json.Marshal(h)
	if err != nil {
		return r, fmt.Errorf("seal answer: %w", err)
	}
	body, err := e.cfg.Sealer.Seal(ctx, scope, key, r.Body)
	if err != nil {
		return r, fmt.Errorf("seal answer: %w", err)
	}
	if body == nil {
		body = []byte{}
	}
	r.Headers, r.Body = headers, body
	return r, nil
}

// checkSealed refuses a finished row whose answer is sealed when the engine has no
// Sealer to open it.
func (e *Engine) checkSealed(row *store.Row) error {
	if v, _ := jsonFormat(row.ResponseHeaders); v == responseSealed && e.cfg.Sealer == nil {
		return fmt.Errorf("%w: the answer is sealed and this engine has no Config.Sealer", ErrNewerFormat)
	}
	return nil
}

// openResponse is the answer stored on a finished row, opened when it is sealed.
func (e *Engine) openResponse(ctx context.Context, row *store.Row) (*phases.Response, error) {
	if v, _ := jsonFormat(row.ResponseHeaders); v != responseSealed {
		return storedResponse(row)
	}
	if err := e.checkSealed(row); err != nil {
		return nil, err
	}
	var h map[string]json.RawMessage
	if err := json.Unmarshal(row.ResponseHeaders, &h); err != nil {
		return nil, fmt.Errorf("decode stored headers: %w", err)
	}
	delete(h, store.FormatMember)
	headers, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("decode stored headers: %w", err)
	}
	body, err := e.cfg.Sealer.Open(ctx, row.Scope, row.Key, row.ResponseBody)
	if err != nil {
		return nil, fmt.Errorf("workflow: open the stored answer of scope %q key %q: %w", row.Scope, row.Key, err)
	}
	plain := *row
	plain.ResponseHeaders, plain.ResponseBody = headers, body
	return storedResponse(&plain)
}
