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
	return startUIOn(t, b, "127.0.0.1:0", env, args...)
}

var servingRe = regexp.MustCompile(`^idemflow ui: serving http://(\S+):(\d+)/ \((.+)\)$`)

// startUIOn runs `idemflow ui -addr addr` and returns http://127.0.0.1:PORT of the port
// it printed.
func startUIOn(t *testing.T, b *bundle, addr string, env []string, args ...string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-database-url", serverURL(t, b.db), "-schema", b.db.Schema, "ui", "-addr", addr}, args...)...)
	cmd.Env = append(append(os.Environ(), "DATABASE_URL=", envWriteToken+"=", envReadToken+"="), env...)
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
	m := servingRe.FindStringSubmatch(lines.Text())
	require.NotNil(t, m, lines.Text())
	go func() { _, _ = io.Copy(io.Discard, errOut) }()
	return "http://127.0.0.1:" + m[2], cmd
}

// uiRefused runs `idemflow ui` with args and requires that it refuses to start: exit
// status 2 and a message holding each of want. A run that starts serving instead is
// killed and fails the test.
func uiRefused(t *testing.T, b *bundle, env []string, args []string, want ...string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-database-url", serverURL(t, b.db), "-schema", b.db.Schema, "ui"}, args...)...)
	cmd.Env = append(append(os.Environ(), "DATABASE_URL=", envWriteToken+"=", envReadToken+"="), env...)
	errOut, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(errOut)
	var text strings.Builder
	for lines.Scan() {
		if servingRe.MatchString(lines.Text()) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			require.Failf(t, "started", "ui %q started instead of refusing: %s", args, lines.Text())
		}
		text.WriteString(lines.Text() + "\n")
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "ui %q: %s", args, text.String())
	require.Equal(t, 2, ee.ExitCode(), "ui %q: %s", args, text.String())
	for _, w := range want {
		require.Contains(t, text.String(), w, "ui %q", args)
	}
}

// get is a GET of url with the Host header host ("" keeps the URL's).
func get(t *testing.T, url, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
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
		code, body := get(t, url+"/key?scope=acct&key=dead", host)
		require.Equal(t, want, code, host)
		if want == http.StatusForbidden {
			require.NotContains(t, body, "dead", "nothing of the key is shown under %s", host)
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

// TestUIExposedAddress: on an address other machines can reach (unspecified, a
// non-loopback IP, a name) `idemflow ui` refuses to start, exit status 2, naming
// -allow-host and -read-token-file, unless given one of them; once started, it answers
// on loopback too only under localhost, its own IP literals and the allowed names, so
// a page that rebinds its name to 127.0.0.1 reads nothing; with a read token, reading
// needs a login.
func TestUIExposedAddress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keysInStates(t, b)
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "ops.example.invalid:0"} {
		uiRefused(t, b, nil, []string{"-addr", addr}, "-allow-host", "-read-token-file", envReadToken)
		uiRefused(t, b, []string{envWriteToken + "=a-write-token-of-enough-bytes"}, []string{"-addr", addr}, "-allow-host")
	}
	uiRefused(t, b, nil, []string{"-addr", "0.0.0.0:0", "-allow-host", "http://x/"}, "host")

	const page = "/key?scope=acct&key=dead"
	url, _ := startUIOn(t, b, "0.0.0.0:0", nil, "-allow-host", "ops.example.com,Other.example", "-allow-host", "third.example")
	port := portOf(t, url)
	for host, want := range map[string]int{
		"rebound.example:" + port: http.StatusForbidden, "127.0.0.1.rebound.example:" + port: http.StatusForbidden,
		"127.0.0.1:" + port: http.StatusOK, "localhost:" + port: http.StatusOK, "ops.example.com:" + port: http.StatusOK,
		"other.example": http.StatusOK, "third.example:" + port: http.StatusOK,
	} {
		code, body := get(t, url+page, host)
		require.Equal(t, want, code, host)
		if want == http.StatusForbidden {
			require.NotContains(t, body, "given up", host)
		}
	}

	file := filepath.Join(t.TempDir(), "read")
	require.NoError(t, os.WriteFile(file, []byte("a-read-token-of-enough-bytes\n"), 0o600))
	for _, env := range [][]string{nil, {envReadToken + "=another-read-token-of-enough"}} {
		args := []string{"-read-token-file", file}
		if env != nil {
			args = nil
		}
		url, _ = startUIOn(t, b, ":0", env, args...)
		code, body := get(t, url+page, "")
		require.Equal(t, http.StatusUnauthorized, code)
		require.Contains(t, body, `id="token"`)
		require.NotContains(t, body, "given up")
		code, _ = get(t, url+page, "rebound.example:"+portOf(t, url))
		require.Equal(t, http.StatusForbidden, code)
	}
}
