package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idemflow/idemflow/idemflowui"
)

// envWriteToken is where `idemflow ui` reads its write token when no file is given.
const envWriteToken = "IDEMFLOW_UI_WRITE_TOKEN"

// ui serves the operator's web page until ctx ends. It listens only on -addr, which
// defaults to loopback; it is read-only unless given a write token.
func (c *cli) ui(ctx context.Context, args []string) error {
	fs, _ := flags("ui")
	addr := fs.String("addr", "127.0.0.1:8081", "address to listen on (host:port)")
	tokenFile := fs.String("write-token-file", "", "file holding the write token (default $"+envWriteToken+"; none: read-only)")
	if err := parse(fs, args, 0, ""); err != nil {
		return err
	}
	token := os.Getenv(envWriteToken)
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("ui: write token: %w", err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return fmt.Errorf("ui: write token file %s is empty", *tokenFile)
		}
	}
	if _, err := idemflowui.New(c.engine, &idemflowui.Options{WriteToken: token}); err != nil {
		return badUsage("ui: %v", err) // before listening: bad usage changes nothing
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("ui: %w", err)
	}
	h, err := idemflowui.New(c.engine, &idemflowui.Options{WriteToken: token, Hosts: loopbackHosts(ln.Addr())})
	if err != nil {
		ln.Close()
		return fmt.Errorf("ui: %w", err)
	}
	mode := "read-only"
	if token != "" {
		mode = "writes need the token"
	}
	fmt.Fprintf(c.errOut, "idemflow ui: serving http://%s/ (%s)\n", ln.Addr(), mode)
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

// loopbackHosts are the Host headers a browser sends to a page listening on addr, when
// addr is a loopback address: the pages answer only those (see idemflowui.Options.Hosts).
// For any other address it is nil, and the operator's network decides who can reach it.
func loopbackHosts(addr net.Addr) []string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !tcp.IP.IsLoopback() {
		return nil
	}
	port := strconv.Itoa(tcp.Port)
	return []string{net.JoinHostPort(tcp.IP.String(), port), net.JoinHostPort("localhost", port)}
}
