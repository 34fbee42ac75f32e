package testflow

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
)

// Sealer is a workflow.Sealer for tests: AES-256-GCM under a key made of 32 copies of
// one byte, a random nonce before the ciphertext, the scope and key as additional
// data. Two Sealers of the same byte open each other's values; of another, not.
type Sealer struct{ aead cipher.AEAD }

// NewSealer returns the Sealer of key byte k.
func NewSealer(k byte) *Sealer {
	block, err := aes.NewCipher(bytes.Repeat([]byte{k}, 32))
	if err != nil {
		panic(err) // a 32-byte key: cannot fail
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return &Sealer{aead: aead}
}

// Seal encrypts plain for (scope, key).
func (s *Sealer) Seal(_ context.Context, scope, key string, plain []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return s.aead.Seal(nonce, nonce, plain, []byte(scope+"\x00"+key)), nil
}

// Open decrypts what Seal returned for (scope, key).
func (s *Sealer) Open(_ context.Context, scope, key string, sealed []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return nil, errors.New("sealed value too short")
	}
	return s.aead.Open(nil, sealed[:n], sealed[n:], []byte(scope+"\x00"+key))
}
