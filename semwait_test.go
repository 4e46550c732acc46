package dlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tests of a Semaphore's registered wait where it differs from a Mutex's:
// one Client's Acquires wait side by side on one key, none holding the
// Client's slot for it.

// leaveDeadRegistration has c's Acquire of s register behind a full
// Semaphore and give up, its registration's removal lost: the
// registration stays in the document, no longer extended, as a crashed
// waiter's does.
func leaveDeadRegistration(t *testing.T, c *Client, h *hooked, s string, n int) {
	t.Helper()
	lost := make(chan struct{}, 1)
	h.on("release", func(context.Context, func() error) error {
		select {
		case lost <- struct{}{}:
		default:
		}
		return errors.New("lost")
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := c.NewSemaphore(s, n).Acquire(ctx); done <- err }()
	require.Eventually(t, func() bool { return h.count("register") > 0 }, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	<-lost // the registration's removal was sent, and lost
	h.on("release", nil)
}

// TestSemaphoreClearsItsOwnDeadRegistration: a registration of this
// Client's that no Acquire uses (its removal was lost) is cleared as any
// dead waiter's, once its TTL has passed unextended; a later Acquire of
// the same Client then takes the free permit. It waited for ever, counting
// the dead registration as an awake waiter owed the permit: each read made
// it due "at once", a moment before the check that asked. Real time, not
// a synctest bubble: there two readings of the clock can be equal.
func TestSemaphoreClearsItsOwnDeadRegistration(t *testing.T) {
	const ttl = time.Second
	ctx := context.Background()
	st := newMemStore()
	other, _ := memClient(t, st, WithTTL(ttl))
	c, h := memClient(t, st, WithTTL(ttl))
	held, err := other.NewSemaphore("s", 1).Acquire(ctx)
	require.NoError(t, err)
	leaveDeadRegistration(t, c, h, "s", 1)
	require.NoError(t, held.Release(ctx))
	require.Len(t, holder(st, "s").Waiters, 1, "the dead registration")

	// The bound on a dead waiter: its registration's TTL (two TTLs), a
	// read and a poll; six TTLs leaves room for a loaded machine.
	start := time.Now()
	wait, cancel := context.WithTimeout(ctx, 6*ttl)
	defer cancel()
	l, err := c.NewSemaphore("s", 1).Acquire(wait)
	require.NoError(t, err, "the permit is free but for this Client's own dead registration")
	t.Logf("took the permit %v after the holder released it", time.Since(start))
	require.NoError(t, l.Release(ctx))
}

// TestSemaphoreOwnAcquiresLeaveEachOther: two Acquires of one Client wait
// side by side behind a full Semaphore, each registered; neither clears
// the other's live registration (where two readings of the clock are
// equal, each did, at once, and they were served out of order), and they
// take the permit in the order they registered.
func TestSemaphoreOwnAcquiresLeaveEachOther(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := newMemStore()
		other, _ := memClient(t, st)
		c, h := memClient(t, st)
		held, err := other.NewSemaphore("s", 1).Acquire(ctx)
		require.NoError(t, err)
		took := make(chan string, 2)
		var wg sync.WaitGroup
		for i, who := range []string{"first", "second"} {
			wg.Go(func() {
				l, err := c.NewSemaphore("s", 1).Acquire(ctx)
				if assert.NoError(t, err) {
					took <- who
					time.Sleep(time.Second)
					assert.NoError(t, l.Release(ctx))
				}
			})
			for h.count("register") <= i { // registered, in this order
				time.Sleep(10 * time.Millisecond)
			}
		}
		require.Len(t, holder(st, "s").Waiters, 2, "both registered")
		time.Sleep(5 * time.Second)
		assert.Zero(t, h.count("reap"), "an Acquire cleared its sibling's live registration")
		assert.Equal(t, 2, h.count("register"), "registrations: one each")
		require.NoError(t, held.Release(ctx))
		assert.Equal(t, "first", <-took)
		assert.Equal(t, "second", <-took)
		wg.Wait()
	})
}

// TestSemaphoreLateRegistrations: an Acquire that must wait behind a full
// Semaphore, whose registrations are all answered after their local
// deadline, ends with ErrTTLTooShort after lateReplies of them in a row,
// as a Lock does, and leaves nothing registered. It registered again at
// every poll until its ctx ended.
func TestSemaphoreLateRegistrations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ctx := context.Background()
		other, _ := memClient(t, st)
		held, err := other.NewSemaphore("s", 1).Acquire(ctx)
		require.NoError(t, err)
		const ttl = 100 * time.Millisecond
		c, h := memClient(t, st, WithTTL(ttl))
		h.on("register", lateReply(5*ttl)) // past the registration's two TTLs
		wait, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		_, err = c.NewSemaphore("s", 1).Acquire(wait)
		require.ErrorIs(t, err, ErrTTLTooShort)
		require.NoError(t, wait.Err(), "Acquire registered until its ctx ended")
		assert.Equal(t, lateReplies, h.count("register"))
		synctest.Wait() // the clean-up in the background
		assert.Empty(t, holder(st, "s").Waiters, "registered after the Acquire returned")
		require.NoError(t, held.Release(ctx))
	})
}

