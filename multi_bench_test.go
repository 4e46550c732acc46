package dlock

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkMultiLock: an uncontended Lock+Unlock of k keys (that exist
// already), by one MultiMutex and by k Mutexes locked one after the other
// in key order (what a caller does without MultiMutex), on the test
// server (or MONGODB_URI). It reports the commands of each, counted as
// TestRoundTrips counts them.
//
//	go test -run '^$' -bench BenchmarkMultiLock -benchtime 200x .
func BenchmarkMultiLock(b *testing.B) {
	for _, k := range []int{1, 2, 8, 64} {
		keys := make([]string, k)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%03d", i)
		}
		b.Run(fmt.Sprintf("k=%d/multi", k), func(b *testing.B) {
			c := newClient(b, newColl(b))
			ctx := context.Background()
			m := c.NewMultiMutex(keys)
			if err := m.Lock(ctx); err != nil { // the documents, and the floor's
				b.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
			mark := commands.total.Load()
			for b.Loop() {
				if err := m.Lock(ctx); err != nil {
					b.Fatal(err)
				}
				if err := m.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			reportCommands(b, mark, b.N)
		})
		b.Run(fmt.Sprintf("k=%d/mutexes", k), func(b *testing.B) {
			c := newClient(b, newColl(b))
			ctx := context.Background()
			ms := make([]*Mutex, k)
			for i, key := range keys {
				ms[i] = c.NewMutex(key)
			}
			lockAll := func() {
				for _, m := range ms {
					if err := m.Lock(ctx); err != nil {
						b.Fatal(err)
					}
				}
				for _, m := range ms {
					if err := m.Unlock(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			lockAll()
			mark := commands.total.Load()
			for b.Loop() {
				lockAll()
			}
			reportCommands(b, mark, b.N)
		})
	}
}
