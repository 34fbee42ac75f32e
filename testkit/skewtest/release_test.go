package skewtest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// previousFile names the previous release: lines "commit <hash>" and "version <v>",
// the version being the release's git tag.
const previousFile = ".ci/previous-release"

// previousRelease returns the repository's root and the git revision of the previous
// release to build: IDEMFLOW_SKEW_PREVIOUS when set, else the tag that
// .ci/previous-release names (its version), else, in a clone without the tag, the
// commit it names. It fails the test when the clone's history does not hold the
// release, or when the tag and the file name different commits.
func previousRelease(t *testing.T) (root, rev string) {
	t.Helper()
	root = strings.TrimSpace(git(t, "", "rev-parse", "--show-toplevel"))
	rev = os.Getenv("IDEMFLOW_SKEW_PREVIOUS")
	if rev == "" {
		var err error
		if rev, err = releaseRev(root, filepath.Join(root, previousFile)); err != nil {
			t.Fatal(err)
		}
	}
	if err := exec.Command("git", "-C", root, "cat-file", "-e", rev+"^{commit}").Run(); err != nil {
		t.Fatalf("the previous release %s is not in this clone's history (a shallow clone?): "+
			"run `git fetch --unshallow --tags` (CI needs a full clone)", rev)
	}
	return root, rev
}

// releaseRev reads the previous release's file and returns the revision to build:
// its version's tag when the repository at root has that tag, else its commit. A tag
// that points at another commit than the file's is an error: one of them is wrong.
func releaseRev(root, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fields := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), " "); ok && !strings.HasPrefix(name, "#") {
			fields[name] = strings.TrimSpace(v)
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	commit, version := fields["commit"], fields["version"]
	if commit == "" || version == "" {
		return "", fmt.Errorf("%s needs a commit line and a version line", path)
	}
	cmd := exec.Command("git", "-C", root, "rev-parse", "--verify", "--quiet", "refs/tags/"+version+"^{commit}")
	out, err := cmd.Output()
	if err != nil { // no such tag: a clone without tags builds the commit
		return commit, nil
	}
	tagged := string(bytes.TrimSpace(out))
	if !strings.HasPrefix(tagged, commit) {
		return "", fmt.Errorf("the tag %s is at %s, but %s names the commit %s", version, tagged, path, commit)
	}
	return version, nil
}

// TestReleaseRev: the previous release is built by its tag when the clone has it, by
// its commit when not, and a tag on another commit is refused.
func TestReleaseRev(t *testing.T) {
	t.Parallel()
	repo := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("init", "-q")
	run("commit", "-q", "--allow-empty", "-m", "release")
	release := run("rev-parse", "HEAD")
	run("commit", "-q", "--allow-empty", "-m", "later")
	later := run("rev-parse", "HEAD")
	file := filepath.Join(repo, "previous-release")
	write := func(commit string) {
		t.Helper()
		text := "# a comment\ncommit " + commit + "\nversion v0.3.0\n"
		if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	check := func(want string, wantErr bool) {
		t.Helper()
		got, err := releaseRev(repo, file)
		if (err != nil) != wantErr || got != want {
			t.Fatalf("releaseRev = %q, %v; want %q (an error: %v)", got, err, want, wantErr)
		}
	}

	write(release)
	check(release, false) // no tag yet: the commit
	run("tag", "-a", "v0.3.0", release, "-m", "v0.3.0")
	check("v0.3.0", false) // the tag
	write(release[:7])
	check("v0.3.0", false) // an abbreviated commit matches the tag too
	write(later)
	check("", true) // the tag and the file disagree
}
