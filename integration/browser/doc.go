// Package browser holds idemflowui's browser tests: they drive the operator page in
// headless Chromium through chromedp. It is in the integration module
// (github.com/idemflow/idemflow/integration) so that chromedp is a requirement of these
// tests only, not of the library's users; the repository's go.work joins it, and
// `go test work` runs it. TestScreenshots writes the pictures in docs/:
//
//	IDEMFLOW_SCREENSHOTS=docs go test -run TestScreenshots ./integration/browser
package browser
