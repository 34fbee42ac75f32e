package keytable

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestFinishWAL reads, with pg_walinspect, the WAL records a pipelined finish (its
// fence, the finish and COMMIT in one transaction) writes for the key table, and
// counts them: the fence's row lock, one update of the row that stays on the row's
// page, so that PostgreSQL logs the new version without the columns before the first
// it changes (the update's prefix flag), and one entry in the primary key and one in
// the retention index (TestIndexEntries says which). A finish that wrote another
// record of the key table, or a row version too wide to stay on its page, fails here.
// It counts records, never bytes: what a finish writes in bytes is the bench's
// (docs/OPERATIONS.md, "What a key row costs").
func TestFinishWAL(t *testing.T) {
	t.Parallel()
	if pgtest.CitusMode() {
		t.Skip("skipped: the shards' WAL is the workers'")
	}
	ctx := context.Background()
	db := pgtest.New(t)
	walinspect := walInspectSchema(t, db.Pool)
	s := New()
	nodes := map[string]string{}
	for name, node := range keyIndexes(t, db.Pool) {
		nodes[node] = name
	}
	var table string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_relation_filenode('idemflow_keys')::text`).Scan(&table))
	nodes[table] = "idemflow_keys"

	// The first finish also makes the retention index's root page: the others count.
	for i := range 4 {
		f := finishWALClaim(t, db, s, fmt.Sprintf("k%d", i))
		var start, end string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&start))
		resp := StoredResponse{Status: 201, Headers: []byte(`{"Content-Type": ["application/json"]}`), Body: []byte(`{"id":"ch_1"}`),
			History: History{Entry: []byte(`{"attempt":1,"outcome":"finished"}`), Keep: 20}}
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		head := s.QueueHead(b, Head{Fence: f, Lock: true})
		write := s.QueueKeyWrite(b, KeyWrite{Fence: f, Held: true, Response: &resp})
		b.Queue("COMMIT")
		br := db.Pool.SendBatch(ctx, b)
		_, err := br.Exec()
		require.NoError(t, err)
		_, err = head.Read(br)
		require.NoError(t, err)
		_, err = write.Read(br)
		require.NoError(t, err)
		_, err = br.Exec()
		require.NoError(t, err)
		require.NoError(t, br.Close())
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&end))

		got := finishWALRecords(t, db, walinspect, nodes, start, end)
		if i == 0 {
			continue
		}
		require.Equal(t, map[string]int{
			"Heap/LOCK idemflow_keys":                      1,
			"Heap/UPDATE idemflow_keys same page, prefix":  1,
			"Btree/INSERT_LEAF idemflow_keys_pkey":         1,
			"Btree/INSERT_LEAF idemflow_keys_finished_idx": 1,
		}, got, "finish %d", i)
	}
}

// finishWALClaim commits a claim of key, at recovery point "one" with its request
// body, and returns its fence.
func finishWALClaim(t *testing.T, db *pgtest.DB, s *Store, key string) Fence {
	t.Helper()
	ctx := context.Background()
	c := Claim{Scope: "s", Key: key, ID: newID(t, db.Pool), Flow: "f", Method: "POST", Route: "/r",
		Fingerprint: make([]byte, 32), Body: []byte(`{"amount":100,"currency":"eur"}`), Lease: time.Minute}
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	b := &pgx.Batch{}
	q := s.QueueKeyWrite(b, KeyWrite{Claim: &c, RecoveryPoint: "one", Data: []byte(`{"charge":"ch_1"}`)})
	br := tx.SendBatch(ctx, b)
	at, err := q.Read(br)
	require.NoError(t, err)
	require.NoError(t, br.Close())
	require.NoError(t, tx.Commit(ctx))
	return Fence{Scope: "s", Key: key, ID: c.ID, LockVersion: 1, CreatedAt: at}
}

var (
	walBlock = regexp.MustCompile(`rel \d+/\d+/(\d+) fork main blk (\d+)`)
	walFlags = regexp.MustCompile(`flags 0x([0-9A-Fa-f]+)`)
)

// finishWALRecords counts the heap and B-tree records from start to end that name a
// relation of nodes (file node to name), by kind and relation; a heap update also says
// whether its two row versions share a page and whether it logs a prefix of the old.
func finishWALRecords(t *testing.T, db *pgtest.DB, walinspect string, nodes map[string]string, start, end string) map[string]int {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT resource_manager || '/' || record_type, coalesce(block_ref, ''), description
FROM `+walinspect+`.pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
WHERE resource_manager IN ('Heap', 'Heap2', 'Btree')`, start, end)
	require.NoError(t, err)
	got := map[string]int{}
	var kind, ref, desc string
	_, err = pgx.ForEachRow(rows, []any{&kind, &ref, &desc}, func() error {
		blocks := map[string]bool{}
		name := ""
		for _, m := range walBlock.FindAllStringSubmatch(ref, -1) {
			if n, ok := nodes[m[1]]; ok {
				name = n
				blocks[m[0]] = true
			}
		}
		if name == "" {
			return nil
		}
		key := kind + " " + name
		if kind == "Heap/UPDATE" || kind == "Heap/UPDATE+INIT" {
			key += map[bool]string{true: " same page", false: " two pages"}[len(blocks) == 1]
			if m := walFlags.FindStringSubmatch(desc); m != nil {
				if flags, err := strconv.ParseUint(m[1], 16, 8); err == nil && flags&0x20 != 0 { // XLH_UPDATE_PREFIX_FROM_OLD
					key += ", prefix"
				}
			}
		}
		got[key]++
		return nil
	})
	require.NoError(t, err)
	return got
}
