package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// gate stands between a server and the provider: it holds the first payment request
// until let is closed, and says on entered when it holds it.
type gate struct {
	url     string
	entered chan struct{}
	let     chan struct{}
}

func newGate(t *testing.T, provider string) *gate {
	t.Helper()
	target, err := url.Parse(provider)
	require.NoError(t, err)
	g := &gate{entered: make(chan struct{}), let: make(chan struct{})}
	proxy := httputil.NewSingleHostReverseProxy(target)
	first := make(chan struct{}, 1)
	first <- struct{}{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-first:
			close(g.entered)
			<-g.let
		default:
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-g.let:
		default:
			close(g.let)
		}
	})
	g.url = srv.URL
	return g
}

// waiting reads how many attempts of a server started with -telemetry prometheus
// have waited for another's answer.
func waiting(t *testing.T, p *process) int {
	t.Helper()
	m := regexp.MustCompile(`metrics: (http://\S+/metrics)`).FindStringSubmatch(p.output())
	require.NotNil(t, m, p.output())
	resp, err := http.Get(m[1])
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	n := regexp.MustCompile(`idemflow_key_events_total\{idemflow_event="waiting"[^}]*\} (\d+)\n`).FindSubmatch(b)
	if n == nil {
		return 0
	}
	v, err := strconv.Atoi(string(n[1]))
	require.NoError(t, err)
	return v
}

// TestServeWait: a client that treats 409 as final (plain net/http, one request)
// gets its answer from `charges serve -wait 5s` while another request with its key is
// still running, whether that request runs in the same server or in another server
// process on the same database.
func TestServeWait(t *testing.T) {
	t.Parallel()
	for _, sameServer := range []bool{true, false} {
		name := map[bool]string{true: "OwnerInSameServer", false: "OwnerInOtherServer"}[sameServer]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, direct)
			g := newGate(t, s.provider.url)
			owner := s.serve(t, nil, "-provider-url", g.url, "-wait", "5s", "-telemetry", "prometheus", "-metrics-addr", "127.0.0.1:0")
			waiter := owner
			if !sameServer {
				waiter = s.serve(t, nil, "-wait", "5s", "-telemetry", "prometheus", "-metrics-addr", "127.0.0.1:0")
			}
			first := make(chan answer, 1)
			go func() {
				a, err := tryPost(owner.url, "acct_wait", "k1", body)
				if err != nil {
					t.Error(err)
				}
				first <- a
			}()
			<-g.entered // the first request is in its call to the provider
			second := make(chan answer, 1)
			go func() {
				a, err := tryPost(waiter.url, "acct_wait", "k1", body)
				if err != nil {
					t.Error(err)
				}
				second <- a
			}()
			eventually(t, "the second request to wait", func() bool { return waiting(t, waiter) == 1 })
			close(g.let)
			a, b := <-first, <-second
			require.Equal(t, http.StatusCreated, a.status, a.body)
			require.Equal(t, http.StatusCreated, b.status, "the waiting request's answer: %s", b.body)
			require.Equal(t, "true", b.header.Get("Idempotent-Replayed"))
			require.Equal(t, a.body, b.body)
			s.requireCharged(t, "acct_wait", "k1")
		})
	}
}
