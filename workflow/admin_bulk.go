package workflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/textproto"
	"slices"
	"strings"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
	"github.com/idemflow/idemflow/phases"
)

// Operators' actions on many keys (BulkKeys) and the cancel of one (CancelKey).

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

// ErrCallMayHaveRun: CancelKey refused a key one of whose call phases may already
// have reached the remote side (see CallMayHaveRunError). Nothing was changed.
var ErrCallMayHaveRun = vocab.ErrCallMayHaveRun

// CallMayHaveRunError is the error of a CancelKey refused without Force. It matches
// ErrCallMayHaveRun.
type CallMayHaveRunError struct {
	Scope, Key, Flow, RecoveryPoint string
	// ID is the key row's identity, the first part of its derived keys.
	ID string
	// Phases are the call phases that may have run (every one, in order, when the
	// flow is not registered with the engine).
	Phases []string
	// DerivedKeys are their derived keys (phases.Run.DerivedKey), to look the calls
	// up at the remote side; a phase that made several calls used these followed by
	// ":" and a part (phases.Run.DerivedKeyFor).
	DerivedKeys []string
	// FlowUnknown is true when the flow is not registered with this engine, which then
	// cannot tell which phases are call phases: every cancel of it needs Force.
	FlowUnknown bool
}

func (e *CallMayHaveRunError) Error() string {
	if e.FlowUnknown {
		return fmt.Sprintf("%v: flow %q is not registered with this engine, so whether a call phase ran is unknown (key at recovery point %q; reconcile with the remote side by its derived keys, %s:PHASE, then force)",
			ErrCallMayHaveRun, e.Flow, e.RecoveryPoint, e.ID)
	}
	return fmt.Sprintf("%v: key at recovery point %q, call phases %s (derived keys %s): reconcile with the remote side, then force",
		ErrCallMayHaveRun, e.RecoveryPoint, strings.Join(e.Phases, ", "), strings.Join(e.DerivedKeys, ", "))
}

// Is makes the error match ErrCallMayHaveRun.
func (e *CallMayHaveRunError) Is(target error) bool { return target == ErrCallMayHaveRun }

// CancelOptions are the final answer CancelKey stores, and whether to force it.
type CancelOptions struct {
	// Status is the answer's status: a final 2xx or 4xx (a 5xx is never stored).
	Status int
	// Header holds the answer's headers; each must be one the engine stores
	// (Config.StoredHeaders, Content-Type, Content-Encoding, Vary).
	Header map[string][]string
	// Body is the answer's body, at most Config.MaxResponseBytes.
	Body []byte
	// Force cancels a key even when a call phase may have reached the remote side.
	Force bool
}

