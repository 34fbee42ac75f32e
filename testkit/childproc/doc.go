// Package childproc is idemflow's one harness for tests that run part of their work in
// a real child process: the test binary re-executed, killed with SIGKILL or paused
// with SIGSTOP at a named boundary of the engine (a crash or a zombie), while the
// parent recovers what the child left. idemflowtest's crash matrix and the workflow,
// sweeper and reliability suites are built on it.
//
// The parent starts a child with Start and reads the JSON lines it prints (Child.Next,
// Child.Killed, Child.Paused, Child.Resume); it may also kill or continue the child
// itself (Child.Kill, Child.Continue). The child runs a program registered with
// Register (a TestMain calls RunIfChild, as idemflowtest.Main does), reports with Emit
// and ends itself with Kill or Stop, at the boundaries that Points turns into
// workflow.Hooks.
// WaitSessionsGone waits until the server has ended a killed child's sessions (and with
// them its transactions and claim locks).
//
// Killing and pausing the calling thread (not just the process) needs Linux; elsewhere
// on Unix the whole process is signalled.
//
// This package imports idemflow's phases and workflow packages.
package childproc
