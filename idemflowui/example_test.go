package idemflowui_test

import (
	"net/http"
	"os"

	"github.com/idemflow/idemflow/idemflowui"
	"github.com/idemflow/idemflow/workflow"
)

// mount is the package documentation's usage, compiled.
func mount(engine *workflow.Engine, mux *http.ServeMux) error {
	ui, err := idemflowui.New(engine, &idemflowui.Options{
		Prefix:     "/idemflow",
		WriteToken: os.Getenv("IDEMFLOW_UI_WRITE_TOKEN"), // empty: read-only
	})
	if err != nil {
		return err
	}
	mux.Handle("/idemflow/", ui)
	return nil
}

// The page mounted in an admin server under /idemflow/ on loopback, read-only unless
// the environment holds a write token.
func Example() {
	var engine *workflow.Engine // the service's engine
	mux := http.NewServeMux()
	if err := mount(engine, mux); err != nil {
		return
	}
	_ = http.ListenAndServe("127.0.0.1:8081", mux)
}
