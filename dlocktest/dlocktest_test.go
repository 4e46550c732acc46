package dlocktest_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// newClient returns a Client on s, closed when the test ends; inside a
// synctest bubble, the Cleanup runs inside the bubble.
func newClient(t *testing.T, s *dlocktest.Server, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c := s.Client(opts...)
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil && !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// holdFor is the documented local deadline of a lease, counted from when
// its last successful write was sent: ttl·(1-ρ)/(1+ρ) minus a 1% guard.
func holdFor(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*(1-dlock.MaxClockDrift)/(1+dlock.MaxClockDrift) - float64(ttl)*0.01)
}

// within returns what ch yields, or fails the test when d of fake time
// passes first: a broken partition fails the test instead of hanging it.
func within[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
		panic("unreachable")
	}
}

// inBubble runs f in a synctest bubble and logs the real time it took.
func inBubble(t *testing.T, f func(t *testing.T)) {
	start := time.Now()
	synctest.Test(t, f)
	t.Logf("real time: %v", time.Since(start))
}

// Two Clients of one Server contend as two processes would.
func TestClientsContend(t *testing.T) {
	ctx := context.Background()
	s := dlocktest.NewServer()
	a, b := newClient(t, s), newClient(t, s)

	ma, mb := a.NewMutex("k"), b.NewMutex("k")
	require.NoError(t, ma.Lock(ctx))
	assert.EqualValues(t, 1, ma.Lease().Token())
	err := mb.TryLock(ctx)
	require.ErrorIs(t, err, dlock.ErrLocked)
	assert.Contains(t, err.Error(), "another owner")

	require.NoError(t, ma.Unlock(ctx))
	lockCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, mb.Lock(lockCtx))
	assert.EqualValues(t, 2, mb.Lease().Token())
	require.ErrorIs(t, ma.TryLock(ctx), dlock.ErrLocked)
}

// A partitioned holder loses its lease at its local deadline, just under
// the TTL after its last successful write, and only then, a TTL after that
// write, does another Client take the key: an hour of fake time, no real
// time.
func TestPartitionedHolderLosesLease(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		ctx := context.Background()
		const ttl = time.Hour
		s := dlocktest.NewServer()
		a := newClient(t, s, dlock.WithTTL(ttl))
		b := newClient(t, s, dlock.WithTTL(ttl))

		ma := a.NewMutex("k")
		require.NoError(t, ma.Lock(ctx))
		lease := ma.Lease()
		start := time.Now() // A's last successful write: the acquire
		s.Partition(a)

		var lostAt time.Time
		lostSeen := make(chan struct{})
		go func() {
			<-lease.Done() // Lost closes first, if at all
			lostAt = time.Now()
			close(lostSeen)
		}()
		mb := b.NewMutex("k")
		type result struct {
			err    error
			at     time.Time
			aAlive bool // A's lease was not yet lost when B's Lock returned
		}
		bDone := make(chan result, 1)
		go func() {
			err := mb.Lock(ctx)
			r := result{err: err, at: time.Now()}
			select {
			case <-lease.Lost():
			default:
				r.aAlive = true
			}
			bDone <- r
		}()

		within(t, lostSeen, 2*ttl, "A's lease lost")
		lostAfter := lostAt.Sub(start)
		t.Logf("A lost its lease after %v of fake time", lostAfter)
		assert.Less(t, lostAfter, ttl)
		assert.Greater(t, lostAfter, 58*time.Minute)
		assert.InDelta(t, holdFor(ttl), lostAfter, float64(time.Millisecond), "not the documented local deadline")
		select {
		case <-lease.Done():
		default:
			t.Error("Lost closed but Done did not")
		}
		assert.ErrorIs(t, context.Cause(lease.Context()), dlock.ErrLeaseLost)
		var lost *dlock.LeaseLostError
		require.ErrorAs(t, lease.Err(), &lost)
		assert.ErrorIs(t, lease.Err(), dlock.ErrLeaseLost)
		assert.NotNil(t, lost.Cause, "lost to failed extensions, not to a takeover")

		r := within(t, bDone, 2*ttl, "B's Lock")
		require.NoError(t, r.err)
		assert.False(t, r.aAlive, "B acquired while A's lease was live")
		bAfter := r.at.Sub(start)
		t.Logf("B acquired after %v of fake time", bAfter)
		assert.True(t, lostAt.Before(r.at), "B acquired at %v, before A's lease was lost at %v", bAfter, lostAfter)
		assert.GreaterOrEqual(t, bAfter, ttl, "B took the key less than a TTL after A's last write")
		assert.LessOrEqual(t, bAfter, ttl+dlock.DefaultMaxBackoff, "B took too long")
		assert.EqualValues(t, 2, mb.Lease().Token())

		s.Heal(a)
		require.ErrorIs(t, ma.Unlock(ctx), dlock.ErrLeaseLost)
		require.NoError(t, a.Close(ctx))
		require.ErrorIs(t, ma.TryLock(ctx), dlock.ErrClosed)
		assert.NotNil(t, mb.Lease(), "A's clean-up freed B's hold")
	})
}

