package workflow

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/textproto"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/internal/attempt"
	"github.com/idemflow/idemflow/internal/fingerprint"
	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/internal/vocab"
	"github.com/idemflow/idemflow/phases"
)

// Defaults for Config.
const (
	LeaseDefault             = 30 * time.Second
	MaxBodyBytesDefault      = 1 << 20
	MaxResponseBytesDefault  = 1 << 20
	MaxPhaseDataBytesDefault = 64 << 10
	TxRetriesDefault         = 5
	BackoffBaseDefault       = time.Second
	BackoffMaxDefault        = 5 * time.Minute
	HistoryDefault           = 20
	MaxWaitersDefault        = 1000
)

// storedHeadersDefault is never handed out: StoredHeadersDefault returns copies.
var storedHeadersDefault = []string{
	"Content-Type", "Content-Language", "Content-Location", "Location", "ETag",
	"Last-Modified", "Cache-Control", "Link", "Retry-After",
}

// StoredHeadersDefault returns the response headers kept on a finished key and
// replayed when Config.StoredHeaders is nil. Each call returns a fresh slice; changing
// it changes nothing else. Headers such as Set-Cookie, Date and authentication headers
// are never stored, whatever the configuration says.
func StoredHeadersDefault() []string {
	return slices.Clone(storedHeadersDefault)
}

