// Package otelsdk holds otelidemflow's tests that read what it records through the
// OpenTelemetry SDK (in-memory span recorder and metric reader). It is in the
// integration module (github.com/idemflow/idemflow/integration) so that the SDK is a
// requirement of these tests only: otelidemflow itself, in the library module, needs
// only the OpenTelemetry API. The repository's go.work joins it; `go test work` runs it.
package otelsdk
