package workflow

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/internal/fingerprint"
	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
)

// ErrNewerFormat: the key's row holds something this build cannot read: a status, a
// fingerprint version, a recovery point its flow does not have, or phase data or a
// stored response in a newer format. It was written by a newer build (or a newer
// version of the flow), as during a rolling deploy, and this build leaves it alone: it
// answers nothing final (no mismatch, no dead-letter, no replay), takes nothing over,
// and its sweepers do not take the key. Retry after NewerFormatRetryAfter, when the
// newer build may answer it; the HTTP layer answers 503 with Retry-After. An unknown
// recovery point matches ErrUnknownRecoveryPoint as well.
var ErrNewerFormat = vocab.ErrNewerFormat

// NewerFormatRetryAfter is the Retry-After suggested for ErrNewerFormat: long enough
// for a rolling deploy to move the request to a newer build, short enough for a client.
const NewerFormatRetryAfter = 5 * time.Second

// formatMember is keytable.FormatMember as bytes, made once: jsonFormat runs on every
// look-up.
var formatMember = []byte(keytable.FormatMember)

// jsonFormat is the format version of a stored JSON object (phase data, response
// headers): its member keytable.FormatMember, 1 when absent. ok is false when the member
// is not a positive integer or the object cannot be decoded: not a format this build
// reads.
func jsonFormat(obj []byte) (version int, ok bool) {
	if !bytes.Contains(obj, formatMember) {
		return 1, true // the common case: no member, and no decoding
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(obj, &m); err != nil {
		return 0, false
	}
	raw, found := m[keytable.FormatMember]
	if !found {
		return 1, true
	}
	var v int // not the result: its address would move the result to the heap on every call
	if err := json.Unmarshal(raw, &v); err != nil || v < 1 {
		return 0, false
	}
	return v, true
}

// checkFormat returns an error wrapping ErrNewerFormat when row holds something this
// build does not read (see ErrNewerFormat), before anything is decided on it. The
// recovery point is checked against the flow where the flow is known (see
// unknownPoint).
func checkFormat(row *keytable.Row) error {
	if !keytable.KnownStatus(row.Status) {
		return fmt.Errorf("%w: status %q", ErrNewerFormat, row.Status)
	}
	if !fingerprint.Known(row.Fingerprint) {
		v := -1
		if len(row.Fingerprint) > 0 {
			v = int(row.Fingerprint[0])
		}
		return fmt.Errorf("%w: fingerprint of %d bytes (version byte %d)", ErrNewerFormat, len(row.Fingerprint), v)
	}
	if v, ok := jsonFormat(row.PhaseData); !ok || v > keytable.PhaseDataFormat && v != keytable.PhaseDataSealed {
		return fmt.Errorf("%w: phase data format %d", ErrNewerFormat, v)
	}
	if row.Status == keytable.StatusFinished {
		if v, ok := jsonFormat(row.ResponseHeaders); !ok || v > keytable.ResponseFormat && v != responseSealed {
			return fmt.Errorf("%w: stored response format %d", ErrNewerFormat, v)
		}
	}
	return nil
}

// checkRow is checkKnown, and that the engine can open what the row holds sealed
// (checkSealed): what an attempt on the key needs before it decides anything.
func (e *Engine) checkRow(row *keytable.Row) error {
	if err := e.checkKnown(row); err != nil {
		return err
	}
	return e.checkSealed(row)
}

// checkKnown is checkFormat, and for an unfinished row of a registered flow, that the
// flow has its recovery point. An operator's action on one key needs no more: it
// opens nothing sealed.
func (e *Engine) checkKnown(row *keytable.Row) error {
	if err := checkFormat(row); err != nil {
		return err
	}
	if row.Status == keytable.StatusFinished {
		return nil
	}
	if f, ok := e.flow(row.Flow); ok {
		if _, err := f.Index(row.RecoveryPoint); err != nil {
			return unknownPoint(err)
		}
	}
	return nil
}

// unknownPoint is the error for a recovery point the flow does not have: both
// ErrUnknownRecoveryPoint and ErrNewerFormat.
func unknownPoint(cause error) error {
	return fmt.Errorf("%w (%w): %v", ErrUnknownRecoveryPoint, ErrNewerFormat, cause)
}
