package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
)

// StartStandby makes a streaming standby of primary: pg_basebackup copies primary's
// data through upstream ("host:port": primary's own address, or a fault proxy in front
// of it, through which the standby then streams), writing the replication settings
// (-R), and a server is started on the copy. It answers read-only queries until it is
// promoted (SELECT pg_promote()). Call Stop when done.
func StartStandby(ctx context.Context, primary *Dedicated, upstream string) (*Dedicated, error) {
	dir, err := os.MkdirTemp("", "pgtest-standby-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: temporary directory: %w", err)
	}
	d := &Dedicated{binDir: primary.binDir, dir: dir, data: filepath.Join(dir, "data"), owner: primary.owner}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	if d.owner != nil {
		if err := os.Chown(dir, d.owner.uid, d.owner.gid); err != nil {
			return nil, fmt.Errorf("pgtest: hand %s to OS user %s: %w", dir, d.owner.name, err)
		}
	}
	host, port, err := net.SplitHostPort(upstream)
	if err != nil {
		return nil, fmt.Errorf("pgtest: upstream: %w", err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(d.binDir, "pg_basebackup"), "--pgdata", d.data,
		"--dbname", fmt.Sprintf("host=%s port=%s user=postgres sslmode=disable", host, port),
		"--write-recovery-conf", "--wal-method=stream", "--checkpoint=fast", "--no-sync")
	cmd.Dir = dir
	cmd.Env = childEnv()
	cmd.SysProcAttr = toolProcAttr(d.owner)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: pg_basebackup: %w\n%s", err, tail(out))
	}
	p, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	d.port = p
	d.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p)
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	ok = true
	return d, nil
}

// Addr is the server's "host:port".
func (d *Dedicated) Addr() string { return fmt.Sprintf("127.0.0.1:%d", d.port) }
