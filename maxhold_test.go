package dlock

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Tests of WithMaxHold on the in-memory store, inside synctest bubbles: a
// minute's hold passes in no real time, and the times asserted are exact.

// maxHoldLost is when, after its acquire, a healthy hold capped at d with
// TTL ttl is lost: the last extension is due lastGuard before the cap less
// a TTL, and the lease lasts holdFor after it.
func maxHoldLost(d, ttl time.Duration) time.Duration {
	return d - ttl - lastGuard(ttl) + holdFor(ttl)
}

// requireMaxHoldLost checks that l ended as lost to the cap, with every
// view of the loss saying so.
func requireMaxHoldLost(t *testing.T, l *Lease) *LeaseLostError {
	t.Helper()
	err := l.Err()
	require.True(t, waitClosed(l.Lost(), 0), "Lost not closed")
	var lost *LeaseLostError
	require.ErrorAs(t, err, &lost)
	require.ErrorIs(t, err, ErrLeaseLost)
	require.ErrorIs(t, lost.Cause, ErrMaxHold)
	require.ErrorIs(t, context.Cause(l.Context()), ErrMaxHold)
	assert.Equal(t, l.Token(), lost.Token)
	return lost
}

func TestMaxHoldLostAtCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ttl, d := 10*time.Second, time.Minute
		c, h := memClient(t, st, WithTTL(ttl), WithMaxHold(d))
		m := c.NewMutex("k")
		start := time.Now()
		require.NoError(t, m.Lock(context.Background()))
		l := m.Lease()
		<-l.Lost()
		assert.Equal(t, maxHoldLost(d, ttl), time.Since(start), "lost at the wrong time")
		assert.Less(t, time.Since(start), d, "lost after the cap")
		lost := requireMaxHoldLost(t, l)
		assert.Contains(t, lost.Error(), "maximum hold time reached (1m0s after the acquire)")

		// Extended on its cadence (every ttl/3) until the last extension,
		// a TTL and a guard before the cap, and never after it.
		lastDue := d - ttl - lastGuard(ttl)
		assert.Equal(t, int(lastDue/(ttl/3))+1, h.count("extend"))
		r := holder(st, "k")
		assert.Equal(t, lastDue, r.At.Sub(start), "the last write to the key")
		time.Sleep(2 * ttl)
		assert.Equal(t, r.Rev, holder(st, "k").Rev, "written after the lease was lost")

		require.ErrorIs(t, m.Unlock(context.Background()), ErrMaxHold)
	})
}

// Other Clients take the key at most one TTL after the cap when they were
// already waiting, whenever they began; one that begins after the cap
// takes it a TTL after its first look.
func TestMaxHoldOthersTakeOver(t *testing.T) {
	ttl, d := 10*time.Second, time.Minute
	lastDue := d - ttl - lastGuard(ttl)
	for _, tc := range []struct {
		name   string
		from   time.Duration // when the other Client starts waiting, after the acquire
		within time.Duration // by when it must hold the key, after the acquire
	}{
		{name: "waiting from the start", from: 0, within: d + ttl},
		{name: "waiting from just before the last extension", from: lastDue - 50*time.Millisecond, within: d + ttl},
		{name: "waiting from the last extension", from: lastDue, within: d + ttl},
		{name: "waiting from the cap", from: d, within: d + ttl + DefaultMaxBackoff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newMemStore()
				a, _ := memClient(t, st, WithTTL(ttl), WithMaxHold(d))
				b, _ := memClient(t, st, WithTTL(ttl))
				m := a.NewMutex("k")
				start := time.Now()
				require.NoError(t, m.Lock(context.Background()))
				l := m.Lease()
				time.Sleep(tc.from)
				other := b.NewMutex("k")
				require.NoError(t, other.Lock(context.Background()))
				took := time.Since(start)
				assert.LessOrEqual(t, took, tc.within, "taken over too late")
				assert.Greater(t, other.Lease().Token(), l.Token())
				requireMaxHoldLost(t, l) // and lost before the other took the key
				assert.Less(t, maxHoldLost(d, ttl), took)
				t.Logf("taken over %v after the cap", took-d)
			})
		})
	}
}

// The last extension is not retried: when it fails, the lease is lost at
// the deadline of the one before, to the cap and to the failure.
func TestMaxHoldLastExtensionFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ttl, d := 10*time.Second, time.Minute
		c, h := memClient(t, st, WithTTL(ttl), WithMaxHold(d))
		m := c.NewMutex("k")
		start := time.Now()
		lastDue := d - ttl - lastGuard(ttl)
		h.on("extend", func(ctx context.Context, call func() error) error {
			if time.Since(start) >= lastDue {
				return errInjected
			}
			return call()
		})
		require.NoError(t, m.Lock(context.Background()))
		l := m.Lease()
		<-l.Lost()
		every := ttl / 3
		prev := lastDue / every * every // the last extension that applied
		assert.Equal(t, prev+holdFor(ttl), time.Since(start))
		lost := requireMaxHoldLost(t, l)
		require.ErrorIs(t, lost.Cause, errInjected, "the failure is part of the cause")
		assert.Equal(t, int(lastDue/every)+1, h.count("extend"), "the last extension was retried")
	})
}

