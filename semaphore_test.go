package dlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// At most n permits at once across Clients; TryAcquire says
// ErrLocked when all are held; each permit has its own token from the
// key's one counter; Holders shows them, with their data.
func TestSemaphore(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		var leases []*Lease
		for i := range 3 {
			c := sp.client(t)
			l, err := c.NewSemaphore("s", 3, WithData([]byte{byte('a' + i)})).Acquire(ctx)
			require.NoError(t, err)
			assert.Equal(t, []byte{byte('a' + i)}, l.Data())
			if len(leases) > 0 {
				assert.Greater(t, l.Token(), leases[len(leases)-1].Token(), "each permit a token of its own, increasing")
			}
			leases = append(leases, l)
		}
		c := sp.client(t)
		s := c.NewSemaphore("s", 3)
		_, err := s.TryAcquire(ctx)
		assert.ErrorIs(t, err, ErrLocked, "all 3 permits are held")

		hs, err := c.Holders(ctx, "s")
		require.NoError(t, err)
		require.Len(t, hs, 3)
		for i, h := range hs {
			assert.Equal(t, Holder{Owner: leases[i].c.Owner(), Token: leases[i].Token(), Data: []byte{byte('a' + i)}, Shared: true}, h)
		}

		require.NoError(t, leases[1].Release(ctx))
		l, err := s.TryAcquire(ctx)
		require.NoError(t, err, "a permit was given back")
		assert.Greater(t, l.Token(), leases[2].Token())
		require.NoError(t, l.Release(ctx))
		require.NoError(t, leases[0].Release(ctx))
		require.NoError(t, leases[2].Release(ctx))
		hs, err = c.Holders(ctx, "s")
		require.NoError(t, err)
		assert.Empty(t, hs, "all given back")
	})
}

// Never more than n permits held, under contention from several
// Clients and goroutines, and all n in use at some point.
func TestSemaphoreLimit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		const n, workers, rounds = 2, 6, 8
		var inUse, most atomic.Int32
		var wg sync.WaitGroup
		var last sync.Map
		for i := range workers {
			c := sp.client(t, WithBackoff(time.Millisecond, 5*time.Millisecond))
			s := c.NewSemaphore("s", n)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					l, err := s.Acquire(ctx)
					if !assert.NoError(t, err) {
						return
					}
					now := inUse.Add(1)
					for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
					}
					assert.LessOrEqual(t, now, int32(n), "permits held at once")
					last.Store(i, l.Token())
					time.Sleep(time.Millisecond) // work while holding: lets holds overlap
					inUse.Add(-1)
					assert.NoError(t, l.Release(ctx))
				}
			}()
		}
		wg.Wait()
		t.Logf("most permits in use at once: %d", most.Load())

		// And n can be held at once: n Clients each hold one until all do.
		var all sync.WaitGroup
		all.Add(n)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := sp.client(t).NewSemaphore("s", n).Acquire(ctx)
				all.Done()
				if assert.NoError(t, err) {
					all.Wait() // the others hold theirs too
					assert.NoError(t, l.Release(ctx))
				}
			}()
		}
		wg.Wait()
	})
}

// Every Client using a key must agree on the kind and on n.
func TestKindMismatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		c := sp.client(t, WithBackoff(time.Millisecond, 2*time.Millisecond))
		l, err := c.NewSemaphore("s", 3).Acquire(ctx)
		require.NoError(t, err)
		_, err = c.NewSemaphore("s", 4).Acquire(ctx)
		assert.ErrorIs(t, err, ErrKindMismatch, "another n")
		assert.ErrorContains(t, err, "Semaphore of 3 permits")
		_, err = c.NewSemaphore("s", 4).TryAcquire(ctx)
		assert.ErrorIs(t, err, ErrKindMismatch, "another n, TryAcquire")
		assert.ErrorIs(t, c.NewMutex("s").Lock(ctx), ErrKindMismatch, "a Mutex on a Semaphore's key")
		assert.ErrorIs(t, c.NewRWMutex("s").RLock(ctx), ErrKindMismatch, "an RWMutex on a Semaphore's key")
		require.NoError(t, l.Release(ctx))
		_, err = c.NewSemaphore("s", 4).Acquire(ctx)
		assert.ErrorIs(t, err, ErrKindMismatch, "also while the key is free")

		m := c.NewMutex("m")
		require.NoError(t, m.Lock(ctx))
		require.NoError(t, m.Unlock(ctx))
		_, err = c.NewSemaphore("m", 2).Acquire(ctx)
		assert.ErrorIs(t, err, ErrKindMismatch, "a Semaphore on a Mutex's key")
		assert.ErrorIs(t, c.NewRWMutex("m").Lock(ctx), ErrKindMismatch, "an RWMutex on a Mutex's key")

		_, err = c.NewSemaphore("x", 0).Acquire(ctx)
		assert.ErrorIs(t, err, ErrInvalidOption)
		_, err = c.NewSemaphore("x", MaxPermits+1).Acquire(ctx)
		assert.ErrorIs(t, err, ErrInvalidOption)
		_, err = c.NewSemaphore("x", 1, WithData(make([]byte, MaxDataLen+1))).Acquire(ctx)
		assert.ErrorIs(t, err, ErrInvalidOption)
		_, err = (&Semaphore{}).Acquire(ctx)
		assert.ErrorIs(t, err, ErrNoClient)
	})
}

