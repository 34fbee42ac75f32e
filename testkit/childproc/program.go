package childproc

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

// envProgram names the child program a re-executed test binary runs.
const envProgram = "IDEMFLOW_CHILD"

var (
	programsMu sync.Mutex
	programs   = map[string]func(){}
)

// Register names a child program: what a test binary started with Program(name) in its
// environment runs instead of its tests (see RunIfChild). Test files register their
// programs from an init function.
func Register(name string, run func()) {
	programsMu.Lock()
	defer programsMu.Unlock()
	programs[name] = run
}

// Program is the environment variable (NAME=value) that makes a child run the
// registered program name; pass it to Start with the run pattern "^$".
func Program(name string) string { return envProgram + "=" + name }

// RunIfChild runs the registered program this process was started for, if any, and
// exits when it returns. idemflowtest.Main calls it before the tests.
func RunIfChild() {
	name := os.Getenv(envProgram)
	if name == "" {
		return
	}
	programsMu.Lock()
	run := programs[name]
	programsMu.Unlock()
	if run == nil {
		fmt.Fprintf(os.Stderr, "childproc: no child program %q is registered\n", name)
		os.Exit(2)
	}
	run()
	os.Exit(0)
}

// Fail reports a child's failure on standard error and exits with status 2.
func Fail(what string, err error) {
	name := "child"
	if p := os.Getenv(envProgram); p != "" {
		name += " " + p
	}
	fmt.Fprintf(os.Stderr, "%s: %s: %v\n", name, what, err)
	os.Exit(2)
}

// Emit prints v as one JSON line on standard output, for the parent's Next. It is safe
// for concurrent use.
func Emit(v any) {
	emitMu.Lock()
	defer emitMu.Unlock()
	_ = json.NewEncoder(os.Stdout).Encode(v)
}

var emitMu sync.Mutex