// Config configures an Engine. The zero value (or a nil *Config) means all defaults. A
// field's zero value always means its default; special values (such as -1 for TxRetries)
// are kept as written by WithDefaults, so applying it again changes nothing.
type Config struct {
	// Lease is how long an executor owns a key before another may take it over, by the
	// database clock. Each tx phase commit renews it; a call phase's context ends
	// before it does. Defaults to 30s; at least 1s.
	Lease time.Duration
	// MaxBodyBytes limits the request body stored with a key. Defaults to 1 MiB; at
	// most 16 MiB.
	MaxBodyBytes int
	// MaxResponseBytes limits a stored response body. Larger responses are refused,
	// never truncated. Defaults to 1 MiB; at most 16 MiB.
	MaxResponseBytes int
	// MaxPhaseDataBytes limits the encoded phase data. Defaults to 64 KiB; at most
	// 1 MiB.
	MaxPhaseDataBytes int
	// TxRetries is how many times a tx phase is re-run after a serialization failure
	// or deadlock. Defaults to 5. -1 disables retries; other negative values are
	// refused.
	TxRetries int
	// ClaimWithFirstStatement folds a new key's claim into the round trip of the first
	// statement of its flow's first tx phase, at READ COMMITTED: BEGIN, the claim lock
	// (raising when another attempt holds it), the check that raises when the key row
	// exists, then the statement, so a fresh key costs one round trip less. A loser
	// runs none of the phase's statements and never waits; its phase fails with the
	// claim's error and it is answered as today (409, replay, 422). But a loser's phase
	// function does run up to its first statement: set this only for flows whose
	// first tx phase has no effect outside its transaction before that statement.
	// ClaimHeld then runs inside that statement's call. Defaults to false: the claim
	// takes a round trip of its own before the phase function runs.
	ClaimWithFirstStatement bool
	// BackoffBase and BackoffMax shape the delay before a released key is due for the
	// sweeper again: BackoffBase * 2^(attempts-1), capped at BackoffMax, unless the
	// phase suggested a delay. BackoffBase defaults to 1s and BackoffMax to 5m;
	// BackoffMax must not be below BackoffBase.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// StoredHeaders lists the response headers kept and replayed. Defaults (when nil)
	// to StoredHeadersDefault(); an empty, non-nil slice keeps none.
	StoredHeaders []string
	// InProgressRetryAfter is the Retry-After of an attempt turned away because another
	// attempt holds its key (*InProgressError): 0, the default, means the flow's average
	// duration as this engine observed it (see InProgressError); a positive value is
	// used as it is; RetryAfterLease (-1) means the time left on the holder's lease.
	// Always at least 1s and at most the lease left.
	InProgressRetryAfter time.Duration
	// Schema is the PostgreSQL schema of idemflow's key table, as migrations.Config's
	// Schema put it there. Every statement names it, quoted, so the connection's
	// search_path does not matter (poolers such as pgbouncer refuse to set one). The
	// sweeper of an engine works on the same schema. Defaults to "": the current
	// schema, unqualified, as the connection's search_path finds it. At most 63 bytes.
	Schema string
	// Scan is how the engine's sweeps and expiries find keys across scopes: ScanSingle
	// takes or deletes a batch in one statement (the cheapest on plain PostgreSQL),
	// ScanPerKey reads candidates without a lock and then takes or deletes each by its
	// key in a single-shard statement (what Citus needs for a distributed key table).
	// Defaults to ScanAuto: ScanPerKey when the database has the citus extension,
	// asked once, on the first sweep.
	Scan Scan
	// History is how many entries a key's history keeps: one per attempt and per
	// operator action, the newest kept (see Attempt). Defaults to 20; at most 1000. -1
	// keeps none. Entries ride in writes the engine sends anyway: no round trip or
	// commit is added for them.
	History int
	// HistoryOmitCleanFinish stores no history entry for an attempt that finished its
	// key in one go: the key's first attempt, run from the start to its answer. Such a
	// key's history then shows one entry derived from the key row when it is inspected
	// (Attempt.Derived: attempt 1, finished, at the row's finished_at, and the time from
	// the claim to the finish as its ms; not the executor or the phases). It saves the
	// entry's ~280 bytes of WAL and its JSON on every request that finishes cleanly
	// (docs/BENCHMARKS.md); attempts that fail, resume or are taken over keep their
	// entries. Every build from v0.5 derives the entry; v0.4 shows such a key's history
	// empty, so turn it on once every process of the fleet runs v0.5 or later
	// (docs/OPERATIONS.md, "Upgrades"). A later minor release turns it on by default.
	HistoryOmitCleanFinish bool
	// MaxInFlight caps the attempts (Do calls) this engine runs at once, so that
	// under more load than the database can take the excess is answered at once
	// (ErrOverloaded, 503) instead of queueing until its clients give up. An attempt
	// over the cap waits at most AdmitWait for a place, the oldest waiter first; once
	// more attempts wait than there are places, waiting without a break for 100ms
	// (sustained overload, not a burst), the newest waiter first (its client is the
	// one most likely still waiting) and each arrival turns away the waiters older
	// than 10ms, so that refusals are fast. Size it so the pool's connections
	// stay busy: an attempt holds a connection only during its transactions. Defaults
	// (0) to InFlightPerConnDefault (64) per connection of a *pgxpool.Pool (its
	// MaxConns), else to MaxInFlightDefault (64); -1 sets no cap. Sweeps and Resume
	// are not counted. See docs/OPERATIONS.md, "Overload".
	MaxInFlight int
	// AdmitWait bounds each wait of an attempt before its claim: for a place under
	// MaxInFlight, and for a pool connection for its look-up and its first
	// transaction. Past it the attempt is answered ErrOverloaded, having written
	// nothing; and at once, without waiting, when the last waits of the queue it
	// would join took over a quarter of AdmitWait (or over what is left of its
	// context's deadline). After the claim nothing is bounded this way: the attempt
	// finishes. Defaults to AdmitWaitDefault (5s); -1 waits as long as the caller's
	// context.
	AdmitWait time.Duration
	// StandbyWait makes every call phase wait, before it starts, until a standby that
	// can be promoted (a physical streaming replica; see StandbyNames) has flushed
	// the WAL past the key's commits so far, at most StandbyWait; past it the call
	// does not start, the key is released and the attempt fails with
	// ErrStandbyBehind (transient). The position waited for is the primary's WAL
	// insert position read after the commit was answered, which covers the commit
	// whatever its synchronous_commit (with off, the engine makes the primary flush
	// it first). Set it with asynchronous replication, so that a failover cannot lose
	// the commit that precedes a call (and the key row whose id the call's derived
	// key is made of) after the call was made: the retry on the promoted standby
	// would create a new row and charge again. The role needs pg_monitor to read the
	// standbys' positions; without it no call starts (a warning is logged once).
	// Not needed on a single server, or with synchronous replication and
	// synchronous_commit on or remote_apply, where every commit already waits for the
	// standby. Defaults to 0: no wait. See docs/OPERATIONS.md, "Failover".
	StandbyWait time.Duration
	// StandbyNames, when set, are the standbys StandbyWait counts, by the
	// application_name their walreceiver connects with (primary_conninfo's
	// application_name, else cluster_name, else "walreceiver"): name those a
	// failover may promote. Defaults to none: any physical streaming standby counts.
	// Logical replication (CDC) and WAL archivers (pg_receivewal) never count. Each
	// name is 1 to 63 bytes.
	StandbyNames []string
	// MaxWaiters caps how many attempts of this engine wait at once for another
	// attempt's answer (Request.Wait); an attempt that would wait beyond it is answered
	// *InProgressError at once. A waiter holds no connection, only its goroutine and
	// its caller (an HTTP request, say) until the answer or the bound. Defaults to
	// 1000. -1 lets none wait.
	MaxWaiters int
	// Hooks observe the engine; several observers combine with JoinHooks. Optional.
	Hooks Hooks
	// Sweeper is the engine's sweeper's settings (Start and Sweep with a nil config):
	// taking over keys whose client went away, retention, partitions. Defaults: see
	// SweeperConfig; New refuses an invalid one.
	Sweeper SweeperConfig
	// Sealer, when set, seals (encrypts or redacts) every request body and answer a
	// key stores, and opens them before a resumption or a replay (see Sealer). Nil
	// (the default) stores them as they are, and refuses to resume or replay a sealed
	// one (ErrNewerFormat).
	Sealer Sealer
	// Logger receives what the engine cannot return, such as a failed release after a
	// transient failure. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with zero fields set to their defaults. Special
// values are kept as they are, so c.WithDefaults().WithDefaults() equals
// c.WithDefaults(). StoredHeaders and StandbyNames are copied.
func (c *Config) WithDefaults() *Config {
	out := Config{}
	if c != nil {
		out = *c
	}
	out.Lease = cmp.Or(out.Lease, LeaseDefault)
	out.MaxBodyBytes = cmp.Or(out.MaxBodyBytes, MaxBodyBytesDefault)
	out.MaxResponseBytes = cmp.Or(out.MaxResponseBytes, MaxResponseBytesDefault)
	out.MaxPhaseDataBytes = cmp.Or(out.MaxPhaseDataBytes, MaxPhaseDataBytesDefault)
	out.TxRetries = cmp.Or(out.TxRetries, TxRetriesDefault)
	out.BackoffBase = cmp.Or(out.BackoffBase, BackoffBaseDefault)
	out.BackoffMax = cmp.Or(out.BackoffMax, BackoffMaxDefault)
	out.History = cmp.Or(out.History, HistoryDefault)
	out.Sweeper = *out.Sweeper.WithDefaults()
	out.AdmitWait = cmp.Or(out.AdmitWait, AdmitWaitDefault)
	out.MaxWaiters = cmp.Or(out.MaxWaiters, MaxWaitersDefault)
	out.StandbyNames = slices.Clone(out.StandbyNames)
	if out.StoredHeaders == nil {
		out.StoredHeaders = StoredHeadersDefault()
	} else {
		out.StoredHeaders = slices.Clone(out.StoredHeaders)
	}
	out.Logger = cmp.Or(out.Logger, slog.Default())
	return &out
}

func (c *Config) validate() error {
	switch {
	case c.Lease < time.Second:
		return fmt.Errorf("workflow: Lease %s is under 1s", c.Lease)
	case c.MaxBodyBytes < 0 || c.MaxBodyBytes > 16<<20:
		return fmt.Errorf("workflow: MaxBodyBytes %d is outside 0..16 MiB", c.MaxBodyBytes)
	case c.MaxResponseBytes < 0 || c.MaxResponseBytes > 16<<20:
		return fmt.Errorf("workflow: MaxResponseBytes %d is outside 0..16 MiB", c.MaxResponseBytes)
	case c.MaxPhaseDataBytes < 0 || c.MaxPhaseDataBytes > 1<<20:
		return fmt.Errorf("workflow: MaxPhaseDataBytes %d is outside 0..1 MiB", c.MaxPhaseDataBytes)
	case c.TxRetries < -1:
		return fmt.Errorf("workflow: TxRetries %d is negative; -1 disables retries", c.TxRetries)
	case c.InProgressRetryAfter < RetryAfterLease:
		return fmt.Errorf("workflow: InProgressRetryAfter %s is negative; for the lease left use RetryAfterLease (-1)", c.InProgressRetryAfter)
	case c.History < -1 || c.History > 1000:
		return fmt.Errorf("workflow: History %d is outside 1..1000; -1 keeps none", c.History)
	case c.StandbyWait < 0:
		return fmt.Errorf("workflow: StandbyWait %s is negative; 0 waits for no standby", c.StandbyWait)
	case c.MaxInFlight < -1:
		return fmt.Errorf("workflow: MaxInFlight %d is negative; -1 sets no cap", c.MaxInFlight)
	case c.AdmitWait < 0 && c.AdmitWait != -1:
		return fmt.Errorf("workflow: AdmitWait %s is negative; -1 waits as long as the caller", c.AdmitWait)
	case c.MaxWaiters < -1:
		return fmt.Errorf("workflow: MaxWaiters %d is negative; -1 lets none wait", c.MaxWaiters)
	case c.BackoffBase < 0 || c.BackoffMax < c.BackoffBase:
		return fmt.Errorf("workflow: BackoffBase %s and BackoffMax %s are not 0 <= base <= max", c.BackoffBase, c.BackoffMax)
	}
	for _, n := range c.StandbyNames {
		if n == "" || len(n) > 63 {
			return fmt.Errorf("workflow: StandbyNames: %q is not 1 to 63 bytes (an application_name)", n)
		}
	}
	if err := c.Sweeper.validate(); err != nil {
		return fmt.Errorf("workflow: %w", err)
	}
	if err := keytable.ValidateSchema(c.Schema); err != nil {
		return fmt.Errorf("workflow: Schema: %w", err)
	}
	switch c.Scan {
	case ScanAuto, ScanSingle, ScanPerKey:
	default:
		return fmt.Errorf("workflow: Scan %q is not %q, %q or empty", c.Scan, ScanSingle, ScanPerKey)
	}
	return nil
}

// historyKeep is how many history entries a key keeps: 0 when history is off.
func (c *Config) historyKeep() int { return max(c.History, 0) }

// txRetries is how many times a tx phase is re-run after a conflict: TxRetries, with
// -1 (disabled) as 0.
func (c *Config) txRetries() int { return max(c.TxRetries, 0) }

// Pool is what the engine needs of a connection pool; *pgxpool.Pool satisfies it.
type Pool interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Scan is how sweeps and expiries find keys across scopes (Config.Scan): an alias of
// the store's, so that nobody imports store to choose one.
type Scan = keytable.Scan

// The scans of Config.Scan.
const (
	ScanAuto   = keytable.ScanAuto
	ScanSingle = keytable.ScanSingle
	ScanPerKey = keytable.ScanPerKey
)

// Engine runs flows under idempotency keys. It is safe for concurrent use.
type Engine struct {
	pool   Pool
	store  *keytable.Store
	cfg    *Config
	stored map[string]bool // canonical header names kept on finished keys

	mu        sync.RWMutex
	flows     map[string]phases.Flow
	durations durations // how long new keys take, for Retry-After

	adm      *admission                      // attempts in flight, executors running, the drain
	waits    waits                           // the keys this engine runs, and the attempts that wait
	members  map[string]*fingerprint.Members // the flows' FingerprintMembers, validated
	layout   layoutCheck                     // the start-up check of the key table (partition.go)
	sweeping sweeping                        // the engine's sweeper (sweeper.go)
	env      attempt.Env                     // what the executor of an attempt reads (internal/attempt)
}

// New returns an engine on pool. The pool's schema must have been migrated
// (migrations.Migrate). cfg may be nil.
func New(pool Pool, cfg *Config) (*Engine, error) {
	if pool == nil {
		return nil, errors.New("workflow: nil pool")
	}
	c := cfg.WithDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	stored := make(map[string]bool, len(c.StoredHeaders))
	for _, h := range c.StoredHeaders {
		stored[textproto.CanonicalMIMEHeaderKey(h)] = true
	}
	for _, never := range []string{"Set-Cookie", "Date", "Authorization", "Proxy-Authenticate", "Www-Authenticate", "Proxy-Authorization"} {
		delete(stored, never)
	}
	st, err := keytable.NewWith(keytable.Options{Schema: c.Schema, Scan: c.Scan, SealedBodies: c.Sealer != nil})
	if err != nil {
		return nil, fmt.Errorf("workflow: %w", err)
	}
	e := &Engine{pool: pool, store: st, cfg: c, stored: stored, flows: map[string]phases.Flow{},
		members: map[string]*fingerprint.Members{}, adm: newAdmission(inFlightLimit(pool, c.MaxInFlight))}
	e.env = attempt.Env{
		Store: st, Pool: pool, Hooks: &c.Hooks, Admission: e.adm,
		Acquire: e.acquire, Keeps: e.keeps, Seal: e.sealResponse,
		Lease: c.Lease, TxRetries: c.txRetries(),
		HistoryKeep: c.historyKeep(), HistoryOmitCleanFinish: c.HistoryOmitCleanFinish,
		BackoffBase: c.BackoffBase, BackoffMax: c.BackoffMax,
		MaxResponseBytes: c.MaxResponseBytes, MaxPhaseDataBytes: c.MaxPhaseDataBytes,
		StandbyWait: c.StandbyWait, StandbyNames: c.StandbyNames,
		ClaimWithFirstStatement: c.ClaimWithFirstStatement, Logger: c.Logger,
	}
	return e, nil
}

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return *e.cfg }

