package idemclient

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// hit is one request a redirecting server got.
type hit struct {
	method, path, key, body string
}

// redirecting is a local server: POST /v1/charges answers the status of its "status"
// query parameter with Location /v1/next (or /v1/hop with "via=hop", which answers 307
// to /v1/next); /v1/next answers the statuses of its script in turn, then 200.
type redirecting struct {
	*httptest.Server
	mu   sync.Mutex
	hits []hit
	next []int // statuses /v1/next answers first
}

func newRedirecting(t *testing.T, next ...int) *redirecting {
	s := &redirecting{next: next}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *redirecting) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.hits = append(s.hits, hit{method: r.Method, path: r.URL.Path, key: r.Header.Get(KeyHeader), body: string(body)})
	status := http.StatusOK
	if r.URL.Path == "/v1/next" && len(s.next) > 0 {
		status, s.next = s.next[0], s.next[1:]
	}
	s.mu.Unlock()
	switch r.URL.Path {
	case "/v1/charges":
		status, _ := strconv.Atoi(r.URL.Query().Get("status"))
		loc := "/v1/next"
		if r.URL.Query().Get("via") == "hop" {
			loc = "/v1/hop"
		}
		w.Header().Set("Location", loc)
		w.WriteHeader(status)
	case "/v1/hop":
		w.Header().Set("Location", "/v1/next")
		w.WriteHeader(http.StatusTemporaryRedirect)
	default:
		w.WriteHeader(status)
		_, _ = io.WriteString(w, r.Method+" "+r.URL.Path)
	}
}

func (s *redirecting) got() []hit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]hit(nil), s.hits...)
}

// redirectClient is an http.Client over a Transport on a fake clock.
func redirectClient(t *testing.T) *http.Client {
	t.Helper()
	tr, err := NewTransport(nil, nil)
	require.NoError(t, err)
	clock := &fakeClock{now: clockStart}
	tr.now, tr.sleep, tr.rand = clock.Now, clock.Sleep, func() float64 { return 0 }
	return &http.Client{Transport: tr}
}

// postFollowing posts chargeBody to path under key, by the context or by the header,
// and follows the redirects; it returns the final answer's status and body.
func postFollowing(t *testing.T, c *http.Client, url, key string, byHeader bool) (int, string) {
	t.Helper()
	ctx := context.Background()
	if !byHeader {
		ctx = WithKey(ctx, key)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(chargeBody))
	require.NoError(t, err)
	if byHeader {
		req.Header.Set(KeyHeader, key)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// The key belongs to the operation: a 301, 302 or 303 ends it, and the GET that
// follows is a read of another resource, sent without the key (an idemflow server
// keyed it before and answered 422 for a charge that ran); a 307 or 308 repeats the
// operation elsewhere, under the same key and with the same body.
func TestRedirectCarriesKeyOnlyWhenTheOperationRepeats(t *testing.T) {
	t.Parallel()
	for _, byHeader := range []bool{false, true} {
		how := map[bool]string{false: "KeyInContext", true: "KeyInHeader"}[byHeader]
		for _, status := range []int{301, 302, 303} {
			t.Run(how+"/"+strconv.Itoa(status), func(t *testing.T) {
				t.Parallel()
				srv := newRedirecting(t)
				code, body := postFollowing(t, redirectClient(t), srv.URL+"/v1/charges?status="+strconv.Itoa(status), "op-1", byHeader)
				require.Equal(t, http.StatusOK, code)
				require.Equal(t, "GET /v1/next", body)
				require.Equal(t, []hit{
					{method: "POST", path: "/v1/charges", key: "op-1", body: chargeBody},
					{method: "GET", path: "/v1/next"},
				}, srv.got(), "the GET after a %d carries no key", status)
			})
		}
		for _, status := range []int{307, 308} {
			t.Run(how+"/"+strconv.Itoa(status), func(t *testing.T) {
				t.Parallel()
				srv := newRedirecting(t)
				code, body := postFollowing(t, redirectClient(t), srv.URL+"/v1/charges?status="+strconv.Itoa(status), "op-1", byHeader)
				require.Equal(t, http.StatusOK, code)
				require.Equal(t, "POST /v1/next", body)
				require.Equal(t, []hit{
					{method: "POST", path: "/v1/charges", key: "op-1", body: chargeBody},
					{method: "POST", path: "/v1/next", key: "op-1", body: chargeBody},
				}, srv.got(), "a %d repeats the operation under its key", status)
			})
		}
	}
	t.Run("NoKeyAfterA303EvenThroughA307", func(t *testing.T) {
		t.Parallel()
		srv := newRedirecting(t)
		code, _ := postFollowing(t, redirectClient(t), srv.URL+"/v1/charges?status=303&via=hop", "op-1", true)
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, []hit{
			{method: "POST", path: "/v1/charges", key: "op-1", body: chargeBody},
			{method: "GET", path: "/v1/hop"},
			{method: "GET", path: "/v1/next"},
		}, srv.got())
	})
	t.Run("TheReadIsSentOnce", func(t *testing.T) {
		t.Parallel()
		srv := newRedirecting(t, http.StatusServiceUnavailable)
		code, _ := postFollowing(t, redirectClient(t), srv.URL+"/v1/charges?status=303", "op-1", false)
		require.Equal(t, http.StatusServiceUnavailable, code, "a request without a key is never retried")
		require.Len(t, srv.got(), 2)
	})
	t.Run("TheRepeatIsRetried", func(t *testing.T) {
		t.Parallel()
		srv := newRedirecting(t, http.StatusServiceUnavailable)
		code, _ := postFollowing(t, redirectClient(t), srv.URL+"/v1/charges?status=308", "op-1", false)
		require.Equal(t, http.StatusOK, code)
		repeat := hit{method: "POST", path: "/v1/next", key: "op-1", body: chargeBody}
		require.Equal(t, []hit{{method: "POST", path: "/v1/charges", key: "op-1", body: chargeBody}, repeat, repeat}, srv.got())
	})
}
