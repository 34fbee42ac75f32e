package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/workflow"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

const usage = `usage: idemflow -database-url URL [-schema S] COMMAND

commands:
  keys list [-status in_progress|stuck|dead|finished] [-flow F] [-scope S] [-older-than D] [-limit N] [-after CURSOR] [-json]
  keys show [-json] SCOPE KEY
  keys redrive [-json] SCOPE KEY
  keys release [-json] SCOPE KEY
  keys purge [-json] SCOPE KEY
  keys bulk [-json] [-flow F] [-scope S] [-recovery-point P] [-error TEXT] [-all] [-limit N] [-dry-run|-yes] redrive|release
  keys erase [-json] -scope S [-force] [-dry-run|-yes]
  keys cancel [-json] -status N [-header 'Name: value']... [-body TEXT|-body-file FILE] [-force] [-skip-compensation] [-dry-run] SCOPE KEY
  stats [-json]
  partitions [-json]
  migrate [-json] up|down|status
  migrations export -format golang-migrate|goose|tern [-partition week|day|hour] DIR   (needs no database)
  ui [-addr 127.0.0.1:8081] [-write-token-file FILE] [-read-token-file FILE] [-allow-host NAME,...]

Flags come before positional arguments. -json prints one JSON object per line.
Exit status: 0 on success, 1 on failure (a missing key included), 2 on bad usage.
`

// usageError is bad usage: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func badUsage(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// cli is one run of the command.
type cli struct {
	out, errOut io.Writer
	pool        *pgxpool.Pool
	engine      *workflow.Engine
	migrator    *migrations.Migrator
	schema      string // -schema: "" for the connection's search_path
}

// run runs the command line args and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idemflow", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL connection URL (default $DATABASE_URL)")
	schema := fs.String("schema", "", "schema of the key table (default: the connection's search_path)")
	err := fs.Parse(args)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		err = badUsage("%v", err)
	}
	if err == nil && fs.NArg() == 0 {
		err = badUsage("no command")
	}
	if err == nil && fs.Arg(0) == "migrations" {
		return report(stderr, exportMigrations(stdout, fs.Args()[1:]))
	}
	if err == nil && *dbURL == "" {
		err = badUsage("-database-url (or $DATABASE_URL) is required")
	}
	if err != nil {
		return report(stderr, err)
	}
	c := &cli{out: stdout, errOut: stderr}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	var do func(context.Context, []string) error
	switch cmd {
	case "keys":
		do = c.keys
	case "stats":
		do = c.stats
	case "partitions":
		do = c.partitions
	case "migrate":
		do = c.migrate
	case "ui":
		do = c.ui
	default:
		return report(stderr, badUsage("unknown command %q", cmd))
	}
	if err := c.connect(ctx, *dbURL, *schema); err != nil {
		return report(stderr, err)
	}
	defer c.pool.Close()
	return report(stderr, do(ctx, rest))
}

// report prints err, escaped (it may quote client text), and returns the exit status
// it means.
func report(stderr io.Writer, err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stderr, usage)
		return exitUsage
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "idemflow: %s\n\n%s", escape(err.Error()), usage)
		return exitUsage
	}
	fmt.Fprintf(stderr, "idemflow: %s\n", escape(err.Error()))
	return exitFail
}

// connect opens the pool and the engine.
func (c *cli) connect(ctx context.Context, url, schema string) error {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return badUsage("-database-url: %v", err)
	}
	cfg.MaxConns = 2
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "idemflow-cli"
	}
	// The schema is named by every statement of the engine and the migrator, not set
	// as the connection's search_path, so the CLI also works through a pooler that
	// refuses one (pgbouncer).
	m, err := migrations.NewMigrator(&migrations.Config{Schema: schema})
	if err != nil {
		return badUsage("-schema: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(cctx, cfg)
	if err == nil {
		err = pool.Ping(cctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		return fmt.Errorf("connect: %w", err)
	}
	e, err := workflow.New(pool, &workflow.Config{Schema: schema, Logger: slog.New(slog.NewTextHandler(c.errOut, nil))})
	if err != nil {
		pool.Close()
		return err
	}
	c.pool, c.engine, c.migrator, c.schema = pool, e, m, schema
	return nil
}

func (c *cli) keys(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return badUsage("keys: no subcommand (list, show, redrive, release, purge, bulk, cancel, erase)")
	}
	switch args[0] {
	case "list":
		return c.list(ctx, args[1:])
	case "show":
		return c.show(ctx, args[1:])
	case "redrive", "release", "purge":
		return c.act(ctx, args[0], args[1:])
	case "bulk":
		return c.bulk(ctx, args[1:])
	case "cancel":
		return c.cancel(ctx, args[1:])
	case "erase":
		return c.erase(ctx, args[1:])
	}
	return badUsage("keys: unknown subcommand %q", args[0])
}

// flags returns a flag set for a subcommand, with -json.
func flags(name string) (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs, fs.Bool("json", false, "print one JSON object per line")
}

// parse parses a subcommand's flags and wants n positional arguments.
func parse(fs *flag.FlagSet, args []string, n int, names string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return badUsage("%s: %v", fs.Name(), err)
	}
	if fs.NArg() != n {
		if n == 0 {
			return badUsage("%s: unexpected arguments %q (flags come before arguments)", fs.Name(), fs.Args())
		}
		return badUsage("%s: want %s, got %d arguments (flags come before arguments)", fs.Name(), names, fs.NArg())
	}
	return nil
}