// runJob is the code under test: it works every minute until ctx ends,
// and returns why it stopped.
func runJob(ctx context.Context, ticks *atomic.Int64) error {
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-tick.C:
			ticks.Add(1)
		}
	}
}

// The test a user writes: my job stops when its lease is lost.
func TestJobStopsWhenLeaseLost(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		ctx := context.Background()
		const ttl = time.Hour
		s := dlocktest.NewServer()
		c := newClient(t, s, dlock.WithTTL(ttl))
		m := c.NewMutex("nightly-report")
		require.NoError(t, m.Lock(ctx))
		lease := m.Lease()
		locked := time.Now()

		var ticks atomic.Int64
		stopped := make(chan error, 1)
		go func() { stopped <- runJob(lease.Context(), &ticks) }()

		time.Sleep(30 * time.Minute) // fake time: the lease is extended meanwhile
		select {
		case err := <-stopped:
			t.Fatalf("the job stopped while the lease was held: %v", err)
		default:
		}
		require.NoError(t, lease.Err())
		require.GreaterOrEqual(t, ticks.Load(), int64(29), "the job did not run")

		partitioned := time.Now()
		s.Partition(c)
		err := within(t, stopped, ttl, "the job stopped after the partition")
		stoppedAfter := time.Since(partitioned)
		t.Logf("partitioned %v after locking; the job stopped %v after the partition", partitioned.Sub(locked), stoppedAfter)
		require.ErrorIs(t, err, dlock.ErrLeaseLost)
		// The last successful write was the extension at a third of the
		// TTL (the default cadence): the lease was relied on until its
		// local deadline counted from then, and not a moment longer.
		assert.Less(t, stoppedAfter, ttl)
		assert.InDelta(t, ttl/3+holdFor(ttl), time.Since(locked), float64(time.Millisecond))

		n := ticks.Load()
		time.Sleep(ttl)
		assert.Equal(t, n, ticks.Load(), "the job still works")
		s.Heal(c)
	})
}

// A waiter cut off while it waits keeps retrying until its ctx ends, then
// returns the ctx's error, having applied nothing; healed, it locks.
func TestPartitionedWaiter(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		ctx := context.Background()
		s := dlocktest.NewServer()
		a, b := newClient(t, s), newClient(t, s)
		ma, mb := a.NewMutex("k"), b.NewMutex("k")
		require.NoError(t, ma.Lock(ctx))

		const timeout = time.Minute
		start := time.Now()
		waitCtx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- mb.Lock(waitCtx) }()
		synctest.Wait() // B waits between polls of the held key
		select {
		case err := <-done:
			t.Fatalf("B's Lock returned while A held the key: %v", err)
		default:
		}

		s.Partition(b)
		require.NoError(t, ma.Unlock(ctx)) // free, but B cannot reach it: had B reached it, its Lock would succeed
		err := within(t, done, 2*timeout, "B's Lock")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, timeout, time.Since(start), "B gave up before its ctx ended")
		assert.Nil(t, mb.Lease())

		s.Heal(b)
		require.NoError(t, mb.TryLock(ctx), "B's attempts while cut off left the key held")
		assert.EqualValues(t, 2, mb.Lease().Token(), "B's attempts while cut off used tokens")
	})
}

