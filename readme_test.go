// The Go snippets of the README and of the docs its sections moved to (snippetFiles),
// compiled. Each Go block in those files follows a line `<!-- snippet: Name -->`, and is
// then the body of the function Name in this file, dedented one tab, or
// `<!-- snippet: path Name -->`, and is then the whole declaration of the function Name
// in the file at path. TestReadmeSnippets fails when the two differ, so these files
// cannot show code that does not compile.
package idemflow_test

import (
	"bufio"
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/idemmsg"
	"github.com/idemflow/idemflow/migrations"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// What the snippets take from the service around them.
var (
	ctx  = context.Background()
	pool *pgxpool.Pool
	mux  = http.NewServeMux()

	provider interface {
		Pay(ctx context.Context, idempotencyKey string, amount int64) error
	}
	refundHandler http.Handler
)

type charge struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	Status string `json:"status"`
}

// accountFromAuth is the scope: the authenticated account, never a client's claim.
func accountFromAuth(r *http.Request) (string, error) {
	account, ok := r.Context().Value(accountKey{}).(string)
	if !ok {
		return "", errors.New("not authenticated")
	}
	return account, nil
}

type accountKey struct{}

// chargesService is the README's "How it works": the flow, its handler, a sweeper, and
// the shutdown: Stop, then Drain with the HTTP server's Shutdown.
func chargesService() error {
	var chargeID = phases.NewSlot[string]("charge_id")

	flow := phases.Flow{Name: "create_charge", Phases: []phases.Phase{
		phases.Pipelined("create_charge", func(run *phases.Run, p *phases.Pipeline) (*phases.Response, error) {
			id := "ch_" + run.ID() // the key row's id: the same on every retry
			p.Queue(`INSERT INTO charges (id, amount) VALUES ($1, $2)`, id, 500)
			return nil, chargeID.Set(run, id) // no response: go on
		}),
		phases.Call("provider_charge", func(ctx context.Context, run *phases.Run) (*phases.Response, error) {
			return nil, provider.Pay(ctx, run.DerivedKey(), 500) // same key on every retry
		}),
		phases.Tx("finalize", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			id, err := chargeID.Get(run)
			if err != nil {
				return nil, err
			}
			var c charge
			err = tx.QueryRow(ctx, `UPDATE charges SET status = 'succeeded' WHERE id = $1
				RETURNING id, amount, status`, id).Scan(&c.ID, &c.Amount, &c.Status)
			if err != nil {
				return nil, err // transient: nothing stored, the key is released
			}
			return phases.JSON(201, c) // a response finishes the key
		}),
	}}

	if err := migrations.Migrate(ctx, pool); err != nil {
		return err
	}
	engine, err := workflow.New(pool, nil) // nil: the documented defaults
	if err != nil {
		return err
	}
	if err := engine.Register(flow); err != nil {
		return err
	}
	handler, err := idemhttp.Handler(engine, "create_charge", &idemhttp.Config{Scope: accountFromAuth})
	if err != nil {
		return err
	}
	mux.Handle("POST /v1/charges", handler)

	if err := engine.Start(ctx, nil); err != nil { // its sweeper; in every worker process too
		return err
	}
	srv := &http.Server{Addr: ":8080", Handler: mux}
	go srv.ListenAndServe()
	<-ctx.Done() // SIGTERM, through signal.NotifyContext: stop the sweeper, then drain
	stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = engine.Stop(stopCtx)
	drained := make(chan error, 1) // no new attempt or call; keys still held at the end are released
	go func() { drained <- engine.Drain(stopCtx) }()
	return errors.Join(srv.Shutdown(stopCtx), <-drained)
}

// refunds is the README's middleware snippet: any handler made idempotent.
func refunds(engine *workflow.Engine) error {
	idempotent, err := idemhttp.Middleware(engine, &idemhttp.Config{Scope: accountFromAuth, RequireKey: true})
	if err != nil {
		return err
	}
	mux.Handle("POST /v1/refunds", idempotent(refundHandler))
	return nil
}

