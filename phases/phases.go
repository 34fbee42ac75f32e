package phases

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Reserved recovery points. A phase may not use these names.
const (
	// Started is the recovery point of a key before any phase completed.
	Started = "started"
	// Finished is the recovery point of a key whose response is stored.
	Finished = "finished"
)

// Kind says where a phase runs.
type Kind int

const (
	// KindTx runs in one local transaction that also advances the recovery point.
	KindTx Kind = iota + 1
	// KindCall runs with no transaction open, typically calling a remote service.
	KindCall
)

func (k Kind) String() string {
	switch k {
	case KindTx:
		return "tx"
	case KindCall:
		return "call"
	default:
		return fmt.Sprintf("Kind(%d)", int(k))
	}
}

// DBTX is what a tx phase runs its SQL on: the phase's own transaction. It has the method
// set of pgx.Tx that is safe inside a managed transaction (no Commit, Rollback or
// savepoints), which is also sqlc's DBTX, so generated query code accepts it.
//
// The DBTX the engine passes to a tx phase is also a pgx.Tx, for code that takes one
// (such as River's InsertTx): tx.(pgx.Tx). Its Begin opens a savepoint, which commits
// or rolls back like a pgx nested transaction; its own Commit and Rollback are refused
// with ErrTxManaged (see there). The transaction ends with its phase: once the phase
// function returns, every call on it, or on anything it handed out, fails with
// ErrTxDone (see there).
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
}

// TxFunc is the body of a tx phase. Its writes on tx commit if and only if the key's
// recovery point advances past the phase.
type TxFunc func(ctx context.Context, tx DBTX, run *Run) (*Response, error)

// CallFunc is the body of a call phase. No transaction is open while it runs; its
// context ends before the executor's lease does.
type CallFunc func(ctx context.Context, run *Run) (*Response, error)

// Phase is one named step of a flow. Build it with Tx or Call.
type Phase struct {
	// Name is the phase's recovery point once it completes. It must be stable across
	// deployments: a key in flight resumes by name, never by position.
	Name string
	// Kind is KindTx or KindCall.
	Kind Kind
	// IsoLevel is the isolation level of a tx phase's transaction. Defaults to READ
	// COMMITTED, sent explicitly whatever the server's default is. A first phase at
	// REPEATABLE READ or SERIALIZABLE costs one more write of the key row (its claim
	// inserts the row; see package workflow).
	IsoLevel pgx.TxIsoLevel
	// TxFunc is a tx phase's function, CallFunc a call phase's: Tx and Call set the one
	// their Kind needs. Both are nil in a client-only flow's declaration (Flow.ClientOnly).
	// The engine calls them; a phase function has no reason to.
	TxFunc   TxFunc   `json:"-"`
	CallFunc CallFunc `json:"-"`
	// Pipeline builds a pipelined tx phase (see Pipelined): set instead of TxFunc.
	Pipeline PipelineFunc `json:"-"`
}

// Tx returns a tx phase.
func Tx(name string, fn TxFunc) Phase { return Phase{Name: name, Kind: KindTx, TxFunc: fn} }

// Call returns a call phase.
func Call(name string, fn CallFunc) Phase { return Phase{Name: name, Kind: KindCall, CallFunc: fn} }

// Flow is a named, ordered list of phases.
type Flow struct {
	// Name identifies the flow on stored keys. Like phase names it must be stable.
	Name   string
	Phases []Phase
	// ClientOnly marks a flow whose keys only their own client can run, because its
	// phases need something that only the client's attempt has, such as the live HTTP
	// request and its response writer (package idemhttp's middlewares are such flows).
	// Its phases are declared here by name and kind only, built with nil functions
	// (phases.Call("handle", nil)); every attempt brings the functions, closing over
	// what it has (workflow.Request.ClientPhases). So a key of a client-only flow is
	// never run without its client: a sweeper parks it (releases it for the client's
	// retry and leaves it alone for a while) instead of running it, and resuming it
	// without the client fails (workflow.ErrNeedsClient). A client-only flow needs no
	// tx phase: what its attempts do is theirs to say.
	ClientOnly bool
	// FingerprintMembers, when not empty, makes a retry of a key compare only these
	// members of the JSON body with the first request's, each named by a JSON pointer
	// (RFC 6901: "/amount", "/items/0/sku", "/a~1b" for the member "a/b", "/m~0n" for
	// "m~n"; "" is the whole body), compared as the whole body is without it: exact
	// decimal numbers, key order, whitespace and number spelling ignored. A chosen
	// member that differs is a mismatch (HTTP 422), as is one present in one request
	// and absent in the other (absent and null differ); a difference anywhere else
	// replays the first request's stored answer. The body must then be one JSON value
	// without duplicate member names, else the request is refused
	// (workflow.ErrBodyNotJSON, HTTP 400). At most 64 distinct pointers; an invalid one
	// is refused by workflow.Engine.Register. Nil or empty (the default) compares the
	// whole body.
	//
	// Risk: a client that changes a member not listed here, meaning a new operation,
	// gets the first operation's answer replayed and no new operation. List every
	// member that makes an operation what it is (amount, currency, destination...),
	// and leave out only what a client may vary between retries of one operation
	// (a timestamp, a trace id).
	//
	// Upgrades: keys of such a flow are stored with a version 3 fingerprint, which
	// releases before v0.4.0 do not read: they answer an identical retry of such a key
	// 422. Set it only once every process on the key table runs a release that reads
	// version 3 (docs/OPERATIONS.md, "Upgrades"). Setting, changing or removing the
	// list applies to new keys; a key stored under another list (or none) is compared
	// by its whole body, as without the option, until its retention ends.
	FingerprintMembers []string
	// ForgetBody stores an empty request body on the flow's keys, keeping only the
	// request's fingerprint, for a flow whose phases need the body only in the attempt
	// that claims the key (they save in their phase data what later phases need).
	// Then: the attempt that claims a key runs every phase with the request's body; a
	// retry that resumes an unfinished key runs the phases left with the body the
	// retry carries (its fingerprint matched the first request's); a sweeper's resume,
	// or Engine.Resume, runs them with an empty body (Run.Body returns no bytes). A
	// retry with a different body is still refused as a mismatch. Changing it applies
	// to new keys. Defaults to false: the body is stored until the key finishes.
	//
	// Upgrades: an empty body is a value every release reads; a release before v0.4.0
	// resumes such a key, on a retry too, with the empty body, as a sweeper does.
	ForgetBody bool
	// Compensation is what an operator's cancel of a key of the flow runs to undo its
	// committed tx phases (see Compensation). Defaults to none: a cancel leaves them.
	Compensation Compensation
}

