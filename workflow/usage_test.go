package workflow_test

import (
	"context"
	"errors"
	"net/http"

	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

// usage holds the package documentation's snippets, compiled (TestDocSnippets in the
// module's root checks that doc.go shows these lines).
func usage(ctx context.Context, pool workflow.Pool, chargeFlow phases.Flow, r *http.Request, accountID string, body []byte) error {
	engine, err := workflow.New(pool, nil) // nil *Config: all defaults
	if err != nil {
		return err
	}
	if err := engine.Register(chargeFlow); err != nil {
		return err
	}

	res, err := engine.Do(ctx, workflow.Request{
		Scope: accountID, Key: r.Header.Get("Idempotency-Key"),
		Flow: "create_charge", Method: "POST", Route: "/v1/charges", Body: body,
	})
	switch {
	case err == nil:
		// res.Response is the answer; res.Replayed says whether it was stored earlier.
	case errors.Is(err, workflow.ErrInProgress):
		// 409; err.(*workflow.InProgressError).RetryAfter says when to come back.
	case errors.Is(err, workflow.ErrMismatch):
		// 422: the key was used for a different request.
	case errors.Is(err, workflow.ErrTransient):
		// 503: nothing stored; the work resumes on the next attempt or sweep.
	}
	_ = res
	return err
}

var _ = usage
