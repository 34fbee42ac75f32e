package workflow

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
)

// The operator's API: what an operator needs to see and settle keys by hand, all in
// the admin*.go files: list (ListKeys), show with its history (InspectKey), re-drive
// (Redrive), release (ReleaseKey), purge (PurgeKey), counts (CountKeys, GaugeKeys,
// CountOutcomes) here; cancel (CancelKey) and the bulk actions (BulkKeys) in
// admin_bulk.go; a scope's erasure (EraseScope) at the end of this file. It needs no flow
// registered (an engine made only for it, as cmd/idemflow's, works), reads across
// scopes only to list and count, and changes one key at a time, each statement
// filtered by the key's scope; a change that commits emits its key event (acted). A
// key in the wrong status for an action is refused with ErrWrongStatus.

// KeyStatus is a key's status as operators see it.
type KeyStatus string

// Key statuses.
const (
	// KeysInProgress: unfinished and not dead-lettered, stuck keys included. As a list
	// filter, every such key; as a key's status, one that is not stuck.
	KeysInProgress KeyStatus = "in_progress"
	// KeysStuck: in progress, its lease expired or released, and due: a sweeper takes
	// it at its next pass (once older than its grace period).
	KeysStuck KeyStatus = "stuck"
	// KeysDead: dead-lettered, kept with its last error until re-driven (Redrive) or
	// its retention ends (sweeper.Config.DeadRetention).
	KeysDead KeyStatus = "dead"
	// KeysFinished: its response is stored and replayed until retention ends.
	KeysFinished KeyStatus = "finished"
)

var (
	// ErrUnknownStatus: a list asked for a status other than those of KeyStatus.
	// Nothing was read.
	ErrUnknownStatus = vocab.ErrUnknownStatus
	// ErrWrongStatus: an operator's action found the key in a status it does not apply
	// to: ReleaseKey a finished or dead-lettered key (see Redrive), CancelKey a finished
	// one, Redrive one not dead-lettered, PurgeKey one not finished. The message says
	// which ("... is not in progress", "is not dead-lettered", "is not finished", "is
	// finished"). Nothing was changed.
	ErrWrongStatus = vocab.ErrWrongStatus
	// ErrInvalidCursor: ListOptions.After is not a cursor of a page of the same status.
	ErrInvalidCursor = vocab.ErrInvalidCursor
)

// Limits of ListOptions.Limit.
const (
	ListLimitDefault = 100
	ListLimitMax     = 10000
)

// ListOptions select the keys ListKeys returns. The zero value lists every key, the
// first ListLimitDefault of them.
type ListOptions struct {
	// Status keeps only keys of that status; empty keeps all (ordered by claim time,
	// which no index serves: prefer a status on a large table). Keys in progress and
	// stuck keys are ordered by when they are due, dead-lettered keys by claim time,
	// finished keys by finish time, each by an index.
	Status KeyStatus
	// Flow and Scope, when not empty, keep only keys of that flow and that scope.
	Flow  string
	Scope string
	// OlderThan keeps only keys claimed at least that long ago, by the database clock.
	OlderThan time.Duration
	// Limit is the most keys in the page. Defaults to 100; at most 10000.
	Limit int
	// After is KeyPage.Next of the previous page; empty for the first page.
	After string
}

// KeyPage is one page of a list.
type KeyPage struct {
	Keys []KeySummary
	// Next is the cursor of the next page (ListOptions.After), empty on the last page.
	Next string
}

// KeySummary is a key as a list shows it. Its JSON form is a line of `idemflow keys
// list -json`.
type KeySummary struct {
	Scope         string     `json:"scope"`
	Key           string     `json:"key"`
	ID            string     `json:"id"`
	Flow          string     `json:"flow"`
	Status        KeyStatus  `json:"status"`
	RecoveryPoint string     `json:"recovery_point"`
	Attempts      int        `json:"attempts"`
	LastError     string     `json:"last_error"`
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"`
	FinishedAt    *time.Time `json:"finished_at"`
}

