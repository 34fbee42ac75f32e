// Package chargeflow is the charges example's flow and its fake payment provider, in a
// package of their own so that the example's binary and the benchmark run the same
// phases: create_charge (tx: insert a pending charge), provider_charge (call: pay with
// the derived key) and finalize (tx: record the outcome and answer).
//
// This package imports idemflow's phases package.
package chargeflow
