package openapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
)

const (
	// openAPIFragment is the OpenAPI 3.0.3 fragment for API owners.
	openAPIFragment = "../../docs/openapi.yaml"
	// problemsGolden is what idemhttp emits and writes, held to its code by
	// idemhttp's TestProblemsGolden.
	problemsGolden = "../../idemhttp/testdata/problems.json"
	// kindMethod is the kind a HEAD request is answered with: the example's HEAD
	// operation answers it, not its POST.
	kindMethod = "method-not-allowed"
	// serviceTypeBase is the type base of a service that sets one, as problemsGolden
	// records its documents (idemhttp's exampleTypeBase).
	serviceTypeBase = "https://api.example.com/problems/"
)

// goldenProblems is the content of problemsGolden (idemhttp's goldenProblems).
type goldenProblems struct {
	ContentType string `json:"content_type"`
	Kinds       []struct {
		Kind      string `json:"kind"`
		Statuses  []int  `json:"statuses"`
		Documents []struct {
			TypeBase string `json:"type_base"`
			Status   int    `json:"status"`
			Body     any    `json:"body"`
		} `json:"documents"`
	} `json:"kinds"`
}

// TestOpenAPIFragment validates docs/openapi.yaml with kin-openapi and holds it to the
// code, through idemhttp/testdata/problems.json: every problem kind idemhttp emits has a
// schema <Kind>Problem in the fragment with exactly the statuses the code sends it
// with, the example operation answers each of those statuses with a response that
// allows it, no schema names a kind the code no longer has, and each problem document
// as the code writes it (under a service's type base and under the default, about:blank) validates
// against its schema. The header names are idemhttp's. Nothing in the description
// names the library, and it has servers and security (bash .ci/openapi-lint lints it).
func TestOpenAPIFragment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	doc, err := openapi3.NewLoader().LoadFromFile(openAPIFragment)
	require.NoError(t, err)
	require.Equal(t, "3.0.3", doc.OpenAPI)
	require.NoError(t, doc.Validate(ctx))
	described, err := doc.MarshalJSON() // all but the file's comments, which are for API owners
	require.NoError(t, err)
	for _, name := range []string{"idemflow", "idemhttp"} {
		require.NotContains(t, strings.ToLower(string(described)), name, "the description is the service's: it names no library")
	}
	require.NotEmpty(t, doc.Servers, "servers (a variable host: the fragment does not know the service's)")
	require.NotEmpty(t, doc.Security, "security: a key belongs to an authenticated account")

	golden := readGolden(t)
	emitted := map[string]bool{}
	schemas := doc.Components.Schemas
	op := doc.Paths.Find("/v1/charges").Post
	require.NotNil(t, op, "the example operation")
	for _, k := range golden.Kinds {
		emitted[k.Kind] = true
		name := kindSchemaName(k.Kind)
		ref, ok := schemas[name]
		require.True(t, ok, "the code emits the problem kind %q; the fragment has no schema %s", k.Kind, name)
		status, typ := problemProperties(t, ref.Value)
		var want []any
		for _, s := range k.Statuses {
			want = append(want, float64(s))
		}
		require.ElementsMatch(t, want, status.Enum, "%s: the statuses the code sends %q with", name, k.Kind)
		type written struct {
			base   string
			status int
		}
		documents := map[written]any{}
		for _, d := range k.Documents {
			documents[written{d.TypeBase, d.Status}] = d.Body
		}
		for _, s := range k.Statuses {
			body, ok := documents[written{serviceTypeBase, s}]
			require.True(t, ok, "%s: %s has no %d document under a service's type base", k.Kind, problemsGolden, s)
			blank, ok := documents[written{idemhttp.ProblemTypeBaseDefault, s}]
			require.True(t, ok, "%s: %s has no %d document under about:blank", k.Kind, problemsGolden, s)
			require.NoError(t, ref.Value.VisitJSON(body), "%s: the code's %d %s document", name, s, k.Kind)
			require.NoError(t, ref.Value.VisitJSON(blank), "%s under about:blank", name)
			require.Error(t, typ.VisitJSON(serviceTypeBase+"not-"+k.Kind+"-at-all"), "%s: the type pattern tells kinds apart", name)

			resp := op.Responses.Status(s)
			if k.Kind == kindMethod {
				resp = doc.Paths.Find("/v1/charges").Head.Responses.Status(s)
			}
			require.NotNil(t, resp, "the example operation has no %d response for %s", s, k.Kind)
			media := resp.Value.Content.Get(golden.ContentType)
			require.NotNil(t, media, "the %d response is not %s", s, golden.ContentType)
			require.NoError(t, media.Schema.Value.VisitJSON(body), "the %d response does not allow the code's %s document", s, k.Kind)
		}
	}
	require.True(t, emitted[kindMethod], "%s has no %s kind, which the HEAD operation answers", problemsGolden, kindMethod)
	for name := range schemas {
		if kind, ok := strings.CutSuffix(name, "Problem"); ok && kind != "" {
			require.Contains(t, emitted, schemaKindName(kind), "the fragment's %s names a problem kind the code does not emit", name)
		}
	}

	params := op.Parameters
	require.Len(t, params, 1)
	require.Equal(t, idemhttp.KeyHeader, params[0].Value.Name)
	require.Equal(t, "header", params[0].Value.In)
	stored := op.Responses.Status(http.StatusCreated).Value.Headers
	require.Contains(t, stored, idemhttp.ReplayedHeader)
	require.Contains(t, stored, idemhttp.RetentionHeader)
	require.Contains(t, op.Responses.Status(http.StatusConflict).Value.Headers, "Retry-After")
	require.Contains(t, op.Responses.Status(http.StatusServiceUnavailable).Value.Headers, "Retry-After")
}

// readGolden reads problemsGolden; it must name at least one kind, each with a status.
func readGolden(t *testing.T) goldenProblems {
	t.Helper()
	raw, err := os.ReadFile(problemsGolden)
	require.NoError(t, err)
	var golden goldenProblems
	require.NoError(t, json.Unmarshal(raw, &golden))
	require.Equal(t, "application/problem+json", golden.ContentType)
	require.NotEmpty(t, golden.Kinds)
	for _, k := range golden.Kinds {
		require.NotEmpty(t, k.Statuses, "%s: the problem kind %q has no status", problemsGolden, k.Kind)
	}
	return golden
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