func (c *cli) list(ctx context.Context, args []string) error {
	fs, asJSON := flags("keys list")
	status := fs.String("status", "", "in_progress, stuck, dead or finished (default all)")
	var o workflow.ListOptions
	fs.StringVar(&o.Flow, "flow", "", "only keys of this flow")
	fs.StringVar(&o.Scope, "scope", "", "only keys of this scope")
	fs.DurationVar(&o.OlderThan, "older-than", 0, "only keys claimed at least this long ago")
	fs.IntVar(&o.Limit, "limit", 50, fmt.Sprintf("most keys listed, 1..%d", workflow.ListLimitMax))
	fs.StringVar(&o.After, "after", "", "cursor printed by the previous page")
	if err := parse(fs, args, 0, ""); err != nil {
		return err
	}
	o.Status = workflow.KeyStatus(*status)
	if o.Limit < 1 || o.Limit > workflow.ListLimitMax {
		return badUsage("keys list: -limit %d is outside 1..%d", o.Limit, workflow.ListLimitMax)
	}
	if o.OlderThan < 0 {
		return badUsage("keys list: -older-than %v is negative: want a duration such as 10m or 2h (0: any age)", o.OlderThan)
	}
	page, err := c.engine.ListKeys(ctx, o)
	switch {
	case errors.Is(err, workflow.ErrUnknownStatus):
		return badUsage("keys list: -status %q: want in_progress, stuck, dead or finished", *status)
	case errors.Is(err, workflow.ErrInvalidCursor):
		return badUsage("keys list: -after: not a cursor of a list of this status")
	case err != nil:
		return err
	}
	if *asJSON {
		for _, k := range page.Keys {
			if err := c.json(k); err != nil {
				return err
			}
		}
	} else {
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SCOPE\tKEY\tSTATUS\tFLOW\tRECOVERY POINT\tATTEMPTS\tCREATED\tLAST ERROR")
		for _, k := range page.Keys {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", escape(k.Scope), escape(k.Key), escape(string(k.Status)),
				escape(k.Flow), escape(k.RecoveryPoint), k.Attempts, stamp(k.CreatedAt), oneLine(k.LastError, 60))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if page.Next != "" {
		fmt.Fprintf(c.errOut, "idemflow: more keys: add -after %s\n", escape(page.Next))
	}
	return nil
}

func (c *cli) show(ctx context.Context, args []string) error {
	fs, asJSON := flags("keys show")
	if err := parse(fs, args, 2, "SCOPE KEY"); err != nil {
		return err
	}
	info, err := c.inspect(ctx, fs.Arg(0), fs.Arg(1))
	if err != nil {
		return err
	}
	if *asJSON {
		return c.json(info)
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	for _, kv := range [][2]string{
		{"scope", info.Scope}, {"key", info.Key}, {"id", info.ID}, {"flow", info.Flow},
		{"status", string(info.Status)}, {"recovery point", info.RecoveryPoint},
		{"attempts", fmt.Sprint(info.Attempts)}, {"lock version", fmt.Sprint(info.LockVersion)},
		{"lease left", info.LeaseLeft.String()}, {"next attempt", stamp(info.NextAttemptAt)},
		{"request", oneLine(info.Method, 20) + " " + oneLine(info.Route, 100) + " " + shownBody(info.Request, info.RequestSealed, info.RequestSealedBytes)},
		{"phase data", fmt.Sprintf("%d bytes", info.PhaseDataBytes)},
		{"last error", info.LastError}, {"failed phase", info.FailedPhase},
		{"response status", fmt.Sprint(info.ResponseStatus)}, {"response headers", headerLine(info.ResponseHeader)},
		{"response body", shownBody(info.ResponseBody, info.ResponseSealed, info.ResponseSealedBytes)}, {"origin", info.Origin},
		{"created", stamp(info.CreatedAt)}, {"updated", stamp(info.UpdatedAt)}, {"finished", stampPtr(info.FinishedAt)},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], escape(kv[1]))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(c.out, "\nhistory (%d):\n", len(info.History))
	tw = tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTEMPT\tBY\tAT\tFROM\tPHASES\tOUTCOME\tPHASE\tERROR")
	for _, a := range info.History {
		from := a.From
		if a.Reached != "" {
			from = "reached " + a.Reached
		}
		outcome := escape(string(a.Outcome))
		if a.Derived {
			outcome += " (derived from the key row)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Attempt, escape(string(a.By)), stamp(a.At), escape(from),
			escape(strings.Join(a.Phases, ",")), outcome, escape(a.Phase), oneLine(a.Error, 60))
	}
	return tw.Flush()
}

// shownBody is a stored body as keys show prints it: a sealed one as its size, never
// its bytes (the CLI has no Sealer and opens nothing).
func shownBody(b []byte, sealed bool, size int) string {
	if sealed {
		return fmt.Sprintf("(sealed, %d bytes)", size)
	}
	return oneLine(string(b), 200)
}

// inspect is InspectKey with a missing key as a plain message.
func (c *cli) inspect(ctx context.Context, scope, key string) (*workflow.KeyInfo, error) {
	info, err := c.engine.InspectKey(ctx, scope, key)
	if errors.Is(err, workflow.ErrNotFound) {
		return nil, fmt.Errorf("no key %q in scope %q", key, scope)
	}
	return info, err
}

// act re-drives, releases or purges one key, and prints it as it is after (purge: as
// it was).
func (c *cli) act(ctx context.Context, verb string, args []string) error {
	fs, asJSON := flags("keys " + verb)
	if err := parse(fs, args, 2, "SCOPE KEY"); err != nil {
		return err
	}
	scope, key := fs.Arg(0), fs.Arg(1)
	var err error
	var before *workflow.KeyInfo
	switch verb {
	case "redrive":
		err = c.engine.Redrive(ctx, scope, key)
	case "release":
		err = c.engine.ReleaseKey(ctx, scope, key)
	case "purge":
		if before, err = c.inspect(ctx, scope, key); err == nil {
			err = c.engine.PurgeKey(ctx, scope, key)
		}
	}
	switch {
	case errors.Is(err, workflow.ErrNotFound):
		return fmt.Errorf("no key %q in scope %q", key, scope)
	case errors.Is(err, workflow.ErrWrongStatus):
		return fmt.Errorf("keys %s: %w", verb, err)
	case err != nil:
		return err
	}
	after := before
	if after == nil {
		if after, err = c.inspect(ctx, scope, key); err != nil {
			return err
		}
	}
	if *asJSON {
		return c.json(after.KeySummary)
	}
	past := map[string]string{"redrive": "re-drove", "release": "released", "purge": "purged"}[verb]
	_, err = fmt.Fprintf(c.out, "%s key %q in scope %q (%s at %s, lock version %d)\n", past, key, scope,
		escape(string(after.Status)), escape(after.RecoveryPoint), after.LockVersion)
	return err
}

func (c *cli) stats(ctx context.Context, args []string) error {
	fs, asJSON := flags("stats")
	if err := parse(fs, args, 0, ""); err != nil {
		return err
	}
	counts, err := c.engine.CountKeys(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		for _, n := range counts {
			if err := c.json(n); err != nil {
				return err
			}
		}
		return nil
	}
	byFlow := map[string]map[workflow.KeyStatus]int64{}
	var flowsSeen []string
	for _, n := range counts {
		if byFlow[n.Flow] == nil {
			byFlow[n.Flow] = map[workflow.KeyStatus]int64{}
			flowsSeen = append(flowsSeen, n.Flow)
		}
		byFlow[n.Flow][n.Status] = n.Keys
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "FLOW\tIN PROGRESS\tSTUCK\tDEAD\tFINISHED\t")
	for _, f := range flowsSeen {
		m := byFlow[f]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t\n", escape(f), m[workflow.KeysInProgress], m[workflow.KeysStuck], m[workflow.KeysDead], m[workflow.KeysFinished])
	}
	return tw.Flush()
}

func (c *cli) migrate(ctx context.Context, args []string) error {
	fs, asJSON := flags("migrate")
	if err := parse(fs, args, 1, "up, down or status"); err != nil {
		return err
	}
	var rep *migrations.Report
	var err error
	switch fs.Arg(0) {
	case "up":
		rep, err = c.migrator.Up(ctx, c.pool)
	case "down":
		var v int
		if v, err = c.migrator.Version(ctx, c.pool); err == nil && v > 0 {
			err = c.migrator.MigrateTo(ctx, c.pool, v-1)
		}
	case "status":
	default:
		return badUsage("migrate: want up, down or status, got %q", fs.Arg(0))
	}
	if err != nil {
		return err
	}
	st, err := c.migrator.Status(ctx, c.pool)
	if err != nil {
		return err
	}
	if *asJSON {
		out := struct {
			*migrations.Status
			Adopted *migrations.Adoption `json:"adopted,omitempty"`
			Applied []int                `json:"applied,omitempty"`
		}{Status: st}
		if rep != nil {
			out.Adopted = rep.Adopted
			for _, m := range rep.Applied {
				out.Applied = append(out.Applied, m.Version)
			}
		}
		return c.json(out)
	}
	if rep != nil && (rep.Adopted != nil || len(rep.Applied) > 0) {
		if _, err := io.WriteString(c.out, rep.String()); err != nil {
			return err
		}
	}
	_, err = io.WriteString(c.out, st.String())
	return err
}

// exportMigrations writes the migrations as a migration tool's files into a directory,
// which it creates if need be; it overwrites no file.
func exportMigrations(out io.Writer, args []string) error {
	if len(args) == 0 || args[0] != "export" {
		return badUsage("migrations: want export")
	}
	fs := flag.NewFlagSet("migrations export", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	format := fs.String("format", "", "golang-migrate, goose or tern")
	partition := fs.String("partition", "", "week, day or hour: the partitioned key table (docs/PARTITIONS.md)")
	if err := parse(fs, args[1:], 1, "DIR"); err != nil {
		return err
	}
	if !slices.Contains(migrations.Tools(), migrations.Tool(*format)) {
		return badUsage("migrations export: -format %q: want one of %v", *format, migrations.Tools())
	}
	widths := map[string]time.Duration{"week": migrations.PartitionWeek, "day": migrations.PartitionDay, "hour": migrations.PartitionHour}
	width, partitioned := widths[*partition]
	if *partition != "" && !partitioned {
		return badUsage("migrations export: -partition %q: want week, day or hour", *partition)
	}
	files, err := migrations.ToolFS(migrations.Tool(*format))
	layout := ""
	if partitioned {
		files, err = migrations.PartitionedToolFS(migrations.Tool(*format), width)
		layout = fmt.Sprintf(" (the key table partitioned by %s)", *partition)
	}
	if err != nil {
		return err
	}
	names, err := iofs.Glob(files, "*")
	if err != nil {
		return err
	}
	dir := fs.Arg(0)
	for _, n := range names {
		if _, err := os.Lstat(filepath.Join(dir, n)); err == nil {
			return fmt.Errorf("migrations export: %s already exists; nothing was written (export into an empty directory)", filepath.Join(dir, n))
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("migrations export: %w", err)
	}
	if err := os.CopyFS(dir, files); err != nil {
		return fmt.Errorf("migrations export: %w", err)
	}
	_, err = fmt.Fprintf(out, "wrote %d %s files to %s%s: %s\n", len(names), *format, dir, layout, strings.Join(names, ", "))
	return err
}

// json prints v as one line of JSON, with no raw control character (see escapeJSON).
func (c *cli) json(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.out, "%s\n", escapeJSON(b))
	return err
}

// headerLine is a stored response's headers on one line, sorted by name.
func headerLine(h map[string][]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(h)) {
		for _, v := range h[k] {
			parts = append(parts, k+": "+v)
		}
	}
	return strings.Join(parts, "; ")
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func stampPtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return stamp(*t)
}

// oneLine is s on one line (runs of white space made one space), escaped (see
// escape), cut to n runes.
func oneLine(s string, n int) string {
	s = escape(strings.Join(strings.Fields(s), " "))
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
