package sweeper_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemhttp"
	"github.com/idemflow/idemflow/sweeper"
	"github.com/idemflow/idemflow/testkit/testflow"
)

// capture is a slog.Handler that keeps every record, its attributes flattened to
// "group.name" → value.
type capture struct {
	mu      sync.Mutex
	records []captured
}

type captured struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (c *capture) Enabled(context.Context, slog.Level) bool { return true }
func (c *capture) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *capture) WithGroup(string) slog.Handler            { return c }

func (c *capture) Handle(_ context.Context, r slog.Record) error {
	rec := captured{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	var flatten func(prefix string, a slog.Attr)
	flatten = func(prefix string, a slog.Attr) {
		if a.Value.Kind() == slog.KindGroup {
			for _, g := range a.Value.Group() {
				flatten(prefix+a.Key+".", g)
			}
			return
		}
		rec.attrs[prefix+a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { flatten("", a); return true })
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records = append(c.records, rec)
	return nil
}

// byMessage returns the records of one message.
func (c *capture) byMessage(msg string) []captured {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []captured
	for _, r := range c.records {
		if r.msg == msg {
			out = append(out, r)
		}
	}
	return out
}

// TestLogsEachKeysFate: the sweeper logs each key it finishes, parks or dead-letters,
// with the key's id, scope, flow and recovery point, and never its body.
func TestLogsEachKeysFate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{})
	const secret = "4111111111111111"
	body := []byte(`{"amount":250,"card":"` + secret + `"}`)

	fin := chargeReq("fin")
	fin.Body = body
	b.stuck(t, fin, testflow.Pay)
	dead := chargeReq("dead")
	dead.Body = body
	b.stuck(t, dead, testflow.Settle)
	mw, err := idemhttp.Middleware(b.engine, &idemhttp.Config{
		Scope: func(*http.Request) (string, error) { return "acct", nil },
		Route: func(*http.Request) string { return "/plain" },
	})
	require.NoError(t, err)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	req := httptest.NewRequest(http.MethodPost, "/plain", strings.NewReader(string(body)))
	req.Header.Set("Idempotency-Key", "parked")
	h.ServeHTTP(httptest.NewRecorder(), req)
	for _, k := range []string{"fin", "dead", "parked"} {
		makeDue(t, b.db, k)
	}
	b.fail.set("dead", testflow.Settle, true)

	logs := &capture{}
	s := b.newSweeper(t, &sweeper.Config{MaxAttempts: 1, Logger: slog.New(logs)})
	stats, err := s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Stats{Taken: 3, Finished: 1, Parked: 1, DeadLettered: 1}, stats)

	var parkedFlow string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT flow FROM idemflow_keys WHERE idempotency_key = 'parked'`).Scan(&parkedFlow))
	want := []struct {
		msg, key, flow, point string
		level                 slog.Level
	}{
		{"sweeper: key finished", "fin", testflow.Name, testflow.Reserve, slog.LevelInfo},
		{"sweeper: key dead-lettered", "dead", testflow.Name, testflow.Pay, slog.LevelWarn},
		{"sweeper: key parked", "parked", parkedFlow, "started", slog.LevelInfo},
	}
	for _, w := range want {
		got := logs.byMessage(w.msg)
		require.Len(t, got, 1, "%s: %+v", w.msg, logs.records)
		r := got[0]
		require.Equal(t, w.level, r.level, w.msg)
		require.Equal(t, keyID(t, b.db, w.key), r.attrs["key.id"], w.msg)
		require.Equal(t, "acct", r.attrs["key.scope"], w.msg)
		require.Equal(t, w.key, r.attrs["key.key"], w.msg)
		require.Equal(t, w.flow, r.attrs["flow"], w.msg)
		require.Equal(t, w.point, r.attrs["recovery_point"], w.msg)
	}
	require.Contains(t, logs.byMessage("sweeper: key dead-lettered")[0].attrs["err"], "injected")
	for _, r := range logs.records {
		for k, v := range r.attrs {
			require.NotContains(t, v, secret, "%s: %s carries the body", r.msg, k)
		}
	}
}
