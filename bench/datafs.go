package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The file system under a server's data directory decides much of what a partition's
// removal costs live requests: the drop's commit truncates the partition's files, and
// on a file system that discards freed blocks as it frees them (ext4's discard mount
// option) every commit's WAL flush waits behind that for tens of milliseconds per
// few hundred MiB (docs/PARTITIONS.md, "What the drop costs, and where"). The bench
// names it beside every figure that a removal or a flush moves.

// dataFileSystem describes the file system under the data directory of the server at
// serverURL when that directory is on this machine: its type, its mount options and
// its super block's ("ext4 rw,relatime; rw,discard"), and whether it discards online,
// and pg_wal's when that is elsewhere. A server elsewhere (a data directory this
// machine does not have) gives "not on this machine"; a server in a container or on
// another host whose path this machine has too would be described by this machine's
// mount, which is why the report says where the server ran. On Citus it is the
// coordinator's: the partitions live on the workers.
func dataFileSystem(ctx context.Context, serverURL string) (desc string, discard bool) {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "unknown (" + err.Error() + ")", false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var dir string
	if err := conn.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dir); err != nil {
		return "unknown (" + err.Error() + ")", false
	}
	desc, discard = mountOf(dir)
	// The WAL is flushed where pg_wal is, which may be a link to another file system.
	if wal, wdiscard := mountOf(filepath.Join(dir, "pg_wal")); wal != desc {
		desc += ", pg_wal on " + wal
		discard = discard || wdiscard
	}
	return desc, discard
}

// mountOf finds the mount that holds path in /proc/self/mountinfo (the longest mount
// point that is path or one of its parents).
func mountOf(path string) (desc string, discard bool) {
	real, err := filepath.EvalSymlinks(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "not on this machine", false
	case err != nil:
		return "unknown (" + err.Error() + ")", false
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "unknown (no /proc/self/mountinfo)", false
	}
	defer f.Close()
	return mountIn(f, real)
}

// mountIn is mountOf over the mountinfo text r, for a path with no symbolic link.
func mountIn(r io.Reader, real string) (desc string, discard bool) {
	best := -1
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// id parent major:minor root mount-point options [optional…] - type source super-options
		left, right, ok := strings.Cut(sc.Text(), " - ")
		l, r := strings.Fields(left), strings.Fields(right)
		if !ok || len(l) < 6 || len(r) < 3 {
			continue
		}
		point := unescapeMount(l[4])
		// Of two mounts on one point, the later hides the earlier.
		if !within(real, point) || len(point) < best {
			continue
		}
		best = len(point)
		desc = r[0] + " " + l[5] + "; " + r[2]
		discard = discards(l[5]) || discards(r[2])
	}
	if best < 0 {
		return "unknown (no mount holds " + real + ")", false
	}
	return desc, discard
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	return dir == "/" || path == dir || strings.HasPrefix(path, dir+"/")
}

// discards reports whether the comma-separated mount options turn online discard on:
// discard itself (ext4, XFS) or discard=sync and discard=async (btrfs).
func discards(options string) bool {
	for o := range strings.SplitSeq(options, ",") {
		if o == "discard" || strings.HasPrefix(o, "discard=") {
			return true
		}
	}
	return false
}

// unescapeMount undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// discardNote is what a figure's line says about the data directory's file system.
func discardNote(desc string, discard bool) string {
	if discard {
		return "data directory on " + desc + ": online discard ON (a drop's truncation stalls every WAL flush; docs/PARTITIONS.md)"
	}
	return "data directory on " + desc
}
