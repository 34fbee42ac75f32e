// Package openapi holds the test that validates the OpenAPI fragment for API owners
// (docs/openapi.yaml) with kin-openapi and checks it against the problem kinds,
// statuses and documents idemhttp writes, as recorded in idemhttp/testdata/problems.json
// (which idemhttp's TestProblemsGolden holds to the code). It is in the integration
// module (github.com/idemflow/idemflow/integration) so that kin-openapi and its
// dependencies are requirements of this test only, never of the library module and so
// never in its users' go.sum. The repository's go.work joins it; `go test work` runs it.
//
// It imports idemhttp for its exported header names and default problem type base.
package openapi
