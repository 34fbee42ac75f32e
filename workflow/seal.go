package workflow

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
	"github.com/idemflow/idemflow/phases"
)

// Sealer seals what a key stores of a request (its body) and of an answer (its body),
// and opens it again when a resumption needs the request or a replay the answer, so
// that the key table never holds either in plain text: an encryption with a key the
// database does not hold (AES-GCM with a key from a KMS), or a redaction. Set it as
// Config.Sealer.
//
// Seal returns what is stored for the body plain of the key (scope, key); Open returns
// what Seal was given. For an encryption Open must return exactly those bytes (replays
// are byte for byte, and resumptions run with the request as the client sent it) and
// should fail on a value sealed for another key (pass scope and key as additional
// authenticated data). A Sealer that redacts instead returns from Open what Seal
// stored: a replay then sends the redacted answer and a resumption (a client's retry
// or a sweep) runs the phases left with the redacted request body, so redact only what
// no later phase and no client needs, or keep no body at all (phases.Flow.ForgetBody).
// Both are called concurrently.
//
// An error of Seal fails the attempt as a transient failure: a new key is not claimed,
// a finishing key is released and retried. An error of Open (wrapped in ErrOpenSealed)
// is the answer of the attempt that needed the value, before it changed anything: a
// retry is answered with it and the row is left as it was; a sweep releases the key
// with it as its last error, as a failed attempt.
//
// A sealed request body is stored as phase data format 2, a sealed answer as response
// format 2 (docs/OPERATIONS.md, "Sealing request bodies and answers"). Keys stored
// before the Sealer was set stay in plain text until they finish or their retention
// ends; those stored with it cannot be resumed or replayed by a process without it,
// which answers ErrNewerFormat (retry later), does not sweep them and leaves them
// alone. A release before v0.4.0 would resume a sealed request with the sealed bytes
// as its body: set a Sealer only once no such process runs on the key table.
type Sealer interface {
	Seal(ctx context.Context, scope, key string, plain []byte) ([]byte, error)
	Open(ctx context.Context, scope, key string, sealed []byte) ([]byte, error)
}

// ErrOpenSealed: Config.Sealer failed to open a sealed request body or answer of the
// key (sealed with another encryption key, for another key, or damaged). Nothing was
// run, replayed or changed by the attempt that met it; the Sealer's error is wrapped.
var ErrOpenSealed = vocab.ErrOpenSealed

// responseSealed is the stored response format of a sealed answer: its headers carry
// keytable.FormatMember 2 and its body is what Sealer.Seal returned.
const responseSealed = 2

// sealResponse seals r's body when the engine has a Sealer, marking its headers.
func (e *Engine) sealResponse(ctx context.Context, scope, key string, r keytable.StoredResponse) (keytable.StoredResponse, error) {
	if e.cfg.Sealer == nil {
		return r, nil
	}
	var h map[string]json.RawMessage
	if err := json.Unmarshal(r.Headers, &h); err != nil {
		return r, fmt.Errorf("seal answer: %w", err)
	}
	h[keytable.FormatMember] = json.RawMessage(fmt.Sprint(responseSealed))
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

// checkSealed refuses a row whose answer or request body is sealed when the engine
// has no Sealer to open it.
func (e *Engine) checkSealed(row *keytable.Row) error {
	if e.cfg.Sealer != nil {
		return nil
	}
	if v, _ := jsonFormat(row.ResponseHeaders); row.Status == keytable.StatusFinished && v == responseSealed {
		return fmt.Errorf("%w: the answer is sealed and this engine has no Config.Sealer", ErrNewerFormat)
	}
	if row.Status != keytable.StatusFinished && bodySealed(row) {
		return fmt.Errorf("%w: the request body is sealed and this engine has no Config.Sealer", ErrNewerFormat)
	}
	return nil
}

// openResponse is the answer stored on a finished row, opened when it is sealed.
func (e *Engine) openResponse(ctx context.Context, row *keytable.Row) (*phases.Response, error) {
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
	delete(h, keytable.FormatMember)
	headers, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("decode stored headers: %w", err)
	}
	body, err := e.cfg.Sealer.Open(ctx, row.Scope, row.Key, row.ResponseBody)
	if err != nil {
		return nil, fmt.Errorf("workflow: %w: the stored answer of scope %q key %q: %w", ErrOpenSealed, row.Scope, row.Key, err)
	}
	plain := *row
	plain.ResponseHeaders, plain.ResponseBody = headers, body
	return storedResponse(&plain)
}

