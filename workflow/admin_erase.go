package workflow

import (
	"context"
	"fmt"
)

// The erasure of every key of a scope (EraseScope).

// eraseBatch is how many keys one statement of EraseScope deletes.
const eraseBatch = 500

// EraseOptions say what EraseScope erases.
type EraseOptions struct {
	// Force erases the keys in progress too (unfinished, stuck or leased); without it
	// they are left and counted in EraseResult.Left.
	Force bool
	// DryRun changes nothing: EraseResult counts what would be erased and left.
	DryRun bool
}

// EraseResult is what EraseScope did (or, with DryRun, would do).
type EraseResult struct {
	// Erased counts the keys deleted.
	Erased int64 `json:"erased"`
	// Left counts the keys in progress left because EraseOptions.Force was not set
	// (counted after the erasure: a key claimed meanwhile is among them).
	Left int64 `json:"left"`
	// Fenced counts the keys erased while an executor held a live lease on them: the
	// holder can commit nothing more (every fenced statement it sends matches no row),
	// but a call it had under way may still reach the remote side.
	Fenced int64 `json:"fenced"`
}

// EraseScope deletes every key of scope, answers and request bodies with them, for a
// data subject's request. It deletes a batch of keys at a time, each batch by one
// statement, so that no transaction holds many rows.
//
// Finished and dead-lettered keys are always erased. Keys in progress are erased only
// with opts.Force, leased or not: the deletion fences a live holder, which then fails
// with ErrLeaseLost at its next commit, and the sweeper never takes the key again.
// Erasing a key forgets it: a retry carrying the same key afterwards is a new request
// and runs the flow again, so a payment may be made twice if a client still retries
// (erase a scope whose clients are done). Without Force the keys in progress are left
// alone and counted in Left: let them finish (or cancel them) and erase again.
//
// Errors: ErrInvalidScope (empty, longer than 255 bytes, not UTF-8 text or with a
// NUL; nothing is read); ErrUnavailable when the database fails, with what was erased
// so far.
func (e *Engine) EraseScope(ctx context.Context, scope string, opts EraseOptions) (EraseResult, error) {
	var res EraseResult
	if scope == "" || len(scope) > 255 || !storableText(scope) {
		return res, fmt.Errorf("workflow: erase scope: %w: want 1-255 bytes of UTF-8 text without NUL", ErrInvalidScope)
	}
	if opts.DryRun {
		c, err := e.store.EraseCount(ctx, e.pool, scope)
		if err != nil {
			return res, err
		}
		res.Erased = c.Done
		if opts.Force {
			res.Erased += c.InProgress
			res.Fenced = c.Leased
		} else {
			res.Left = c.InProgress
		}
		return res, nil
	}
	for {
		n, leased, err := e.store.EraseBatch(ctx, e.pool, scope, opts.Force, eraseBatch)
		res.Erased += int64(n)
		res.Fenced += int64(leased)
		if err != nil {
			return res, err
		}
		if n < eraseBatch {
			break
		}
	}
	if !opts.Force {
		c, err := e.store.EraseCount(ctx, e.pool, scope)
		if err != nil {
			return res, err
		}
		res.Left = c.InProgress
	}
	return res, nil
}