// Register adds a flow. It fails if the flow is invalid (see phases.Flow.Validate) or a
// flow of that name is already registered. A client-only flow (phases.Flow.ClientOnly)
// is registered by the names and kinds of its phases; see Request.ClientPhases. An
// invalid phases.Flow.FingerprintMembers is refused too (wrapping phases.ErrInvalidFlow).
func (e *Engine) Register(f phases.Flow) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("workflow: register: %w", err)
	}
	ms, err := fingerprint.NewMembers(f.FingerprintMembers)
	if err != nil {
		return fmt.Errorf("workflow: register: %w: flow %q: %w", phases.ErrInvalidFlow, f.Name, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, dup := e.flows[f.Name]; dup {
		return fmt.Errorf("workflow: register: %w: flow %q is already registered", phases.ErrInvalidFlow, f.Name)
	}
	f.Phases = append([]phases.Phase(nil), f.Phases...)
	f.FingerprintMembers = slices.Clone(f.FingerprintMembers)
	e.flows[f.Name] = f
	e.members[f.Name] = ms
	return nil
}

// Flow returns the registered flow of that name, or false if there is none. Its
// ClientOnly says whether its keys can be finished without their client.
func (e *Engine) Flow(name string) (phases.Flow, bool) {
	f, ok := e.flow(name)
	f.Phases = append([]phases.Phase(nil), f.Phases...)
	f.FingerprintMembers = slices.Clone(f.FingerprintMembers)
	return f, ok
}

// Flows returns the names of the registered flows, sorted.
func (e *Engine) Flows() []string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return slices.Sorted(maps.Keys(e.flows))
}

