// Package monitoring checks the monitoring files under deploy/ against what
// otelidemflow exports: the Prometheus alerting rules parse with Prometheus's own
// rules parser, and every metric the rules and the Grafana dashboard name is one a
// real engine, observed by otelidemflow through the OpenTelemetry Prometheus exporter,
// serves on a scrape.
//
// It is in the integration module so that the library's module does not require
// Prometheus's server code: go test ./integration/monitoring from the repository's root.
//
// This package imports idemflow's workflow, otelidemflow and internal test packages.
package monitoring
