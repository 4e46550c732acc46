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

// Tests of the lease core on the in-memory store, inside testing/synctest
// bubbles: time is the bubble's fake clock, so a TTL passes in no real time
// and every duration asserted here is exact. Faults come from hooks on the
// store's operations.

// A hook runs in place of one store operation: call applies it at the
// store, and the hook decides when, whether, and what the caller hears.
type hook func(ctx context.Context, call func() error) error

// hooked wraps a store with hooks, set and cleared while the test runs.
type hooked struct {
	store
	mu       sync.Mutex
	hooks    map[string]hook // guarded by mu
	calls    map[string]int  // guarded by mu
	extended map[string]int  // extend calls naming each key; guarded by mu
	reaching sync.WaitGroup  // the calls on their way to the store, unhooked (settle)
}

// extensions reports how many extend calls have named key so far.
func (h *hooked) extensions(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.extended[key]
}

func (h *hooked) on(op string, f hook) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hooks[op] = f
}

func (h *hooked) count(op string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[op]
}

// total reports how many operations of every kind have been called.
func (h *hooked) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.calls {
		n += c
	}
	return n
}

func (h *hooked) run(ctx context.Context, op string, call func() error) error {
	h.mu.Lock()
	f := h.hooks[op]
	h.calls[op]++
	if f == nil {
		h.reaching.Add(1)
	}
	h.mu.Unlock()
	if f == nil {
		defer h.reaching.Done()
		return call()
	}
	return f(ctx, call)
}

// settle waits until every call that went to the store unhooked has
// returned: after stop, until the writes sent before it have landed.
func (h *hooked) settle() { h.reaching.Wait() }

func (h *hooked) acquire(ctx context.Context, a attempt, takeover stamp) (r record, err error) {
	err = h.run(ctx, "acquire", func() (err error) { r, err = h.store.acquire(ctx, a, takeover); return err })
	return r, err
}

func (h *hooked) handoff(ctx context.Context, ref leaseRef, next attempt) (r record, err error) {
	err = h.run(ctx, "handoff", func() (err error) { r, err = h.store.handoff(ctx, ref, next); return err })
	return r, err
}

func (h *hooked) extend(ctx context.Context, refs []leaseRef) (ok []bool, err error) {
	h.mu.Lock()
	if h.extended == nil {
		h.extended = make(map[string]int)
	}
	for _, ref := range refs {
		h.extended[ref.key]++
	}
	h.mu.Unlock()
	err = h.run(ctx, "extend", func() (err error) { ok, err = h.store.extend(ctx, refs); return err })
	return ok, err
}

func (h *hooked) requeue(ctx context.Context, ref leaseRef, next attempt) (r record, err error) {
	err = h.run(ctx, "requeue", func() (err error) { r, err = h.store.requeue(ctx, ref, next); return err })
	return r, err
}

func (h *hooked) release(ctx context.Context, ref leaseRef) error {
	return h.run(ctx, "release", func() error { return h.store.release(ctx, ref) })
}

func (h *hooked) setData(ctx context.Context, ref leaseRef, data []byte) error {
	return h.run(ctx, "setData", func() error { return h.store.setData(ctx, ref, data) })
}

func (h *hooked) releaseAll(ctx context.Context, refs []leaseRef) error {
	return h.run(ctx, "releaseAll", func() error { return h.store.releaseAll(ctx, refs) })
}

func (h *hooked) acquireAll(ctx context.Context, as []attempt) (took []bool, err error) {
	err = h.run(ctx, "acquireAll", func() (err error) { took, err = h.store.acquireAll(ctx, as); return err })
	return took, err
}

func (h *hooked) readAll(ctx context.Context, keys []string) (recs []record, floor Token, err error) {
	err = h.run(ctx, "readAll", func() (err error) { recs, floor, err = h.store.readAll(ctx, keys); return err })
	return recs, floor, err
}

func (h *hooked) abandon(ctx context.Context, a attempt) error {
	return h.run(ctx, "abandon", func() error { return h.store.abandon(ctx, a) })
}

func (h *hooked) readMany(ctx context.Context, keys []string) (rs []record, err error) {
	err = h.run(ctx, "readMany", func() (err error) { rs, err = h.store.readMany(ctx, keys); return err })
	return rs, err
}

