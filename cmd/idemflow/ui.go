package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/idemflow/idemflow/idemflowui"
)

// Where `idemflow ui` reads its tokens when no file is given.
const (
	envWriteToken = "IDEMFLOW_UI_WRITE_TOKEN"
	envReadToken  = "IDEMFLOW_UI_READ_TOKEN"
)

// ui serves the operator's web page until ctx ends. It listens only on -addr, which
// defaults to loopback; it is read-only unless given a write token. On an address other
// machines can reach it refuses to start without -allow-host or a read token.
func (c *cli) ui(ctx context.Context, args []string) error {
	fs, _ := flags("ui")
	addr := fs.String("addr", "127.0.0.1:8081", "address to listen on (host:port)")
	writeFile := fs.String("write-token-file", "", "file holding the write token (default $"+envWriteToken+"; none: read-only)")
	readFile := fs.String("read-token-file", "", "file holding the read token: reading needs a login (default $"+envReadToken+"; none: reading needs no login)")
	var hosts []string
	fs.Func("allow-host", "a host name the page answers besides localhost and IP literals (repeat, or comma-separated)", func(v string) error {
		for _, h := range strings.Split(v, ",") {
			if h = strings.TrimSpace(h); h != "" {
				hosts = append(hosts, h)
			}
		}
		return nil
	})
	if err := parse(fs, args, 0, ""); err != nil {
		return err
	}
	write, err := token(*writeFile, envWriteToken, "write")
	if err != nil {
		return err
	}
	read, err := token(*readFile, envReadToken, "read")
	if err != nil {
		return err
	}
	if !loopbackAddr(*addr) && len(hosts) == 0 && read == "" {
		return badUsage("ui: -addr %s can be reached from other machines, and reading the page needs no login: "+
			"set -allow-host NAME (the names operators type in the browser) or -read-token-file FILE (or $%s) so that reading needs a login, "+
			"or listen on loopback (-addr 127.0.0.1:8081)", *addr, envReadToken)
	}
	// The text handler quotes any value holding a control character (strconv.Quote).
	logger := slog.New(slog.NewTextHandler(c.errOut, nil))
	opts := &idemflowui.Options{WriteToken: write, ReadToken: read, Hosts: hosts, Logger: logger}
	h, err := idemflowui.New(c.engine, opts)
	if err != nil {
		return badUsage("ui: %v", err) // before listening: bad usage changes nothing
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("ui: %w", err)
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); len(hosts) == 0 && read == "" && (!ok || !tcp.IP.IsLoopback()) {
		ln.Close() // "localhost" resolved to an address that is not loopback
		return badUsage("ui: -addr %s listens on %s, which is not loopback: set -allow-host NAME or -read-token-file FILE", *addr, ln.Addr())
	}
	fmt.Fprintf(c.errOut, "idemflow ui: serving http://%s/ (%s)\n", ln.Addr(), escape(mode(opts)))
	return serve(ctx, ln, h)
}

// serve serves h on ln until ctx ends, then shuts down.
func serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("ui: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("ui: shut down: %w", err)
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("ui: %w", err)
	}
	return nil
}

// token is the contents of file (whitespace around it trimmed), or else $env.
func token(file, env, what string) (string, error) {
	if file == "" {
		return os.Getenv(env), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("ui: %s token: %w", what, err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("ui: %s token file %s is empty", what, file)
	}
	return t, nil
}

// mode is what the page lets a visitor do, for the start-up line.
func mode(o *idemflowui.Options) string {
	var m []string
	if o.ReadToken != "" {
		m = append(m, "reads need a login")
	}
	if o.WriteToken != "" {
		m = append(m, "writes need the token")
	} else {
		m = append(m, "read-only")
	}
	if len(o.Hosts) > 0 {
		m = append(m, "also answers "+strings.Join(o.Hosts, ", "))
	}
	return strings.Join(m, "; ")
}

// loopbackAddr says whether addr (host:port) names a loopback address: a loopback IP
// or localhost. An empty or unspecified host (":8081", "0.0.0.0:8081") listens on every
// interface, and any other name may resolve to anything: neither is loopback.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
