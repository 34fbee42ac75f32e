package idemhttp_test

import (
	"net/http"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// usage holds the package documentation's snippet, compiled (TestDocSnippets in the
// module's root checks that doc.go shows these lines).
func usage(pool workflow.Pool, chargeFlow phases.Flow, mux *http.ServeMux, accountFromAuth func(*http.Request) (string, error), refundHandler http.Handler) error {
	engine, err := workflow.New(pool, nil)
	if err != nil {
		return err
	}
	if err := engine.Register(chargeFlow); err != nil {
		return err
	}
	create, err := idemhttp.Handler(engine, "create_charge", &idemhttp.Config{Scope: accountFromAuth})
	if err != nil {
		return err
	}
	mux.Handle("POST /v1/charges", create)

	idempotent, err := idemhttp.Middleware(engine, &idemhttp.Config{Scope: accountFromAuth, RequireKey: true})
	if err != nil {
		return err
	}
	mux.Handle("POST /v1/refunds", idempotent(refundHandler))
	return nil
}

var _ = usage