func (h *hooked) read(ctx context.Context, key string) (r record, err error) {
	err = h.run(ctx, "read", func() (err error) { r, err = h.store.read(ctx, key); return err })
	return r, err
}

func (h *hooked) floor(ctx context.Context) (f Token, err error) {
	err = h.run(ctx, "floor", func() (err error) { f, err = h.store.floor(ctx); return err })
	return f, err
}

func (h *hooked) idle(ctx context.Context, cutoff time.Time, limit int) (recs []idleRecord, err error) {
	err = h.run(ctx, "idle", func() (err error) { recs, err = h.store.idle(ctx, cutoff, limit); return err })
	return recs, err
}

func (h *hooked) raiseFloor(ctx context.Context, t Token) error {
	return h.run(ctx, "raiseFloor", func() error { return h.store.raiseFloor(ctx, t) })
}

func (h *hooked) remove(ctx context.Context, recs []idleRecord) (n int, err error) {
	err = h.run(ctx, "remove", func() (err error) { n, err = h.store.remove(ctx, recs); return err })
	return n, err
}

func (h *hooked) mark(ctx context.Context, ref leaseRef, sleep bool) (r record, err error) {
	err = h.run(ctx, "mark", func() (err error) { r, err = h.store.mark(ctx, ref, sleep); return err })
	return r, err
}

func (h *hooked) register(ctx context.Context, a attempt) (r record, err error) {
	err = h.run(ctx, "register", func() (err error) { r, err = h.store.register(ctx, a); return err })
	return r, err
}

func (h *hooked) reap(ctx context.Context, key string, at stamp, stale []staleEntry) (ok bool, err error) {
	err = h.run(ctx, "reap", func() (err error) { ok, err = h.store.reap(ctx, key, at, stale); return err })
	return ok, err
}

func (h *hooked) serverTime(ctx context.Context) (t time.Time, ok bool, err error) {
	err = h.run(ctx, "serverTime", func() (err error) { t, ok, err = h.store.serverTime(ctx); return err })
	return t, ok, err
}

// answered returns a channel that receives when a call of op has been
// answered (applied at the store), from now on; it holds one signal, and
// drops those that come while it is full.
func (h *hooked) answered(op string) <-chan struct{} {
	ch := make(chan struct{}, 1)
	h.on(op, func(_ context.Context, call func() error) error {
		err := call()
		select {
		case ch <- struct{}{}:
		default:
		}
		return err
	})
	return ch
}

// Hooks.

// failing fails without reaching the store, as a dead network would.
func failing(context.Context, func() error) error { return errInjected }

// lateReply applies at once and answers d later.
func lateReply(d time.Duration) hook {
	return func(_ context.Context, call func() error) error {
		err := call()
		time.Sleep(d)
		return err
	}
}

// applyThenHang applies at once and never answers: the caller's ctx ends
// the call, as the driver's timeout would.
func applyThenHang(ctx context.Context, call func() error) error {
	call()
	<-ctx.Done()
	return ctx.Err()
}

// storeOps names every operation of the store interface.
var storeOps = []string{"acquire", "handoff", "extend", "release", "setData", "releaseAll", "acquireAll", "readAll", "abandon", "read", "readMany",
	"floor", "idle", "raiseFloor", "remove", "register", "mark", "requeue", "reap", "serverTime"}

// stop makes every operation hang, as a crashed or cut-off process's
// would, until the returned restart is called (or the test ends).
func (h *hooked) stop(t *testing.T) (restart func()) {
	for _, op := range storeOps {
		h.on(op, hang)
	}
	restart = func() {
		for _, op := range storeOps {
			h.on(op, nil)
		}
	}
	t.Cleanup(restart) // before Close, had the test stopped early
	return restart
}

// hang never reaches the store, and never answers.
func hang(ctx context.Context, _ func() error) error {
	<-ctx.Done()
	return ctx.Err()
}

// memClient returns a Client on st, with hooks, closed when the test ends.
// Call it inside a bubble.
func memClient(t *testing.T, st store, opts ...Option) (*Client, *hooked) {
	t.Helper()
	h := &hooked{store: st, hooks: map[string]hook{}, calls: map[string]int{}}
	c, err := newClientOn(func(*telemetry) store { return h }, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })
	return c, h
}

