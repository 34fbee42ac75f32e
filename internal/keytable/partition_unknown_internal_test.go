package keytable

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestClaimInsertFailsClosed: the claim that inserts at commit takes the partitioned
// layout's form (the claim lock, the absence check, the insert: three statements in
// its one round trip) until the Store has learnt that its key table is plain; once it
// has, it is the plain form's single statement, as before (the hot path is unchanged).
func TestClaimInsertFailsClosed(t *testing.T) {
	t.Parallel()
	c := Claim{Scope: "s", Key: "k", ID: "00000000-0000-4000-8000-000000000001", Flow: "f", Method: "POST", Route: "/r"}
	for _, tc := range []struct {
		name   string
		learnt int32 // 0 unknown, 1 plain, 2 partitioned
		want   int
	}{{"Unknown", 0, 3}, {"Plain", 1, 1}, {"Partitioned", 2, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := New()
			s.learnt.partitioned.Store(tc.learnt)
			b := &pgx.Batch{}
			s.QueueKeyWrite(b, KeyWrite{Claim: &c, RecoveryPoint: "started", Data: []byte("{}")})
			require.Equal(t, tc.want, b.Len(), "statements of the claim that inserts")
			b = &pgx.Batch{}
			s.QueueKeyWrite(b, KeyWrite{Claim: &c, Response: &StoredResponse{Status: 201, Headers: []byte("{}"), Body: []byte("ok")}})
			require.Equal(t, tc.want, b.Len(), "statements of the claim that inserts a finished row")
			require.Equal(t, tc.learnt == 1, s.KnownUnpartitioned(), "a pipelined claim inserts at once only on a table learnt plain")
		})
	}
}
