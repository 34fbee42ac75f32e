package main

// The bench's child processes: its own binary run with a hidden subcommand (the
// sweepers, the crowd's server and load generator, the refusals' server). The bench
// starts each with the flags of the bench database and talks to it over its stdin and
// stdout: the child says a first line (ready, or the address it serves on), reads what
// the bench writes, and ends when its stdin closes.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
)

// childStatsPath is the route at which a serving child serves its figures.
const childStatsPath = "/stats"

// subcommands are the bench's hidden subcommands, each the body of a child process.
var subcommands = map[string]func(args []string) error{
	childCommand:       runChild,
	refuserCommand:     runRefuser,
	crowdServerCommand: runCrowdServer,
	crowdCommand:       runCrowd,
}

// child is a running child process with pipes to its stdin and from its stdout.
type child struct {
	what  string // names the process in errors
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// startChild starts the bench's binary with the hidden subcommand sub, the bench
// database's flags and args, under the command prefix wrap (taskset; nil: none). what
// names the process in errors.
func (e *env) startChild(ctx context.Context, what string, wrap []string, sub string, args ...string) (*child, error) {
	cmd, err := selfCommand(ctx, wrap, sub, append(e.db.childArgs(), args...)...)
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", what, err)
	}
	return &child{what: what, cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}, nil
}

// selfCommand is the bench's binary with the hidden subcommand sub and args, under the
// command prefix wrap (nil: none), its stderr the bench's.
func selfCommand(ctx context.Context, wrap []string, sub string, args ...string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	argv := append(append(append([]string{}, wrap...), exe, sub), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	return cmd, nil
}

// send writes line to the child's stdin.
func (k *child) send(line string) error {
	_, err := io.WriteString(k.stdin, line+"\n")
	return err
}

// baseURL reads the address a serving child says first (serveChild) as an http:// URL.
func (k *child) baseURL() (string, error) {
	if !k.out.Scan() {
		return "", fmt.Errorf("%s did not say its address", k.what)
	}
	return "http://" + k.out.Text(), nil
}

// stop closes the child's stdin, which ends it, and waits for it to exit.
func (k *child) stop() {
	_ = k.stdin.Close()
	_ = k.cmd.Wait()
}

// killAll kills the children that have not been waited for.
func killAll(kids []*child) {
	for _, k := range kids {
		if k.cmd.ProcessState == nil && k.cmd.Process != nil {
			_ = k.cmd.Process.Kill()
			_ = k.cmd.Wait()
		}
	}
}

// serveChild is a serving child's side: it serves srv on a loopback port, says the
// address on stdout and returns when stdin closes, srv still serving.
func serveChild(srv *http.Server) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() { _ = srv.Serve(ln) }()
	fmt.Println(ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin) // until the bench closes it
	return nil
}

// handleChildStats serves stats() as JSON at childStatsPath on mux, for the
// bench's readChildStats.
func handleChildStats[T any](mux *http.ServeMux, stats func() T) {
	mux.HandleFunc("GET "+childStatsPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(stats())
	})
}

// readChildStats reads the stats a server process of the bench's serves at
// childStatsPath, as JSON into a T; what names the reading in an error.
func readChildStats[T any](ctx context.Context, client *http.Client, base, what string) (T, error) {
	var st T
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+childStatsPath, nil)
	if err != nil {
		return st, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("%s: %w", what, err)
	}
	return st, nil
}