// holder returns the record of key in st.
func holder(st *memStore, key string) record {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.records[key]
}

// A late clean-up cannot free a newer hold. G1's acquire applies but its
// reply never comes; its Lock gives up and sends the clean-up, which is
// slow too; G2, of the same Client, takes the key (the record is its
// Client's, from a call that gave up); then G1's clean-up lands. It must
// not free G2's hold: a third party still finds the key locked, and G2's
// lease is valid.
func TestLateAbandonCannotFreeLaterHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		a, h := memClient(t, st, WithTTL(10*time.Second))
		b, _ := memClient(t, st)
		h.on("acquire", applyThenHang)
		abandonGo, abandoned := make(chan struct{}), make(chan struct{})
		h.on("abandon", func(_ context.Context, call func() error) error {
			<-abandonGo
			defer close(abandoned)
			return call() // with a context of its own: it lands late, but it lands
		})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, a.NewMutex("k").Lock(ctx), context.DeadlineExceeded)
		assert.Equal(t, a.owner, holder(st, "k").Owner, "the unanswered acquire applied")

		h.on("acquire", nil)
		g2 := a.NewMutex("k")
		require.NoError(t, g2.Lock(context.Background()), "the Client takes over its own abandoned hold")
		close(abandonGo)
		<-abandoned

		require.ErrorIs(t, b.NewMutex("k").TryLock(context.Background()), ErrLocked, "the late clean-up freed the newer hold")
		require.NoError(t, g2.Lease().Err())
		assert.Equal(t, g2.Lease().Token(), holder(st, "k").Token)
	})
}

// Close racing an in-flight acquire leaves the key free, not held for a
// TTL. Close waits for the Lock under way; the Lock, answered after Close began,
// gives the hold back and returns ErrClosed; the key is free when Close
// returns.
func TestCloseDuringAcquire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, h := memClient(t, st)
		answer := make(chan struct{})
		h.on("acquire", func(_ context.Context, call func() error) error {
			err := call()
			<-answer
			return err
		})
		locked := make(chan error)
		go func() { locked <- c.NewMutex("k").Lock(context.Background()) }()
		synctest.Wait() // the acquire has applied; its reply is held back
		closed := make(chan error)
		go func() { closed <- c.Close(context.Background()) }()
		synctest.Wait()
		select {
		case <-closed:
			t.Fatal("Close returned while a Lock it could wait for was under way")
		default:
		}
		close(answer)
		require.ErrorIs(t, <-locked, ErrClosed)
		require.NoError(t, <-closed)
		assert.Equal(t, "", holder(st, "k").Owner, "key left held after Close")
	})
}

// Close's bulk release cannot land before a concurrent Unlock's handoff:
// Close waits for the Unlock, the hold passed on is then released by
// Close, and nothing is left held.
func TestCloseDuringHandoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, h := memClient(t, st)
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(context.Background()))
		m2 := c.NewMutex("k")
		got := make(chan error)
		go func() { got <- m2.Lock(context.Background()) }()
		synctest.Wait() // queued
		answer := make(chan struct{})
		h.on("handoff", func(_ context.Context, call func() error) error {
			<-answer
			return call()
		})
		unlocked := make(chan error)
		go func() { unlocked <- m.Unlock(context.Background()) }()
		synctest.Wait()
		closed := make(chan error)
		go func() { closed <- c.Close(context.Background()) }()
		synctest.Wait()
		close(answer)
		require.NoError(t, <-unlocked)
		lockErr := <-got
		require.NoError(t, <-closed)
		if lockErr == nil {
			require.ErrorIs(t, m2.lease.Err(), ErrReleased, "Close ends the lease handed over")
			assert.Nil(t, m2.Lease(), "an ended lease is the Mutex's no more")
		} else {
			require.ErrorIs(t, lockErr, ErrClosed)
		}
		assert.Equal(t, "", holder(st, "k").Owner, "key left held after Close")
	})
}

