package faultproxy_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/testkit/faultproxy"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

func TestMain(m *testing.M) { idemflowtest.Main(m) }

// setup starts a proxy in front of the shared server and returns it with a connection
// config that goes through it.
func setup(t *testing.T) (*faultproxy.Proxy, *pgx.ConnConfig, *pgtest.DB) {
	t.Helper()
	db := pgtest.NewEmpty(t)
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	p, err := faultproxy.New(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	host, port, err := net.SplitHostPort(p.Addr())
	require.NoError(t, err)
	n, _ := strconv.Atoi(port)
	cfg.Host, cfg.Port = host, uint16(n)
	cfg.TLSConfig, cfg.Fallbacks = nil, nil
	cfg.ConnectTimeout = 2 * time.Second
	return p, cfg, db
}

func connect(t *testing.T, cfg *pgx.ConnConfig) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

func TestRefuse(t *testing.T) {
	t.Parallel()
	p, cfg, _ := setup(t)
	p.Refuse(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := pgx.ConnectConfig(ctx, cfg)
	require.Error(t, err)
	require.Positive(t, p.Refused())
	p.Refuse(false)
	c := connect(t, cfg)
	require.NoError(t, c.Ping(ctx))
}

// TestBlackholeAndHeal: a ping sent into a blackhole is held there and never answered;
// only its caller's cancellation ends the wait. The ping is cancelled once the proxy
// holds it, not after a fixed time: with a deadline of 300 ms, a machine that stalled
// the ping before it was written, or the proxy before it read it, ended the wait with
// nothing held up (shown by a temporary 350 ms sleep before the ping).
func TestBlackholeAndHeal(t *testing.T) {
	t.Parallel()
	p, cfg, _ := setup(t)
	c := connect(t, cfg)
	p.Blackhole()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pinged := make(chan error, 1)
	go func() { pinged <- c.Ping(ctx) }()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(5 * time.Millisecond) // polling the proxy's count; no hook exists
	defer tick.Stop()
	for p.HeldUp() == 0 {
		require.True(t, time.Now().Before(deadline), "the blackhole never got the ping")
		select {
		case err := <-pinged:
			t.Fatalf("the ping ended before the blackhole held it: %v", err)
		case <-tick.C:
		}
	}
	select {
	case err := <-pinged:
		t.Fatalf("the ping passed the blackhole: %v", err)
	default:
	}
	cancel()
	require.Error(t, <-pinged, "nothing passes a blackhole; the cancellation ends the wait")
	p.Heal()
	c2 := connect(t, cfg)
	require.NoError(t, c2.Ping(context.Background()))
}

func TestResetMidQuery(t *testing.T) {
	t.Parallel()
	p, cfg, _ := setup(t)
	c := connect(t, cfg)
	p.ResetMidQuery(1)
	_, err := c.Exec(context.Background(), "SELECT 1")
	require.Error(t, err)
	require.EqualValues(t, 1, p.Resets())
	require.True(t, c.IsClosed())
}

func TestHalfOpen(t *testing.T) {
	t.Parallel()
	p, cfg, db := setup(t)
	cfg.RuntimeParams["application_name"] = "halfopen_test"
	c := connect(t, cfg)
	require.Equal(t, 1, p.HalfOpen())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	require.Error(t, c.Ping(ctx), "no answer comes on a half-open connection; only the deadline ends the wait")
	// The server's side was closed: its backend goes away.
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond) // polling the server's view; no hook exists
	defer tick.Stop()
	for {
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = 'halfopen_test'`).Scan(&n))
		if n == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the backend behind a half-open connection lingers")
		<-tick.C
	}
}

func TestLatency(t *testing.T) {
	t.Parallel()
	p, cfg, _ := setup(t)
	c := connect(t, cfg)
	p.SetLatency(50 * time.Millisecond)
	start := time.Now()
	require.NoError(t, c.Ping(context.Background()))
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "a round trip pays the latency both ways")
	require.Positive(t, p.Delayed())
}
