package workflow_test

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/workflow"
)

// gcmSealer is a real sealer: AES-256-GCM, a random nonce before the ciphertext, the
// scope and key as additional data.
type gcmSealer struct{ aead cipher.AEAD }

func newGCMSealer(t *testing.T) *gcmSealer {
	t.Helper()
	k := make([]byte, 32)
	_, err := rand.Read(k)
	require.NoError(t, err)
	block, err := aes.NewCipher(k)
	require.NoError(t, err)
	aead, err := cipher.NewGCM(block)
	require.NoError(t, err)
	return &gcmSealer{aead: aead}
}

func (s *gcmSealer) Seal(_ context.Context, scope, key string, plain []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return s.aead.Seal(nonce, nonce, plain, []byte(scope+"\x00"+key)), nil
}

func (s *gcmSealer) Open(_ context.Context, scope, key string, sealed []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return nil, errors.New("sealed value too short")
	}
	return s.aead.Open(nil, sealed[:n], sealed[n:], []byte(scope+"\x00"+key))
}

// TestSealer: with a Sealer the stored answer is ciphertext, marked sealed, and a
// retry replays the first answer byte for byte; an engine without a Sealer refuses
// the key with ErrNewerFormat (retryable) and one with another key fails to open it,
// both leaving the row as it was; a ciphertext moved to another key does not open;
// answers stored in plain text are still replayed by the sealing engine.
func TestSealer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, setupOpts{}) // b.engine has no Sealer
	sealing := b.newEngine(t, setupOpts{cfg: &workflow.Config{Sealer: newGCMSealer(t)}})
	const body = `{"amount":12}`

	first, err := sealing.Do(ctx, chargeReq("s", "k1", body))
	require.NoError(t, err)
	require.NotEmpty(t, first.Response.Body)
	var storedBody, headers []byte
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT response_body, response_headers::text FROM idemflow_keys
		WHERE scope = 's' AND idempotency_key = 'k1'`).Scan(&storedBody, &headers))
	require.NotContains(t, string(storedBody), string(first.Response.Body), "the stored answer is sealed")
	require.Contains(t, string(headers), `"idemflow:format": 2`, "and marked so")
	for range 2 {
		again, err := sealing.Do(ctx, chargeReq("s", "k1", body))
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, first.Response.Status, again.Response.Status)
		require.Equal(t, first.Response.Body, again.Response.Body, "byte for byte")
		for _, h := range []string{"Content-Type", "Location"} { // the stored headers
			require.Equal(t, first.Response.Header[h], again.Response.Header[h], h)
		}
	}

	row := keyRow(t, b.db, "s", "k1")
	_, err = b.engine.Do(ctx, chargeReq("s", "k1", body))
	require.ErrorIs(t, err, workflow.ErrNewerFormat, "a build without the sealer does not replay ciphertext")
	other := b.newEngine(t, setupOpts{cfg: &workflow.Config{Sealer: newGCMSealer(t)}})
	res, err := other.Do(ctx, chargeReq("s", "k1", body))
	require.Error(t, err, "another key does not open it")
	require.Nil(t, res)
	require.Equal(t, row, keyRow(t, b.db, "s", "k1"), "refusals change nothing")

	_, err = sealing.Do(ctx, chargeReq("s", "k2", body))
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE idemflow_keys SET response_body = (SELECT response_body FROM idemflow_keys
		WHERE scope = 's' AND idempotency_key = 'k1') WHERE scope = 's' AND idempotency_key = 'k2'`)
	require.NoError(t, err)
	_, err = sealing.Do(ctx, chargeReq("s", "k2", body))
	require.Error(t, err, "a sealed answer opens only on its own key")

	plain, err := b.engine.Do(ctx, chargeReq("s", "p1", body))
	require.NoError(t, err)
	replayed, err := sealing.Do(ctx, chargeReq("s", "p1", body))
	require.NoError(t, err)
	require.True(t, replayed.Replayed)
	require.Equal(t, plain.Response.Body, replayed.Response.Body, "plain answers stay readable")
}
