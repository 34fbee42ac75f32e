package attempt

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/internal/vocab"
)

// An entry's JSON is json.Marshal's, byte for byte: the history column and `keys show
// -json` hold the same form (TestInspectKeyHistory), whichever encoder wrote it.
func TestAttemptJSON(t *testing.T) {
	at := time.Date(2026, 12, 1, 23, 0, 0, 123456789, time.FixedZone("x", 3600))
	cases := []vocab.Attempt{
		{},
		{Attempt: 1, By: vocab.ExecutorClient, From: "started", Phases: []string{"reserve", "pay"}, Outcome: vocab.OutcomeFinished, Millis: 3},
		{Attempt: 2, By: vocab.ExecutorSweeper, From: "reserve", Phases: []string{}, Outcome: vocab.OutcomeReleased, Phase: "pay",
			Error: `provider: 503 "busy" <retry> & \ later` + "\n\t\x00\x1f", Millis: -1},
		{Attempt: 7, Outcome: vocab.OutcomeAbandoned, Reached: "reserve", LeaseLive: true, At: at},
		{Attempt: 1, Outcome: vocab.OutcomeFinished, Millis: 4, At: at, Derived: true},
		{Attempt: -3, By: vocab.ExecutorOperator, Outcome: vocab.OutcomeRedriven, At: time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC)},
		{Outcome: "x", Error: "invalid \xff\xfe utf-8, \u2028 \u2029 é 世界 \U0001F600", Phases: []string{"\x7f", ""}},
	}
	for _, a := range cases {
		want, err := json.Marshal(a)
		require.NoError(t, err)
		got, ok := appendJSON([]byte("prefix"), &a)
		require.True(t, ok)
		require.Equal(t, "prefix"+string(want), string(got))
	}
	// An At json.Marshal refuses: no entry either way.
	bad := vocab.Attempt{At: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}
	_, err := json.Marshal(bad)
	require.Error(t, err)
	_, ok := appendJSON(nil, &bad)
	require.False(t, ok)
	require.Empty(t, Entry(bad, 3).Entry)
	h := Entry(cases[1], 3)
	require.Equal(t, 3, h.Keep)
	want, err := json.Marshal(cases[1])
	require.NoError(t, err)
	require.Equal(t, "["+string(want)+"]", string(h.Entry), "the array the statement takes")
}

func FuzzAttemptJSON(f *testing.F) {
	f.Add(1, "client", "started", "reserve", "finished", "", "", int64(3), "", false, int64(0))
	f.Add(-2, "", "a\"b", "<p>", "x&y", "pay", "\xff\n\u2028", int64(-7), "r\\", true, int64(1764630000123456789))
	f.Fuzz(func(t *testing.T, n int, by, from, phase1, outcome, phase, msg string, ms int64, reached string, live bool, nanos int64) {
		a := vocab.Attempt{Attempt: n, By: vocab.Executor(by), From: from, Phases: []string{phase1, phase}, Outcome: vocab.Outcome(outcome),
			Phase: phase, Error: msg, Millis: ms, Reached: reached, LeaseLive: live}
		if nanos != 0 {
			a.At = time.Unix(0, nanos).UTC()
		}
		want, err := json.Marshal(a)
		got, ok := appendJSON(nil, &a)
		require.Equal(t, err == nil, ok)
		if ok {
			require.Equal(t, string(want), string(got))
		}
	})
}

// BenchmarkHistoryEntry is the entry of a finish as the engine builds it: with the
// appender, and with json.Marshal (before).
func BenchmarkHistoryEntry(b *testing.B) {
	a := vocab.Attempt{Attempt: 1, By: vocab.ExecutorClient, From: "started", Phases: []string{"reserve", "pay"}, Outcome: vocab.OutcomeFinished, Millis: 3}
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if len(Entry(a, 10).Entry) == 0 {
				b.Fatal("no entry")
			}
		}
	})
	b.Run("marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if out, err := json.Marshal(a); err != nil || len(out) == 0 {
				b.Fatal("no entry")
			}
		}
	})
}
