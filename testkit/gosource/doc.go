// Package gosource reads the Go source of idemflow's own packages, for the tests that
// hold the code to a rule read from it: every exported error has a class, key events
// have the emitters a test pins.
//
//	fset := token.NewFileSet()
//	files := gosource.Files(t, fset, ".")
//	for _, name := range gosource.ExportedVars(files) { ... }
//
// It imports none of idemflow's packages.
package gosource
