package phases_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// exportedAPI returns the exported identifiers declared in the package's non-test
// files: top-level names as they are, methods as Recv.Name.
func exportedAPI(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	fset := token.NewFileSet()
	var names []string
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					names = append(names, d.Name.Name)
					continue
				}
				recv := d.Recv.List[0].Type
				if s, ok := recv.(*ast.StarExpr); ok {
					recv = s.X
				}
				if g, ok := recv.(*ast.IndexExpr); ok {
					recv = g.X
				}
				names = append(names, recv.(*ast.Ident).Name+"."+d.Name.Name)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names = append(names, s.Name.Name)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names = append(names, n.Name)
							}
						}
					}
				}
			}
		}
	}
	slices.Sort(names)
	return names
}

// TestEngineMachineryIsNotExported: what the engine does to a run goes through
// internal/runstate (a Run is a runstate.Run), so a phase function, which holds a *Run,
// cannot change its own derived key or undo phase data. (A phase's function is on
// Phase, as TxFunc or CallFunc: the engine calls it like any other caller.)
func TestEngineMachineryIsNotExported(t *testing.T) {
	t.Parallel()
	api := exportedAPI(t)
	require.Contains(t, api, "Run.DerivedKey", "the parser sees the package")
	for _, name := range []string{
		"NewRun", "RunInfo", "Run.EnterPhase", "Run.Revert", "Run.MarshalData",
		"Phase.RunTx", "Phase.RunCall",
	} {
		require.NotContains(t, api, name)
	}
	var runMethods []string
	for _, n := range api {
		if m, ok := strings.CutPrefix(n, "Run."); ok {
			runMethods = append(runMethods, m)
		}
	}
	require.Equal(t, []string{
		"Attempt", "Body", "DerivedKey", "DerivedKeyFor", "Flow", "ID", "Key", "Method",
		"Phase", "Route", "Scope",
	}, runMethods, "Run's methods only read; a new one must not let a phase change the run")
}

// TestDocSnippetIsCompiled: the flow shown in the package documentation is, line for
// line, the one in Example, so it compiles and its output is checked.
func TestDocSnippetIsCompiled(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	// The first code block: tab-indented lines and the blank lines between them.
	var snippet []string
	for _, line := range strings.Split(f.Doc.Text(), "\n") {
		if strings.HasPrefix(line, "\t") || line == "" && len(snippet) > 0 {
			snippet = append(snippet, line)
		} else if len(snippet) > 0 {
			break
		}
	}
	for len(snippet) > 0 && snippet[len(snippet)-1] == "" {
		snippet = snippet[:len(snippet)-1]
	}
	require.NotEmpty(t, snippet, "doc.go shows a flow")
	example, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	require.Contains(t, string(example), strings.Join(snippet, "\n")+"\n")
}