// An extension in flight across the last moment for one: when its reply
// comes, past that moment, no further extension is sent.
func TestMaxHoldNoExtensionAfterStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ttl, d := 10*time.Second, time.Minute
		c, h := memClient(t, st, WithTTL(ttl), WithMaxHold(d))
		m := c.NewMutex("k")
		start := time.Now()
		stop := d - ttl
		every := ttl / 3
		slowAt := (d - ttl - lastGuard(ttl)) / every * every // the extension before the last
		h.on("extend", func(ctx context.Context, call func() error) error {
			if time.Since(start) == slowAt {
				return lateReply(stop-slowAt+100*time.Millisecond)(ctx, call) // answered past stop
			}
			if time.Since(start) > stop {
				t.Errorf("extension sent %v after the acquire, past %v", time.Since(start), stop)
			}
			return call()
		})
		require.NoError(t, m.Lock(context.Background()))
		l := m.Lease()
		<-l.Lost()
		assert.Equal(t, slowAt+holdFor(ttl), time.Since(start))
		requireMaxHoldLost(t, l)
		assert.Equal(t, int(slowAt/every), h.count("extend"))
	})
}

// The extender sends, in one write, every lease due within half a cadence;
// a capped hold's last extension does not go early with the others, or
// the hold would end sooner than it need. Here another lease of the
// Client is extended every second, and the capped one joins it each time
// it is due within half its cadence, but not for its last extension.
func TestMaxHoldLastExtensionNotEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ttl, d := 10*time.Second, time.Minute
		c, _ := memClient(t, st, WithTTL(ttl))
		busy := c.NewMutex("busy", WithExtendInterval(time.Second))
		require.NoError(t, busy.Lock(context.Background()))
		time.Sleep(100 * time.Millisecond) // so that the capped lease is due between busy's extensions
		m := c.NewMutex("k", WithMaxHold(d))
		start := time.Now()
		require.NoError(t, m.Lock(context.Background()))
		l := m.Lease()
		<-l.Lost()
		assert.Equal(t, maxHoldLost(d, ttl), time.Since(start))
		requireMaxHoldLost(t, l)
		require.NoError(t, busy.Lease().Err())
	})
}

// A hold capped at its TTL is never extended.
func TestMaxHoldOfOneTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ttl := 10 * time.Second
		c, h := memClient(t, st, WithTTL(ttl), WithMaxHold(ttl))
		m := c.NewMutex("k")
		start := time.Now()
		require.NoError(t, m.Lock(context.Background()))
		l := m.Lease()
		<-l.Lost()
		assert.Equal(t, holdFor(ttl), time.Since(start))
		requireMaxHoldLost(t, l)
		assert.Zero(t, h.count("extend"))
	})
}

// A hold handed over within a Client is a new hold, with a cap of its own
// counted from the handoff.
func TestMaxHoldHandoffStartsNewHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ttl, d := 10*time.Second, time.Minute
		c, h := memClient(t, st, WithTTL(ttl))
		m1 := c.NewMutex("k", WithMaxHold(d))
		require.NoError(t, m1.Lock(context.Background()))
		first := m1.Lease()
		time.Sleep(30 * time.Second)
		m2 := c.NewMutex("k", WithMaxHold(d))
		got := make(chan error)
		go func() { got <- m2.Lock(context.Background()) }()
		time.Sleep(10 * time.Second)
		handoff := time.Now()
		require.NoError(t, m1.Unlock(context.Background()))
		require.NoError(t, <-got)
		assert.Equal(t, 1, h.count("handoff"))
		second := m2.Lease()
		assert.ErrorIs(t, first.Err(), ErrReleased)
		assert.Greater(t, second.Token(), first.Token())
		<-second.Lost()
		assert.Equal(t, maxHoldLost(d, ttl), time.Since(handoff))
		requireMaxHoldLost(t, second)
	})
}

// Whatever the timing of the extensions, the deadline never passes the
// cap: an extension sent just before the cap extends the lease to the cap.
func TestMaxHoldDeadlineClamped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		clk := &manualClock{now: time.Unix(1e9, 0)}
		ttl, d := 10*time.Second, 15*time.Second
		c, _ := memClient(t, st, WithTTL(ttl), WithMaxHold(d), withClock(clk))
		m := c.NewMutex("k")
		start := clk.Now()
		require.NoError(t, m.Lock(context.Background()))
		l := m.Lease()
		l.extended(start.Add(d - time.Millisecond))
		l.mu.Lock()
		deadline := l.deadline
		l.mu.Unlock()
		assert.Equal(t, start.Add(d), deadline)
		clk.advance(d - time.Nanosecond)
		require.NoError(t, l.Err())
		clk.advance(time.Nanosecond)
		requireMaxHoldLost(t, l)
	})
}

