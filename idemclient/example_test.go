package idemclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"

	"github.com/idemflow/idemflow/idemclient"
)

// scriptedAPI stands in for an idemflow server: the first attempt under a key fails
// with 503 (nothing stored), the second runs the operation and stores its answer, and
// every later one replays that answer.
func scriptedAPI() *httptest.Server {
	var mu sync.Mutex
	attempts := map[string]int{}
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		attempts[r.Header.Get(idemclient.KeyHeader)]++
		n := attempts[r.Header.Get(idemclient.KeyHeader)]
		mu.Unlock()
		switch {
		case n == 1:
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case n > 2:
			w.Header().Set(idemclient.ReplayedHeader, "true")
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charged":%s}`, body)
	}))
}

// Example sends one logical operation twice, as a process would before and after a
// restart: the first call is retried past a 503 and gets the operation's answer, the
// second gets the same answer, replayed.
func Example() {
	api := scriptedAPI()
	defer api.Close()
	for range 2 {
		if err := renew(context.Background(), api.URL); err != nil {
			fmt.Println(err)
		}
	}
	// Output:
	// 201 replayed=false {"charged":{"amount":1299}}
	// 201 replayed=true {"charged":{"amount":1299}}
}

// renew charges a subscription's renewal for October 2026 under a key derived from
// the operation.
func renew(ctx context.Context, api string) error {
	transport, err := idemclient.NewTransport(nil, nil) // http.DefaultTransport, the default policy
	if err != nil {
		return err
	}
	client := &http.Client{Transport: transport}

	// One key per logical operation: the same on every attempt, and after a restart.
	ctx = idemclient.WithKey(ctx, idemclient.KeyFrom("renewal", "sub_123", "2026-10"))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, api+"/v1/charges", strings.NewReader(`{"amount":1299}`))
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	switch {
	case errors.Is(err, idemclient.ErrDeadLettered):
		return err // 410: the server gave up; do not retry, not even under a new key
	case errors.Is(err, idemclient.ErrExhausted):
		return err // no final answer yet: retry later with the same key
	case err != nil:
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	fmt.Printf("%d replayed=%t %s\n", resp.StatusCode, idemclient.Replayed(resp), body)
	return nil
}

// ExampleKeyFrom derives keys from operations; characters other than letters, digits
// and "-._~" are escaped, so the parts never run into each other.
func ExampleKeyFrom() {
	fmt.Println(idemclient.KeyFrom("sub_123", "2026-10"))
	fmt.Println(idemclient.KeyFrom("refund", "order 17/2"))
	fmt.Println(idemclient.KeyFrom("a:b", "c") == idemclient.KeyFrom("a", "b:c"))
	// Output:
	// sub_123:2026-10
	// refund:order%2017%2F2
	// false
}

// ExamplePendingKey keeps a random key for an operation in a FileStore: a process
// that restarts before the final answer gets the same key back.
func ExamplePendingKey() {
	dir, err := os.MkdirTemp("", "idemclient-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()

	store, err := idemclient.NewFileStore(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	key, err := idemclient.PendingKey(ctx, store, "payout batch 2026-10-31")
	if err != nil {
		fmt.Println(err)
		return
	}
	// ... send with idemclient.WithKey(ctx, key); the process dies; on restart:
	again, _ := idemclient.PendingKey(ctx, store, "payout batch 2026-10-31")
	fmt.Println("same key after a restart:", again == key)

	// Once the final answer is recorded, forget the key; the name is then a new
	// operation with a new key.
	_ = store.Delete(ctx, "payout batch 2026-10-31")
	fresh, _ := idemclient.PendingKey(ctx, store, "payout batch 2026-10-31")
	fmt.Println("same key after Delete:", fresh == key)
	// Output:
	// same key after a restart: true
	// same key after Delete: false
}

// chargesClient has the shape of a generated API client (oapi-codegen's client takes
// any HttpRequestDoer, ogen's any ht.Client): it builds each request with the
// caller's context and hands it to its doer.
type chargesClient struct {
	server string
	doer   interface {
		Do(*http.Request) (*http.Response, error)
	}
}

func (c *chargesClient) CreateCharge(ctx context.Context, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.server+"/v1/charges", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	return c.doer.Do(req)
}

// ExampleWithKey gives a generated client an http.Client on a Transport and each
// operation its key through the context: the generated code needs no change.
func ExampleWithKey() {
	api := scriptedAPI()
	defer api.Close()
	transport, err := idemclient.NewTransport(nil, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	charges := &chargesClient{server: api.URL, doer: &http.Client{Transport: transport}}

	ctx := idemclient.WithKey(context.Background(), idemclient.KeyFrom("order", "17"))
	resp, err := charges.CreateCharge(ctx, `{"amount":500}`)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	fmt.Println(resp.StatusCode, idemclient.Replayed(resp))
	// Output:
	// 201 false
}