// Several Clients, each with several goroutines, lock one key in turn, in
// real time: at most one holds it at a time, and the tokens go up with
// each hold, by one, or by two where a Lock that waited reserved a token
// for its Mutex's next Lock and that Lock did not take the hold over
// (see "Fairness" in the package doc: the keep).
func TestExclusion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const clients, goroutines, rounds = 3, 4, 50
	s := dlocktest.NewServer()

	var inside, maxInside atomic.Int32
	var last atomic.Uint64
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		c := newClient(t, s, dlock.WithBackoff(dlock.MinBackoff, 2*time.Millisecond))
		for range goroutines {
			m := c.NewMutex("k")
			wg.Go(func() {
				for range rounds {
					if err := m.Lock(ctx); err != nil {
						t.Error(err)
						return
					}
					n := inside.Add(1)
					for old := maxInside.Load(); n > old && !maxInside.CompareAndSwap(old, n); old = maxInside.Load() {
					}
					l := m.Lease()
					if l == nil {
						t.Error("Lock returned, and its lease is lost already")
						return
					}
					tok := uint64(l.Token())
					if prev := last.Swap(tok); tok <= prev {
						t.Errorf("token %d after %d", tok, prev)
					}
					time.Sleep(10 * time.Microsecond) // a critical section others could overlap
					if err := l.Err(); err != nil {
						t.Error(err)
					}
					inside.Add(-1)
					if err := m.Unlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	t.Logf("%d holds in %v", clients*goroutines*rounds, time.Since(start))
	assert.EqualValues(t, 1, maxInside.Load(), "holders overlapped")
	holds := uint64(clients * goroutines * rounds)
	assert.GreaterOrEqual(t, last.Load(), holds, "a token for each hold")
	assert.LessOrEqual(t, last.Load(), 2*holds, "at most two tokens for each hold")
}

// Two Servers share nothing: the same key is free on each, and a
// partition on one does not touch the other.
func TestServersIndependent(t *testing.T) {
	ctx := context.Background()
	s1, s2 := dlocktest.NewServer(), dlocktest.NewServer()
	c1, c2 := newClient(t, s1), newClient(t, s2)
	m1, m2 := c1.NewMutex("k"), c2.NewMutex("k")
	require.NoError(t, m1.TryLock(ctx))
	require.NoError(t, m2.TryLock(ctx))
	assert.EqualValues(t, 1, m1.Lease().Token())
	assert.EqualValues(t, 1, m2.Lease().Token())

	s1.Partition(c1)
	require.NoError(t, m2.Unlock(ctx))
	require.NoError(t, m2.TryLock(ctx))
	assert.EqualValues(t, 2, m2.Lease().Token())
	s1.Heal(c1)
}

// The Server keeps a hold's trace context as a MongoDB server does: two
// Clients, each with its own tracer provider (two processes), and the
// waiter's Lock span links to the span in which the holder took the key,
// which Holders names too.
func TestTraceLinks(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		ctx := context.Background()
		s := dlocktest.NewServer()
		hspans, wspans := tracetest.NewInMemoryExporter(), tracetest.NewInMemoryExporter()
		holder := newClient(t, s, dlock.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(hspans))))
		waiter := newClient(t, s, dlock.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(wspans))))

		hm := holder.NewMutex("k")
		require.NoError(t, hm.Lock(ctx))
		require.Len(t, hspans.GetSpans(), 1)
		took := hspans.GetSpans()[0].SpanContext
		hs, err := holder.Holders(ctx, "k")
		require.NoError(t, err)
		require.Len(t, hs, 1)
		assert.Equal(t, took.TraceID(), hs[0].TraceID)
		assert.Equal(t, took.SpanID(), hs[0].SpanID)

		done := make(chan error)
		wm := waiter.NewMutex("k")
		go func() { done <- wm.Lock(ctx) }()
		synctest.Wait() // the waiter saw the holder, and sleeps until its next poll
		require.NoError(t, hm.Unlock(ctx))
		require.NoError(t, <-done)
		require.NoError(t, wm.Unlock(ctx))

		spans := wspans.GetSpans()
		require.Len(t, spans, 2) // Lock, Release
		require.Equal(t, "dlock.Lock", spans[0].Name)
		require.Len(t, spans[0].Links, 1)
		assert.Equal(t, took.TraceID(), spans[0].Links[0].SpanContext.TraceID())
		assert.Equal(t, took.SpanID(), spans[0].Links[0].SpanContext.SpanID())
	})
}