// delivery is the part of a queue's message the snippet uses; NATS JetStream's
// jetstream.Msg has it (examples/payouts consumes real ones). An interface here keeps
// nats.go out of the library module's requirements.
type delivery interface{ Data() []byte }

// consume is the README's message snippet: one delivery of a queue, run under its key.
func consume(engine *workflow.Engine, payoutID string, msg delivery) idemmsg.Decision {
	d := idemmsg.Handle(ctx, engine, idemmsg.Message{Scope: "payouts", Key: payoutID, Flow: "payout", Payload: msg.Data()})
	return d
}

// The snippets are compiled, not run: they need a database and a provider.
// ownSchema is the README's schema snippet: idemflow's objects in a schema of their own.
func ownSchema() error {
	m, err := migrations.NewMigrator(&migrations.Config{Schema: "idemflow"})
	if err != nil {
		return err
	}
	if err := m.Migrate(ctx, pool); err != nil { // creates the schema if need be
		return err
	}
	engine, err := workflow.New(pool, &workflow.Config{Schema: "idemflow"})
	if err != nil {
		return err
	}
	return engine.Start(ctx, nil) // its sweeper works on the engine's schema
}

var _ = []any{chargesService, refunds, consume, ownSchema}

var snippetMarker = regexp.MustCompile(`^<!-- snippet: ((?:[\w./-]+ )?\w+) -->$`)

// snippetFiles are the markdown files whose every Go block is a marked snippet,
// compiled: the README, the docs that hold its moved sections, docs/API.md,
// docs/PHASES.md and docs/FIRST-FLOW.md (whose snippets are examples/firstflow's
// functions, which that package's tests run).
var snippetFiles = []string{"README.md", "docs/PRODUCTION.md", "docs/MESSAGES.md", "docs/TESTING.md", "docs/API.md",
	"docs/PHASES.md", "docs/FIRST-FLOW.md"}

// readmeMaxLines is the most lines the README may have: the rest goes to docs/.
const readmeMaxLines = 250

// markedSnippets returns the marked Go blocks of the markdown file at path by the
// name of their function.
func markedSnippets(t *testing.T, path string) map[string]string {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	snippets := map[string]string{}
	var name string
	var body *strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case body != nil && line == "```":
			snippets[name] = body.String()
			name, body = "", nil
		case body != nil:
			body.WriteString(line + "\n")
		case name != "" && line == "```go":
			body = &strings.Builder{}
		case name != "":
			t.Fatalf("%s: the snippet marker for %s is not followed by a ```go block", path, name)
		default:
			if m := snippetMarker.FindStringSubmatch(line); m != nil {
				name = m[1]
			}
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, body, "%s: the snippet %s is not closed", path, name)
	return snippets
}

// functions returns the functions of a Go file by name: their bodies, dedented one
// tab, and their whole declarations.
func functions(t *testing.T, path string) (bodies, decls map[string]string) {
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, path, src, 0)
	require.NoError(t, err)
	bodies, decls = map[string]string{}, map[string]string{}
	for _, d := range file.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		inner := string(src[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset])
		var b strings.Builder
		for _, line := range strings.Split(strings.Trim(inner, "\n"), "\n") {
			b.WriteString(strings.TrimPrefix(line, "\t") + "\n")
		}
		bodies[fn.Name.Name] = b.String()
		decls[fn.Name.Name] = string(src[fset.Position(fn.Pos()).Offset:fset.Position(fn.End()).Offset]) + "\n"
	}
	return bodies, decls
}

