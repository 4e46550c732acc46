package dlock

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Readers share, a writer excludes everyone; TryLock and
// TryRLock say ErrLocked; a writer's token exceeds every token before it.
func TestRWMutex(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		a, b, w := sp.client(t), sp.client(t), sp.client(t)
		ra, rb, rw := a.NewRWMutex("k", WithData([]byte("reader a"))), b.NewRWMutex("k"), w.NewRWMutex("k", WithData([]byte("writer")))
		require.NoError(t, ra.RLock(ctx))
		require.NoError(t, rb.RLock(ctx), "two Clients read at once")
		assert.ErrorIs(t, rw.TryLock(ctx), ErrLocked, "no writer while readers hold")
		hs, err := w.Holders(ctx, "k")
		require.NoError(t, err)
		require.Len(t, hs, 2)
		assert.Equal(t, Holder{Owner: a.Owner(), Token: ra.Lease().Token(), Data: []byte("reader a"), Shared: true}, hs[0])
		assert.Equal(t, Holder{Owner: b.Owner(), Token: rb.Lease().Token(), Shared: true}, hs[1])
		readTokens := []Token{ra.Lease().Token(), rb.Lease().Token()}

		require.NoError(t, ra.RUnlock(ctx))
		require.NoError(t, rb.RUnlock(ctx))
		require.NoError(t, rw.Lock(ctx))
		assert.Greater(t, rw.Lease().Token(), max(readTokens[0], readTokens[1]), "the writer's token exceeds the readers'")
		assert.Equal(t, []byte("writer"), rw.Lease().Data())
		assert.ErrorIs(t, ra.TryRLock(ctx), ErrLocked, "no reader while a writer holds")
		assert.ErrorIs(t, ra.TryLock(ctx), ErrLocked)
		hs, err = a.Holders(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, []Holder{{Owner: w.Owner(), Token: rw.Lease().Token(), Data: []byte("writer")}}, hs)
		require.NoError(t, rw.Unlock(ctx))
		assert.ErrorIs(t, rw.Unlock(ctx), ErrNotHeld)
		assert.ErrorIs(t, rw.RUnlock(ctx), ErrNotHeld)

		require.NoError(t, ra.RLock(ctx))
		assert.Greater(t, ra.Lease().Token(), readTokens[1])
		require.NoError(t, ra.RUnlock(ctx))
		hs, err = a.Holders(ctx, "k")
		require.NoError(t, err)
		assert.Empty(t, hs)
	})
}

// Goroutines of one Client that RLock a key share one hold on
// the server: one command for the first (once the RWMutex knows the key),
// none for the rest; the last RUnlock releases it, in one command.
func TestRWMutexLocalReaders(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		c := sp.client(t)
		rw := c.NewRWMutex("k")
		require.NoError(t, rw.RLock(ctx)) // creates the document; the RWMutex learns its counter
		require.NoError(t, rw.RUnlock(ctx))

		mark := sp.commands()
		require.NoError(t, rw.RLock(ctx))
		assert.EqualValues(t, 1, sp.commands()-mark, "commands for the first RLock")
		mark = sp.commands()
		other := c.NewRWMutex("k") // another RWMutex of the same Client shares too
		var wg sync.WaitGroup
		for range 7 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				assert.NoError(t, other.RLock(ctx))
			}()
		}
		wg.Wait()
		assert.EqualValues(t, 0, sp.commands()-mark, "commands for 7 more RLocks")
		hs, err := c.Holders(ctx, "k")
		require.NoError(t, err)
		assert.Len(t, hs, 1, "one shared hold on the server")
		mark = sp.commands()
		for range 7 {
			require.NoError(t, other.RUnlock(ctx))
		}
		assert.EqualValues(t, 0, sp.commands()-mark, "commands for 7 RUnlocks")
		require.NoError(t, rw.RUnlock(ctx))
		assert.EqualValues(t, 1, sp.commands()-mark, "the last RUnlock releases")
		hs, err = c.Holders(ctx, "k")
		require.NoError(t, err)
		assert.Empty(t, hs)
	})
}