func (e *Engine) flow(name string) (phases.Flow, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	f, ok := e.flows[name]
	return f, ok
}

// Request is one attempt of a logical operation.
type Request struct {
	// Scope is the key's owner, resolved by the server (an account, a tenant): 1-255
	// bytes of UTF-8 text without control characters (ValidateScope).
	Scope string
	// Key is the client's idempotency key: 1-255 printable ASCII characters
	// (ValidateKey).
	Key string
	// Flow names a registered flow.
	Flow string
	// Method, Route and Body identify the request: a later attempt with the same key
	// must match them (Body compared in canonical JSON form when it is JSON, or only
	// in the members its flow chooses: phases.Flow.FingerprintMembers).
	Method string
	Route  string
	Body   []byte
	// ClientPhases are, for a client-only flow (phases.Flow.ClientOnly), this attempt's
	// phases with their functions: as many as the registered flow has, with the same
	// names and kinds in the same order (else ErrInvalidRequest). The engine runs them
	// in place of the registered ones if this attempt runs the key, and never keeps
	// them past the attempt; they are not part of the fingerprint. Without them Do
	// fails with ErrNeedsClient for a client-only flow, and with them with
	// ErrInvalidRequest for any other; nothing is written either way.
	ClientPhases []phases.Phase
	// Wait, when positive, lets this attempt wait up to that long when another attempt
	// holds its key (or is claiming it): it waits for that attempt's answer and
	// replays it, holding no connection and waiting on no lock (see the engine's doc,
	// "Bounded wait"). If that attempt releases the key (a transient failure) or its
	// lease ends, this one takes the key over and resumes it, as a retry would; if the
	// bound passes first, or Config.MaxWaiters attempts already wait, Do returns
	// *InProgressError as without a wait. Zero, the default, answers at once. Negative
	// is refused (ErrInvalidRequest).
	Wait time.Duration
}

// ValidateKey reports whether key is a valid idempotency key: 1-255 bytes of printable
// ASCII (space through tilde). The error wraps ErrInvalidKey, and also
// ErrControlCharacter when the key holds a C0 or C1 control character or DEL. Do,
// package idemhttp (ParseKeyHeader) and package idemmsg refuse keys with it.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > 255 {
		return fmt.Errorf("%w: %d bytes, the limit is 255", ErrInvalidKey, len(key))
	}
	if r, at, ok := controlCharacter(key); ok {
		return fmt.Errorf("%w: %w U+%04X at byte %d", ErrInvalidKey, ErrControlCharacter, r, at)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte %#x at %d is not printable ASCII", ErrInvalidKey, c, i)
		}
	}
	return nil
}

// ValidateScope reports whether scope can own keys: 1-255 bytes of UTF-8 text with no
// control character (C0 U+0000-U+001F, DEL U+007F, C1 U+0080-U+009F), so that no
// scope can move an operator's cursor or hide in a log line. The error wraps
// ErrInvalidScope, and also ErrControlCharacter for a control character. Do, package
// idemhttp (before the body is read) and package idemmsg refuse scopes with it; the
// admin calls accept any UTF-8 text without NUL, so that rows stored by older
// releases stay reachable.
func ValidateScope(scope string) error {
	if scope == "" || len(scope) > 255 {
		return fmt.Errorf("%w: want 1-255 bytes, got %d", ErrInvalidScope, len(scope))
	}
	if !utf8.ValidString(scope) {
		return fmt.Errorf("%w: not UTF-8 text", ErrInvalidScope)
	}
	if r, at, ok := controlCharacter(scope); ok {
		return fmt.Errorf("%w: %w U+%04X at byte %d", ErrInvalidScope, ErrControlCharacter, r, at)
	}
	return nil
}

// controlCharacter finds the first C0 or C1 control character or DEL in s. A byte
// that is not part of valid UTF-8 is not one (the callers refuse those themselves).
func controlCharacter(s string) (r rune, at int, ok bool) {
	for i, c := range s {
		if c < 0x20 || (c >= 0x7f && c <= 0x9f) {
			return c, i, true
		}
	}
	return 0, 0, false
}

// storableText reports whether s can be stored in a text column: valid UTF-8 with no
// NUL byte.
func storableText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

