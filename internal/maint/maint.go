// Package maint is the engine's maintenance API: taking over keys whose lease ran out,
// running them from their recovery point, giving back the ones not run, and expiring
// finished keys. The sweeper package schedules it; users never call it, so it is not
// part of workflow's API. workflow implements it and registers the implementation
// (Register); Of finds it for an engine.
//
// The words, as everywhere in idemflow: a key is "released" by a failed attempt (its
// lease cleared, due again after a backoff), "given back" when a sweeper took it but
// did not run it (the takeover's attempt uncounted, due at once), and "parked" when
// only its client can finish it (released for the client's retry, left alone by sweeps
// for a while).
//
// This package imports idemflow's phases and store packages.
package maint

import (
	"context"
	"time"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/store"
)

// Engine is what a sweeper drives.
type Engine interface {
	// TakeDue takes over, in one short statement, up to opts.Limit keys that are in
	// progress with an expired or released lease, due, older than the grace period, and
	// of a flow registered on this engine, oldest due first. Rows locked by anyone else
	// are skipped, never waited for, so sweepers take disjoint sets. It returns an empty
	// slice when nothing is due.
	TakeDue(ctx context.Context, opts TakeDueOpts) ([]*Taken, error)
	// Run runs a taken key from its recovery point through the same phase code a
	// client's retry runs, and records its fate: finished, released, dead-lettered,
	// parked, or lost to another executor. The error is non-nil only when the fate
	// could not be recorded; the lease then runs out and a later sweep takes the key.
	Run(ctx context.Context, t *Taken, opts *RunOpts) (Result, error)
	// GiveBack returns a taken key without running it: the lease is cleared, the
	// takeover's attempt uncounted, and the key stays due. It runs even if ctx has ended
	// (bounded by a few seconds) and returns nil if the key was taken over meanwhile.
	GiveBack(ctx context.Context, t *Taken) error
	// ExpireFinished deletes up to limit finished keys that finished more than
	// retention ago by the database clock, oldest first, skipping locked rows, and
	// returns how many: fewer than limit means nothing more is expired for now.
	ExpireFinished(ctx context.Context, retention time.Duration, limit int) (int64, error)
	// ExpireDead deletes up to limit dead-lettered keys dead-lettered more than
	// retention ago, and ExpireParked up to limit parked keys (of a client-only flow
	// registered on this engine, in progress, not leased) claimed more than retention
	// ago; each returns how many.
	ExpireDead(ctx context.Context, retention time.Duration, limit int) (int64, error)
	ExpireParked(ctx context.Context, retention time.Duration, limit int) (int64, error)
	// Lease is the lease a takeover sets.
	Lease() time.Duration
}

// TakeDueOpts select the keys TakeDue takes.
type TakeDueOpts struct {
	// Limit is the most keys taken. Required, positive.
	Limit int
	// Grace leaves keys claimed less than Grace ago (by the database clock) to their
	// client's own retry. Zero means the default, 5s, as sweeper.Config.Grace; -1 means
	// no grace.
	Grace time.Duration
}

// Taken is a key taken over by TakeDue: its lock version was bumped, so nothing that
// ran it before can commit, and it holds a fresh lease. Pass it to Run, or to GiveBack
// if it will not be run.
type Taken struct {
	Scope         string
	Key           string
	ID            string // the key row's identity
	Flow          string
	RecoveryPoint string
	LockVersion   int64
	// Attempts counts the claim and every takeover, this one included.
	Attempts int

	// Row is the key row as the takeover returned it, and At when the takeover was
	// sent: the engine's, not the sweeper's.
	Row *store.Row
	At  time.Time
}

// Fence is the fence of the taken key's row.
func (t *Taken) Fence() store.Fence {
	return store.Fence{Scope: t.Scope, Key: t.Key, ID: t.ID, LockVersion: t.LockVersion}
}

// LeaseLeft estimates how much of the lease set by the takeover remains, measured from
// when the takeover was sent.
func (t *Taken) LeaseLeft() time.Duration { return t.Row.LeaseLeft() - time.Since(t.At) }

// RunOpts configure Run. A nil *RunOpts means all defaults.
type RunOpts struct {
	// MaxAttempts dead-letters a key whose failed attempt was its MaxAttempts-th or
	// later (Taken.Attempts counts the claim and every takeover). Zero means the
	// default, 10, as sweeper.Config.MaxAttempts; -1 means a key is never
	// dead-lettered.
	MaxAttempts int
	// ParkFor is how long a parked key is left alone by sweeps. Defaults to the
	// engine's BackoffMax.
	ParkFor time.Duration
}

// Outcome is what became of a key Run ran.
type Outcome string

// Outcomes of Run.
const (
	// Finished: the key was driven to finished; its response is stored.
	Finished Outcome = "finished"
	// Released: the attempt failed (or the key cannot be run here); the key was
	// released with its recovery point and is due again after a backoff.
	Released Outcome = "released"
	// DeadLettered: the attempt failed and was the last one allowed.
	DeadLettered Outcome = "dead_lettered"
	// LeaseLost: another executor took the key over while this one ran it; nothing
	// this run did after that was committed.
	LeaseLost Outcome = "lease_lost"
	// Parked: the key's flow is client-only; it was released, not run, for its
	// client's retry.
	Parked Outcome = "parked"
)

// Result reports what Run did with a key.
type Result struct {
	Outcome Outcome
	// Response is the stored answer when Outcome is Finished.
	Response *phases.Response
	// Err is why the attempt failed, for every other outcome.
	Err error
}

var of func(engine any) Engine

// Register sets how Of finds the maintenance API of an engine. The workflow package
// calls it once, from an init function.
func Register(f func(engine any) Engine) { of = f }

// Of returns the maintenance API of engine (a *workflow.Engine), or nil if it is not
// one.
func Of(engine any) Engine {
	if of == nil {
		return nil
	}
	return of(engine)
}
