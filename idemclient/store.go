package idemclient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Store keeps the keys of pending operations, so that a process that restarts before
// an operation's final answer retries it with the key it sent before, and the server
// answers it once. Implementations must be safe for concurrent use, and PutIfAbsent
// atomic, also across processes that share the store. FileStore keeps keys in a
// directory; an SQL table with a primary key on the operation does it in a database
// (see the package's SQL store example).
//
// If the store is lost (its directory or table deleted, a machine replaced), the
// operations it held get new keys on their next attempt, and the server sees new
// operations: an operation that had already taken effect under its old key runs a
// second time. A second charge, a second transfer. Keep the store as durable as the
// record of what the operations are for, or derive keys from the operations (KeyFrom),
// which need no store at all.
type Store interface {
	// PutIfAbsent saves key as op's key unless op has one, and returns op's key: the
	// one saved before, or key. It returns once the key is durable.
	PutIfAbsent(ctx context.Context, op, key string) (string, error)
	// Delete forgets op's key. Forgetting an op that has none is not an error.
	Delete(ctx context.Context, op string) error
}

// PendingKey returns the key of the pending operation op ("charge order 17"): the key
// store holds for op from an earlier call, in this process or one before a restart, or
// a new key (NewKey), durable in store before it is returned. Send every attempt of op
// with this key (WithKey), and call store.Delete(ctx, op) only once the operation's
// final answer is recorded where the caller needs it: a key forgotten earlier is a new
// operation on the next attempt. The error wraps store's, or ErrInvalidKey when store
// returns an invalid key.
func PendingKey(ctx context.Context, store Store, op string) (string, error) {
	if op == "" {
		return "", errors.New("idemclient: PendingKey: empty operation name")
	}
	key, err := store.PutIfAbsent(ctx, op, NewKey())
	if err != nil {
		return "", fmt.Errorf("idemclient: keep the key of %q: %w", op, err)
	}
	if err := ValidateKey(key); err != nil {
		return "", fmt.Errorf("idemclient: the store's key for %q: %w", op, err)
	}
	return key, nil
}

// FileStore is a Store in a directory: one file per pending operation, named by the
// SHA-256 of the operation's name and holding its key. Saving a key writes and syncs a
// temporary file, then links it into place (which fails if the operation has a key),
// so a crash never leaves a half-written key and two processes that save keys for one
// operation at once agree on one. It needs a local file system with hard links; keep
// it on the disk that outlives the process (not a tmpfs).
type FileStore struct {
	dir string
}

// NewFileStore returns a FileStore in dir, which it creates (mode 0700) if need be.
func NewFileStore(dir string) (*FileStore, error) {
	if dir == "" {
		return nil, errors.New("idemclient: NewFileStore: empty directory name")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("idemclient: create the key directory: %w", err)
	}
	return &FileStore{dir: dir}, nil
}

func (s *FileStore) path(op string) string {
	sum := sha256.Sum256([]byte(op))
	return filepath.Join(s.dir, hex.EncodeToString(sum[:])+".key")
}

// PutIfAbsent implements Store.
func (s *FileStore) PutIfAbsent(ctx context.Context, op, key string) (string, error) {
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	path := s.path(op)
	saved, err := s.read(path)
	switch {
	case err == nil:
		return saved, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("idemclient: read key: %w", err)
	}
	tmp, err := os.CreateTemp(s.dir, "pending-*.tmp")
	if err != nil {
		return "", fmt.Errorf("idemclient: save key: %w", err)
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after a successful link
	_, err = tmp.WriteString(key + "\n")
	err = errors.Join(err, tmp.Sync(), tmp.Close())
	if err != nil {
		return "", fmt.Errorf("idemclient: save key: %w", err)
	}
	if err := os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
		return s.read(path) // another call saved one first
	} else if err != nil {
		return "", fmt.Errorf("idemclient: save key: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		return "", fmt.Errorf("idemclient: save key: %w", err)
	}
	return key, nil
}

// Delete implements Store.
func (s *FileStore) Delete(ctx context.Context, op string) error {
	if err := os.Remove(s.path(op)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("idemclient: forget key: %w", err)
	}
	return syncDir(s.dir)
}

func (s *FileStore) read(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	key := strings.TrimSuffix(string(b), "\n")
	if err := ValidateKey(key); err != nil {
		return "", fmt.Errorf("idemclient: %s: %w", path, err)
	}
	return key, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