// KeyInfo is one key in full.
type KeyInfo struct {
	KeySummary
	Method string `json:"method"`
	Route  string `json:"route"`
	// Request is the stored request body (empty once finished: a finished key keeps
	// only what a replay needs); nil when it is sealed.
	Request []byte `json:"request"`
	// RequestSealed says that the stored request body is sealed (Config.Sealer), and
	// RequestSealedBytes is its size as stored. InspectKey never opens a sealed value.
	RequestSealed      bool `json:"request_sealed,omitempty"`
	RequestSealedBytes int  `json:"request_sealed_bytes,omitempty"`
	// PhaseDataBytes is the size of the phase data carried between phases.
	PhaseDataBytes int   `json:"phase_data_bytes"`
	LockVersion    int64 `json:"lock_version"`
	// LeaseLeft is what remains of the lease by the database clock; 0 when none.
	LeaseLeft time.Duration `json:"lease_left_ns"`
	// NextAttemptAt is when a sweeper may take the key (unfinished keys).
	NextAttemptAt time.Time `json:"next_attempt_at"`
	// ResponseStatus is the stored response's status (finished keys), else 0.
	ResponseStatus int `json:"response_status"`
	// ResponseHeader and ResponseBody are the stored response's headers and body, as
	// a replay sends them (finished keys), else nil.
	ResponseHeader map[string][]string `json:"response_header,omitempty"`
	ResponseBody   []byte              `json:"response_body,omitempty"`
	// ResponseSealed says that the stored answer's body is sealed (ResponseBody is
	// then nil; its headers are not sealed), and ResponseSealedBytes is its size as
	// stored.
	ResponseSealed      bool `json:"response_sealed,omitempty"`
	ResponseSealedBytes int  `json:"response_sealed_bytes,omitempty"`
	// Origin is what Hooks.Origin gave when the key was claimed.
	Origin string `json:"origin"`
	// FailedPhase is the phase of the newest history entry that names one: where the
	// last error happened.
	FailedPhase string `json:"failed_phase"`
	// History is the key's history, oldest first (see Attempt).
	History []Attempt `json:"history"`
}

// KeyCount is how many keys of a flow have a status (CountKeys), or ended in it,
// finished or dead, in the bucket of time that starts at Start (CountOutcomes).
type KeyCount struct {
	Flow   string    `json:"flow"`
	Status KeyStatus `json:"status"`
	// Start is the start of the bucket, for CountOutcomes; zero for CountKeys.
	Start time.Time `json:"start,omitzero"`
	Keys  int64     `json:"keys"`
}

// KeyGauge is how many unfinished keys a flow has.
type KeyGauge struct {
	Flow string
	// InProgress counts keys in progress, stuck ones included.
	InProgress int64
	// Stuck counts keys whose lease expired or was released and that are due.
	Stuck int64
	// Dead counts dead-lettered keys.
	Dead int64
	// OldestDue is how long the stuck key that has waited longest has been due for a
	// sweeper (since its next attempt time or its lease's end, the later), by the
	// database clock; 0 when none is stuck. A sweeper that keeps up holds it near
	// its grace period and pass interval.
	OldestDue time.Duration
}

// cursor is what a KeyPage.Next holds.
type cursor struct {
	Status KeyStatus `json:"s"`
	At     time.Time `json:"t"`
	Scope  string    `json:"c"`
	Key    string    `json:"k"`
}

