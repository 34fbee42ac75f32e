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

	"github.com/idemflow/idemflow/internal/attempt"
	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
	"github.com/idemflow/idemflow/phases"
)

// The cancel of one key by an operator (CancelKey), what it will do (PreviewCancel),
// and the flow's compensation it runs (compensate).

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
	// SkipCompensation cancels without running the flow's compensation
	// (phases.Flow.Compensation): the writes of the committed tx phases stay. It is
	// needed to cancel a key of a flow this engine does not register (as in
	// cmd/idemflow), which cannot tell whether the flow declares one
	// (ErrCompensationUnknown).
	SkipCompensation bool
}

// CancelKey finishes an unfinished key (in progress, stuck or dead-lettered) with the
// answer opts gives, stored and replayed as any finished key's; the sweeper never
// runs it again, and retention deletes it as any finished key. Its lock version is
// bumped, so that an executor that still holds it (paused, or slow) can commit
// nothing more.
//
// When the key's flow declares a compensation (phases.Flow.Compensation), the cancel
// runs it first, in the transaction that writes the cancel to the key row, and with
// the recovery point the key reached: the undo and the cancel commit together, or
// neither does. The transaction is fenced like a tx phase's: it starts with the check
// of the row as read (an in-progress key) and ends with the cancel's write, which
// refuses a row whose lock version, recovery point or status moved in between (an
// executor committed a phase meanwhile): then nothing commits and the key is read and
// cancelled again, from its new recovery point. opts.SkipCompensation cancels without
// it. PreviewCancel says beforehand what a cancel will run.
//
// Without opts.Force it refuses, with a *CallMayHaveRunError, a key one of whose call
// phases may have reached the remote side: a call phase at or before the key's
// recovery point (it ran), or one an attempt may have run without committing
// anything after the recovery point, which is every call phase that comes before the
// first tx phase after it (an attempt runs those, then dies or is fenced at that tx
// phase's commit). A live holder can still make those calls after the cancel: its
// commit after them is refused, but the calls were made. When the flow is not
// registered with the engine (as in cmd/idemflow), every call phase may have run: it
// always needs Force, and, since such an engine cannot tell whether the flow declares
// a compensation, SkipCompensation too (ErrCompensationUnknown).
//
// Errors: ErrInvalidScope, ErrInvalidKey; ErrInvalidRequest for an answer that cannot
// be stored (status, header, size); ErrNotFound; ErrWrongStatus for a finished key;
// ErrCallMayHaveRun; ErrCompensationUnknown; a *CompensationError (matching
// ErrCompensationFailed) when the compensation failed; ErrNewerFormat for a key a
// newer build wrote; ErrLeaseLost when the key kept changing while it was being
// cancelled (nothing changed: try again); ErrUnavailable. In every error case but
// ErrUnavailable nothing was changed, the compensation's writes included; after
// ErrUnavailable the cancel may have committed (the connection was lost while its
// answer was read): read the key with Key before deciding to cancel it again (a
// second cancel of a key the first one finished is refused with ErrWrongStatus, so
// the compensation never runs twice).
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
		row, err := e.cancellable(ctx, scope, key)
		if err != nil {
			return err
		}
		if refused := e.mayHaveCalled(row); refused != nil && !opts.Force {
			return refused
		}
		comp, err := e.compensation(row, opts.SkipCompensation)
		if err != nil {
			return err
		}
		a := Attempt{By: ExecutorOperator, From: row.RecoveryPoint, Outcome: OutcomeOperatorCancelled}
		if comp.Func != nil {
			a.Phases = []string{comp.Name}
		}
		resp.History = e.entry(a)
		c := keytable.Cancel{ID: row.ID, LockVersion: row.LockVersion, CreatedAt: row.CreatedAt,
			RecoveryPoint: row.RecoveryPoint, Response: resp}
		if comp.Func == nil {
			err = e.store.CancelKey(ctx, e.pool, scope, key, c)
		} else {
			err = e.compensate(ctx, comp, row, c)
		}
		if errors.Is(err, keytable.ErrNotFound) || errors.Is(err, keytable.ErrLeaseLost) {
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

// cancellable reads the row of a key to cancel: unfinished, in a format this build
// reads.
func (e *Engine) cancellable(ctx context.Context, scope, key string) (*keytable.Row, error) {
	row, err := e.store.Lookup(ctx, e.pool, scope, key)
	if errors.Is(err, keytable.ErrNotFound) {
		return nil, fmt.Errorf("%w: scope %q key %q", ErrNotFound, scope, key)
	}
	if err != nil {
		return nil, err
	}
	if err := e.checkKnown(row); err != nil {
		return nil, fmt.Errorf("workflow: scope %q key %q: %w", scope, key, err)
	}
	if row.Status == keytable.StatusFinished {
		return nil, fmt.Errorf("%w: scope %q key %q is finished", ErrWrongStatus, scope, key)
	}
	return row, nil
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

// ErrCompensationUnknown: CancelKey refused a key whose flow this engine does not
// register, so it cannot tell whether the flow declares a compensation, nor run one.
// Nothing was changed. Cancel it where the flow is registered (the service's engine,
// or its operator page), or with CancelOptions.SkipCompensation to leave the
// committed phases' writes as they are.
var ErrCompensationUnknown = vocab.ErrCompensationUnknown

// ErrCompensationFailed: the compensation a cancel ran returned an error or panicked
// (see CompensationError). Nothing was changed: its writes rolled back with the
// cancel, and the key is as it was.
var ErrCompensationFailed = vocab.ErrCompensationFailed

// CompensationError is the error of a cancel whose compensation failed. It matches
// ErrCompensationFailed and unwraps to the compensation's error (a *phases.PanicError
// for a panic).
type CompensationError struct {
	Scope, Key, Flow string
	// Compensation is the compensation's name; RecoveryPoint the one it ran from.
	Compensation, RecoveryPoint string
	Err                         error
}

func (e *CompensationError) Error() string {
	return fmt.Sprintf("%v: compensation %q of flow %q from recovery point %q, scope %q key %q: %v (nothing changed: the key is not cancelled)",
		ErrCompensationFailed, e.Compensation, e.Flow, e.RecoveryPoint, e.Scope, e.Key, e.Err)
}

// Is makes the error match ErrCompensationFailed.
func (e *CompensationError) Is(target error) bool { return target == ErrCompensationFailed }

// Unwrap returns the compensation's error.
func (e *CompensationError) Unwrap() error { return e.Err }

// CancelPreview is what a cancel of a key will do, as PreviewCancel reads it.
type CancelPreview struct {
	Scope, Key, Flow string
	// Status is the key's status (in_progress or dead); RecoveryPoint where it stands,
	// the point a compensation runs from.
	Status, RecoveryPoint string
	// Compensation is the name of the flow's compensation, which a cancel runs unless
	// CancelOptions.SkipCompensation; empty when the flow declares none (or is unknown).
	Compensation string
	// FlowUnknown: the flow is not registered with this engine, which can then neither
	// tell whether it declares a compensation nor run one (ErrCompensationUnknown).
	FlowUnknown bool
	// Refused is the refusal a cancel without CancelOptions.Force gets, nil if none.
	Refused *CallMayHaveRunError
}

// Effect says, in one sentence for an operator, what a cancel with or without
// CancelOptions.SkipCompensation (skip) does to the flow's committed writes.
func (p *CancelPreview) Effect(skip bool) string {
	switch {
	case skip:
		return fmt.Sprintf("no compensation (skipped): the writes of the phases committed up to recovery point %q stay", p.RecoveryPoint)
	case p.FlowUnknown:
		return fmt.Sprintf("refused: flow %q is not registered here, so whether it declares a compensation is unknown; cancel where the flow is registered (the service's engine or operator page), or skip the compensation and the writes of the phases committed up to recovery point %q stay",
			p.Flow, p.RecoveryPoint)
	case p.Compensation != "":
		return fmt.Sprintf("will run compensation %q of flow %q from recovery point %q, in the cancel's transaction", p.Compensation, p.Flow, p.RecoveryPoint)
	}
	return fmt.Sprintf("no compensation: flow %q declares none; the writes of the phases committed up to recovery point %q stay", p.Flow, p.RecoveryPoint)
}

// PreviewCancel reads what a cancel of the key (scope, key) would do now: the
// compensation it would run and from which recovery point, or that it runs none, and
// the refusal it would get without Force. It changes nothing; the key may move before
// the cancel, which decides again on the row it then reads.
//
// Errors: as CancelKey's before it changes anything (ErrInvalidScope, ErrInvalidKey,
// ErrNotFound, ErrWrongStatus, ErrNewerFormat, ErrUnavailable).
func (e *Engine) PreviewCancel(ctx context.Context, scope, key string) (*CancelPreview, error) {
	if err := checkKey(scope, key); err != nil {
		return nil, err
	}
	row, err := e.cancellable(ctx, scope, key)
	if err != nil {
		return nil, err
	}
	p := &CancelPreview{Scope: scope, Key: key, Flow: row.Flow, Status: row.Status, RecoveryPoint: row.RecoveryPoint,
		Refused: e.mayHaveCalled(row)}
	f, ok := e.flow(row.Flow)
	p.FlowUnknown = !ok
	if ok && f.Compensation.Func != nil {
		p.Compensation = f.Compensation.Name
	}
	return p, nil
}

// compensation is the compensation a cancel of row runs (the zero value: none), or
// ErrCompensationUnknown.
func (e *Engine) compensation(row *keytable.Row, skip bool) (phases.Compensation, error) {
	if skip {
		return phases.Compensation{}, nil
	}
	f, ok := e.flow(row.Flow)
	if !ok {
		return phases.Compensation{}, fmt.Errorf("workflow: cancel key: scope %q key %q: %w: flow %q is not registered with this engine; cancel it where the flow is registered (the service's engine or operator page), or skip the compensation (the writes of the phases committed up to recovery point %q stay)",
			row.Scope, row.Key, ErrCompensationUnknown, row.Flow, row.RecoveryPoint)
	}
	return f.Compensation, nil
}

// compensate runs comp on row, from its recovery point, and the cancel c, in one
// transaction fenced as a Go-code tx phase's: the check of the row's fence ahead of
// the compensation's first statement (an in-progress row; a dead-lettered one has no
// holder to fence out), the compensation's Go code on the managed transaction
// (phaseTx: its own Commit is refused, and nothing reaches it once it returned), then
// the cancel's fenced write with COMMIT in one round trip (keytable.KeyWrite.Cancel).
// A check or a write that misses comes back as keytable.ErrLeaseLost, with nothing
// committed.
func (e *Engine) compensate(ctx context.Context, comp phases.Compensation, row *keytable.Row, c keytable.Cancel) error {
	body, err := e.openBody(ctx, row)
	if err != nil {
		return err
	}
	failed, err := attempt.Compensate(ctx, &e.env, comp, row, body, c)
	if failed != nil {
		return &CompensationError{Scope: row.Scope, Key: row.Key, Flow: row.Flow, Compensation: comp.Name,
			RecoveryPoint: row.RecoveryPoint, Err: failed}
	}
	return err
}
