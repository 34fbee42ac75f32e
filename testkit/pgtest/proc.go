package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// runReady starts cmd, its output going to logFile (at logPath), as a process of dir,
// and waits until url accepts connections. If that fails it stops the process and
// returns an error with the end of the log, wrapping errPortTaken when the log says
// the port was taken; what names the program ("postgres", "pgbouncer") and port its
// port, in the error. cmd's SysProcAttr is set by the caller.
func runReady(ctx context.Context, cmd *exec.Cmd, dir string, logFile *os.File, logPath, url, what string, port int) (*localServer, error) {
	cmd.Dir = dir
	cmd.Env = childEnv()
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	exited, err := startLocked(cmd)
	if err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("pgtest: start %s: %w", cmd.Path, err)
	}
	l := &localServer{dir: dir, cmd: cmd, exited: exited, log: logFile}
	if err := waitReady(ctx, url, exited, StartTimeoutDefault); err != nil {
		stopErr := l.stopProcess()
		_ = logFile.Close()
		logTail := tailFile(logPath)
		if errors.Is(err, errExited) && containsBindFailure(logTail) {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return nil, errors.Join(fmt.Errorf("pgtest: %s on port %d did not start: %w\n--- end of its log ---\n%s",
			what, port, err, logTail), stopErr)
	}
	return l, nil
}