func (e *Engine) validate(req *Request) (phases.Flow, error) {
	if err := ValidateKey(req.Key); err != nil {
		return phases.Flow{}, err
	}
	if err := ValidateScope(req.Scope); err != nil {
		return phases.Flow{}, err
	}
	if req.Method == "" || len(req.Method) > 16 || !storableText(req.Method) {
		return phases.Flow{}, fmt.Errorf("%w: method %q", ErrInvalidRequest, req.Method)
	}
	if req.Route == "" || len(req.Route) > 1024 {
		return phases.Flow{}, fmt.Errorf("%w: route of %d bytes, want 1-1024", ErrInvalidRequest, len(req.Route))
	}
	if !storableText(req.Route) {
		return phases.Flow{}, fmt.Errorf("%w: route is not UTF-8 text without NUL", ErrInvalidRequest)
	}
	if req.Wait < 0 {
		return phases.Flow{}, fmt.Errorf("%w: negative wait %s", ErrInvalidRequest, req.Wait)
	}
	if len(req.Body) > e.cfg.MaxBodyBytes {
		return phases.Flow{}, fmt.Errorf("%w: %d bytes, the limit is %d", ErrBodyTooLarge, len(req.Body), e.cfg.MaxBodyBytes)
	}
	f, ok := e.flow(req.Flow)
	if !ok {
		return phases.Flow{}, fmt.Errorf("%w: %q", ErrUnknownFlow, req.Flow)
	}
	if req.Body == nil {
		req.Body = []byte{}
	}
	return attemptFlow(f, req)
}

// attemptFlow returns the flow an attempt runs: f itself, or for a client-only flow,
// f with the attempt's own phases (req nil: an attempt without its client, Resume's).
func attemptFlow(f phases.Flow, req *Request) (phases.Flow, error) {
	if !f.ClientOnly {
		if req != nil && req.ClientPhases != nil {
			return phases.Flow{}, fmt.Errorf("%w: flow %q is not client-only: ClientPhases must be nil", ErrInvalidRequest, f.Name)
		}
		return f, nil
	}
	if req == nil || req.ClientPhases == nil {
		return phases.Flow{}, fmt.Errorf("%w: flow %q is client-only", ErrNeedsClient, f.Name)
	}
	if len(req.ClientPhases) != len(f.Phases) {
		return phases.Flow{}, fmt.Errorf("%w: flow %q has %d phases, the attempt brought %d", ErrInvalidRequest, f.Name, len(f.Phases), len(req.ClientPhases))
	}
	for i, p := range req.ClientPhases {
		if want := f.Phases[i]; p.Name != want.Name || p.Kind != want.Kind {
			return phases.Flow{}, fmt.Errorf("%w: flow %q phase %d is %s %q, the attempt brought %s %q",
				ErrInvalidRequest, f.Name, i, want.Kind, want.Name, p.Kind, p.Name)
		}
	}
	f.Phases = req.ClientPhases
	return f, nil
}

// maxRaces bounds how often an attempt re-reads a key after losing a race with another
// attempt on it; each race means another attempt made progress.
const maxRaces = 8

// answer is how an attempt on a key ends: with its result; or, when the key changed
// under it (another attempt made progress), with another look-up; or, for a new key
// whose claim found the row, as that row.
type answer struct {
	out   Result
	again bool          // look the key up again
	found *keytable.Row // fresh only: answer as this row
	// claimLost: fresh only, the claim found another attempt in the key's first
	// transaction (the answer is in progress)
	claimLost bool
}

// ended is the answer of an attempt that ended with out.
func ended(out Result) answer { return answer{out: out} }

// Do runs one attempt of req: Run, with its Result as a result and an error. A new key
// runs its flow from the start; a finished key replays its stored response; an
// unfinished key whose lease ended is taken over and resumed from its recovery point.
//
// Errors (Result.Err): ErrInvalidKey, ErrInvalidScope (both also wrapping
// ErrControlCharacter for a control character; no statement sent), ErrInvalidRequest,
// ErrBodyTooLarge and ErrUnknownFlow for bad input (nothing written); ErrBodyNotJSON
// (also ErrInvalidRequest) for a body that is not JSON when the flow fingerprints
// chosen members (nothing written); ErrMismatch (nothing written);
// *InProgressError; *TransientError; ErrLeaseLost; ErrNewerFormat for a row a newer
// build wrote (nothing written; an unknown recovery point is also
// ErrUnknownRecoveryPoint); ErrDeadLettered; ErrUnavailable or ErrConflict when the
// database fails; a *ShedError (ErrOverloaded, ErrDraining) when the attempt was turned
// away before its claim (nothing written); ctx's error when ctx ended before the claim
// (nothing written).
//
// Cancellation: ctx is honoured until the attempt's claim is durable (the key row
// committed with the first tx phase, or before the first call phase, or a takeover),
// since until then nothing was written; after it, the attempt is detached from ctx
// and runs on, so that a retry finds its answer (callers such as HTTP handlers pass
// the request's context as it is).
func (e *Engine) Do(ctx context.Context, req Request) (*Result, error) {
	return split(e.Run(ctx, req))
}

// Run runs one attempt of req, as Do does, and returns how it ended: never nil, with
// Outcome OutcomeFinished or OutcomeReplayed and the Response, or another Outcome and
// Err (the error Do returns). Bad input ends OutcomeFailed before any hook runs.
func (e *Engine) Run(ctx context.Context, req Request) *Result {
	return e.run(ctx, req, nil)
}

// RunReading runs one attempt of req, as Run does, with the body read by read once the
// attempt is admitted (req.Body is ignored): under MaxInFlight, holding its place while
// read runs, so that an attempt turned away (overloaded or draining) never reads its
// body, and one admitted keeps its place until its answer. read is called at most once,
// and not at all when the attempt is turned away or its other fields are bad input
// (answered as Run answers them, before any hook). A body that read cannot give
// (its error) or that is over Config.MaxBodyBytes ends the attempt OutcomeFailed,
// after the hooks saw it start, with ErrInvalidRequest wrapping read's error or with
// ErrBodyTooLarge; nothing is written and its place is given back. A caller such as
// an HTTP handler uses it when reading the body is work a refusal should not pay for.
func (e *Engine) RunReading(ctx context.Context, req Request, read func() ([]byte, error)) *Result {
	if read == nil {
		out := failure(fmt.Errorf("%w: RunReading needs a read function", ErrInvalidRequest))
		return &out
	}
	req.Body = nil
	return e.run(ctx, req, read)
}

