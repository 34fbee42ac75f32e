package pgpipe_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/pgpipe"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// errCut is the read error of a cutConn once it has cut the connection.
var errCut = errors.New("cutConn: connection cut after the guard's results")

// cutConn passes the server's messages through until it has passed, once armed, one
// CommandComplete; every read after that fails, as a connection reset would. It
// delivers the stream message by message, so the cut falls between two messages the
// server sent in one packet.
type cutConn struct {
	net.Conn
	mu    sync.Mutex
	armed bool
	cut   bool
	buf   []byte // read from the server, not yet delivered
}

func (c *cutConn) arm() { c.mu.Lock(); c.armed = true; c.mu.Unlock() }

func (c *cutConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return 0, errCut
	}
	for len(c.buf) < 5 || len(c.buf) < 1+int(binary.BigEndian.Uint32(c.buf[1:5])) {
		chunk := make([]byte, 8192)
		n, err := c.Conn.Read(chunk)
		c.buf = append(c.buf, chunk[:n]...)
		if err != nil {
			return 0, err
		}
	}
	size := 1 + int(binary.BigEndian.Uint32(c.buf[1:5]))
	n := copy(p, c.buf[:size])
	if n < size { // p too small for the message: deliver part of it
		c.buf = c.buf[n:]
		return n, nil
	}
	if c.armed && c.buf[0] == 'C' {
		c.cut = true
		_ = c.Conn.Close()
	}
	c.buf = c.buf[size:]
	return n, nil
}

// TestGuardCutWhilePreparing: the connection fails after the guard's results, while
// the answers to the rest's prepares are read. pgconn then closes the connection in a
// goroutine of its own, which writes Terminate on it; the batch must not send the
// pipeline's Sync beside it (run under -race, a Sync there is a data race in pgx's
// frontend: TestNetworkFaults found it). The batch fails with the read's error and
// the connection is closed.
func TestGuardCutWhilePreparing(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmpty(t)
	cfg, err := pgx.ParseConfig(db.URL)
	require.NoError(t, err)
	var cc *cutConn
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cc = &cutConn{Conn: c}
		return cc, nil
	}
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })

	b := &pgx.Batch{}
	b.Queue(`SELECT 1`)
	b.Queue(`SELECT 2`) // not prepared on this connection: the rest waits for the guard
	cc.arm()
	br := pgpipe.SendGuarded(context.Background(), conn, b, 1)
	_, err = br.Exec()
	require.NoError(t, err, "the guard's own results arrive whole")
	_, err = br.Exec()
	require.ErrorIs(t, err, errCut, "the rest fails with the cut")
	require.Error(t, br.Close())
	require.True(t, conn.IsClosed())
}