// ErrInvalidFlow is returned by Validate for a flow that cannot be registered.
var ErrInvalidFlow = errors.New("invalid flow")

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,63}$`)

// Validate checks that the flow can be run: a valid name, at least one phase, unique
// phase names that are not reserved, a function for every phase, and at least one tx
// phase. A client-only flow (ClientOnly) instead has no function for any phase (its
// attempts bring them) and needs no tx phase. A compensation, if any, needs a function
// and a valid name no phase has. The last phase is the one expected to respond; a flow that runs past it without a response fails at run time with
// ErrNoResponse.
func (f Flow) Validate() error {
	if !nameRE.MatchString(f.Name) {
		return fmt.Errorf("%w: flow name %q: want 1-64 of [a-z0-9_.-], starting with a letter", ErrInvalidFlow, f.Name)
	}
	if len(f.Phases) == 0 {
		return fmt.Errorf("%w: flow %q has no phases", ErrInvalidFlow, f.Name)
	}
	seen := make(map[string]bool, len(f.Phases))
	hasTx := false
	for i, p := range f.Phases {
		if !nameRE.MatchString(p.Name) {
			return fmt.Errorf("%w: flow %q phase %d: name %q: want 1-64 of [a-z0-9_.-], starting with a letter", ErrInvalidFlow, f.Name, i, p.Name)
		}
		if p.Name == Started || p.Name == Finished {
			return fmt.Errorf("%w: flow %q: phase name %q is reserved", ErrInvalidFlow, f.Name, p.Name)
		}
		if seen[p.Name] {
			return fmt.Errorf("%w: flow %q: duplicate phase name %q", ErrInvalidFlow, f.Name, p.Name)
		}
		seen[p.Name] = true
		hasFunc := p.TxFunc != nil || p.CallFunc != nil || p.Pipeline != nil
		switch {
		case p.Kind != KindTx && p.Kind != KindCall:
			return fmt.Errorf("%w: flow %q phase %q: kind %s (build phases with phases.Tx or phases.Call)", ErrInvalidFlow, f.Name, p.Name, p.Kind)
		case p.TxFunc != nil && p.CallFunc != nil, p.Pipeline != nil && (p.TxFunc != nil || p.CallFunc != nil):
			return fmt.Errorf("%w: flow %q phase %q has more than one function", ErrInvalidFlow, f.Name, p.Name)
		case p.Pipeline != nil && (p.Kind != KindTx || p.IsoLevel != "" && p.IsoLevel != pgx.ReadCommitted):
			return fmt.Errorf("%w: flow %q phase %q: a pipelined phase is a tx phase at READ COMMITTED (build it with phases.Pipelined)", ErrInvalidFlow, f.Name, p.Name)
		case f.ClientOnly && hasFunc:
			return fmt.Errorf("%w: client-only flow %q phase %q has a function: its attempts bring the functions", ErrInvalidFlow, f.Name, p.Name)
		case f.ClientOnly:
		case p.Kind == KindTx && (p.TxFunc != nil || p.Pipeline != nil):
			hasTx = true
		case p.Kind == KindCall && p.CallFunc != nil:
		default:
			return fmt.Errorf("%w: flow %q phase %q: no function (build phases with phases.Tx or phases.Call)", ErrInvalidFlow, f.Name, p.Name)
		}
	}
	if !hasTx && !f.ClientOnly {
		return fmt.Errorf("%w: flow %q has no tx phase", ErrInvalidFlow, f.Name)
	}
	return f.Compensation.validate(f)
}

// Index returns the position of the named phase, -1 for Started, or an error for a name
// the flow does not have.
func (f Flow) Index(recoveryPoint string) (int, error) {
	if recoveryPoint == Started {
		return -1, nil
	}
	for i, p := range f.Phases {
		if p.Name == recoveryPoint {
			return i, nil
		}
	}
	return 0, fmt.Errorf("flow %q has no phase %q", f.Name, recoveryPoint)
}