// ListKeys returns a page of keys that match opts, across scopes unless opts.Scope is
// set. It locks nothing.
//
// Errors: ErrUnknownStatus; ErrInvalidScope, ErrInvalidRequest (a flow that is not
// text) and ErrInvalidCursor for bad options; ErrUnavailable when the database fails.
func (e *Engine) ListKeys(ctx context.Context, opts ListOptions) (KeyPage, error) {
	if _, ok := keyStatuses[opts.Status]; !ok && opts.Status != "" {
		return KeyPage{}, fmt.Errorf("workflow: list keys: %w: %q (want in_progress, stuck, dead or finished)", ErrUnknownStatus, opts.Status)
	}
	if opts.Scope != "" && !storableText(opts.Scope) {
		return KeyPage{}, fmt.Errorf("workflow: list keys: %w: not UTF-8 text without NUL", ErrInvalidScope)
	}
	if !storableText(opts.Flow) {
		return KeyPage{}, fmt.Errorf("workflow: list keys: %w: flow is not UTF-8 text without NUL", ErrInvalidRequest)
	}
	limit := opts.Limit
	if limit == 0 {
		limit = ListLimitDefault
	}
	if limit < 0 || limit > ListLimitMax {
		return KeyPage{}, fmt.Errorf("workflow: list keys: %w: limit %d is outside 1..%d", ErrInvalidRequest, opts.Limit, ListLimitMax)
	}
	q := keytable.ListKeys{Status: string(opts.Status), Flow: opts.Flow, Scope: opts.Scope, OlderThan: opts.OlderThan, Limit: limit}
	if opts.After != "" {
		c, err := decodeCursor(opts.After)
		if err != nil || c.Status != opts.Status {
			return KeyPage{}, fmt.Errorf("workflow: list keys: %w", ErrInvalidCursor)
		}
		q.After = &keytable.Cursor{At: c.At, Scope: c.Scope, Key: c.Key}
	}
	rows, err := e.store.List(ctx, e.pool, q)
	if err != nil {
		return KeyPage{}, err
	}
	page := KeyPage{Keys: make([]KeySummary, len(rows))}
	for i := range rows {
		page.Keys[i] = summary(&rows[i])
	}
	if len(rows) == limit {
		last := rows[len(rows)-1]
		page.Next = encodeCursor(cursor{Status: opts.Status, At: last.Order, Scope: last.Scope, Key: last.Key})
	}
	return page, nil
}

var keyStatuses = map[KeyStatus]bool{KeysInProgress: true, KeysStuck: true, KeysDead: true, KeysFinished: true}

