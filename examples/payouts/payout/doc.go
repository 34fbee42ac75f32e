// Package payout is the payouts consumer's flow: record a requested payout, have the
// fake bank transfer the money under the derived key, and settle it in the ledger.
// It also holds the fake bank, and Bare, the same work without idemflow, which the
// benchmark compares against the flow.
package payout
