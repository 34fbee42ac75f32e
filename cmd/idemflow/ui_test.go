package main

import (
	"bufio"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// startUI runs `idemflow ui` on a free loopback port with env added, and returns the
// base URL it printed; the process is ended at cleanup.
func startUI(t *testing.T, b *bundle, env []string, args ...string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-database-url", serverURL(t, b.db), "-schema", b.db.Schema, "ui", "-addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(append(os.Environ(), "DATABASE_URL=", envWriteToken+"="), env...)
	errOut, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	lines := bufio.NewScanner(errOut)
	require.True(t, lines.Scan())
	m := regexp.MustCompile(`^idemflow ui: serving (http://127\.0\.0\.1:\d+)/ \((.+)\)$`).FindStringSubmatch(lines.Text())
	require.NotNil(t, m, lines.Text())
	go func() { _, _ = io.Copy(io.Discard, errOut) }()
	return m[1], cmd
}

func status(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// portOf is the port of a URL's host.
func portOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := neturl.Parse(raw)
	require.NoError(t, err)
	return u.Port()
}

// TestUI: `idemflow ui` serves the page on the loopback address it was given, is
// read-only without a token, offers the login with one (from a file or the
// environment), and exits 0 on SIGTERM.
func TestUI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keysInStates(t, b)

	url, cmd := startUI(t, b, nil)
	require.Equal(t, http.StatusOK, status(t, url+"/"))
	require.Equal(t, http.StatusOK, status(t, url+"/key?scope=acct&key=dead"))
	require.Equal(t, http.StatusForbidden, status(t, url+"/login"), "read-only")
	// A page of another site that rebinds its name to 127.0.0.1 sends its own Host.
	for host, want := range map[string]int{
		"rebound.example:" + portOf(t, url): http.StatusForbidden,
		"localhost:" + portOf(t, url):       http.StatusOK,
	} {
		req, err := http.NewRequest(http.MethodGet, url+"/key?scope=acct&key=dead", nil)
		require.NoError(t, err)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, host)
		if want == http.StatusForbidden {
			require.NotContains(t, string(body), "dead", "nothing of the key is shown under %s", host)
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "exit 0")

	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte("a-token-of-twenty-bytes\n"), 0o600))
	url, _ = startUI(t, b, nil, "-write-token-file", file)
	require.Equal(t, http.StatusOK, status(t, url+"/login"))
	url, _ = startUI(t, b, []string{envWriteToken + "=another-token-of-enough-bytes"})
	require.Equal(t, http.StatusOK, status(t, url+"/login"))

	r := b.cli(t, "ui", "-write-token-file", filepath.Join(t.TempDir(), "none"))
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "write token")
	short := filepath.Join(t.TempDir(), "short")
	require.NoError(t, os.WriteFile(short, []byte("short"), 0o600))
	r = b.cli(t, "ui", "-write-token-file", short)
	require.Equal(t, 2, r.code, r.stderr)
	require.True(t, strings.Contains(r.stderr, "at least 16"), r.stderr)
	r = b.cli(t, "ui", "-addr", "127.0.0.1:0", "extra")
	require.Equal(t, 2, r.code, r.stderr)
}