func encodeCursor(c cursor) string {
	b, _ := json.Marshal(c) // a cursor always encodes
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (cursor, error) {
	var c cursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	return c, err
}

func summary(r *keytable.KeySummary) KeySummary {
	k := KeySummary{
		Scope: r.Scope, Key: r.Key, ID: r.ID, Flow: r.Flow, Status: KeyStatus(r.Status),
		RecoveryPoint: r.RecoveryPoint, Attempts: r.Attempts,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, FinishedAt: r.FinishedAt,
	}
	if r.LastError != nil {
		k.LastError = *r.LastError
	}
	return k
}

// checkKey validates the scope and key of an admin call on one key.
func checkKey(scope, key string) error {
	if scope == "" || len(scope) > 255 || !storableText(scope) {
		return fmt.Errorf("%w: want 1-255 bytes of UTF-8 text without NUL", ErrInvalidScope)
	}
	return ValidateKey(key)
}

// InspectKey returns one key in full: its request, progress, lease, last error with
// the phase it happened in, timestamps and history.
//
// Errors: ErrInvalidScope, ErrInvalidKey; ErrNotFound; ErrUnavailable.
func (e *Engine) InspectKey(ctx context.Context, scope, key string) (*KeyInfo, error) {
	if err := checkKey(scope, key); err != nil {
		return nil, err
	}
	d, err := e.store.Show(ctx, e.pool, scope, key)
	if errors.Is(err, keytable.ErrNotFound) {
		return nil, fmt.Errorf("%w: scope %q key %q", ErrNotFound, scope, key)
	}
	if err != nil {
		return nil, err
	}
	info := &KeyInfo{
		KeySummary: summary(&d.KeySummary), Method: d.Method, Route: d.Route, Request: d.RequestBody,
		PhaseDataBytes: d.PhaseDataBytes, LockVersion: d.LockVersion,
		LeaseLeft: time.Duration(d.LeaseLeftMillis) * time.Millisecond, NextAttemptAt: d.NextAttemptAt,
		History: []Attempt{},
	}
	if d.ResponseStatus != nil {
		info.ResponseStatus = *d.ResponseStatus
	}
	if d.Origin != nil {
		info.Origin = *d.Origin
	}
	if d.ResponseStatus != nil {
		info.ResponseBody = d.ResponseBody
		// Headers in a newer format (see ErrNewerFormat) are not shown.
		if json.Unmarshal(d.ResponseHeaders, &info.ResponseHeader) != nil {
			info.ResponseHeader = nil
		}
	}
	showSealed(info, d)
	if err := json.Unmarshal(d.History, &info.History); err != nil {
		return nil, fmt.Errorf("workflow: inspect key: decode history: %w", err)
	}
	if e.cfg.History > 0 {
		info.History = withFinish(info.History, &info.KeySummary)
	}
	for i := len(info.History) - 1; i >= 0; i-- {
		if p := info.History[i].Phase; p != "" {
			info.FailedPhase = p
			break
		}
	}
	return info, nil
}

// withFinish is the history h of key k with the entry of the attempt that finished k
// derived from the row when none was stored (Config.HistoryOmitCleanFinish, or a writer
// with history off): a finished key has exactly one finishing entry, its attempt's
// or an operator's cancel.
func withFinish(h []Attempt, k *KeySummary) []Attempt {
	if k.Status != KeysFinished || k.FinishedAt == nil {
		return h
	}
	for _, a := range h {
		if a.Outcome == OutcomeFinished || a.Outcome == OutcomeOperatorCancelled {
			return h
		}
	}
	a := Attempt{Attempt: k.Attempts, Outcome: OutcomeFinished, At: *k.FinishedAt, Derived: true}
	if k.Attempts == 1 && len(h) == 0 { // it ran from the claim, which set created_at
		a.Millis = k.FinishedAt.Sub(k.CreatedAt).Milliseconds()
	}
	return append(h, a)
}

// ReleaseKey takes the lease of a key in progress away from whoever holds it, live or
// expired, so that a sweeper (or the client's retry) takes it at once: the lease is
// cleared, the key is due now, and its lock version is bumped, so that the holder,
// should it be paused rather than dead, can commit nothing more when it resumes (its
// next commit is fenced; see the DESIGN's invariant 2). An operator's entry goes into
// the key's history. Use it on a stuck key, or on one whose holder is known to hang;
// a key's claim that has not committed yet (no row) cannot be released: its holder's
// connection holds it until the holder ends.
//
// Errors: ErrInvalidScope, ErrInvalidKey; ErrNotFound; ErrWrongStatus for a finished
// or dead-lettered key (nothing changes; see Redrive); ErrNewerFormat for a key a
// newer build wrote (nothing changes); ErrUnavailable.
func (e *Engine) ReleaseKey(ctx context.Context, scope, key string) error {
	return e.operate(ctx, scope, key, "not in progress", func() (KeyEvent, error) {
		_, err := e.store.ReleaseKey(ctx, e.pool, scope, key, e.cfg.historyKeep())
		return KeyEvent{Kind: OutcomeOperatorReleased, Scope: scope, Key: key}, err
	})
}

// operate runs an operator's change of one key (ReleaseKey, PurgeKey, Redrive): it
// checks the key, refuses one a newer build wrote, runs change and, once change has
// committed, emits the key event it returns. A change that matched no row ends in an
// error wrapping ErrNotFound when the key is missing, else ErrWrongStatus saying the
// key is wrong ("not in progress").
func (e *Engine) operate(ctx context.Context, scope, key string, wrong string, change func() (KeyEvent, error)) error {
	if err := checkKey(scope, key); err != nil {
		return err
	}
	if err := e.readable(ctx, scope, key); err != nil {
		return err
	}
	ev, err := change()
	if errors.Is(err, keytable.ErrNotFound) {
		return e.notIn(ctx, scope, key, wrong)
	}
	if err != nil {
		return err
	}
	e.acted(ctx, ev)
	return nil
}

// Redrive puts a dead-lettered key back in progress: released, its attempts reset to
// zero, due at once, with its recovery point and phase data as they were. The next
// sweep (or a Resume, or the client's retry) runs it from there. Its last error is
// kept until the next failure or the finish replaces it.
//
// Errors: ErrInvalidScope, ErrInvalidKey; ErrNotFound; ErrWrongStatus when the key exists in another
// state (nothing changes); ErrNewerFormat for a key a newer build wrote (nothing
// changes); ErrUnavailable when the database fails.
func (e *Engine) Redrive(ctx context.Context, scope, key string) error {
	return e.operate(ctx, scope, key, "not dead-lettered", func() (KeyEvent, error) {
		row, err := e.store.Redrive(ctx, e.pool, scope, key, e.entry(Attempt{By: ExecutorOperator, Outcome: OutcomeRedriven}))
		if err != nil {
			return KeyEvent{}, err
		}
		return KeyEvent{Kind: OutcomeRedriven, Flow: row.Flow, Scope: row.Scope, Key: row.Key, RecoveryPoint: row.RecoveryPoint}, nil
	})
}

// readable returns an error wrapping ErrNewerFormat when the key's row was written by
// a newer build (see ErrNewerFormat), so that an operator's call on one key changes
// nothing this build cannot read; nil when it can, or when the key is missing (the
// call itself then says so). A row's format changes only when a newer build writes
// it, so the check is not repeated by the statement that follows.
func (e *Engine) readable(ctx context.Context, scope, key string) error {
	row, err := e.store.Lookup(ctx, e.pool, scope, key)
	switch {
	case errors.Is(err, keytable.ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	if err := e.checkKnown(row); err != nil {
		return fmt.Errorf("workflow: scope %q key %q: %w", scope, key, err)
	}
	return nil
}

// notIn is the error of an admin call that matched no row: ErrNotFound if the key is
// missing, else ErrWrongStatus saying the key is wrong.
func (e *Engine) notIn(ctx context.Context, scope, key string, wrong string) error {
	_, err := e.store.Lookup(ctx, e.pool, scope, key)
	switch {
	case errors.Is(err, keytable.ErrNotFound):
		return fmt.Errorf("%w: scope %q key %q", ErrNotFound, scope, key)
	case err != nil:
		return err
	}
	return fmt.Errorf("%w: scope %q key %q is %s", ErrWrongStatus, scope, key, wrong)
}

// PurgeKey deletes a finished key before its retention ends.
//
// Warning: the key is then forgotten. A retry with the same key is no longer replayed
// its stored answer: it starts a new operation and runs the flow again, with new
// derived keys. Purge a key only when its client will never retry it, or when running
// it again is what is wanted.
//
// Errors: ErrInvalidScope, ErrInvalidKey; ErrNotFound; ErrWrongStatus for a key in
// progress or dead-lettered (nothing changes); ErrNewerFormat for a key a newer build
// wrote (nothing changes); ErrUnavailable.
func (e *Engine) PurgeKey(ctx context.Context, scope, key string) error {
	return e.operate(ctx, scope, key, "not finished", func() (KeyEvent, error) {
		err := e.store.Purge(ctx, e.pool, scope, key)
		return KeyEvent{Kind: OutcomePurged, Scope: scope, Key: key}, err
	})
}

// CountKeys counts every key by flow and status (a stuck key counts as stuck, not in
// progress), ordered by flow and status. It reads the whole table: for monitoring use
// GaugeKeys.
func (e *Engine) CountKeys(ctx context.Context) ([]KeyCount, error) {
	rows, err := e.store.Counts(ctx, e.pool)
	if err != nil {
		return nil, err
	}
	out := make([]KeyCount, len(rows))
	for i, r := range rows {
		out[i] = KeyCount{Flow: r.Flow, Status: KeyStatus(r.Status), Keys: r.Keys}
	}
	return out, nil
}

// Limits of OutcomeOptions.
const (
	outcomeWindowDefault = time.Hour
	outcomeWindowMax     = 7 * 24 * time.Hour
	outcomeBucketsMax    = 1000
)

// OutcomeOptions select what CountOutcomes counts.
type OutcomeOptions struct {
	// Window is how far back to count, by the database clock. Defaults to an hour; at
	// most 7 days.
	Window time.Duration
	// Bucket is the width of one count, at least a second; buckets start at whole
	// multiples of it since the Unix epoch. Defaults to a twelfth of Window; at most
	// 1000 buckets in the window.
	Bucket time.Duration
	// Status counts only keys that finished (KeysFinished) or only those dead-lettered
	// (KeysDead); empty counts both.
	Status KeyStatus
}

// CountOutcomes counts the keys that finished or were dead-lettered in the last
// opts.Window, by flow and bucket (KeyCount.Start), ordered by bucket, flow and
// status; buckets with none are left out. A dead-lettered key is counted when it
// died, and not once it is re-driven. It reads only the indexes of finished and of dead-lettered keys
// over the window and their rows, so its cost follows the keys that ended in the
// window, never the size of the table.
//
// Errors: ErrInvalidRequest for a window, bucket or status out of range;
// ErrUnavailable when the database fails.
func (e *Engine) CountOutcomes(ctx context.Context, opts OutcomeOptions) ([]KeyCount, error) {
	window := cmp.Or(opts.Window, outcomeWindowDefault)
	bucket := cmp.Or(opts.Bucket, window/12)
	switch {
	case window < time.Second || window > outcomeWindowMax:
		return nil, fmt.Errorf("workflow: count outcomes: %w: window %v is outside 1s..%v", ErrInvalidRequest, opts.Window, outcomeWindowMax)
	case bucket < time.Second || window/bucket > outcomeBucketsMax:
		return nil, fmt.Errorf("workflow: count outcomes: %w: bucket %v is under 1s or makes more than %d buckets", ErrInvalidRequest, opts.Bucket, outcomeBucketsMax)
	case opts.Status != "" && opts.Status != KeysFinished && opts.Status != KeysDead:
		return nil, fmt.Errorf("workflow: count outcomes: %w: status %q (want finished, dead or none)", ErrInvalidRequest, opts.Status)
	}
	rows, err := e.store.Outcomes(ctx, e.pool, window, bucket, string(opts.Status))
	if err != nil {
		return nil, err
	}
	out := make([]KeyCount, len(rows))
	for i, r := range rows {
		out[i] = KeyCount{Flow: r.Flow, Status: KeyStatus(r.Status), Start: r.Start, Keys: r.Keys}
	}
	return out, nil
}

// GaugeKeys counts the unfinished keys of each flow that has any: in progress, stuck
// and dead-lettered, ordered by flow. It is one statement that reads only the indexes
// of unfinished keys and their rows, so its cost follows the number of unfinished
// keys, never the finished ones: cheap enough for every collection of a metrics
// scrape (see package otelidemflow).
func (e *Engine) GaugeKeys(ctx context.Context) ([]KeyGauge, error) {
	rows, err := e.store.Gauges(ctx, e.pool)
	if err != nil {
		return nil, err
	}
	out := make([]KeyGauge, len(rows))
	for i, r := range rows {
		out[i] = KeyGauge{Flow: r.Flow, InProgress: r.InProgress, Stuck: r.Stuck, Dead: r.Dead, OldestDue: r.OldestDue}
	}
	return out, nil
}

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
	var err error
	res.Erased, res.Fenced, res.Left, err = e.store.EraseScope(ctx, e.pool, scope, opts.Force, opts.DryRun, eraseBatch)
	return res, err
}