// run is Run, with the body read by read once admitted when read is not nil.
func (e *Engine) run(ctx context.Context, req Request, read func() ([]byte, error)) *Result {
	f, err := e.validate(&req)
	if err != nil {
		out := failure(err)
		return &out
	}
	ev := AttemptEvent{Executor: ExecutorClient, Flow: f.Name, Scope: req.Scope, Key: req.Key}
	out, _ := e.runAttempt(ctx, ev, func(ctx context.Context) (Result, error) {
		if err := e.admitNew(ctx); err != nil {
			return failure(err), nil
		}
		held := true
		defer func() { // on every path, a panicking read included
			if held {
				e.adm.done()
			}
		}()
		if read != nil {
			if req.Body, err = e.readBody(read); err != nil {
				return failure(err), nil
			}
		}
		return e.do(ctx, f, req, &held).out, nil
	})
	return &out
}

// readBody reads an admitted attempt's body with read (RunReading): ErrInvalidRequest
// when read fails, ErrBodyTooLarge over Config.MaxBodyBytes.
func (e *Engine) readBody(read func() ([]byte, error)) ([]byte, error) {
	body, err := read()
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: read the body: %w", ErrInvalidRequest, err)
	case len(body) > e.cfg.MaxBodyBytes:
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrBodyTooLarge, len(body), e.cfg.MaxBodyBytes)
	case body == nil:
		return []byte{}, nil
	}
	return body, nil
}

// do answers req, holding a place under MaxInFlight (*held) except while it waits for
// another attempt's answer: a waiter runs nothing, so it gives its place back and
// takes one again, bounded by AdmitWait, once there is something to run or replay.
func (e *Engine) do(ctx context.Context, f phases.Flow, req Request, held *bool) answer {
	fp, err := fingerprint.Of(e.memberSet(f.Name), req.Method, req.Route, req.Body)
	if err != nil {
		return ended(failure(err))
	}
	w := e.newWaiter(f.Name, req)
	defer w.leave()
	var seen *keytable.Row // the key as a watch read it for this waiter
	known := false         // seen is the key's state: no look-up needed (nil: no row)
	for races := 0; races < maxRaces; {
		var a answer
		if !known && w.ownerHere() { // this engine runs the key: wait, sending nothing
			a = ended(inProgress(e.retryAfter(f.Name, claimRetryAfter, e.cfg.Lease), false))
		} else {
			a = e.attempt(ctx, f, &req, fp, seen, known, races == 0)
		}
		if a.again {
			races++
			known = false
			continue
		}
		if !w.waits(a) {
			return a
		}
		polls := pollsAfterLookup
		if a.claimLost {
			polls = pollsAfterClaim
		}
		e.adm.done()
		*held = false
		if seen, known = w.wait(ctx, polls); !known {
			return w.late(a) // the bound passed: answer in progress, as without a wait
		}
		if err := e.adm.admit(ctx, e.cfg.AdmitWait); err != nil {
			return ended(failure(err))
		}
		*held = true
	}
	return ended(failure(fmt.Errorf("workflow: key kept changing under %d attempts: %w", maxRaces, keytable.ErrConflict)))
}

// attempt answers req once: as row when known (nil: the key has no row), else as
// the key's row looked up now. first: no claim of this request found the key's row
// yet; then, when the flow's claim looks for the row under the claim lock, the look-up
// may be the recent one (keytable.Store.LookupRecent): a row it misses, the claim finds.
func (e *Engine) attempt(ctx context.Context, f phases.Flow, req *Request, fp []byte, row *keytable.Row, known, first bool) answer {
	if !known {
		var err error
		row, err = e.lookup(ctx, req.Scope, req.Key, first && claimLooks(f))
		switch {
		case errors.Is(err, keytable.ErrNotFound):
			row = nil
		case err != nil:
			return ended(failure(err))
		}
	}
	var a answer
	if row == nil {
		a = e.fresh(ctx, f, *req, fp)
		row = a.found
	}
	if row != nil { // found, or the claim found it
		a = e.existing(ctx, row, req, fp)
	}
	return a
}

// Resume drives an existing key: it replays a finished key, and takes over and resumes
// an unfinished one whose lease ended, from its recovery point, with the request stored
// on the key. It is what the sweeper and operators call.
//
// Errors: ErrNotFound; *InProgressError while a lease is live; ErrUnknownFlow if the
// key's flow is not registered and ErrUnknownRecoveryPoint (with ErrNewerFormat) if
// the flow has no phase of that name (both leave the key untouched); ErrDeadLettered;
// and the errors of Do.
func (e *Engine) Resume(ctx context.Context, scope, key string) (*Result, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	if e.adm.Draining() {
		return nil, shed(ErrDraining)
	}
	ev := AttemptEvent{Executor: ExecutorClient, Scope: scope, Key: key}
	out, _ := e.runAttempt(ctx, ev, func(ctx context.Context) (Result, error) { return e.resume(ctx, scope, key), nil })
	return split(&out)
}

func (e *Engine) resume(ctx context.Context, scope, key string) Result {
	for range maxRaces {
		row, err := e.lookup(ctx, scope, key, false)
		if errors.Is(err, keytable.ErrNotFound) {
			return failure(fmt.Errorf("%w: scope %q key %q", ErrNotFound, scope, key))
		}
		if err != nil {
			return failure(err)
		}
		if a := e.existing(ctx, row, nil, nil); !a.again {
			return a.out
		}
	}
	return failure(fmt.Errorf("workflow: key kept changing under %d attempts: %w", maxRaces, keytable.ErrConflict))
}

// existing answers an attempt that found a key row. req and fp are nil for Resume.
func (e *Engine) existing(ctx context.Context, row *keytable.Row, req *Request, fp []byte) answer {
	a := e.existingRow(ctx, row, req, fp)
	a.out = withKey(a.out, row.ID, row.Flow, row.Origin, row.RecoveryPoint, 0)
	return a
}