// At most one writer and never a writer with a reader, under
// contention from several Clients; readers do overlap.
func TestRWMutexExclusion(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		var readers, writers, overlap atomic.Int32
		var wg sync.WaitGroup
		for i := range 4 {
			c := sp.client(t, WithBackoff(time.Millisecond, 5*time.Millisecond))
			rw := c.NewRWMutex("k")
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 10 {
					if (i+j)%3 == 0 {
						if !assert.NoError(t, rw.Lock(ctx)) {
							return
						}
						if writers.Add(1) != 1 || readers.Load() != 0 {
							t.Error("a writer with another holder")
						}
						time.Sleep(time.Millisecond)
						writers.Add(-1)
						assert.NoError(t, rw.Unlock(ctx))
						continue
					}
					if !assert.NoError(t, rw.RLock(ctx)) {
						return
					}
					if n := readers.Add(1); n > 1 {
						overlap.Add(1)
					}
					if writers.Load() != 0 {
						t.Error("a reader with a writer")
					}
					time.Sleep(time.Millisecond)
					readers.Add(-1)
					assert.NoError(t, rw.RUnlock(ctx))
				}
			}()
		}
		wg.Wait()
		t.Logf("reads that overlapped another: %d", overlap.Load())
	})
}

// A waiting writer is not starved by readers that keep the key
// held shared between them: once it waits, no new shared hold is taken,
// and it gets the key when the holds already there end.
func TestRWMutexWriterNotStarved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Two reader Clients, each holding for 300 ms and starting again
		// 150 ms after the other: the key is never free of readers.
		var wg sync.WaitGroup
		for i := range 2 {
			c, _ := memClient(t, st, WithTTL(time.Second))
			rw := c.NewRWMutex("k")
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(i) * 150 * time.Millisecond)
				for ctx.Err() == nil {
					if rw.RLock(ctx) != nil {
						return
					}
					time.Sleep(300 * time.Millisecond)
					rw.RUnlock(context.Background())
				}
			}()
		}
		time.Sleep(time.Second)
		w, _ := memClient(t, st, WithTTL(time.Second))
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		start := time.Now()
		require.NoError(t, w.NewRWMutex("k").Lock(wctx), "the writer got the key")
		t.Logf("the writer waited %v", time.Since(start))
		assert.Less(t, time.Since(start), time.Second, "within the readers' hold time and a few polls")
		cancel()
		wg.Wait()
	})
}

// A crashed (cut off) reader's share is free again within the
// bound of a crashed Mutex holder, and it learns of its loss first.
func TestRWMutexCrashedReader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ctx := context.Background()
		link := &memLink{memStore: st}
		r, err := newClientOn(func(*telemetry) store { return link }, WithTTL(time.Second))
		require.NoError(t, err)
		defer r.Close(ctx)
		live, _ := memClient(t, st, WithTTL(time.Second))
		rr, lr := r.NewRWMutex("k"), live.NewRWMutex("k")
		require.NoError(t, rr.RLock(ctx))
		require.NoError(t, lr.RLock(ctx)) // a live reader keeps the document changing
		l := rr.Lease()
		link.down.Store(true)

		w, _ := memClient(t, st, WithTTL(time.Second))
		wm := w.NewRWMutex("k")
		got := make(chan error, 1)
		start := time.Now()
		go func() { got <- wm.Lock(ctx) }()
		time.Sleep(1500 * time.Millisecond)
		require.NoError(t, lr.RUnlock(ctx)) // the live reader leaves; the cut-off one never does
		require.NoError(t, <-got)
		assert.ErrorIs(t, l.Err(), ErrLeaseLost, "the cut-off reader's hold ended before the writer's began")
		assert.LessOrEqual(t, time.Since(start), 2*time.Second+DefaultMaxBackoff)
		require.NoError(t, wm.Unlock(ctx))
	})
}

