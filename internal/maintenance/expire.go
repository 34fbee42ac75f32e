package maintenance

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Defaults of ExpirerConfig (the engine's sweeper settings name them too).
const (
	RetentionDefault       = 24 * time.Hour
	DeadRetentionDefault   = 90 * 24 * time.Hour
	ParkedRetentionDefault = 30 * 24 * time.Hour
	CleanupBatchDefault    = 1000
	CleanupShareDefault    = 0.5
)

// ExpirerConfig is an Expirer's settings, filled in and checked by the engine.
type ExpirerConfig struct {
	// Finished, Dead and Parked are the retentions of finished keys (since they
	// finished), dead-lettered keys (since they were dead-lettered) and parked keys
	// (since their claim). Negative: such keys are kept forever.
	Finished, Dead, Parked time.Duration
	// Batch is the most keys one statement deletes.
	Batch int
	// Share is the share of its time a cleanup of a backlog spends deleting, in (0, 1]:
	// after each full batch it rests for as long as the batch took, times
	// (1-Share)/Share.
	Share float64
	// RemovalWait is how long, on a partitioned key table, a partition past its
	// removal may wait for the removal's window (PartitionerConfig.RemoveAt): its
	// finished keys are deleted one by one only after that (keytable's
	// ExpireFinishedWaiting). 0 without a window.
	RemovalWait time.Duration
}

// Expirer deletes keys past their retention: finished, dead-lettered and parked keys,
// each in short statements that skip rows anyone else has locked (their SQL is
// keytable's expire_sql.go).
type Expirer struct {
	Env    *Env
	Config ExpirerConfig
	// ClientOnly returns the names of the registered client-only flows: only their
	// keys are ever parked, so only theirs expire as parked.
	ClientOnly func() []string
	// Rest waits d, or until stop is closed or ctx ends, between full batches; nil: a
	// timer. Tests replace it to see the pace.
	Rest func(ctx context.Context, stop <-chan struct{}, d time.Duration)
}

// Expired counts the keys one pass of an Expirer deleted.
type Expired struct {
	Finished, Dead, Parked int64
}

// Kind is a kind of key an Expirer deletes.
type Kind int

const (
	Finished Kind = iota
	Dead
	Parked
)

func (k Kind) String() string { return [...]string{"finished", "dead-lettered", "parked"}[k] }

// RunOnce deletes each kind's expired keys in batches until a batch comes back short,
// resting between full batches (Config.Share), unless stop (nil: never) is closed or
// ctx ends. A kind whose retention is negative is skipped.
func (s *Expirer) RunOnce(ctx context.Context, stop <-chan struct{}) (Expired, error) {
	var out Expired
	var errs []error
	for _, c := range []struct {
		kind      Kind
		retention time.Duration
		count     *int64
	}{
		{Finished, s.Config.Finished, &out.Finished},
		{Dead, s.Config.Dead, &out.Dead},
		{Parked, s.Config.Parked, &out.Parked},
	} {
		if Stopped(ctx, stop) || c.retention < 0 {
			continue
		}
		n, err := s.cleanup(ctx, stop, c.kind, c.retention)
		*c.count = n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// cleanup deletes expired keys of kind in batches until one comes back short, resting
// between full batches so that it spends Config.Share of its time deleting.
func (s *Expirer) cleanup(ctx context.Context, stop <-chan struct{}, kind Kind, retention time.Duration) (int64, error) {
	var total int64
	for !Stopped(ctx, stop) {
		began := time.Now()
		n, err := s.Expire(ctx, kind, retention, s.Config.Batch)
		total += n
		if err != nil {
			return total, fmt.Errorf("expire %s keys: %w", kind, err)
		}
		if n < int64(s.Config.Batch) {
			break
		}
		if s.Config.Share < 1 {
			rest := s.Rest
			if rest == nil {
				rest = restFor
			}
			rest(ctx, stop, time.Duration(float64(time.Since(began))*(1-s.Config.Share)/s.Config.Share))
		}
	}
	return total, nil
}

// Expire deletes, in one short statement bounded like the engine's own, up to limit
// keys of kind past retention by the database clock, oldest first, skipping rows
// locked by anyone else, and returns how many it deleted: fewer than limit means
// nothing more is expired for now.
//
//   - Finished: keys that finished more than retention ago. Keys in progress and
//     dead-lettered keys are never deleted by it. A finished key is replayed until it
//     is deleted, so a client can rely on replays for at least retention.
//   - Dead: keys dead-lettered more than retention ago; until then a dead-lettered key
//     is listed and can be re-driven.
//   - Parked: keys of the client-only flows (ClientOnly) in progress without a live
//     lease and claimed more than retention ago. Keys of other flows are never deleted
//     by it: a sweeper finishes them or dead-letters them.
func (s *Expirer) Expire(ctx context.Context, kind Kind, retention time.Duration, limit int) (int64, error) {
	what := [...]string{"finished", "dead", "parked"}[kind]
	if retention <= 0 {
		return 0, fmt.Errorf("workflow: expire %s keys: retention %s is not positive", what, retention)
	}
	var flows []string
	if kind == Parked {
		flows = s.ClientOnly()
	}
	ctx, cancel := s.Env.bounded(ctx)
	defer cancel()
	st, db := s.Env.Store, s.Env.Pool
	switch kind {
	case Dead:
		return st.ExpireDead(ctx, db, retention, limit)
	case Parked:
		return st.ExpireParked(ctx, db, flows, retention, limit)
	}
	return st.ExpireFinishedWaiting(ctx, db, retention, limit, s.Config.RemovalWait)
}

// restFor waits d, or until stop is closed or ctx ends.
func restFor(ctx context.Context, stop <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	case <-ctx.Done():
	}
}
