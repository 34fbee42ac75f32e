package keytable_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/keytable"
	"github.com/idemflow/idemflow/testkit/pgtest"
)

// Benchmarks of the store's hot statements, each in the shape the engine sends it: one
// round trip on one warm connection. For profiling:
//
//	go test -run '^$' -bench . -benchtime 2000x -cpuprofile cpu.out ./store/

var benchIDs atomic.Int64

// benchClaim is a claim with a fresh key and id.
func benchClaim() keytable.Claim {
	n := benchIDs.Add(1)
	return claim("bench", fmt.Sprintf("k%d", n), fmt.Sprintf("00000000-0000-4000-8000-%012d", n))
}

// benchConn is one connection of a fresh schema's pool, held for the benchmark.
func benchConn(b *testing.B) *pgxpool.Conn {
	b.Helper()
	db := pgtest.New(b)
	conn, err := db.Pool.Acquire(context.Background())
	require.NoError(b, err)
	b.Cleanup(conn.Release)
	return conn
}

// sendTx sends BEGIN (unless the transaction is open already), what queue adds and
// COMMIT as one batch, and reads it with read.
func sendTx(ctx context.Context, conn *pgxpool.Conn, st *keytable.Store, w keytable.KeyWrite, begin bool) (time.Time, error) {
	bt := &pgx.Batch{}
	if begin {
		bt.Queue("BEGIN")
	}
	q := st.QueueKeyWrite(bt, w)
	bt.Queue("COMMIT")
	br := conn.SendBatch(ctx, bt)
	defer br.Close()
	if begin {
		if _, err := br.Exec(); err != nil {
			return time.Time{}, err
		}
	}
	at, err := q.Read(br)
	if err != nil {
		return at, err
	}
	tag, err := br.Exec()
	if err != nil {
		return at, err
	}
	if tag.String() != "COMMIT" {
		return at, fmt.Errorf("commit answered %q", tag)
	}
	return at, br.Close()
}

// BenchmarkClaim is a new key's claim and its insert at COMMIT, as the engine sends
// them for a first tx phase at READ COMMITTED, less the phase's own statements: BEGIN,
// the claim lock and the look-up in one round trip, then the insert and COMMIT.
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	conn := benchConn(b)
	st := keytable.New()
	b.ReportAllocs()
	for b.Loop() {
		c := benchClaim()
		bt := &pgx.Batch{}
		bt.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
		look := st.QueueClaimLook(bt, c)
		br := conn.SendBatch(ctx, bt)
		_, err := br.Exec()
		var at time.Time // the transaction's start: the inserted row's created_at
		if err == nil {
			var locked bool
			locked, at, _, err = look.Read(br)
			if errors.Is(err, keytable.ErrNotFound) {
				err = nil
			}
			if err == nil && !locked {
				err = fmt.Errorf("key %s: claim lock busy", c.Key)
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			_, err = sendTx(ctx, conn, st, keytable.KeyWrite{Claim: &c, Fence: keytable.Fence{CreatedAt: at}, Held: true, RecoveryPoint: "create_charge", Data: []byte(`{"charge_id":"ch_1"}`)}, false)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimFinish is a key claimed and finished by the engine alone (a call phase
// that answers): BEGIN, the claim with the insert of a finished row, and COMMIT in one
// round trip.
func BenchmarkClaimFinish(b *testing.B) {
	ctx := context.Background()
	conn := benchConn(b)
	st := keytable.New()
	resp := keytable.StoredResponse{Status: 201, Headers: []byte(`{"Content-Type":["application/json"]}`),
		Body: []byte(`{"id":"ch_1","amount":1999,"currency":"usd","status":"succeeded"}`)}
	b.ReportAllocs()
	for b.Loop() {
		c := benchClaim()
		_, err := sendTx(ctx, conn, st, keytable.KeyWrite{Claim: &c, Response: &resp}, true)
		if err != nil {
			b.Fatal(err)
		}
	}
}

// claimFor commits a claim of c on its own.
// claimFor claims c and returns its row's created_at (the last part of its fence).
func claimFor(b *testing.B, conn *pgxpool.Conn, c keytable.Claim) time.Time {
	st := keytable.New()
	at, err := sendTx(context.Background(), conn, st, keytable.KeyWrite{Claim: &c, RecoveryPoint: "started", Data: []byte(`{}`)}, true)
	require.NoError(b, err)
	return at
}

// BenchmarkAdvance is BEGIN, the fenced advance of one key and COMMIT in one round trip.
func BenchmarkAdvance(b *testing.B) {
	ctx := context.Background()
	conn := benchConn(b)
	st := keytable.New()
	c := benchClaim()
	f := keytable.Fence{Scope: c.Scope, Key: c.Key, ID: c.ID, LockVersion: 1, CreatedAt: claimFor(b, conn, c)}
	b.ReportAllocs()
	for b.Loop() {
		_, err := sendTx(ctx, conn, st, keytable.KeyWrite{Fence: f, RecoveryPoint: "create_charge", Data: []byte(`{"charge_id":"ch_1"}`), Lease: time.Minute}, true)
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLookup is the replay path's only statement.
func BenchmarkLookup(b *testing.B) {
	ctx := context.Background()
	conn := benchConn(b)
	st := keytable.New()
	c := benchClaim()
	claimFor(b, conn, c)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := st.Lookup(ctx, conn, c.Scope, c.Key); err != nil {
			b.Fatal(err)
		}
	}
}
