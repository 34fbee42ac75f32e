package idemhttp_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/phases"
	"github.com/idemflow/idemflow/workflow"
)

func ExampleHandler() {
	ctx := context.Background()
	pool, drop, err := idemflowtest.NewExampleDB(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()

	engine, err := workflow.New(pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	// A flow of one tx phase whose response finishes the key.
	err = engine.Register(phases.Flow{Name: "greet", Phases: []phases.Phase{
		phases.Tx("greet", func(ctx context.Context, tx phases.DBTX, run *phases.Run) (*phases.Response, error) {
			var n int
			if err := tx.QueryRow(ctx, `SELECT length($1::text)`, string(run.Body())).Scan(&n); err != nil {
				return nil, err
			}
			return phases.JSON(http.StatusCreated, map[string]any{"account": run.Scope(), "body_length": n})
		}),
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	handler, err := idemhttp.Handler(engine, "greet", &idemhttp.Config{
		// The account is whoever the application authenticated; here, a header.
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("POST /greetings", handler)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post := func(key, body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/greetings", strings.NewReader(body))
		req.Header.Set("X-Account", "acct_1")
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d replayed=%t %s %s\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true",
			resp.Header.Get("Content-Type"), b)
	}
	post(`"greeting-1"`, `{"name":"Ada"}`)
	post(`greeting-1`, `{ "name": "Ada" }`)  // the same request: replayed
	post(`"greeting-1"`, `{"name":"Grace"}`) // the same key for another request
	// Output:
	// 201 replayed=false application/json {"account":"acct_1","body_length":14}
	// 201 replayed=true application/json {"account":"acct_1","body_length":14}
	// 422 replayed=false application/problem+json {"type":"about:blank","title":"Unprocessable Entity","status":422,"detail":"The idempotency key was already used for a different request (method, route or body); nothing was done for this one. The first request may have taken effect: do not send this request again under a new key before checking its outcome. Resend the first request unchanged, with this key, to get its answer."}
}

func ExampleMiddleware() {
	ctx := context.Background()
	pool, drop, err := idemflowtest.NewExampleDB(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer drop()

	engine, err := workflow.New(pool, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	idempotent, err := idemhttp.Middleware(engine, &idemhttp.Config{
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
		// RequireKey false: a request without Idempotency-Key runs without idempotency.
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// A plain handler that is not idempotent on its own.
	var orders atomic.Int64
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := orders.Add(1)
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d\n", id)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idempotent(createOrder))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post := func(key string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"sku":"tea"}`))
		req.Header.Set("X-Account", "acct_1")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d %s replayed=%t %s", resp.StatusCode, resp.Header.Get("Location"),
			resp.Header.Get("Idempotent-Replayed") == "true", b)
	}
	post("order-a")
	post("order-a")
	post("") // no key: not idempotent
	post("order-b")
	// Output:
	// 201 /orders/1 replayed=false order 1
	// 201 /orders/1 replayed=true order 1
	// 201 /orders/2 replayed=false order 2
	// 201 /orders/3 replayed=false order 3
}
