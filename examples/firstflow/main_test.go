package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/testkit/childproc"
)

func init() { childproc.Register("firstflow", main) }

// logLine is what the child's JSON log lines say.
type logLine struct {
	Msg  string `json:"msg"`
	Addr string `json:"addr"`
}

// nextLog reads the child's log lines until one with msg.
func nextLog(t *testing.T, c *childproc.Child, msg string) logLine {
	t.Helper()
	for {
		var l logLine
		c.Next(t, 2*time.Minute, &l)
		if l.Msg == msg {
			return l
		}
	}
}

// TestMainDrainsOnSIGTERM runs main in a real process and sends it SIGTERM while a
// withdrawal waits on the bank: the withdrawal is answered 201 and finished, not cut
// off, and the process logs its drain and exits 0.
func TestMainDrainsOnSIGTERM(t *testing.T) {
	db := idemflowtest.NewDB(t, Schema, `INSERT INTO accounts (id, balance) VALUES ('acct', 1000)`)
	remote := idemflowtest.NewRemote(t, nil)
	// The bank holds the first transfer until the test lets it go, and lets every
	// request go once the test ends, so that a failing test ends too.
	inCall, release := make(chan struct{}), make(chan struct{})
	var entered, released sync.Once
	letGo := func() { released.Do(func() { close(release) }) }
	t.Cleanup(letGo)
	remote.During(func(*http.Request) {
		entered.Do(func() { close(inCall) })
		<-release
	})
	child := childproc.Start(t, "^$", childproc.Program("firstflow"),
		"DATABASE_URL="+db.URL, "BANK_URL="+remote.URL, "ADDR=127.0.0.1:0")
	addr := nextLog(t, child, "firstflow: listening").Addr

	type reply struct {
		status int
		body   []byte
		err    error
	}
	answered := make(chan reply, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/withdrawals",
			bytes.NewReader([]byte(`{"amount":100,"iban":"DE89370400440532013000"}`)))
		req.Header.Set("Idempotency-Key", "in-flight")
		req.Header.Set("X-Account", "acct")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- reply{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		answered <- reply{status: resp.StatusCode, body: body, err: err}
	}()
	select {
	case <-inCall:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the withdrawal never reached the bank; stderr:\n%s", child.Stderr())
	}
	require.NoError(t, syscall.Kill(child.Pid(), syscall.SIGTERM))
	nextLog(t, child, "firstflow: draining")
	letGo()

	r := <-answered
	require.NoError(t, r.err)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	lines, err := child.Exit()
	require.NoError(t, err, "main's exit; stderr:\n%s", child.Stderr())
	var drained bool
	for _, raw := range lines {
		var l logLine
		drained = drained || (json.Unmarshal(raw, &l) == nil && l.Msg == "firstflow: drained")
	}
	require.True(t, drained, "main logged its drain: %q", lines)
	idemflowtest.RequireFinished(t, db.Pool, "acct", "in-flight")
}