// A permit whose holder is cut off is free again once its TTL
// has passed, and its holder learns of the loss first.
func TestSemaphoreCrashedHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ctx := context.Background()
		link := &memLink{memStore: st}
		holder, err := newClientOn(func(*telemetry) store { return link }, WithTTL(time.Second))
		require.NoError(t, err)
		defer holder.Close(ctx)
		l, err := holder.NewSemaphore("s", 1).Acquire(ctx)
		require.NoError(t, err)
		link.down.Store(true) // cut off: its extensions fail from now on

		c, _ := memClient(t, st, WithTTL(time.Second))
		start := time.Now()
		l2, err := c.NewSemaphore("s", 1).Acquire(ctx)
		require.NoError(t, err)
		waited := time.Since(start)
		assert.ErrorIs(t, l.Err(), ErrLeaseLost, "the cut-off holder's permit ended before the next one began")
		select {
		case <-l.Lost():
		default:
			t.Error("Lost not closed")
		}
		assert.LessOrEqual(t, waited, 2*time.Second+DefaultMaxBackoff, "free within a TTL of being seen, plus a poll")
		assert.Greater(t, l2.Token(), l.Token())
		require.NoError(t, l2.Release(ctx))
		assert.True(t, errors.Is(l.Release(ctx), ErrLeaseLost))
	})
}

// A Client's extensions of all its holds of all kinds (a Mutex's,
// a read hold, a permit) are one bulk write per cadence.
func TestOneExtensionForAllKinds(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		rounds := make(chan extendRound, 16)
		f := &faultyStore{}
		f.onExtend = func(r extendRound) {
			select {
			case rounds <- r:
			default:
			}
		}
		c := sp.client(t, WithTTL(3*time.Second), withFaults(f))
		m, rw, s := c.NewMutex("m"), c.NewRWMutex("rw"), c.NewSemaphore("s", 2)
		require.NoError(t, m.Lock(ctx))
		require.NoError(t, rw.RLock(ctx))
		p, err := s.Acquire(ctx)
		require.NoError(t, err)
		for r := range rounds {
			if r.leases == 3 {
				require.NoError(t, r.err)
				if _, ok := sp.(mongoKeys); ok {
					assert.EqualValues(t, 1, r.commands, "commands for one extension of three holds of three kinds")
				}
				break
			}
		}
		assert.NoError(t, m.Unlock(ctx))
		assert.NoError(t, rw.RUnlock(ctx))
		assert.NoError(t, p.Release(ctx))
	})
}

