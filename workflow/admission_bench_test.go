package workflow

import (
	"context"
	"testing"
	"time"
)

// BenchmarkAdmission is the CPU an attempt spends in admission with no contention:
// a place taken and given back (Place), and with the hopeless-queue checks and one
// pre-claim connection wait followed (Door).
func BenchmarkAdmission(b *testing.B) {
	ctx := context.Background()
	b.Run("Place", func(b *testing.B) {
		a := newAdmission(64)
		for b.Loop() {
			if err := a.admit(ctx, AdmitWaitDefault); err != nil {
				b.Fatal(err)
			}
			a.done()
		}
	})
	b.Run("Door", func(b *testing.B) {
		a := newAdmission(64)
		for b.Loop() {
			if hopeless(ctx, AdmitWaitDefault) >= 0 && a.conns.expected() > time.Hour {
				b.Fatal("refused")
			}
			if err := a.admit(ctx, AdmitWaitDefault); err != nil {
				b.Fatal(err)
			}
			a.conns.pending.Add(1)
			start := time.Now()
			a.conns.observe(time.Since(start))
			a.conns.pending.Add(-1)
			a.done()
		}
	})
}