// CancelKey finishes an unfinished key (in progress, stuck or dead-lettered) with the
// answer opts gives, stored and replayed as any finished key's; the sweeper never
// runs it again, and retention deletes it as any finished key. Its lock version is
// bumped, so that an executor that still holds it (paused, or slow) can commit
// nothing more.
//
// Without opts.Force it refuses, with a *CallMayHaveRunError, a key one of whose call
// phases may have reached the remote side: a call phase at or before the key's
// recovery point (it ran), or one an attempt may have run without committing
// anything after the recovery point, which is every call phase that comes before the
// first tx phase after it (an attempt runs those, then dies or is fenced at that tx
// phase's commit). A live holder can still make those calls after the cancel: its
// commit after them is refused, but the calls were made. When the flow is not
// registered with the engine (as in cmd/idemflow), every call phase may have run: it
// always needs Force.
//
// Errors: ErrInvalidScope, ErrInvalidKey; ErrInvalidRequest for an answer that cannot
// be stored (status, header, size); ErrNotFound; ErrWrongStatus for a finished key;
// ErrCallMayHaveRun; ErrNewerFormat for a key a newer build wrote; ErrLeaseLost when
// the key kept changing while it was being cancelled (nothing changed: try again);
// ErrUnavailable. In every error case but ErrUnavailable nothing was changed; after
// ErrUnavailable the cancel may have committed (the connection was lost while its
// answer was read): read the key with Key before deciding to cancel it again.
func (e *Engine) CancelKey(ctx context.Context, scope, key string, opts CancelOptions) error {
	if err := checkKey(scope, key); err != nil {
		return err
	}
	resp, err := e.cancelResponse(opts)
	if err == nil {
		resp, err = e.sealResponse(ctx, scope, key, resp) // stored like any answer
	}
	if err != nil {
		return fmt.Errorf("workflow: cancel key: %w", err)
	}
	for range 3 { // the row may move between the read and the update; read again
		row, err := e.store.Lookup(ctx, e.pool, scope, key)
		if errors.Is(err, keytable.ErrNotFound) {
			return fmt.Errorf("%w: scope %q key %q", ErrNotFound, scope, key)
		}
		if err != nil {
			return err
		}
		if err := e.checkKnown(row); err != nil {
			return fmt.Errorf("workflow: scope %q key %q: %w", scope, key, err)
		}
		if row.Status == keytable.StatusFinished {
			return fmt.Errorf("%w: scope %q key %q is finished", ErrWrongStatus, scope, key)
		}
		if refused := e.mayHaveCalled(row); refused != nil && !opts.Force {
			return refused
		}
		resp.History = e.entry(Attempt{By: ExecutorOperator, From: row.RecoveryPoint, Outcome: OutcomeOperatorCancelled})
		err = e.store.CancelKey(ctx, e.pool, scope, key, keytable.Cancel{ID: row.ID, LockVersion: row.LockVersion, CreatedAt: row.CreatedAt,
			RecoveryPoint: row.RecoveryPoint, Response: resp})
		if errors.Is(err, keytable.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		e.acted(ctx, KeyEvent{Kind: OutcomeOperatorCancelled, Flow: row.Flow, Scope: scope, Key: key, RecoveryPoint: row.RecoveryPoint})
		return nil
	}
	return fmt.Errorf("workflow: cancel key: scope %q key %q kept changing: %w", scope, key, ErrLeaseLost)
}

// cancelResponse checks the answer of a cancel and encodes it as stored.
func (e *Engine) cancelResponse(opts CancelOptions) (keytable.StoredResponse, error) {
	if (opts.Status < 200 || opts.Status > 299) && (opts.Status < 400 || opts.Status > 499) {
		return keytable.StoredResponse{}, fmt.Errorf("%w: status %d is not a final 2xx or 4xx (a 5xx is never stored)", ErrInvalidRequest, opts.Status)
	}
	if len(opts.Body) > e.cfg.MaxResponseBytes {
		return keytable.StoredResponse{}, fmt.Errorf("%w: body of %d bytes, the limit is %d", ErrInvalidRequest, len(opts.Body), e.cfg.MaxResponseBytes)
	}
	kept := map[string][]string{}
	for _, k := range slices.Sorted(maps.Keys(opts.Header)) {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if !e.keeps(ck) {
			return keytable.StoredResponse{}, fmt.Errorf("%w: header %q is not one the engine stores (Config.StoredHeaders)", ErrInvalidRequest, k)
		}
		for _, v := range opts.Header[k] {
			if !storableText(v) || strings.ContainsAny(v, "\r\n") {
				return keytable.StoredResponse{}, fmt.Errorf("%w: header %q has a value with a line break or NUL", ErrInvalidRequest, k)
			}
		}
		kept[ck] = append(kept[ck], opts.Header[k]...)
	}
	headers, err := json.Marshal(kept)
	if err != nil {
		return keytable.StoredResponse{}, fmt.Errorf("encode headers: %w", err)
	}
	body := opts.Body
	if body == nil {
		body = []byte{}
	}
	return keytable.StoredResponse{Status: opts.Status, Headers: headers, Body: body}, nil
}

// mayHaveCalled is the refusal of a cancel of row, or nil: see CancelKey.
func (e *Engine) mayHaveCalled(row *keytable.Row) *CallMayHaveRunError {
	ref := &CallMayHaveRunError{ID: row.ID, Scope: row.Scope, Key: row.Key, Flow: row.Flow, RecoveryPoint: row.RecoveryPoint}
	f, ok := e.flow(row.Flow)
	if !ok {
		ref.FlowUnknown = true
		return ref
	}
	at, err := f.Index(row.RecoveryPoint)
	if err != nil { // checkRow let it through: cannot happen
		ref.FlowUnknown = true
		return ref
	}
	for i, p := range f.Phases {
		if i > at && p.Kind == phases.KindTx {
			break // no attempt passes this commit without moving the recovery point
		}
		if p.Kind == phases.KindCall {
			ref.Phases = append(ref.Phases, p.Name)
			ref.DerivedKeys = append(ref.DerivedKeys, row.ID+":"+p.Name)
		}
	}
	if len(ref.Phases) == 0 {
		return nil
	}
	return ref
}
