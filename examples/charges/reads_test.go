package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// send is one request with an optional Bearer account (sent byte for byte, as a
// client may).
func send(t *testing.T, method, url, account, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if account != "" {
		req.Header.Set("Authorization", "Bearer "+account)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// TestNoClientTriggered500 sends what a client can put in a path, a Bearer account and
// a body to every route of the API: ids that are not UTF-8 or hold NUL, accounts with
// C0 or C1 control characters or invalid UTF-8, a source with NUL. Each is answered
// 400, 401 or 404 problem+json, the server logs no ERROR line, and nothing is written.
func TestNoClientTriggered500(t *testing.T) {
	t.Parallel()
	s := newStack(t, direct)
	base := s.server.url
	created := post(t, base, "acct_ok", "k-ok", body)
	require.Equal(t, http.StatusCreated, created.status, created.body)

	cases := []struct {
		name, method, path, account, key, body string
		status                                 int
	}{
		{"IDNotUTF8", "GET", "/v1/charges/%ff", "acct_ok", "", "", 404},
		{"IDNUL", "GET", "/v1/charges/%00", "acct_ok", "", "", 404},
		{"IDTruncatedRune", "GET", "/v1/charges/ch_%c3", "acct_ok", "", "", 404},
		{"IDTooLong", "GET", "/v1/charges/" + strings.Repeat("x", 300), "acct_ok", "", "", 404},
		{"IDUTF8", "GET", "/v1/charges/ch_%c3%a9", "acct_ok", "", "", 404},
		{"GetAccountNotUTF8", "GET", "/v1/charges/ch_1", "acct\xff", "", "", 401},
		{"GetAccountC1", "GET", "/v1/charges/ch_1", "acct\u009b31m", "", "", 401},
		{"GetAccountC1AndBadID", "GET", "/v1/charges/%ff", "acct\u0085x", "", "", 401},
		{"ListAccountNotUTF8", "GET", "/v1/charges", "acct\xc3", "", "", 401},
		{"ListAccountC1", "GET", "/v1/charges", "acct\u0080x", "", "", 401},
		{"ListNoAccount", "GET", "/v1/charges", "", "", "", 401},
		{"PostAccountNotUTF8", "POST", "/v1/charges", "acct\xff", "k1", body, 401},
		{"PostAccountC1", "POST", "/v1/charges", "acct\u009f", "k1", body, 401},
		{"PostSourceNUL", "POST", "/v1/charges", "acct_nul", "k-nul", `{"amount":1,"currency":"usd","source":"tok\u0000"}`, 400},
		{"PostKeyNotASCII", "POST", "/v1/charges", "acct_ok", "k\xc2\x85", body, 400},
	}
	for _, c := range cases {
		for range 2 { // at will: the same answer every time
			a := send(t, c.method, base+c.path, c.account, c.key, c.body)
			require.Equal(t, c.status, a.status, "%s: %s", c.name, a.body)
			require.Contains(t, a.header.Get("Content-Type"), "problem+json", c.name)
		}
	}
	// A C0 control character or DEL in a header never reaches the handlers: net/http
	// answers 400 itself (text/plain, before any routing), so nothing runs.
	for _, account := range []string{"acct\x01", "acct\x1b[2J", "acct\x7f"} {
		require.Equal(t, http.StatusBadRequest, rawStatus(t, base, "GET /v1/charges HTTP/1.1", "Authorization: Bearer "+account))
		require.Equal(t, http.StatusBadRequest, rawStatus(t, base, "POST /v1/charges HTTP/1.1",
			"Authorization: Bearer "+account, "Idempotency-Key: k-raw", "Content-Length: 2"))
	}
	require.Equal(t, 1, s.count(t, `SELECT count(*) FROM charges`), "only the valid charge")
	require.Equal(t, 1, s.count(t, `SELECT count(*) FROM idemflow_keys WHERE scope <> 'acct_nul'`), "no other key")
	require.NotContains(t, s.server.output(), "level=ERROR", "no ERROR line a client can trigger")
}

// rawStatus sends a request line and header lines as they are (a Go client refuses
// control characters in headers) and returns the answer's status.
func rawStatus(t *testing.T, base, line string, header ...string) int {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "%s\r\nHost: x\r\n%s\r\n\r\n{}", line, strings.Join(header, "\r\n"))
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	return resp.StatusCode
}