func TestReadmeSnippets(t *testing.T) {
	bodies, _ := functions(t, "readme_test.go")
	for _, file := range snippetFiles {
		snippets := markedSnippets(t, file)
		require.NotEmpty(t, snippets, "%s has no marked snippets", file)
		for marker, snippet := range snippets {
			path, name, whole := strings.Cut(marker, " ")
			if !whole {
				body, ok := bodies[marker]
				require.True(t, ok, "%s shows the snippet %s, which readme_test.go does not define", file, marker)
				require.Equal(t, body, snippet, "%s's snippet %s differs from the body of %s in readme_test.go", file, marker, marker)
				continue
			}
			_, decls := functions(t, path)
			decl, ok := decls[name]
			require.True(t, ok, "%s shows the function %s of %s, which that file does not define", file, name, path)
			require.Equal(t, decl, snippet, "%s's snippet differs from %s in %s", file, name, path)
		}
		// Every Go block in the file is a marked snippet.
		text, err := os.ReadFile(file)
		require.NoError(t, err)
		require.Equal(t, len(snippets), strings.Count(string(text), "\n```go\n"),
			"%s has a Go block without a `<!-- snippet: Name -->` line before it", file)
	}
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	require.LessOrEqual(t, strings.Count(string(readme), "\n"), readmeMaxLines,
		"README.md is over %d lines: move a section to docs/", readmeMaxLines)
	// The install line names the newest release of the changelog, in the first screen.
	changelog, err := os.ReadFile("CHANGELOG.md")
	require.NoError(t, err)
	newest := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\]`).FindSubmatch(changelog)
	require.NotNil(t, newest, "CHANGELOG.md has no released version")
	install := "`go get github.com/idemflow/idemflow@v" + string(newest[1]) + "`"
	at := strings.Index(string(readme), install)
	require.GreaterOrEqual(t, at, 0, "README.md does not install the newest release: %s", install)
	require.Less(t, strings.Count(string(readme[:at]), "\n"), 40, "README.md's install line is not on its first screen")
}

// docBlocks returns the code blocks of a package's doc.go: runs of tab-indented comment
// lines, dedented.
func docBlocks(t *testing.T, path string) [][]string {
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	var blocks [][]string
	var block []string
	for _, line := range strings.Split(string(src), "\n") {
		if code, ok := strings.CutPrefix(line, "//\t"); ok {
			block = append(block, code)
			continue
		}
		if block != nil {
			blocks = append(blocks, block)
			block = nil
		}
	}
	return blocks
}

// testLines returns, for every test file of the module, its lines and the lines of each
// of its function bodies, dedented one tab.
func testLines(t *testing.T) [][]string {
	var runs [][]string
	err := filepath.WalkDir(".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(name, "_test.go") {
			return err
		}
		src, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		runs = append(runs, strings.Split(string(src), "\n"))
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			return err
		}
		for _, d := range file.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Body != nil {
				inner := string(src[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset])
				var lines []string
				for _, line := range strings.Split(inner, "\n") {
					lines = append(lines, strings.TrimPrefix(line, "\t"))
				}
				runs = append(runs, lines)
			}
		}
		return nil
	})
	require.NoError(t, err)
	return runs
}

// contains reports whether block is a run of consecutive lines of body.
func contains(body, block []string) bool {
	for i := 0; i+len(block) <= len(body); i++ {
		if slices.Equal(body[i:i+len(block)], block) {
			return true
		}
	}
	return false
}

// Every code block in a package's documentation is compiled: its lines are a run of
// lines of a test file of the module, or of a function's body there (an example, a
// test, or a usage function kept for the documentation).
func TestDocSnippets(t *testing.T) {
	docs, err := filepath.Glob("*/doc.go")
	require.NoError(t, err)
	require.NotEmpty(t, docs)
	runs := testLines(t)
	for _, doc := range docs {
		for _, block := range docBlocks(t, doc) {
			found := slices.ContainsFunc(runs, func(run []string) bool { return contains(run, block) })
			require.True(t, found, "%s shows code that no test file holds:\n%s", doc, strings.Join(block, "\n"))
		}
	}
}