// bodySealed reports whether row's request body is sealed: its phase data is format 2.
func bodySealed(row *keytable.Row) bool {
	v, _ := jsonFormat(row.PhaseData)
	return v == keytable.PhaseDataSealed
}

// storedBody is the request body stored on a new key of f, and whether it is sealed:
// none when f forgets it (phases.Flow.ForgetBody), sealed when the engine has a
// Sealer, else the body as it came. A Sealer's failure is transient: nothing is
// stored.
func (e *Engine) storedBody(ctx context.Context, f phases.Flow, req Request) ([]byte, bool, error) {
	if f.ForgetBody {
		return []byte{}, false, nil
	}
	if e.cfg.Sealer == nil {
		return req.Body, false, nil
	}
	body, err := e.cfg.Sealer.Seal(ctx, req.Scope, req.Key, req.Body)
	if err != nil {
		return nil, false, &TransientError{Phase: phases.Started, RetryAfter: time.Second, Err: fmt.Errorf("seal request body: %w", err)}
	}
	if body == nil {
		body = []byte{}
	}
	return body, true, nil
}

// openBody is the request body of row as the phases get it: opened when it is sealed.
// It is called before anything changes the row, so that a body this engine cannot open
// changes nothing.
func (e *Engine) openBody(ctx context.Context, row *keytable.Row) ([]byte, error) {
	if !bodySealed(row) {
		return row.RequestBody, nil
	}
	if e.cfg.Sealer == nil { // checkRow refuses it before: a backstop
		return nil, fmt.Errorf("%w: the request body is sealed and this engine has no Config.Sealer", ErrNewerFormat)
	}
	body, err := e.cfg.Sealer.Open(ctx, row.Scope, row.Key, row.RequestBody)
	if err != nil {
		return nil, fmt.Errorf("workflow: %w: the request body of scope %q key %q: %w", ErrOpenSealed, row.Scope, row.Key, err)
	}
	return body, nil
}

// openedRow is row with its request body opened (row itself when it is not sealed).
func (e *Engine) openedRow(ctx context.Context, row *keytable.Row) (*keytable.Row, error) {
	if !bodySealed(row) {
		return row, nil
	}
	body, err := e.openBody(ctx, row)
	if err != nil {
		return nil, err
	}
	opened := *row
	opened.RequestBody = body
	return &opened, nil
}

// showSealed fills in what info shows of d's sealed values: their size and that they
// are sealed, never their bytes (the admin API opens nothing), and a sealed answer's
// headers, which are stored in plain text.
func showSealed(info *KeyInfo, d *keytable.KeyDetail) {
	if d.PhaseDataFormat == strconv.Itoa(keytable.PhaseDataSealed) {
		info.RequestSealed, info.RequestSealedBytes, info.Request = true, len(d.RequestBody), nil
	}
	if v, _ := jsonFormat(d.ResponseHeaders); d.ResponseStatus == nil || v != responseSealed {
		return
	}
	info.ResponseSealed, info.ResponseSealedBytes, info.ResponseBody = true, len(d.ResponseBody), nil
	var h map[string]json.RawMessage
	if json.Unmarshal(d.ResponseHeaders, &h) != nil {
		return
	}
	delete(h, keytable.FormatMember)
	info.ResponseHeader = map[string][]string{}
	for name, raw := range h {
		var vals []string
		if json.Unmarshal(raw, &vals) == nil {
			info.ResponseHeader[name] = vals
		}
	}
}
