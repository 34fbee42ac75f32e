package store_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/pgtest"
	"github.com/idemflow/idemflow/store"
)

// Benchmarks of the store's hot statements, each in the shape the engine sends it: one
// round trip on one warm connection. For profiling:
//
//	go test -run '^$' -bench . -benchtime 2000x -cpuprofile cpu.out ./store/

var benchIDs atomic.Int64

// benchClaim is a claim with a fresh key and id.
func benchClaim() store.Claim {
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

// sendTx sends BEGIN, what queue adds and COMMIT as one batch, and reads it with read.
func sendTx(ctx context.Context, conn *pgxpool.Conn, queue func(*pgx.Batch), read func(pgx.BatchResults) error) error {
	bt := &pgx.Batch{}
	bt.Queue("BEGIN")
	queue(bt)
	bt.Queue("COMMIT")
	br := conn.SendBatch(ctx, bt)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return err
	}
	if err := read(br); err != nil {
		return err
	}
	tag, err := br.Exec()
	if err != nil {
		return err
	}
	if !store.IsCommitted(tag) {
		return fmt.Errorf("commit answered %q", tag)
	}
	return br.Close()
}

// BenchmarkClaim is BEGIN, the claim of a fresh key and COMMIT in one round trip.
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	conn := benchConn(b)
	st := store.New()
	b.ReportAllocs()
	for b.Loop() {
		c := benchClaim()
		err := sendTx(ctx, conn, func(bt *pgx.Batch) { st.QueueClaim(bt, c) }, func(br pgx.BatchResults) error {
			row, err := st.ReadClaim(br)
			if err == nil && !row.Inserted {
				err = fmt.Errorf("key %s was not inserted", c.Key)
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimFinish is a one-phase key: BEGIN, the claim, the fenced finish and
// COMMIT in one round trip.
func BenchmarkClaimFinish(b *testing.B) {
	ctx := context.Background()
	conn := benchConn(b)
	st := store.New()
	resp := store.StoredResponse{Status: 201, Headers: []byte(`{"Content-Type":["application/json"]}`),
		Body: []byte(`{"id":"ch_1","amount":1999,"currency":"usd","status":"succeeded"}`)}
	b.ReportAllocs()
	for b.Loop() {
		c := benchClaim()
		f := store.Fence{Scope: c.Scope, Key: c.Key, ID: c.ID, LockVersion: 1}
		err := sendTx(ctx, conn, func(bt *pgx.Batch) {
			st.QueueClaim(bt, c)
			st.QueueFinish(bt, f, []byte(`{}`), resp)
		}, func(br pgx.BatchResults) error {
			if _, err := st.ReadClaim(br); err != nil {
				return err
			}
			return st.ReadFenced(br)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAdvance is BEGIN, the fenced advance of one key and COMMIT in one round trip.
func BenchmarkAdvance(b *testing.B) {
	ctx := context.Background()
	conn := benchConn(b)
	st := store.New()
	c := benchClaim()
	require.NoError(b, sendTx(ctx, conn, func(bt *pgx.Batch) { st.QueueClaim(bt, c) }, func(br pgx.BatchResults) error {
		_, err := st.ReadClaim(br)
		return err
	}))
	f := store.Fence{Scope: c.Scope, Key: c.Key, ID: c.ID, LockVersion: 1}
	b.ReportAllocs()
	for b.Loop() {
		err := sendTx(ctx, conn, func(bt *pgx.Batch) {
			st.QueueAdvance(bt, f, "create_charge", []byte(`{"charge_id":"ch_1"}`), time.Minute)
		}, st.ReadFenced)
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLookup is the replay path's only statement.
func BenchmarkLookup(b *testing.B) {
	ctx := context.Background()
	conn := benchConn(b)
	st := store.New()
	c := benchClaim()
	require.NoError(b, sendTx(ctx, conn, func(bt *pgx.Batch) { st.QueueClaim(bt, c) }, func(br pgx.BatchResults) error {
		_, err := st.ReadClaim(br)
		return err
	}))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := st.Lookup(ctx, conn, c.Scope, c.Key); err != nil {
			b.Fatal(err)
		}
	}
}