// On the real server, a permit and a read hold whose Client
// stopped extending them (a crash) are free again within the bound of a
// crashed Mutex holder; and the crashed holder's leases report the loss.
func TestSharedCrashedHolder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		const ttl = 300 * time.Millisecond
		f := &faultyStore{}
		crashed := sp.client(t, WithTTL(ttl), withFaults(f))
		p, err := crashed.NewSemaphore("s", 1).Acquire(ctx)
		require.NoError(t, err)
		rw := crashed.NewRWMutex("rw")
		require.NoError(t, rw.RLock(ctx))
		r := rw.Lease()
		f.crash()

		c := sp.client(t, WithTTL(ttl), WithBackoff(time.Millisecond, 20*time.Millisecond))
		start := time.Now()
		p2, err := c.NewSemaphore("s", 1).Acquire(ctx)
		require.NoError(t, err)
		w := c.NewRWMutex("rw")
		require.NoError(t, w.Lock(ctx))
		took := time.Since(start)
		assert.ErrorIs(t, p.Err(), ErrLeaseLost)
		assert.ErrorIs(t, r.Err(), ErrLeaseLost)
		assert.True(t, waitClosed(p.Lost(), 0), "Lost closed")
		assert.ErrorIs(t, context.Cause(r.Context()), ErrLeaseLost, "Context cancelled with the loss")
		// The exact bound (two TTLs after the last write, plus a poll) is
		// checked on the simulated clock (TestSemaphoreCrashedHolder,
		// TestRWMutexCrashedReader); here, with room for a loaded machine.
		assert.Less(t, took, 6*ttl, "both free about two TTLs after the crash")
		assert.NoError(t, p2.Release(ctx))
		assert.NoError(t, w.Unlock(ctx))
	})
}

// TestSemaphoreServesInOrder: a Semaphore's waiters are served first
// come, first served, across permits and Clients. Both permits are held;
// a, then b, then c wait (each registers); one permit is given back and
// a takes it, though c polls too; the next goes to b, then c. A
// TryAcquire meanwhile does not pass them.
func TestSemaphoreServesInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ctx := context.Background()
		h, _ := memClient(t, st)
		hs := h.NewSemaphore("s", 2)
		l1, err := hs.Acquire(ctx)
		require.NoError(t, err)
		l2, err := hs.Acquire(ctx)
		require.NoError(t, err)
		type got struct {
			who string
			l   *Lease
		}
		took := make(chan got, 3)
		for _, who := range []string{"a", "b", "c"} {
			c, _ := memClient(t, st)
			go func() {
				l, err := c.NewSemaphore("s", 2).Acquire(ctx)
				if assert.NoError(t, err) {
					took <- got{who, l}
				}
			}()
			synctest.Wait() // registered, in this order
		}
		require.Len(t, holder(st, "s").Waiters, 3, "a, b and c registered")
		try, _ := memClient(t, st)
		require.NoError(t, l1.Release(ctx))
		_, err = try.NewSemaphore("s", 2).TryAcquire(ctx)
		assert.ErrorIs(t, err, ErrLocked, "a TryAcquire passed the waiters")
		first := <-took
		assert.Equal(t, "a", first.who)
		require.NoError(t, l2.Release(ctx))
		second := <-took
		assert.Equal(t, "b", second.who)
		require.NoError(t, first.l.Release(ctx))
		third := <-took
		assert.Equal(t, "c", third.who)
		require.NoError(t, second.l.Release(ctx))
		require.NoError(t, third.l.Release(ctx))
	})
}

// TestSemaphoreLoopersDoNotStarveAWaiter: two Clients loop on a Semaphore
// of 2 permits with 1 ms holds, and a third's one Acquire gets a permit
// within a poll interval: it registers at once, the loopers registered
// ahead of it take a permit each, and the next freed is owed to it (the
// loopers may take the other meanwhile). It waited behind them for ever
// when every poll raced.
func TestSemaphoreLoopersDoNotStarveAWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ctx, cancel := context.WithCancel(context.Background())
		var turns atomic.Int64
		var wg sync.WaitGroup
		for range 2 {
			c, _ := memClient(t, st)
			s := c.NewSemaphore("s", 2)
			wg.Go(func() {
				for ctx.Err() == nil {
					l, err := s.Acquire(ctx)
					if err != nil {
						return
					}
					turns.Add(1)
					time.Sleep(time.Millisecond)
					l.Release(context.Background())
				}
			})
		}
		defer wg.Wait()
		defer cancel()
		time.Sleep(100 * time.Millisecond) // the loop under way
		c, _ := memClient(t, st)
		start, before := time.Now(), turns.Load()
		one, stop := context.WithTimeout(ctx, 10*time.Second)
		defer stop()
		l, err := c.NewSemaphore("s", 2).Acquire(one)
		require.NoError(t, err, "the one Acquire, after %d turns of the loopers", turns.Load()-before)
		t.Logf("the one Acquire took %v, after %d turns of the loopers", time.Since(start), turns.Load()-before)
		assert.LessOrEqual(t, time.Since(start), fairPoll, "the one Acquire's wait")
		require.NoError(t, l.Release(ctx))
	})
}
