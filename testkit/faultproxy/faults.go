package faultproxy

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Network faults beyond a lost COMMIT acknowledgement: added latency, a blackhole, a
// database that refuses connections, connections reset in the middle of a query's
// answer, and half-open connections. Each is switched on and off (or armed) through a
// Proxy method and counted, so that a test can assert that its fault fired.

// faults is the proxy's fault state.
type faults struct {
	done chan struct{} // closed by Close

	latency  atomic.Int64 // nanoseconds added before forwarding anything, each way
	refusing atomic.Bool
	resets   atomic.Int64 // mid-query resets still to make

	mu    sync.Mutex
	hole  chan struct{} // non-nil while blackholed; closed when healed
	links map[*link]struct{}

	refused, reset, halfOpened, delayed, heldUp atomic.Int64
}

func (f *faults) init() {
	f.done = make(chan struct{})
	f.links = map[*link]struct{}{}
}

// link is one proxied connection: the client's side and the server's side.
type link struct {
	client, server net.Conn
	// halfOpen: the server's side was cut and the client's side is kept open and
	// silent: what the client writes is read and dropped, and nothing comes back.
	halfOpen atomic.Bool
}

func (p *Proxy) addLink(client, server net.Conn) *link {
	l := &link{client: client, server: server}
	p.f.mu.Lock()
	p.f.links[l] = struct{}{}
	p.f.mu.Unlock()
	return l
}

func (p *Proxy) removeLink(l *link) {
	p.f.mu.Lock()
	delete(p.f.links, l)
	p.f.mu.Unlock()
}

// CommitDropsArmed is the number of COMMIT acknowledgements DropNextCommitAck armed
// that are still to be dropped.
func (p *Proxy) CommitDropsArmed() int64 { return p.dropCommits.Load() }

// SetLatency adds d before every message from the server and every chunk from the
// client is forwarded, each way: a round trip takes at least 2d longer. Zero removes it.
func (p *Proxy) SetLatency(d time.Duration) { p.f.latency.Store(int64(max(d, 0))) }

// Delayed is how many messages or chunks were held up by added latency.
func (p *Proxy) Delayed() int64 { return p.f.delayed.Load() }

// Blackhole stops all traffic through the proxy, both ways, on existing and new
// connections, without closing anything: like a network partition, each side waits for
// bytes that do not come (the server does not learn that the client gave up). Heal
// ends it; what was held back is then forwarded.
func (p *Proxy) Blackhole() {
	p.f.mu.Lock()
	defer p.f.mu.Unlock()
	if p.f.hole == nil {
		p.f.hole = make(chan struct{})
	}
}

// Heal ends a blackhole.
func (p *Proxy) Heal() {
	p.f.mu.Lock()
	defer p.f.mu.Unlock()
	if p.f.hole != nil {
		close(p.f.hole)
		p.f.hole = nil
	}
}

// HeldUp is how many messages or chunks a blackhole held back.
func (p *Proxy) HeldUp() int64 { return p.f.heldUp.Load() }

// Refuse makes the proxy reset every new connection at once (on) or accept them again
// (off): a database that refuses connections. Existing connections are left alone.
func (p *Proxy) Refuse(on bool) { p.f.refusing.Store(on) }

// Refused is how many connections were refused.
func (p *Proxy) Refused() int64 { return p.f.refused.Load() }

// ResetMidQuery arms n resets: each of the next n times the server answers a query
// (any message but ReadyForQuery, authentication and parameter status), the
// connection is reset (RST) both ways instead: the server may have run the statement,
// the client gets only part of the answer, or none.
func (p *Proxy) ResetMidQuery(n int) { p.f.resets.Add(int64(n)) }

// Resets is how many connections were reset in the middle of a query.
func (p *Proxy) Resets() int64 { return p.f.reset.Load() }

// HalfOpen turns every current connection into a half-open one: the server's side is
// closed (its backend ends and rolls back what was open), while the client's side
// stays open and silent, as when the server's host vanished without a word: the client
// waits until its own deadline. It returns how many connections it cut.
func (p *Proxy) HalfOpen() int {
	p.f.mu.Lock()
	links := make([]*link, 0, len(p.f.links))
	for l := range p.f.links {
		links = append(links, l)
	}
	p.f.mu.Unlock()
	n := 0
	for _, l := range links {
		if l.halfOpen.CompareAndSwap(false, true) {
			p.f.halfOpened.Add(1)
			_ = l.server.Close()
			n++
		}
	}
	return n
}

// HalfOpened is how many connections HalfOpen cut.
func (p *Proxy) HalfOpened() int64 { return p.f.halfOpened.Load() }

// Conns is the number of connections through the proxy that are not closed yet.
func (p *Proxy) Conns() int {
	p.f.mu.Lock()
	defer p.f.mu.Unlock()
	return len(p.f.links)
}

// refuse resets a new client connection without dialing the server.
func (p *Proxy) refuse(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // close with RST, like a refused connection
	}
	p.f.refused.Add(1)
	_ = c.Close()
}

var errProxyClosed = errors.New("faultproxy: closed")

// pass waits out a blackhole and the added latency before something is forwarded.
func (p *Proxy) pass() error {
	p.f.mu.Lock()
	hole := p.f.hole
	p.f.mu.Unlock()
	if hole != nil {
		p.f.heldUp.Add(1)
		select {
		case <-hole:
		case <-p.f.done:
			return errProxyClosed
		}
	}
	if d := time.Duration(p.f.latency.Load()); d > 0 {
		p.f.delayed.Add(1)
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-p.f.done:
			return errProxyClosed
		}
	}
	return nil
}

// beforeServerMessage applies the faults to a message from the server of type typ.
func (p *Proxy) beforeServerMessage(l *link, typ byte) error {
	if err := p.pass(); err != nil {
		return err
	}
	switch typ {
	case 'Z', 'R', 'S', 'K', 'N': // ready for query, auth, parameter status, key data, notice
		return nil
	}
	if p.takeReset() {
		p.f.reset.Add(1) // counted first: the client may look as soon as it sees the reset
		resetConn(l.client)
		resetConn(l.server)
		return errors.New("faultproxy: reset in the middle of a query")
	}
	return nil
}

func (p *Proxy) takeReset() bool {
	for {
		n := p.f.resets.Load()
		if n <= 0 {
			return false
		}
		if p.f.resets.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// clientToServer forwards what the client sends, applying the faults; on a half-open
// link it reads and drops it.
func (p *Proxy) clientToServer(l *link) error {
	buf := make([]byte, 32<<10)
	for {
		n, err := l.client.Read(buf)
		if n > 0 && !l.halfOpen.Load() {
			if perr := p.pass(); perr != nil {
				return perr
			}
			if _, werr := l.server.Write(buf[:n]); werr != nil && !l.halfOpen.Load() {
				return werr
			}
		}
		if err != nil {
			return err
		}
	}
}