// A local waiter whose ctx ends while the hold is being handed to it
// returns when its ctx ends, without waiting for the handoff's reply (3 s
// here, for a 200 ms ctx), and the hold it was handed is given back.
func TestWaiterLeavesDuringHandoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, h := memClient(t, st)
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(context.Background()))
		h.on("handoff", func(_ context.Context, call func() error) error {
			time.Sleep(3 * time.Second)
			return call()
		})
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		got := make(chan error)
		go func() { got <- c.NewMutex("k").Lock(ctx) }()
		synctest.Wait() // queued
		unlocked := make(chan error)
		go func() { unlocked <- m.Unlock(context.Background()) }()
		require.ErrorIs(t, <-got, context.DeadlineExceeded)
		assert.Equal(t, 200*time.Millisecond, time.Since(start), "Lock returned late")
		require.NoError(t, <-unlocked)
		synctest.Wait() // the hold handed to nobody is given back in the background
		assert.Equal(t, "", holder(st, "k").Owner, "the hold handed to a waiter that left is left held")
		require.NoError(t, c.NewMutex("k").TryLock(context.Background()))
	})
}

// A read that shows the key free while acquires fail (a lagging
// secondary) does not make the loop spin: each failed attempt after a
// read is followed by a poll wait, so 300 ms cost a handful of commands.
func TestNoSpinOnLaggingReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		a, _ := memClient(t, st)
		require.NoError(t, a.NewMutex("k").Lock(context.Background()))
		b, h := memClient(t, st)
		h.on("read", func(ctx context.Context, call func() error) error {
			if h.count("read") > 1000 {
				t.Error("spinning")
				return errors.New("spinning") // not transient: Lock gives up
			}
			return nil // a lagging read: the zero record, free
		})
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, b.NewMutex("k").Lock(ctx), context.DeadlineExceeded)
		// Polls start at 5 ms and double to 250 ms: about 7 in 300 ms,
		// each at most an acquire, a read, and the acquire the read called for.
		assert.LessOrEqual(t, h.count("acquire")+h.count("read"), 3*8)
	})
}

// Unlock of a lease already lost, on a frozen server, does not wait for
// the driver's timeout: it returns the lease's error at once; the tidy-up
// runs in the background, and Close stops it.
func TestUnlockLostLeaseReturnsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, h := memClient(t, st, WithTTL(time.Second))
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(context.Background()))
		l := m.Lease()
		h.on("extend", hang) // the server is frozen
		h.on("release", hang)
		<-l.Lost()
		start := time.Now()
		err := m.Unlock(context.Background())
		var lost *LeaseLostError
		require.ErrorAs(t, err, &lost)
		assert.Equal(t, l.Token(), lost.Token)
		assert.Zero(t, time.Since(start), "Unlock of a lost lease waited")
		synctest.Wait()
		assert.Equal(t, 1, h.count("release"), "the tidy-up is sent in the background")
		start = time.Now()
		require.NoError(t, c.Close(context.Background()))
		assert.LessOrEqual(t, time.Since(start), cleanupTimeout, "Close waits for the tidy-up at most its bound")
	})
}

// A Lock with a ctx already done returns at once, sends nothing (not even
// a clean-up write), and its error is the ctx's, with none of the driver's
// internals.
func TestLockWithDoneContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, _ := memClient(t, st)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for _, lock := range []func(*Mutex, context.Context) error{(*Mutex).Lock, (*Mutex).TryLock} {
			err := lock(c.NewMutex("k"), ctx)
			require.ErrorIs(t, err, context.Canceled)
			assert.Equal(t, `dlock: lock "k": context canceled`, err.Error())
		}
		assert.Zero(t, st.commands.Load(), "commands sent")
	})
}

// A Lock whose ctx ends while its acquire is in flight returns the ctx's
// error, not the store's account of the cancelled command, and the hold it
// may have won is given back.
func TestLockCancelledInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, h := memClient(t, st)
		h.on("acquire", func(ctx context.Context, call func() error) error {
			call()
			<-ctx.Done()
			return errors.Join(errors.New("connection pool internals"), ctx.Err())
		})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		err := c.NewMutex("k").Lock(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.NotContains(t, err.Error(), "pool")
		require.NoError(t, c.Close(context.Background())) // waits for the clean-up
		assert.Equal(t, "", holder(st, "k").Owner)
	})
}