// An RUnlock cannot tell which RLock it undoes when this Client's RLocks
// count on more than one shared hold, so no RUnlock returns nil while a
// hold that an RLock not yet undone counted on is lost: every RUnlock
// reports the loss until the lost hold is counted down, last. Here a
// hold is lost as a writer's reap of it would make it: its entry is
// cleared, and the next extension finds it gone.
func TestRWMutexRUnlockReportsLoss(t *testing.T) {
	const ttl = 3 * time.Second
	for _, tc := range []struct {
		name   string
		joined bool // a second RLock joins the first hold
		lose   int  // the hold lost: 0 the older, 1 the newer, -1 none
		want   []bool
	}{
		{name: "none lost", lose: -1, want: []bool{false, false}},
		{name: "newer hold lost", lose: 1, want: []bool{true, true}},
		{name: "older hold lost", lose: 0, want: []bool{true, true}},
		{name: "joined hold lost", joined: true, lose: 0, want: []bool{true, true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				st := newMemStore()
				c, _ := memClient(t, st, WithTTL(ttl))
				rw := c.NewRWMutex("k")
				require.NoError(t, rw.RLock(ctx))
				if tc.joined {
					require.NoError(t, rw.RLock(ctx))
				}
				time.Sleep(c.cfg.every()) // past the first hold's join window
				require.NoError(t, rw.RLock(ctx))
				c.mu.Lock()
				var leases []*Lease
				for _, h := range c.readers["k"].holds {
					leases = append(leases, h.l)
				}
				c.mu.Unlock()
				require.Len(t, leases, 2, "RLocks on two holds")

				var lost *Lease
				if tc.lose >= 0 {
					lost = leases[tc.lose]
					hk := holdKey(c.owner, lost.hold)
					e := holder(st, "k").Shared[hk]
					ok, err := st.reap(ctx, "k", stamp{}, []staleEntry{{role: roleShared, key: hk, epoch: e.Epoch, token: e.Token}})
					require.NoError(t, err)
					require.True(t, ok)
					time.Sleep(c.cfg.every() + time.Millisecond) // the next extension finds it gone
					synctest.Wait()
					require.ErrorIs(t, lost.Err(), ErrLeaseLost)
				}
				for i, want := range tc.want {
					err := rw.RUnlock(ctx)
					if !want {
						assert.NoError(t, err, "RUnlock %d", i)
						continue
					}
					var lerr *LeaseLostError
					if assert.ErrorAs(t, err, &lerr, "RUnlock %d", i) {
						assert.Equal(t, lost.Token(), lerr.Token, "RUnlock %d names the lost hold", i)
					}
				}
				require.ErrorIs(t, rw.RUnlock(ctx), ErrNotHeld)
				hs, err := c.Holders(ctx, "k")
				require.NoError(t, err)
				assert.Empty(t, hs, "a hold still held after the last RUnlock")
			})
		})
	}
}

// An RLock that would join a hold of this Client's fails with ErrClosed
// once Close has begun, as every other call does, rather than counting on
// a hold that Close is about to end.
func TestRWMutexRLockAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		c, h := memClient(t, newMemStore())
		rw := c.NewRWMutex("k")
		require.NoError(t, rw.RLock(ctx))

		gate := make(chan struct{})
		open := sync.OnceFunc(func() { close(gate) })
		defer open()
		h.on("acquire", func(_ context.Context, call func() error) error { <-gate; return call() })
		locked := make(chan error, 1)
		go func() { locked <- c.NewMutex("other").Lock(ctx) }()
		synctest.Wait() // a call under way, which Close waits for
		closed := make(chan error, 1)
		go func() { closed <- c.Close(ctx) }()
		synctest.Wait() // Close has begun, and waits

		require.ErrorIs(t, rw.RLock(ctx), ErrClosed, "RLock joined a hold as Close began")
		require.ErrorIs(t, rw.TryRLock(ctx), ErrClosed)
		require.ErrorIs(t, rw.Lock(ctx), ErrClosed)
		open()
		require.ErrorIs(t, <-locked, ErrClosed)
		require.NoError(t, <-closed)
		require.ErrorIs(t, rw.RUnlock(ctx), ErrClosed)
		require.ErrorIs(t, rw.RUnlock(ctx), ErrNotHeld, "the joining RLock was counted")
	})
}
