// Package deploytest checks the monitoring files under deploy/ against what
// otelidemflow exports: the Prometheus alerting rules parse with Prometheus's own
// rules parser, and every metric the rules and the Grafana dashboard name is one a
// real engine, observed by otelidemflow through the OpenTelemetry Prometheus exporter,
// serves on a scrape.
//
// It is a module of its own so that the library's module does not require Prometheus's
// server code. Run its tests from this directory: go test ./...
//
// This package imports idemflow's workflow, otelidemflow and internal test packages.
package deploytest