func (e *Engine) existingRow(ctx context.Context, row *keytable.Row, req *Request, fp []byte) answer {
	if err := e.checkRow(row); err != nil {
		return ended(failure(err)) // a newer build's row: nothing final, nothing written
	}
	if req != nil && (row.Flow != req.Flow || row.Method != req.Method || row.Route != req.Route || !fingerprint.Matches(row.Fingerprint, fp, req.Method, req.Route, req.Body, e.memberSet(req.Flow))) {
		return ended(noted(Result{Outcome: OutcomeMismatch, Err: ErrMismatch}, nil, true))
	}
	switch row.Status {
	case keytable.StatusFinished:
		resp, err := e.openResponse(ctx, row)
		if err != nil {
			return ended(failure(err))
		}
		return ended(answered(resp, true))
	case keytable.StatusDead:
		last := ""
		if row.LastError != nil {
			last = *row.LastError
		}
		return ended(failure(fmt.Errorf("%w: %s", ErrDeadLettered, last)))
	}
	if row.LeaseLive {
		return ended(inProgress(e.retryAfter(row.Flow, row.LeaseLeft(), row.LeaseLeft()), true))
	}
	f, ok := e.flow(row.Flow)
	if !ok {
		return ended(failure(fmt.Errorf("%w: %q (stored on key %q)", ErrUnknownFlow, row.Flow, row.Key)))
	}
	f, err := attemptFlow(f, req)
	if err != nil {
		return ended(failure(err))
	}
	next, err := f.Index(row.RecoveryPoint)
	if err != nil {
		return ended(failure(unknownPoint(err)))
	}
	body, err := e.openBody(ctx, row) // before the takeover: a body it cannot open changes no row
	if err != nil {
		return ended(failure(err))
	}
	defer e.waits.end(row.Scope, row.Key, e.waits.run(row.Scope, row.Key)) // wakes this engine's waiters
	started := time.Now()
	taken, err := e.takeover(ctx, row)
	if errors.Is(err, keytable.ErrNotTaken) {
		return answer{again: true}
	}
	if err != nil {
		return ended(failure(err))
	}
	e.attemptEvent(ctx, KeyEvent{Kind: OutcomeTakenOver, Flow: row.Flow, Scope: row.Scope, Key: row.Key, RecoveryPoint: row.RecoveryPoint})
	taken.RequestBody = body // opened; the fence names the same row
	if req != nil && f.ForgetBody && len(taken.RequestBody) == 0 {
		taken.RequestBody = req.Body // a retry brings the body that was not stored
	}
	x, err := attempt.Take(&e.env, f, taken, started, attempt.Taken{By: ExecutorClient, Detach: req != nil}) // detached: Do's attempt, not Resume's
	if err != nil {
		return ended(failure(err))
	}
	return ended(x.Keyed(x.Drive(ctx, next+1).Out))
}

// claimRetryAfter is the Retry-After of an attempt that found its key being claimed by
// another attempt, whose first transaction is still running, before any attempt of the
// flow was observed.
const claimRetryAfter = time.Second

// fresh runs a new key from its first phase. The claim checks make sure that an
// attempt that does not own the key runs nothing of the flow: when another attempt is
// claiming the key, fresh answers in progress; when the key's row exists, it answers
// as the row (or looks it up again when the claim did not read it).
func (e *Engine) fresh(ctx context.Context, f phases.Flow, req Request, fp []byte) answer {
	id, err := newUUID()
	if err != nil {
		return ended(failure(err))
	}
	body, sealed, err := e.storedBody(ctx, f, req)
	if err != nil {
		return ended(failure(err))
	}
	defer e.waits.end(req.Scope, req.Key, e.waits.run(req.Scope, req.Key)) // wakes this engine's waiters
	origin := storedOrigin(ctx, &e.cfg.Hooks)
	x := attempt.Fresh(&e.env, f, keytable.Claim{
		Scope: req.Scope, Key: req.Key, ID: id, Flow: f.Name,
		Method: req.Method, Route: req.Route, Fingerprint: fp, Body: body,
		Lease: e.cfg.Lease, Origin: origin,
	}, req.Body, sealed)
	started := time.Now()
	end := x.Drive(ctx, 0)
	switch {
	case end.Finished:
		e.durations.observe(f.Name, time.Since(started))
	case end.Lost && end.Busy:
		// Another attempt is in the key's first transaction: nothing is durable yet, so
		// there is nothing to replay or compare; the client retries.
		out := inProgress(e.retryAfter(f.Name, claimRetryAfter, e.cfg.Lease), true)
		out = standing(out, phases.Started)
		return answer{out: out, claimLost: true}
	case end.Lost && end.Found != nil:
		return answer{found: end.Found}
	case end.Lost:
		return answer{again: true} // the row exists: look it up and answer it
	}
	return ended(x.Keyed(end.Out))
}

// bounded limits one of the engine's own statements to a lease, so that a connection
// that stops answering cannot hold a caller whose context has no deadline (a handler
// that outlives its client, a sweeper's background loop).
func (e *Engine) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, e.cfg.Lease)
}

// lookup reads a key row before the claim: the wait for a connection is bounded by
// AdmitWait. recent: the flow's claim looks for the row itself under the claim lock,
// so on a partitioned key table the look-up may read the current partition alone
// (keytable.Store.LookupRecent, docs/PARTITIONS.md "The look-up before a claim"): a
// row it misses, the claim finds.
func (e *Engine) lookup(ctx context.Context, scope, key string, recent bool) (*keytable.Row, error) {
	pc, err := e.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer pc.Release()
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	if recent {
		return e.store.LookupRecent(ctx, pc, scope, key)
	}
	return e.store.Lookup(ctx, pc, scope, key)
}

