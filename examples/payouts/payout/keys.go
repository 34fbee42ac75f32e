package payout

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"

	"github.com/idemflow/idemflow/workflow"
)

// EncodedPrefix starts the hashed form of a payout id or an account: EncodedPrefix and
// the unpadded base64url SHA-256 of the id's bytes. The "1" is the form's version: a
// later form gets a new prefix, and ids in the old form stay what they are.
const EncodedPrefix = "~1~"

// Key is the idempotency key of a payout id: the id itself when it is a valid key
// (1-255 printable ASCII, workflow.ValidateKey) that does not start with "~", else its
// hashed form. Every id Parse accepts has a key; two distinct ids never share one
// (short of a SHA-256 collision), since only hashed forms start with "~"; and the same
// id has the same key in every process and release.
func Key(payoutID string) string {
	if !strings.HasPrefix(payoutID, "~") && workflow.ValidateKey(payoutID) == nil {
		return payoutID
	}
	return hashed(payoutID)
}

// Scope is the scope of an account's payouts under prefix: prefix + "/" + the account
// when that is a valid scope (workflow.ValidateScope: UTF-8 text without control
// characters, at most 255 bytes) and the account does not start with "~", else prefix
// + "/" + the account's hashed form. Payouts of two accounts never share a scope, so
// the same payout id from two accounts is two payouts. prefix must be a valid scope of
// at most 200 bytes (the consumer checks it at start).
func Scope(prefix, account string) string {
	if s := prefix + "/" + account; !strings.HasPrefix(account, "~") && workflow.ValidateScope(s) == nil {
		return s
	}
	return prefix + "/" + hashed(account)
}

func hashed(id string) string {
	sum := sha256.Sum256([]byte(id))
	return EncodedPrefix + base64.RawURLEncoding.EncodeToString(sum[:])
}
