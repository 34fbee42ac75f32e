package keytable

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/testkit/pgtest"
)

// TestDecodeRow reads key rows of every shape (in progress and leased, released,
// finished, dead, empty bodies and data, text in several scripts) with decodeRow and
// with rows.Scan into Row's fields: the two give equal rows, and scanOne gives that
// row on a connection where decodeRow declines (text results from the simple protocol,
// timestamps scanned into a location of the connection's own).
func TestDecodeRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	s := New()
	_, err := db.Pool.Exec(ctx, `INSERT INTO idemflow_keys
	(scope, idempotency_key, id, flow, method, route, fingerprint, request_body, recovery_point, phase_data,
	 status, lock_version, attempts, last_error, origin, locked_until,
	 response_status, response_headers, response_body, finished_at)
VALUES
	('acct', 'leased', gen_random_uuid(), 'f', 'POST', '/r', '\x02aa', '{"a":1}', 'started', '{"k":"v"}',
	 'in_progress', 3, 2, NULL, 'trace-1', statement_timestamp() + interval '1 minute', NULL, NULL, NULL, NULL),
	('acct', 'released', gen_random_uuid(), 'f', 'PUT', '/r/ü', '', '', 'charge', '{}',
	 'in_progress', 1, 1, 'provider said no', NULL, NULL, NULL, NULL, NULL, NULL),
	('ακκ', 'finished', gen_random_uuid(), 'flow_二', 'POST', '/v1/charges', '\x03', '\x00ff',
	 'finished', '{"n":[1,2.5,"x"]}', 'finished', 7, 4, NULL, '', NULL,
	 201, '{"Content-Type":["application/json"]}', '{"id":"ch_1"}', statement_timestamp()),
	('acct', 'empty-answer', gen_random_uuid(), 'f', 'DELETE', '/r', '\x02', 'x', 'finished', '{}',
	 'finished', 1, 1, NULL, NULL, NULL, 204, '{}', '', statement_timestamp()),
	('acct', 'dead', gen_random_uuid(), 'f', 'POST', '/r', '\x02', 'x', 'started', '{}',
	 'dead', 2, 9, 'gave up', 'o', NULL, NULL, NULL, NULL, NULL)`)
	require.NoError(t, err)
	keys := [][2]string{{"acct", "leased"}, {"acct", "released"}, {"ακκ", "finished"}, {"acct", "empty-answer"}, {"acct", "dead"}}

	for _, k := range keys {
		rows, err := db.Pool.Query(ctx, s.lookupSQL(), k[0], k[1])
		require.NoError(t, err)
		require.True(t, rows.Next(), k)
		fast, ok := decodeRow(rows)
		if !ok {
			for i, fd := range rows.FieldDescriptions() {
				t.Logf("%d %s %d %d %q", i, fd.Name, fd.DataTypeOID, fd.Format, rows.RawValues()[i])
			}
			rows.Close()
		}
		require.True(t, ok, "%s: binary results are decoded", k)
		var r Row
		require.NoError(t, rows.Scan(&r.Scope, &r.Key, &r.ID, &r.Flow, &r.Method, &r.Route, &r.Fingerprint, &r.RequestBody,
			&r.RecoveryPoint, &r.PhaseData, &r.Status, &r.LockVersion, &r.Attempts, &r.LastError, &r.Origin, &r.CreatedAt,
			&r.LeaseLive, &r.LeaseLeftMillis, &r.ResponseStatus, &r.ResponseHeaders, &r.ResponseBody))
		rows.Close()
		require.NoError(t, rows.Err())
		require.Equal(t, r, *fast, k)
		require.Equal(t, r.CreatedAt.Location(), fast.CreatedAt.Location(), k)
		require.True(t, r.CreatedAt.Equal(fast.CreatedAt), k)
		if fast.RequestBody != nil {
			require.Equal(t, len(fast.RequestBody), cap(fast.RequestBody), "%s: an append to a column cannot reach the next", k)
		}
	}
	row, err := s.Lookup(ctx, db.Pool, "ακκ", "finished")
	require.NoError(t, err)
	require.Equal(t, 201, *row.ResponseStatus)
	require.Equal(t, `{"n": [1, 2.5, "x"]}`, string(row.PhaseData), "jsonb's text, without its version byte")
	require.Equal(t, []byte{0x00, 0xff}, row.RequestBody)

	decodeDeclined(t, db, s, keys)
}

// decodeDeclined is TestDecodeRow's second half: where decodeRow declines (the simple
// protocol, a timestamptz codec of the connection's own), scanOne scans the same rows.
func decodeDeclined(t *testing.T, db *pgtest.DB, s *Store, keys [][2]string) {
	ctx := context.Background()
	for name, configure := range map[string]func(*pgxpool.Config){
		"SimpleProtocol": func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol },
		"ScanLocation": func(c *pgxpool.Config) {
			c.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
				conn.TypeMap().RegisterType(&pgtype.Type{Name: "timestamptz", OID: pgtype.TimestamptzOID,
					Codec: &pgtype.TimestamptzCodec{ScanLocation: time.UTC}})
				return nil
			}
		},
	} {
		cfg, err := pgxpool.ParseConfig(db.URL)
		require.NoError(t, err)
		configure(cfg)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer pool.Close()
		for _, k := range keys {
			rows, err := pool.Query(ctx, s.lookupSQL(), k[0], k[1])
			require.NoError(t, err)
			require.True(t, rows.Next())
			_, ok := decodeRow(rows)
			require.False(t, ok, "%s: %s", name, k)
			rows.Close()
			want, err := s.Lookup(ctx, db.Pool, k[0], k[1])
			require.NoError(t, err)
			got, err := s.Lookup(ctx, pool, k[0], k[1])
			require.NoError(t, err)
			if name == "ScanLocation" {
				require.Equal(t, time.UTC, got.CreatedAt.Location())
				got.CreatedAt = got.CreatedAt.Local()
			}
			want.LeaseLeftMillis, got.LeaseLeftMillis = 0, 0 // read at two times
			require.Equal(t, want, got, "%s: %s", name, k)
		}
	}
}
