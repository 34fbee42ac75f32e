package idemhttp

import (
	"encoding/json"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// update rewrites the golden file from the code: go test ./idemhttp -run TestProblemsGolden -update.
var update = flag.Bool("update", false, "rewrite testdata/problems.json from what the code writes")

// problemsGolden holds the problem kinds this package emits and the documents it writes
// for them. The OpenAPI fragment (docs/openapi.yaml) is checked against it by
// TestOpenAPIFragment in integration/openapi (the integration module), which keeps
// kin-openapi out of the library module's requirements.
const problemsGolden = "testdata/problems.json"

// exampleTypeBase is the type base of a service that sets one (Config.ProblemTypeBase),
// for the golden documents beside the default's (about:blank).
const exampleTypeBase = "https://api.example.com/problems/"

// goldenProblems is the content of problemsGolden.
type goldenProblems struct {
	// ContentType is the Content-Type of every problem document.
	ContentType string `json:"content_type"`
	// Kinds are the problem kinds, sorted, each with the statuses it is sent with.
	Kinds []goldenKind `json:"kinds"`
}

// goldenKind is one problem kind, the statuses (sorted) the code sends it with, and the
// document it writes for each status under a service's type base and under the default,
// about:blank.
type goldenKind struct {
	Kind      string           `json:"kind"`
	Statuses  []int            `json:"statuses"`
	Documents []goldenDocument `json:"documents"`
}

// goldenDocument is a problem document as front.problem writes it.
type goldenDocument struct {
	TypeBase string          `json:"type_base"`
	Status   int             `json:"status"`
	Body     json.RawMessage `json:"body"`
}

// TestProblemsGolden holds testdata/problems.json to the code: every problem kind this
// package emits, read from its source (the kind* constants and the statuses they are
// sent with), and the problem document the code writes for each kind and status under
// a service's type base and under the default, about:blank; no document names this
// library. TestOpenAPIFragment (integration/openapi)
// checks docs/openapi.yaml against that file; after a change here, regenerate it with
// -update and run that test too.
func TestProblemsGolden(t *testing.T) {
	t.Parallel()
	emitted := problemKinds(t)
	require.NotEmpty(t, emitted)
	golden := goldenProblems{ContentType: problemContentType}
	for _, kind := range slices.Sorted(maps.Keys(emitted)) {
		statuses := slices.Sorted(slices.Values(emitted[kind]))
		k := goldenKind{Kind: kind, Statuses: statuses}
		for _, s := range statuses {
			for _, base := range []string{exampleTypeBase, ProblemTypeBaseDefault} {
				k.Documents = append(k.Documents, goldenDocument{TypeBase: base, Status: s, Body: writtenProblem(t, base, s, kind)})
			}
		}
		golden.Kinds = append(golden.Kinds, k)
	}
	got, err := json.MarshalIndent(golden, "", "  ")
	require.NoError(t, err)
	require.NotContains(t, strings.ToLower(string(got)), "idemflow", "a problem document names the library")
	require.NotContains(t, strings.ToLower(string(got)), "idemhttp", "a problem document names the library")
	got = append(got, '\n')
	if *update {
		require.NoError(t, os.WriteFile(problemsGolden, got, 0o644))
	}
	want, err := os.ReadFile(problemsGolden)
	require.NoError(t, err, "regenerate it: go test ./idemhttp -run TestProblemsGolden -update")
	if line, w, g, differ := firstDifference(string(want), string(got)); differ {
		t.Fatalf("%s is not what the code writes: line %d is\n\t%s\nand the code writes\n\t%s\n"+
			"regenerate it with go test ./idemhttp -run TestProblemsGolden -update, then hold "+
			"docs/openapi.yaml to it with go test ./integration/openapi", problemsGolden, line, w, g)
	}
}

// firstDifference is the first line (from 1) where want and got differ, and that line
// of each ("(end of file)" past the last); differ is false when they are equal.
func firstDifference(want, got string) (line int, w, g string, differ bool) {
	if want == got {
		return 0, "", "", false
	}
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	at := func(lines []string, i int) string {
		if i < len(lines) {
			return lines[i]
		}
		return "(end of file)"
	}
	i := 0
	for i < len(wl) && i < len(gl) && wl[i] == gl[i] {
		i++
	}
	return i + 1, at(wl, i), at(gl, i), true
}

// writtenProblem is the problem document front.problem writes for kind under base.
func writtenProblem(t *testing.T, base string, status int, kind string) json.RawMessage {
	t.Helper()
	rec := httptest.NewRecorder()
	f := &front{cfg: &Config{ProblemTypeBase: base}}
	f.problem(rec, status, kind, "What to do next.")
	require.Equal(t, status, rec.Code)
	require.Equal(t, problemContentType, rec.Header().Get("Content-Type"))
	require.True(t, json.Valid(rec.Body.Bytes()), "%s %d: %s", kind, status, rec.Body)
	return rec.Body.Bytes()
}

// problemKinds reads this package's source: the value of every kind* constant, and the
// statuses each is sent with, from every httpAnswer{status: …, kind: …} literal and
// every problem(w, status, kind, …) call whose status is an http.Status* constant.
func problemKinds(t *testing.T) map[string][]int {
	t.Helper()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	values := map[string]string{} // constant name -> kind
	var parsed []*ast.File
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		parsed = append(parsed, f)
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
				for _, spec := range g.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if strings.HasPrefix(n.Name, "kind") && i < len(vs.Values) {
							if lit, ok := vs.Values[i].(*ast.BasicLit); ok {
								values[n.Name], _ = strconv.Unquote(lit.Value)
							}
						}
					}
				}
			}
		}
	}
	require.NotEmpty(t, values, "no kind* constants found")
	kinds := map[string][]int{}
	for _, v := range values {
		kinds[v] = nil
	}
	sent := func(statusExpr, kindExpr ast.Expr) {
		id, ok := kindExpr.(*ast.Ident)
		if !ok || values[id.Name] == "" {
			return
		}
		if s, ok := httpStatus(statusExpr); ok && !slices.Contains(kinds[values[id.Name]], s) {
			kinds[values[id.Name]] = append(kinds[values[id.Name]], s)
		}
	}
	for _, f := range parsed {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				if id, ok := n.Type.(*ast.Ident); ok && id.Name == "httpAnswer" {
					fields := map[string]ast.Expr{}
					for _, e := range n.Elts {
						if kv, ok := e.(*ast.KeyValueExpr); ok {
							fields[kv.Key.(*ast.Ident).Name] = kv.Value
						}
					}
					if fields["kind"] != nil {
						sent(fields["status"], fields["kind"])
					}
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "problem" && len(n.Args) >= 3 {
					sent(n.Args[1], n.Args[2])
				}
			}
			return true
		})
	}
	for kind, statuses := range kinds {
		require.NotEmpty(t, statuses, "the problem kind %q is sent with no status this test can read", kind)
	}
	return kinds
}

// httpStatus reads an http.StatusXxx selector as its code, by the status texts of
// net/http.
func httpStatus(e ast.Expr) (int, bool) {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return 0, false
	}
	if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "http" {
		return 0, false
	}
	for code := 100; code < 600; code++ {
		text := strings.NewReplacer(" ", "", "-", "").Replace(http.StatusText(code))
		if text != "" && "Status"+text == sel.Sel.Name {
			return code, true
		}
	}
	return 0, false
}
