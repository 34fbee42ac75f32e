// Package migratetools holds no code, only tests and examples: idemflow's migrations
// (migrations.ToolFS) applied up, down and up again with the libraries of
// golang-migrate, goose and tern, and migrations.Migrate adopting a schema each tool
// migrated. It is in the integration module so that those tools are dependencies of
// these tests only, never of idemflow's users; `go test work` runs its tests.
package migratetools