// TestSemaphoreStaleReadPassesNoOne: a read from before the waiter's
// registration was numbered, answered after a later view, tells it
// nothing. The scene: W registers behind E; W's next read shows E asleep
// (its attempt could then pass E, by the server's check that E still is);
// E wakes; W's next read is one sent before W registered, in which E is
// awake and the permit free. Taken as news, W passed E without naming it
// to the server, as its last good view counted no one awake ahead, and
// took the permit owed to E (so did the simulation, with stale reads,
// under flawActOnStaleRead).
func TestSemaphoreStaleReadPassesNoOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := newMemStore()
		p, _ := memClient(t, st)
		held, err := p.NewSemaphore("s", 1).Acquire(ctx)
		require.NoError(t, err)
		e := attempt{key: "s", owner: "E", hold: 1, ttl: time.Hour, kind: semKind(1), shared: true, limit: 1}
		_, err = st.register(ctx, e)
		require.NoError(t, err)
		require.NoError(t, held.Release(ctx))
		stale, err := st.read(ctx, "s") // the permit free, E awake, W not registered
		require.NoError(t, err)

		w, _ := memClient(t, st, withPacer(backoffPacer{})) // W stays awake
		s := w.NewSemaphore("s", 1)
		x := w.newSharedWait(ctx, claim{lk: s, cfg: &s.cfg, pace: &s.pace,
			attempt: attempt{key: "s", ttl: s.cfg.ttl, kind: semKind(1), shared: true, limit: 1}}, false)
		ready, err := x.join()
		require.NoError(t, err)
		require.False(t, ready, "a permit for W while E waits awake ahead")
		eRef := leaseRef{key: "s", owner: "E", hold: 1, ttl: e.ttl, token: 1, role: roleWaiter}
		_, err = st.mark(ctx, eRef, true)
		require.NoError(t, err)
		_, err = x.read()
		require.NoError(t, err)
		require.True(t, x.ready, "E asleep: W may pass it, if the server finds it still asleep")
		_, err = st.mark(ctx, eRef, false) // W's attempt was lost; E wakes
		require.NoError(t, err)

		x.view = &view{r: stale}
		if _, err := x.read(); err == nil && x.ready {
			x.attemptOnce(true)
		}
		assert.Empty(t, holder(st, "s").Shared, "W took the permit owed to E, awake ahead of it")
		w.unregister(x.q.reg)
	})
}

// TestTryAcquireBehindACrashedWaiter: a TryAcquire fails with ErrLocked
// while a waiter is registered, whatever number of permits is free, and a
// crashed waiter's registration stops blocking it two TTLs after the
// key's document was last written (its registration's TTL, by the
// server's clock), as the docs of TryAcquire and TryLock say.
func TestTryAcquireBehindACrashedWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = time.Second
		ctx := context.Background()
		st := newMemStore()
		h, _ := memClient(t, st, WithTTL(ttl))
		s := h.NewSemaphore("s", 2)
		p1, err := s.Acquire(ctx)
		require.NoError(t, err)
		p2, err := s.Acquire(ctx)
		require.NoError(t, err)
		link := &memLink{memStore: st}
		w, err := newClientOn(func(*telemetry) store { return link }, WithTTL(ttl))
		require.NoError(t, err)
		defer w.Close(ctx)
		waiting, cancel := context.WithCancel(ctx)
		defer cancel()
		go w.NewSemaphore("s", 2).Acquire(waiting)
		synctest.Wait()
		require.Len(t, holder(st, "s").Waiters, 1, "the waiter registered")
		link.down.Store(true) // it crashes: nothing it sends lands from now on
		require.NoError(t, p1.Release(ctx))
		require.NoError(t, p2.Release(ctx))
		written := time.Now() // the document's last write

		try := h.NewSemaphore("s", 2)
		_, err = try.TryAcquire(ctx)
		assert.ErrorIs(t, err, ErrLocked, "0 of 2 permits held, a waiter registered")
		time.Sleep(written.Add(2 * ttl).Sub(time.Now()))
		_, err = try.TryAcquire(ctx)
		assert.ErrorIs(t, err, ErrLocked, "at two TTLs after the last write")
		time.Sleep(2 * serverClockResolution)
		l, err := try.TryAcquire(ctx)
		require.NoError(t, err, "past two TTLs after the last write")
		require.NoError(t, l.Release(ctx))
	})
}