// The zero Mutex, and a nil one, return errors rather than panic:
// ErrNoClient from Lock and TryLock, ErrNotHeld from Unlock.
func TestZeroMutex(t *testing.T) {
	var m Mutex
	require.ErrorIs(t, m.Lock(context.Background()), ErrNoClient)
	require.ErrorIs(t, m.TryLock(context.Background()), ErrNoClient)
	require.ErrorIs(t, m.Unlock(context.Background()), ErrNotHeld)
	assert.Nil(t, m.Lease())
	var nilMutex *Mutex
	require.ErrorIs(t, nilMutex.Lock(context.Background()), ErrNoClient)
}

// TryLock on a key this Client holds says so, not "locked by another
// owner".
func TestTryLockSaysWhoHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		a, _ := memClient(t, st)
		b, _ := memClient(t, st)
		require.NoError(t, a.NewMutex("k").Lock(context.Background()))
		here := a.NewMutex("k").TryLock(context.Background())
		require.ErrorIs(t, here, ErrLocked)
		assert.Contains(t, here.Error(), "by this Client")
		there := b.NewMutex("k").TryLock(context.Background())
		require.ErrorIs(t, there, ErrLocked)
		assert.Contains(t, there.Error(), "by another owner")
	})
}

// Decisions on three edges, so that code and docs agree: (1) a Release
// racing Close returns nil or ErrClosed, never ErrReleased; (2) a lease
// past its local deadline that the background goroutine has not yet
// ended is lost: Release returns its *LeaseLostError and does not hand
// the key over; (3) Lock never returns a lease that has already ended: an
// acquire answered after the local deadline is retried.
func TestReleaseRacingClose(t *testing.T) {
	for i := range 20 {
		synctest.Test(t, func(t *testing.T) {
			st := newMemStore()
			c, _ := memClient(t, st)
			m := c.NewMutex("k")
			require.NoError(t, m.Lock(context.Background()))
			unlocked := make(chan error)
			go func() {
				time.Sleep(time.Duration(i%3) * time.Millisecond)
				unlocked <- m.Unlock(context.Background())
			}()
			time.Sleep(time.Duration(i%2) * time.Millisecond)
			require.NoError(t, c.Close(context.Background()))
			if err := <-unlocked; err != nil {
				require.ErrorIs(t, err, ErrClosed)
			}
		})
	}
}

// manualClock is a clock that moves only when told, whose timers never
// fire: the extender never runs on its own.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *manualClock) NewTimer(time.Duration) *time.Timer { return time.NewTimer(24 * time.Hour) }

func TestLeasePastDeadlineIsLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		clk := &manualClock{now: time.Unix(1e9, 0)}
		ttl := 10 * time.Second
		c, h := memClient(t, st, WithTTL(ttl), withClock(clk))
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(context.Background()))
		l := m.Lease()
		clk.advance(holdFor(ttl) - time.Nanosecond)
		require.NoError(t, l.Err())
		clk.advance(time.Nanosecond) // the deadline; the extender has not run
		require.ErrorIs(t, l.Err(), ErrLeaseLost, "Err must read the clock")
		require.True(t, waitClosed(l.Lost(), 0))

		require.ErrorIs(t, m.Unlock(context.Background()), ErrLeaseLost)

		// Released past its deadline, with a waiter: no handoff.
		require.NoError(t, m.Lock(context.Background()))
		l = m.Lease()
		waiter := c.NewMutex("k")
		got := make(chan error)
		go func() { got <- waiter.Lock(context.Background()) }()
		synctest.Wait()
		clk.advance(holdFor(ttl))
		require.ErrorIs(t, m.Unlock(context.Background()), ErrLeaseLost)
		assert.Zero(t, h.count("handoff"), "a lost lease was handed over")
		require.NoError(t, <-got)
		require.NoError(t, waiter.Lease().Err())
		assert.Greater(t, waiter.Lease().Token(), l.Token())
	})
}

func TestLockNeverReturnsAnEndedLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ttl := time.Second
		c, h := memClient(t, st, WithTTL(ttl))
		var first atomic.Bool
		h.on("acquire", func(ctx context.Context, call func() error) error {
			err := call()
			if first.CompareAndSwap(false, true) {
				time.Sleep(ttl) // answered after the deadline
			}
			return err
		})
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(context.Background()))
		require.NoError(t, m.Lease().Err(), "Lock returned an ended lease")
		assert.Equal(t, Token(2), m.Lease().Token(), "the hold renewed by the retry")
		assert.Equal(t, 2, h.count("acquire"))

		// TryLock makes one attempt: the hold it won too late is lost.
		require.NoError(t, m.Unlock(context.Background()))
		first.Store(false)
		err := c.NewMutex("k").TryLock(context.Background())
		require.ErrorIs(t, err, ErrLeaseLost)
		require.ErrorIs(t, err, errLateReply)
	})
}