// claimLooks reports whether f's claim of a new key looks for the key's row under the
// claim lock, in a snapshot taken after it: every claim at READ COMMITTED (a first tx
// phase's, a pipelined phase's, and the claim that inserts the row with a first call
// phase's commit). A first tx phase at REPEATABLE READ or SERIALIZABLE claims in its
// one snapshot, taken before the lock (refused on a partitioned key table): its
// look-up before the claim must find every row.
func claimLooks(f phases.Flow) bool {
	if len(f.Phases) == 0 || f.Phases[0].Kind != phases.KindTx {
		return true
	}
	iso := f.Phases[0].IsoLevel
	return iso == "" || iso == pgx.ReadCommitted || iso == pgx.ReadUncommitted
}

func storedResponse(row *keytable.Row) (*phases.Response, error) {
	resp := &phases.Response{Body: row.ResponseBody, Header: map[string][]string{}}
	if row.ResponseStatus != nil {
		resp.Status = *row.ResponseStatus
	}
	if resp.Body == nil {
		resp.Body = []byte{}
	}
	if len(row.ResponseHeaders) > 0 && !decodeHeaders(row.ResponseHeaders, resp.Header) {
		clear(resp.Header)
		if err := json.Unmarshal(row.ResponseHeaders, &resp.Header); err != nil {
			return nil, fmt.Errorf("decode stored headers: %w", err)
		}
	}
	return resp, nil
}

// decodeHeaders decodes stored headers, a JSON object of names to lists of strings as
// jsonb writes it, into h, in two allocations besides h's own: one string for every
// name and value, one slice for every list. It reports false, leaving h partly
// filled, for any other form (an escape, a null, invalid UTF-8): encoding/json
// decodes those.
func decodeHeaders(b []byte, h map[string][]string) bool {
	if !utf8.Valid(b) {
		return false
	}
	s := string(b)
	p := headerParser{s: s, vals: make([]string, 0, strings.Count(s, `"`)/2)}
	if !p.skip('{') {
		return false
	}
	for first := true; !p.skip('}'); first = false {
		if !first && !p.skip(',') {
			return false
		}
		name, ok := p.str()
		if !ok || !p.skip(':') || !p.skip('[') {
			return false
		}
		start := len(p.vals)
		for firstVal := true; !p.skip(']'); firstVal = false {
			if !firstVal && !p.skip(',') {
				return false
			}
			v, ok := p.str()
			if !ok {
				return false
			}
			p.vals = append(p.vals, v)
		}
		h[name] = p.vals[start:len(p.vals):len(p.vals)]
	}
	p.space()
	return p.i == len(s)
}

// headerParser reads stored headers: s from i, the lists' values appended to vals.
type headerParser struct {
	s    string
	i    int
	vals []string
}

// space skips JSON whitespace.
func (p *headerParser) space() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == '\n' || p.s[p.i] == '\r') {
		p.i++
	}
}

// skip reads c after whitespace, and reports whether it was there.
func (p *headerParser) skip(c byte) bool {
	p.space()
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

// str reads a string without escapes or control characters after whitespace.
func (p *headerParser) str() (string, bool) {
	if !p.skip('"') {
		return "", false
	}
	for j := p.i; j < len(p.s); j++ {
		switch c := p.s[j]; {
		case c == '"':
			v := p.s[p.i:j]
			p.i = j + 1
			return v, true
		case c == '\\' || c < 0x20:
			return "", false
		}
	}
	return "", false
}

func newUUID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate key id: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32], nil
}

// representationHeaders describe a response body itself: what it is, how it is encoded
// and which request headers chose it. The bytes mean nothing without them, so they are
// stored and replayed with the body whatever Config.StoredHeaders lists (gzip bytes are
// never replayed labelled application/json).
var representationHeaders = map[string]bool{"Content-Type": true, "Content-Encoding": true, "Vary": true}

// keeps reports whether the engine stores and replays the header of canonical name: it
// is allow-listed (Config.StoredHeaders, less the names never stored) or describes the
// body (representationHeaders).
func (e *Engine) keeps(canonical string) bool {
	return e.stored[canonical] || representationHeaders[canonical]
}

// memberSet is the member list of a registered flow, nil if it has none.
func (e *Engine) memberSet(flow string) *fingerprint.Members {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.members[flow]
}

// ErrBodyNotJSON: the flow fingerprints chosen members (phases.Flow.FingerprintMembers)
// and the request body is not one canonicalisable JSON value (see Fingerprint: not
// JSON, invalid UTF-8, duplicate member names, nesting deeper than 64 levels, an
// exponent of more than 18 digits). It wraps ErrInvalidRequest; nothing was written.
var ErrBodyNotJSON = vocab.ErrBodyNotJSON

// Fingerprint returns the fingerprint an engine stores on a request's key, for a flow
// whose phases.Flow.FingerprintMembers is members.
//
// With no members (nil or empty), it is version 2: 33 bytes, the version byte 0x02 and
// the sha256 of the method, the route and the body. A body that is one valid JSON value
// is hashed in an exact canonical form, so object key order, whitespace, string escapes
// and number spelling (1, 1.0, 1e0, 10e-1) don't matter, while any two numbers of
// different decimal value, however many digits they take, differ. Any other body,
// including JSON with duplicate member names, invalid UTF-8, nesting deeper than 64
// levels or an exponent of more than 18 digits, is hashed as its bytes. The two cases
// are kept apart so that no raw body can collide with a JSON one. It never fails.
//
// With members (JSON pointers), it is version 3: 73 bytes, the version byte 0x03 and
// hashes over the method, the route, the member list and the canonical form of the
// members the pointers name, an absent member told apart from a null one, and over
// the whole request, as version 2. Two requests are the same under the list when the
// first 41 bytes of their fingerprints are equal; the last 32 tell whether they are
// the same as a whole. It fails if the list is invalid (see
// phases.Flow.FingerprintMembers) or with ErrBodyNotJSON.
func Fingerprint(method, route string, body []byte, members []string) ([]byte, error) {
	if len(members) == 0 {
		return fingerprint.Whole(method, route, body), nil
	}
	ms, err := fingerprint.NewMembers(members)
	if err != nil {
		return nil, fmt.Errorf("workflow: %w", err)
	}
	return fingerprint.Of(ms, method, route, body)
}