func TestMaxHoldOption(t *testing.T) {
	newMem := func(*telemetry) store { return newMemStore() }
	ttl := 10 * time.Second
	for _, tc := range []struct {
		name   string
		client []Option
		mutex  []Option
		err    string // "" for valid
	}{
		{name: "off", client: []Option{WithTTL(ttl), WithMaxHold(0)}},
		{name: "the TTL", client: []Option{WithTTL(ttl), WithMaxHold(ttl)}},
		{name: "an hour", client: []Option{WithTTL(ttl), WithMaxHold(time.Hour)}},
		{name: "negative", client: []Option{WithMaxHold(-time.Second)}, err: "maximum hold -1s is negative"},
		{name: "under the TTL", client: []Option{WithTTL(ttl), WithMaxHold(ttl - time.Millisecond)},
			err: "maximum hold 9.999s is shorter than the TTL 10s"},
		{name: "for a Mutex", client: []Option{WithTTL(ttl)}, mutex: []Option{WithMaxHold(time.Minute)}},
		{name: "for a Mutex, under the Client's TTL", client: []Option{WithTTL(ttl)}, mutex: []Option{WithMaxHold(time.Second)},
			err: "maximum hold 1s is shorter than the TTL 10s"},
		{name: "for a Mutex, under its own TTL", client: []Option{WithMaxHold(time.Minute)}, mutex: []Option{WithTTL(2 * time.Minute)},
			err: "maximum hold 1m0s is shorter than the TTL 2m0s"},
		{name: "for a Mutex with a shorter TTL", client: []Option{WithTTL(ttl)}, mutex: []Option{WithTTL(time.Second), WithMaxHold(time.Second)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := newClientOn(newMem, tc.client...)
			if tc.mutex == nil {
				if tc.err == "" {
					require.NoError(t, err)
					c.Close(context.Background())
					return
				}
				require.ErrorIs(t, err, ErrInvalidOption)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			defer c.Close(context.Background())
			err = c.NewMutex("k", tc.mutex...).TryLock(context.Background())
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidOption)
			assert.Contains(t, err.Error(), tc.err)
			assert.False(t, errors.Is(err, ErrMaxHold))
		})
	}
}

// A hold lost to the cap is reported as such: the dlock.LeaseLost span and
// the dlock.lease.lost counter name the cause max_hold.
func TestMaxHoldTelemetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newTelemetryRig()
		c, _ := memClient(t, newMemStore(), append(rig.opts, WithTTL(time.Second), WithMaxHold(time.Minute))...)
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(context.Background()))
		<-m.Lease().Lost()
		synctest.Wait() // the extender reports the loss after closing Lost
		lost := rig.ended("dlock.LeaseLost")
		require.Len(t, lost, 1)
		assert.Equal(t, causeMaxHold, attrs(lost[0])[attrCause].AsString())
		assert.EqualValues(t, 1, sum(t, rig.metrics(t)["dlock.lease.lost"], attrCause.String(causeMaxHold)))
	})
}

// WithMaxHold caps every kind of hold alike: a read hold of an RWMutex, a
// write hold, and a Semaphore's permit are lost at the same moment as a
// Mutex's, with the same cause.
func TestMaxHoldEveryKind(t *testing.T) {
	ttl, d := 10*time.Second, time.Minute
	for _, tc := range []struct {
		name string
		lock func(c *Client) (*Lease, error)
	}{
		{"RWMutex.RLock", func(c *Client) (*Lease, error) {
			rw := c.NewRWMutex("k")
			err := rw.RLock(context.Background())
			return rw.Lease(), err
		}},
		{"RWMutex.Lock", func(c *Client) (*Lease, error) {
			rw := c.NewRWMutex("k")
			err := rw.Lock(context.Background())
			return rw.Lease(), err
		}},
		{"Semaphore.Acquire", func(c *Client) (*Lease, error) {
			return c.NewSemaphore("k", 2).Acquire(context.Background())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, _ := memClient(t, newMemStore(), WithTTL(ttl), WithMaxHold(d))
				start := time.Now()
				l, err := tc.lock(c)
				require.NoError(t, err)
				<-l.Lost()
				assert.Equal(t, maxHoldLost(d, ttl), time.Since(start), "lost at the wrong time")
				requireMaxHoldLost(t, l)
			})
		})
	}
}