// Found by the simulation: a lease stayed valid (Err nil, Context live)
// while its release was in flight, so work under its Context could run on
// after the key had passed to another Client. Release ends the lease
// before it sends anything, on both of its paths.
func TestReleaseEndsLeaseBeforeWriting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, h := memClient(t, st)
		m := c.NewMutex("k")
		for _, op := range []string{"release", "handoff"} {
			require.NoError(t, m.Lock(context.Background()))
			l := m.Lease()
			work := l.Context()
			h.on(op, func(_ context.Context, call func() error) error {
				require.ErrorIs(t, l.Err(), ErrReleased, "%s sent while the lease is valid", op)
				require.Error(t, work.Err(), "%s sent while work runs under the lease", op)
				return call()
			})
			if op == "handoff" {
				got := make(chan error)
				go func() { got <- c.NewMutex("k").Lock(context.Background()) }()
				synctest.Wait()
				require.NoError(t, m.Unlock(context.Background()))
				require.NoError(t, <-got)
			} else {
				require.NoError(t, m.Unlock(context.Background()))
			}
			assert.Equal(t, 1, h.count(op))
		}
	})
}

// Mutations of the lease logic that the rest of the suite lets through, each killed here.

// Killed: the lease deadline counted from the acquire's reply instead of
// its send. The reply comes a quarter TTL late; the lease is lost exactly
// holdFor after the send.
func TestDeadlineFromAcquireSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ttl := 10 * time.Second
		c, h := memClient(t, st, WithTTL(ttl))
		h.on("acquire", lateReply(ttl/4))
		h.on("extend", failing)
		sent := time.Now()
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(context.Background()))
		<-m.Lease().Lost()
		assert.Equal(t, holdFor(ttl), time.Since(sent))
	})
}

// Killed: the same for extensions. An extension sent at s whose reply
// comes late extends the lease to s+holdFor, no further.
func TestDeadlineFromExtensionSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ttl := 9 * time.Second
		c, h := memClient(t, st, WithTTL(ttl))
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(context.Background()))
		var sent time.Time
		h.on("extend", func(ctx context.Context, call func() error) error {
			sent = time.Now()
			h.on("extend", failing) // the later ones fail
			return lateReply(ttl/4)(ctx, call)
		})
		<-m.Lease().Lost()
		assert.Equal(t, ttl/3, sent.Sub(time.Unix(946684800, 0)), "the first extension is due at a third of the TTL")
		assert.Equal(t, holdFor(ttl), time.Since(sent))
	})
}

// Killed: an extension that finds another owner not ending the lease. The
// lease ends at that extension, long before its deadline, as taken over.
func TestExtensionFindingAnotherOwnerEndsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ttl := 9 * time.Second
		c, h := memClient(t, st, WithTTL(ttl))
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(context.Background()))
		l := m.Lease()
		start := time.Now()
		h.on("extend", func(ctx context.Context, call func() error) error {
			if h.count("extend") > 100 {
				t.Error("extending a lease the store shows taken over, again and again")
				return hang(ctx, call)
			}
			st.mu.Lock()
			r := st.records["k"]
			r.Owner, r.Token = "intruder", r.Token+1
			st.write("k", r)
			st.mu.Unlock()
			return call()
		})
		<-l.Lost()
		assert.Equal(t, ttl/3, time.Since(start), "lost at the extension that saw it")
		var lost *LeaseLostError
		require.ErrorAs(t, l.Err(), &lost)
		assert.Nil(t, lost.Cause, "taken over, not expired")
	})
}

