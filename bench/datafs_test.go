package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMountIn: the mount holding a path is the longest mount point above it (in
// whatever order mountinfo lists them), and
// discard counts in either the mount's or the super block's options, never as part of
// another option's name.
func TestMountIn(t *testing.T) {
	const info = `22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
30 22 0:26 / /tmp rw,nosuid shared:5 - tmpfs tmpfs rw,size=1024k
31 22 254:1 / /srv/pg\040data rw,noatime shared:6 - xfs /dev/vdb rw,nodiscard
32 22 254:2 / /srv/pgx rw,noatime,discard - ext4 /dev/vdc rw
33 22 254:3 / /srv rw,noatime - ext4 /dev/vdd rw
34 22 254:4 / /btr rw - btrfs /dev/vde rw,ssd,discard=async
35 22 254:5 / /btr rw - btrfs /dev/vdf rw,ssd,nodiscard
36 22 254:6 / /x rw - xfs /dev/vdg rw,discard
37 22 254:7 / /b2 rw - btrfs /dev/vdh rw,ssd,discard=async
`
	for _, c := range []struct {
		path    string
		desc    string
		discard bool
	}{
		{"/var/lib/postgresql/15/main", "ext4 rw,relatime; rw,discard", true},
		{"/tmp/pgtest-1/data", "tmpfs rw,nosuid; rw,size=1024k", false},
		{"/srv/pg data/15", "xfs rw,noatime; rw,nodiscard", false},
		{"/srv/pgx", "ext4 rw,noatime,discard; rw", true},
		{"/srv/pgxy", "ext4 rw,noatime; rw", false}, // not below /srv/pgx
		{"/srv", "ext4 rw,noatime; rw", false},
		{"/btr/data", "btrfs rw; rw,ssd,nodiscard", false}, // the later of two mounts on /btr hides the earlier
		{"/x/data", "xfs rw; rw,discard", true},
		{"/b2", "btrfs rw; rw,ssd,discard=async", true},
	} {
		desc, discard := mountIn(strings.NewReader(info), c.path)
		require.Equal(t, c.desc, desc, c.path)
		require.Equal(t, c.discard, discard, c.path)
	}
	desc, _ := mountIn(strings.NewReader("garbage\n"), "/x")
	require.Contains(t, desc, "unknown")
}
