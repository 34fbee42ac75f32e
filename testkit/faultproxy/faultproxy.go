// Package faultproxy is a TCP proxy between a Postgres client and server that injects
// faults tests need to be deterministic, such as losing the acknowledgement of a COMMIT
// the server has already made durable.
//
// It reads the server's side of the protocol as messages (it needs the connection to
// be plain TCP: sslmode=disable). This package imports none of idemflow's packages.
package faultproxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// Proxy forwards connections from Addr to an upstream Postgres server.
type Proxy struct {
	ln       net.Listener
	upstream string

	dropCommits atomic.Int64 // COMMIT acknowledgements still to drop
	dropped     atomic.Int64

	f faults // latency, blackhole, refusal, resets, half-open links (faults.go)

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// New starts a proxy on a free loopback port in front of upstream ("host:port").
func New(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.f.init()
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address ("127.0.0.1:port").
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DropNextCommitAck makes the proxy cut the connection instead of forwarding the
// server's answer to the next COMMIT: the transaction is committed, the client never
// learns it.
func (p *Proxy) DropNextCommitAck() { p.dropCommits.Add(1) }

// Dropped is the number of COMMIT acknowledgements dropped so far.
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// Close stops the proxy and cuts every connection through it.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if !p.closed {
		close(p.f.done) // wakes goroutines held by a blackhole or latency
	}
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.f.refusing.Load() {
			p.refuse(client)
			continue
		}
		server, err := net.Dial("tcp", p.upstream)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client) || !p.track(server) {
			client.Close()
			server.Close()
			return
		}
		l := p.addLink(client, server)
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_ = p.clientToServer(l)
			p.untrack(server)
			p.untrack(client)
			p.removeLink(l)
		}()
		go func() {
			defer p.wg.Done()
			_ = p.serverToClient(l)
			if l.halfOpen.Load() {
				return // the client side stays open and silent until the client closes it
			}
			p.untrack(client)
			p.untrack(server)
		}()
	}
}

var commitTag = []byte("COMMIT\x00")

// serverToClient forwards the server's messages one by one, dropping the connection
// at a COMMIT's CommandComplete when asked to, and applying the faults of faults.go.
func (p *Proxy) serverToClient(l *link) error {
	client, server := l.client, l.server
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(server, hdr[:]); err != nil {
			return err
		}
		n := int(binary.BigEndian.Uint32(hdr[1:]))
		if n < 4 {
			return errors.New("faultproxy: bad message length")
		}
		body := make([]byte, n-4)
		if _, err := io.ReadFull(server, body); err != nil {
			return err
		}
		if hdr[0] == 'C' && bytes.Equal(body, commitTag) && p.takeDrop() {
			p.dropped.Add(1)
			return errors.New("faultproxy: dropped a COMMIT acknowledgement")
		}
		if err := p.beforeServerMessage(l, hdr[0]); err != nil {
			return err
		}
		if _, err := client.Write(append(hdr[:], body...)); err != nil {
			return err
		}
	}
}

func (p *Proxy) takeDrop() bool {
	for {
		n := p.dropCommits.Load()
		if n <= 0 {
			return false
		}
		if p.dropCommits.CompareAndSwap(n, n-1) {
			return true
		}
	}
}