// Killed: Lease.Err ignoring the local deadline (TestLeasePastDeadlineIsLost
// above, where the extender never runs), and Lock ignoring ctx while it
// sleeps between polls: with an hour between polls, a 50 ms ctx ends the
// wait at 50 ms.
func TestLockHonoursContextBetweenPolls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		a, _ := memClient(t, st)
		require.NoError(t, a.NewMutex("k").Lock(context.Background()))
		b, _ := memClient(t, st, WithBackoff(time.Hour, time.Hour))
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		require.ErrorIs(t, b.NewMutex("k").Lock(ctx), context.DeadlineExceeded)
		assert.Equal(t, 50*time.Millisecond, time.Since(start))
	})
}

// Killed: the extender extending a lease being released. While a slow
// Release is in flight across two cadences, no extension names its lease.
func TestNoExtensionDuringRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ttl := 3 * time.Second
		c, h := memClient(t, st, WithTTL(ttl))
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(context.Background()))
		other := c.NewMutex("other") // keeps the extender busy on a cadence
		require.NoError(t, other.Lock(context.Background()))
		var releasing atomic.Bool
		var before, beforeOther int // written before releasing is set
		h.on("release", func(ctx context.Context, call func() error) error {
			before, beforeOther = h.extensions("k"), h.extensions("other")
			releasing.Store(true)
			time.Sleep(2 * ttl / 3) // two cadences
			return call()
		})
		h.on("extend", func(ctx context.Context, call func() error) error {
			if releasing.Load() && h.extensions("k") > before {
				return hang(ctx, call) // seen: stop here rather than loop
			}
			return call()
		})
		require.NoError(t, m.Unlock(context.Background()))
		assert.Greater(t, h.extensions("other"), beforeOther, "the extender ran during the release")
		assert.Equal(t, before, h.extensions("k"), "extensions of a lease being released")
	})
}

// Killed: holdFor returning the full TTL, and takeoverWait without the
// clock-resolution discount. Exact values: the formulas are the safety
// argument of docs/design.md.
func TestExpiryFormulas(t *testing.T) {
	for _, ttl := range []time.Duration{time.Millisecond, time.Second, 10 * time.Second, time.Hour} {
		want := time.Duration(float64(ttl)*(1-MaxClockDrift)/(1+MaxClockDrift) - float64(ttl)*lostGuard)
		assert.Equal(t, want, holdFor(ttl), "holdFor(%v)", ttl)
		assert.Less(t, holdFor(ttl), ttl)
	}
	ttl := 10 * time.Second
	for _, tc := range []struct {
		elapsed, want time.Duration
	}{
		{-1, ttl},                    // unknown
		{0, ttl},                     // just written
		{serverClockResolution, ttl}, // within the stamp's truncation: no credit
		{500 * time.Millisecond, ttl - 500*time.Millisecond + serverClockResolution},
		{ttl, serverClockResolution},
		{ttl + serverClockResolution, 0},
		{time.Hour, 0},
	} {
		assert.Equal(t, tc.want, takeoverWait(ttl, tc.elapsed), "takeoverWait(%v, %v)", ttl, tc.elapsed)
	}
}

// No extension interval the lease cannot survive is accepted (TTL 1 s,
// every 990 ms would be lost with no fault): the longest interval accepted
// leaves room for a retry: at WithExtendInterval at its maximum,
// a first extension that fails is retried in time, and the lease lives.
func TestLongestExtendIntervalSurvivesAFailure(t *testing.T) {
	ttl := time.Second
	longest := time.Duration(float64(ttl) * MaxExtendInterval)
	assert.Equal(t, holdFor(ttl)/2, longest, "MaxExtendInterval is half the local deadline")
	newMem := func(*telemetry) store { return newMemStore() }
	_, err := newClientOn(newMem, WithTTL(ttl), WithExtendInterval(longest+time.Millisecond))
	require.ErrorIs(t, err, ErrInvalidOption)
	c, err := newClientOn(newMem, WithTTL(ttl), WithExtendInterval(longest))
	require.NoError(t, err)
	c.Close(context.Background())
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, h := memClient(t, st, WithTTL(ttl), WithExtendInterval(longest))
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(context.Background()))
		h.on("extend", func(ctx context.Context, call func() error) error {
			h.on("extend", nil)    // only the first fails
			return hang(ctx, call) // and hangs: given up after half the time left
		})
		time.Sleep(3 * ttl)
		require.NoError(t, m.Lease().Err(), "lost after one failed extension at the longest interval")
		assert.GreaterOrEqual(t, h.count("extend"), 6)
	})
}

