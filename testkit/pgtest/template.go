package pgtest

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// dataTemplate is the process's template data directory for dedicated servers: the
// first one a test asks for runs initdb into it, and every dedicated server copies it
// (a copy of a freshly initialised, cleanly shut down cluster, which is what initdb
// would have made) instead of running initdb again: initdb costs about a second and a
// half of CPU, the copy a tenth of that. It is kept only while Main runs the tests,
// which removes it after them (templates.allowed); without Main each dedicated server
// runs initdb, leaving nothing behind.
var templates struct {
	mu      sync.Mutex
	allowed bool   // Main is running the tests and removes dir after them
	dir     string // temporary directory holding data; "" until made
	data    string
	err     error // of the one attempt to make it
	made    bool
}

// allowTemplate lets dedicated servers copy a template data directory until the
// returned function removes it (MainWith, around the tests).
func allowTemplate() (remove func()) {
	templates.mu.Lock()
	templates.allowed = true
	templates.mu.Unlock()
	return func() {
		templates.mu.Lock()
		defer templates.mu.Unlock()
		templates.allowed = false
		if templates.dir != "" {
			_ = os.RemoveAll(templates.dir)
		}
		templates.dir, templates.data, templates.err, templates.made = "", "", nil, false
	}
}

// newDataDir makes data (in dir) a freshly initialised data directory owned by owner:
// a copy of the template when Main allows one, else initdb's own.
func newDataDir(ctx context.Context, binDir, dir, data string, owner *osUser) error {
	templates.mu.Lock()
	defer templates.mu.Unlock() // copies are serialised: each is short, and the disk is one
	if !templates.allowed {
		return initdb(ctx, binDir, dir, data, owner)
	}
	if !templates.made {
		templates.made = true
		// Every later dedicated server copies it: like the shared server's start, it
		// is bounded by sharedStartTimeout, not by this caller's context.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sharedStartTimeout)
		templates.err = makeTemplate(tctx, binDir, owner)
		cancel()
	}
	if templates.err != nil {
		return templates.err
	}
	if err := copyTree(templates.data, data, owner); err != nil {
		return fmt.Errorf("pgtest: copy the template data directory: %w", err)
	}
	return nil
}

// makeTemplate runs initdb into a new temporary directory, the template.
func makeTemplate(ctx context.Context, binDir string, owner *osUser) error {
	dir, err := os.MkdirTemp("", "pgtest-template-")
	if err != nil {
		return fmt.Errorf("pgtest: temporary directory: %w", err)
	}
	if owner != nil {
		if err := os.Chown(dir, owner.uid, owner.gid); err != nil {
			_ = os.RemoveAll(dir)
			return fmt.Errorf("pgtest: hand %s to OS user %s: %w", dir, owner.name, err)
		}
	}
	data := filepath.Join(dir, "data")
	if err := initdb(ctx, binDir, dir, data, owner); err != nil {
		_ = os.RemoveAll(dir)
		return err
	}
	templates.dir, templates.data = dir, data
	return nil
}

// copyTree copies the directory tree src to dst (which must not exist) with the same
// permissions, owned by owner (nil: this process's user). A data directory holds
// directories and regular files only; anything else is refused.
func copyTree(src, dst string, owner *osUser) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(to, info.Mode().Perm()); err != nil {
				return err
			}
			if err := os.Chmod(to, info.Mode().Perm()); err != nil { // past the umask
				return err
			}
		case info.Mode().IsRegular():
			if err := copyFile(path, to, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: not a directory or a regular file", path)
		}
		if owner != nil {
			return os.Chown(to, owner.uid, owner.gid)
		}
		return nil
	})
}

func copyFile(from, to string, perm fs.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(to, perm)
}
