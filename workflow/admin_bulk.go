package workflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
)

// Operators' actions on many keys (BulkKeys); the cancel of one is cancel.go's.

// BulkAction is what BulkKeys does to each key it selects.
type BulkAction string

// Bulk actions.
const (
	// BulkRedrive re-drives dead-lettered keys, as Redrive does one.
	BulkRedrive BulkAction = "redrive"
	// BulkRelease releases keys in progress, as ReleaseKey does one.
	BulkRelease BulkAction = "release"
)

// Limits of BulkOptions.Limit.
const (
	BulkLimitDefault = 1000
	BulkLimitMax     = 10000
)

// bulkBatch is how many keys one scan of a bulk action reads before acting on them.
const bulkBatch = 100

// ErrEmptyFilter: a bulk action was given no filter and not BulkOptions.All. Nothing
// was read or changed.
var ErrEmptyFilter = vocab.ErrEmptyFilter

// BulkOptions select the keys of BulkKeys and what is done to them. At least one of
// Flow, Scope, RecoveryPoint and ErrorContains must be set, or All.
type BulkOptions struct {
	// Action is BulkRedrive (dead-lettered keys) or BulkRelease (keys in progress).
	Action BulkAction
	// Flow, Scope and RecoveryPoint keep only keys with exactly that value; empty
	// keeps all.
	Flow, Scope, RecoveryPoint string
	// ErrorContains keeps only keys whose last error contains it (case sensitive).
	ErrorContains string
	// All lets every key of the action's status be selected when no filter is set.
	All bool
	// DryRun changes nothing: BulkResult.Matched counts the keys that would be acted on.
	DryRun bool
	// Limit is the most keys acted on (or counted). Defaults to BulkLimitDefault
	// (1000); at most BulkLimitMax (10000).
	Limit int
}

// BulkResult is what BulkKeys did.
type BulkResult struct {
	// Matched counts the keys selected that this build can read: with DryRun, those
	// that would be acted on; else Acted plus Changed.
	Matched int `json:"matched"`
	// Acted counts the keys re-driven or released.
	Acted int `json:"acted"`
	// Changed counts the keys that no longer matched when their turn came (a live
	// attempt finished or advanced them, another operator acted): left alone.
	Changed int `json:"changed"`
	// Newer counts the keys left alone because a newer build wrote them
	// (ErrNewerFormat), never counted in Matched.
	Newer int `json:"newer"`
	// More is true when Limit stopped the action: more keys may match.
	More bool `json:"more"`
}

// BulkKeys re-drives or releases every key that matches opts, up to opts.Limit, in
// claim order. It never changes many rows in one statement: it reads the matching keys
// a batch at a time, without locking them, and acts on each by a statement of its own
// that re-checks the key's status and the filter on the row it changes, and bumps the
// key's lock version (so that a holder of a released key can commit nothing more). A
// key that changed in between is left alone and counted in Changed. With
// opts.DryRun it changes nothing and counts, by the same reads and checks, what it
// would act on. Each key acted on emits its KeyEvent and gets its history entry.
//
// Errors: ErrEmptyFilter; ErrInvalidRequest (an unknown action, a limit out of
// range, a filter that is not text); ErrUnavailable when the database fails, with
// the result so far.
func (e *Engine) BulkKeys(ctx context.Context, opts BulkOptions) (BulkResult, error) {
	var res BulkResult
	status, err := opts.check()
	if err != nil {
		return res, err
	}
	limit := opts.Limit
	if limit == 0 {
		limit = BulkLimitDefault
	}
	f := keytable.Filter{Flow: opts.Flow, Scope: opts.Scope, RecoveryPoint: opts.RecoveryPoint, ErrorContains: opts.ErrorContains}
	var after *keytable.BulkKey
	for {
		page, err := e.store.BulkScan(ctx, e.pool, status, f, after, bulkBatch)
		if err != nil {
			return res, err
		}
		for i := range page {
			if res.Matched == limit {
				res.More = true
				return res, nil
			}
			if err := e.bulkOne(ctx, opts, f, &page[i], &res); err != nil {
				return res, err
			}
		}
		if len(page) < bulkBatch {
			return res, nil
		}
		after = &page[len(page)-1]
	}
}

// check validates opts and returns the status its action acts on.
func (o *BulkOptions) check() (string, error) {
	var status string
	switch o.Action {
	case BulkRedrive:
		status = keytable.StatusDead
	case BulkRelease:
		status = keytable.StatusInProgress
	default:
		return "", fmt.Errorf("workflow: bulk: %w: action %q (want redrive or release)", ErrInvalidRequest, o.Action)
	}
	for _, s := range []string{o.Flow, o.Scope, o.RecoveryPoint, o.ErrorContains} {
		if !storableText(s) || len(s) > 1000 {
			return "", fmt.Errorf("workflow: bulk: %w: a filter is not UTF-8 text without NUL of at most 1000 bytes", ErrInvalidRequest)
		}
	}
	if o.Flow == "" && o.Scope == "" && o.RecoveryPoint == "" && o.ErrorContains == "" && !o.All {
		return "", fmt.Errorf("workflow: bulk %s: %w", o.Action, ErrEmptyFilter)
	}
	if o.Limit < 0 || o.Limit > BulkLimitMax {
		return "", fmt.Errorf("workflow: bulk: %w: limit %d is outside 1..%d", ErrInvalidRequest, o.Limit, BulkLimitMax)
	}
	return status, nil
}

// bulkOne checks and acts on one key a bulk scan found, and counts it in res.
func (e *Engine) bulkOne(ctx context.Context, opts BulkOptions, f keytable.Filter, k *keytable.BulkKey, res *BulkResult) error {
	err := e.readable(ctx, k.Scope, k.Key)
	switch {
	case errors.Is(err, ErrNewerFormat):
		res.Newer++
		return nil
	case err != nil:
		return err
	}
	res.Matched++
	if opts.DryRun {
		return nil
	}
	var kind Outcome
	if opts.Action == BulkRedrive {
		kind = OutcomeRedriven
		err = e.store.BulkRedrive(ctx, e.pool, k.Scope, k.Key, f, e.entry(Attempt{By: ExecutorOperator, Outcome: OutcomeRedriven}))
	} else {
		kind = OutcomeOperatorReleased
		err = e.store.BulkRelease(ctx, e.pool, k.Scope, k.Key, f, e.cfg.historyKeep())
	}
	switch {
	case errors.Is(err, keytable.ErrNotFound):
		res.Matched--
		res.Changed++
		return nil
	case err != nil:
		return err
	}
	res.Acted++
	e.acted(ctx, KeyEvent{Kind: kind, Flow: k.Flow, Scope: k.Scope, Key: k.Key})
	return nil
}
