package idemclient_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/idemclient"
)

// storeTests checks a Store: two handles on one store (two processes, or one process
// before and after a restart) agree on one key per operation, even when they ask at
// once, and Delete makes the name a new operation.
func storeTests(t *testing.T, open func(t *testing.T) idemclient.Store) {
	ctx := context.Background()
	t.Run("ConcurrentHandlesAgree", func(t *testing.T) {
		a, b := open(t), open(t)
		for _, op := range []string{"op-1", "op-2", "charge order 17"} {
			keys := make([]string, 16)
			var wg sync.WaitGroup
			for i := range keys {
				wg.Go(func() {
					store := a
					if i%2 == 1 {
						store = b
					}
					k, err := idemclient.PendingKey(ctx, store, op)
					require.NoError(t, err)
					keys[i] = k
				})
			}
			wg.Wait()
			for _, k := range keys {
				require.Equal(t, keys[0], k, "one key for %q", op)
			}
		}
	})
	t.Run("KeptAcrossARestart", func(t *testing.T) {
		key, err := idemclient.PendingKey(ctx, open(t), "renewal sub_9")
		require.NoError(t, err)
		again, err := idemclient.PendingKey(ctx, open(t), "renewal sub_9")
		require.NoError(t, err)
		require.Equal(t, key, again)
		other, err := idemclient.PendingKey(ctx, open(t), "renewal sub_10")
		require.NoError(t, err)
		require.NotEqual(t, key, other)
	})
	t.Run("DeleteForgets", func(t *testing.T) {
		store := open(t)
		key, err := idemclient.PendingKey(ctx, store, "payout 5")
		require.NoError(t, err)
		require.NoError(t, store.Delete(ctx, "payout 5"))
		require.NoError(t, store.Delete(ctx, "payout 5"), "forgetting twice is fine")
		fresh, err := idemclient.PendingKey(ctx, open(t), "payout 5")
		require.NoError(t, err)
		require.NotEqual(t, key, fresh)
	})
	t.Run("EmptyOperation", func(t *testing.T) {
		_, err := idemclient.PendingKey(ctx, open(t), "")
		require.Error(t, err)
	})
}

func TestFileStore(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "pending")
	storeTests(t, func(t *testing.T) idemclient.Store {
		s, err := idemclient.NewFileStore(dir)
		require.NoError(t, err)
		return s
	})

	t.Run("NoTemporaryFilesLeft", func(t *testing.T) {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			require.Equal(t, ".key", filepath.Ext(e.Name()), e.Name())
		}
	})
	t.Run("CorruptKeyIsAnError", func(t *testing.T) {
		d := t.TempDir()
		s, err := idemclient.NewFileStore(d)
		require.NoError(t, err)
		_, err = idemclient.PendingKey(context.Background(), s, "op")
		require.NoError(t, err)
		entries, err := os.ReadDir(d)
		require.NoError(t, err)
		require.Len(t, entries, 1)
		require.NoError(t, os.WriteFile(filepath.Join(d, entries[0].Name()), []byte("bad\tkey\n"), 0o600))
		_, err = idemclient.PendingKey(context.Background(), s, "op")
		require.ErrorIs(t, err, idemclient.ErrInvalidKey)
	})
	t.Run("EmptyDirectoryName", func(t *testing.T) {
		_, err := idemclient.NewFileStore("")
		require.Error(t, err)
	})
}
