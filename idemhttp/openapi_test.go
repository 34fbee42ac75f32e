package idemhttp

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"
)

// openAPIFragment is the OpenAPI 3.0.3 fragment for API owners.
const openAPIFragment = "../docs/openapi.yaml"

// TestOpenAPIFragment validates docs/openapi.yaml with kin-openapi and holds it to the
// code: every problem kind this package emits, read from its source (the kind*
// constants and the statuses they are sent with), has a schema <Kind>Problem in the
// fragment with exactly those statuses, the example operation answers each of those
// statuses with a response that allows it, no schema names a kind the code no longer
// has, and a problem document as the code writes it (under the default type base and
// under about:blank) validates against its schema. The header names are the package's.
func TestOpenAPIFragment(t *testing.T) {
	ctx := context.Background()
	doc, err := openapi3.NewLoader().LoadFromFile(openAPIFragment)
	require.NoError(t, err)
	require.Equal(t, "3.0.3", doc.OpenAPI)
	require.NoError(t, doc.Validate(ctx))

	emitted := problemKinds(t)
	require.NotEmpty(t, emitted)
	schemas := doc.Components.Schemas
	op := doc.Paths.Find("/v1/charges").Post
	require.NotNil(t, op, "the example operation")
	for kind, statuses := range emitted {
		name := kindSchemaName(kind)
		ref, ok := schemas[name]
		require.True(t, ok, "the code emits the problem kind %q; the fragment has no schema %s", kind, name)
		status, typ := problemProperties(t, ref.Value)
		var want []any
		for _, s := range statuses {
			want = append(want, float64(s))
		}
		require.ElementsMatch(t, want, status.Enum, "%s: the statuses the code sends %q with", name, kind)
		for _, s := range statuses {
			body := writtenProblem(t, ProblemTypeBaseDefault, s, kind)
			require.NoError(t, ref.Value.VisitJSON(body), "%s: the code's %d %s document", name, s, kind)
			require.NoError(t, ref.Value.VisitJSON(writtenProblem(t, "about:blank", s, kind)), "%s under about:blank", name)
			require.Error(t, typ.VisitJSON(ProblemTypeBaseDefault+"not-"+kind+"-at-all"), "%s: the type pattern tells kinds apart", name)

			resp := op.Responses.Status(s)
			if kind == kindMethod {
				resp = doc.Paths.Find("/v1/charges").Head.Responses.Status(s)
			}
			require.NotNil(t, resp, "the example operation has no %d response for %s", s, kind)
			media := resp.Value.Content.Get(problemContentType)
			require.NotNil(t, media, "the %d response is not %s", s, problemContentType)
			require.NoError(t, media.Schema.Value.VisitJSON(body), "the %d response does not allow the code's %s document", s, kind)
		}
	}
	for name := range schemas {
		if kind, ok := strings.CutSuffix(name, "Problem"); ok && kind != "" {
			require.Contains(t, emitted, schemaKindName(kind), "the fragment's %s names a problem kind the code does not emit", name)
		}
	}

	params := op.Parameters
	require.Len(t, params, 1)
	require.Equal(t, KeyHeader, params[0].Value.Name)
	require.Equal(t, "header", params[0].Value.In)
	stored := op.Responses.Status(http.StatusCreated).Value.Headers
	require.Contains(t, stored, ReplayedHeader)
	require.Contains(t, stored, RetentionHeader)
	require.Contains(t, op.Responses.Status(http.StatusConflict).Value.Headers, "Retry-After")
	require.Contains(t, op.Responses.Status(http.StatusServiceUnavailable).Value.Headers, "Retry-After")
}

// problemProperties returns the status and type schemas a <Kind>Problem schema adds to
// Problem.
func problemProperties(t *testing.T, s *openapi3.Schema) (status, typ *openapi3.Schema) {
	t.Helper()
	for _, part := range s.AllOf {
		if p := part.Value.Properties; part.Ref == "" && p["status"] != nil {
			return p["status"].Value, p["type"].Value
		}
	}
	t.Fatalf("a problem schema has no status of its own")
	return nil, nil
}

// writtenProblem is the problem document front.problem writes, decoded.
func writtenProblem(t *testing.T, base string, status int, kind string) any {
	t.Helper()
	rec := httptest.NewRecorder()
	f := &front{cfg: &Config{ProblemTypeBase: base}}
	f.problem(rec, status, kind, "What to do next.")
	require.Equal(t, problemContentType, rec.Header().Get("Content-Type"))
	var v any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &v))
	return v
}

// kindSchemaName is the fragment's schema for kind: key-in-progress is
// KeyInProgressProblem.
func kindSchemaName(kind string) string {
	var b strings.Builder
	for word := range strings.SplitSeq(kind, "-") {
		b.WriteString(strings.ToUpper(word[:1]) + word[1:])
	}
	return b.String() + "Problem"
}

// schemaKindName is kindSchemaName backwards, without the suffix: KeyInProgress is
// key-in-progress.
func schemaKindName(name string) string {
	var b strings.Builder
	for i, r := range name {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('-')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
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
