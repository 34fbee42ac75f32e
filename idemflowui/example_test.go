package idemflowui_test

import (
	"net/http"
	"os"

	"github.com/idemflow/idemflow/idemflowui"
	"github.com/idemflow/idemflow/workflow"
)

// The page mounted in an admin server under /idemflow/, read-only unless the
// environment holds a write token.
func Example() {
	var engine *workflow.Engine // the service's engine
	ui, err := idemflowui.New(engine, &idemflowui.Options{
		Prefix:     "/idemflow",
		WriteToken: os.Getenv("IDEMFLOW_UI_WRITE_TOKEN"),
	})
	if err != nil {
		return // a nil engine, here
	}
	mux := http.NewServeMux()
	mux.Handle("/idemflow/", ui)
	_ = http.ListenAndServe("127.0.0.1:8081", mux)
}