// A TTL shorter than the server's round trip: every acquire, and every
// registration in the queue, is answered after its local deadline. A Lock
// (or a shared acquire) that sees that lateReplies times in a row returns
// ErrTTLTooShort, rather than retry until its ctx ends, and leaves nothing
// held. After a TryLock, whose late hold stays on the server (its clean-up,
// bounded by the TTL, gets no answer), the Lock finds the key held by
// that hold, and registers: registrations answered late count too, or the
// wait would register again and again.
func TestLockTTLShorterThanRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		lock func(ctx context.Context, c *Client, h *hooked) error
	}{
		{"Mutex.Lock", func(ctx context.Context, c *Client, _ *hooked) error { return c.NewMutex("k").Lock(ctx) }},
		{"Election.Campaign", func(ctx context.Context, c *Client, _ *hooked) error {
			_, err := c.NewElection("k").Campaign(ctx, "v")
			return err
		}},
		{"RWMutex.RLock", func(ctx context.Context, c *Client, _ *hooked) error { return c.NewRWMutex("k").RLock(ctx) }},
		{"Semaphore.Acquire", func(ctx context.Context, c *Client, _ *hooked) error {
			_, err := c.NewSemaphore("k", 2).Acquire(ctx)
			return err
		}},
		{"Mutex.TryLock then Lock", func(ctx context.Context, c *Client, h *hooked) error {
			m := c.NewMutex("k")
			h.on("abandon", hang) // the TryLock's clean-up, bounded by the TTL
			require.ErrorIs(t, m.TryLock(ctx), errLateReply)
			synctest.Wait()
			h.on("abandon", nil)
			return m.Lock(ctx)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newMemStore()
				ttl := time.Millisecond
				c, h := memClient(t, st, WithTTL(ttl))
				h.on("acquire", lateReply(2*ttl)) // a round trip of 2 ms
				h.on("register", lateReply(2*ttl))
				ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
				defer cancel()
				err := tc.lock(ctx, c, h)
				require.ErrorIs(t, err, ErrTTLTooShort)
				require.NoError(t, ctx.Err(), "Lock retried until its ctx ended")
				assert.Contains(t, err.Error(), `"k"`)
				assert.Contains(t, err.Error(), "3 writes in a row")
				synctest.Wait() // the clean-up in the background
				r := holder(st, "k")
				assert.Empty(t, r.Owner, "held after the Lock returned")
				assert.Empty(t, r.Shared, "held after the Lock returned")
			})
		})
	}
}

// Two slow replies in a row are two, not three: a wait that gets two
// late acquires (a pause, a failover) and then a timely one takes the key,
// on the embedded server and on the in-memory store. A shared wait once
// counted its first late reply again, when its next read found that same
// hold and rebuilt it from the first send, and so ended with
// ErrTTLTooShort after two.
func TestTwoSlowRepliesDoNotEndAWait(t *testing.T) {
	for _, tc := range []struct {
		name string
		lock func(ctx context.Context, c *Client) error
	}{
		{"Mutex.Lock", func(ctx context.Context, c *Client) error { return c.NewMutex("k").Lock(ctx) }},
		{"RWMutex.RLock", func(ctx context.Context, c *Client) error { return c.NewRWMutex("k").RLock(ctx) }},
		{"Semaphore.Acquire", func(ctx context.Context, c *Client) error {
			_, err := c.NewSemaphore("k", 2).Acquire(ctx)
			return err
		}},
	} {
		run := func(t *testing.T, st store, ttl time.Duration) {
			c, h := memClient(t, st, WithTTL(ttl))
			var sent atomic.Int32
			h.on("acquire", func(ctx context.Context, call func() error) error {
				if sent.Add(1) > 2 {
					return call()
				}
				return lateReply(5*ttl/2)(ctx, call)
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			require.NoError(t, tc.lock(ctx, c), "after two late replies")
			assert.EqualValues(t, 3, sent.Load(), "acquires sent")
		}
		t.Run(tc.name+"/server", func(t *testing.T) {
			run(t, newMongoStore(newColl(t), func(context.Context, int) {}), 400*time.Millisecond)
		})
		t.Run(tc.name+"/memory", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { run(t, newMemStore(), time.Second) })
		})
	}
}
