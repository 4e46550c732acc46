package dlock

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lose makes l lost: every extension fails until its local deadline; then
// the server answers again.
func lose(h *hooked, l *Lease) {
	h.on("extend", failing)
	<-l.Lost()
	h.on("extend", nil)
}

// One behaviour for a lost hold, whatever the primitive: the primitive
// holds it no more (its Lease returns nil), and its next Lock proceeds
// without an Unlock, at once: it neither waits for the lost hold in the
// Client nor for its TTL on the server. The Unlock that comes before any
// new Lock reports the loss.
func TestLostHoldIsForgotten(t *testing.T) {
	const ttl = 10 * time.Second
	ctx := context.Background()
	type primitive struct {
		lock   func(ctx context.Context) error
		lease  func() *Lease
		unlock func(ctx context.Context) error
	}
	for _, tc := range []struct {
		name string
		make func(c *Client) primitive
	}{
		{"Mutex.Lock", func(c *Client) primitive {
			m := c.NewMutex("k")
			return primitive{m.Lock, m.Lease, m.Unlock}
		}},
		{"Mutex.TryLock", func(c *Client) primitive {
			m := c.NewMutex("k")
			return primitive{m.TryLock, m.Lease, m.Unlock}
		}},
		{"RWMutex.Lock", func(c *Client) primitive {
			rw := c.NewRWMutex("k")
			return primitive{rw.Lock, rw.Lease, rw.Unlock}
		}},
		{"Election.Campaign", func(c *Client) primitive {
			e := c.NewElection("k")
			campaign := func(ctx context.Context) error { _, err := e.Campaign(ctx, "v"); return err }
			resign := func(ctx context.Context) error {
				if l := e.lease; l != nil { // e.Lease() is nil once lost
					return l.Release(ctx)
				}
				return ErrNotHeld
			}
			return primitive{campaign, e.Lease, resign}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, h := memClient(t, newMemStore(), WithTTL(ttl))
				p := tc.make(c)
				require.NoError(t, p.lock(ctx))
				first := p.lease()
				lose(h, first)
				assert.True(t, p.lease() == nil, "a lost hold is not the primitive's")

				wait, cancel := context.WithTimeout(ctx, time.Hour) // fail, rather than hang
				defer cancel()
				start := time.Now()
				require.NoError(t, p.lock(wait), "the next Lock proceeds")
				assert.Less(t, time.Since(start), ttl, "without waiting for the lost hold")
				second := p.lease()
				require.NotNil(t, second)
				assert.Greater(t, second.Token(), first.Token())
				require.ErrorIs(t, first.Err(), ErrLeaseLost)

				lose(h, second)
				require.ErrorIs(t, p.unlock(ctx), ErrLeaseLost, "the Unlock of a lost hold reports it")
				require.ErrorIs(t, p.unlock(ctx), ErrNotHeld)
			})
		})
	}
}

// The read side of an RWMutex: a lost read hold is not its Lease, the next
// RLock takes a new one, and the loss is reported by an RUnlock (see
// RWMutex.RUnlock for which).
func TestLostReadHoldIsForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		c, h := memClient(t, newMemStore(), WithTTL(10*time.Second))
		rw := c.NewRWMutex("k")
		require.NoError(t, rw.RLock(ctx))
		first := rw.Lease()
		lose(h, first)
		assert.True(t, rw.Lease() == nil, "a lost read hold is not the RWMutex's")

		require.NoError(t, rw.RLock(ctx))
		second := rw.Lease()
		require.NotNil(t, second)
		assert.NotSame(t, first, second)
		require.NoError(t, second.Err())
		require.ErrorIs(t, rw.RUnlock(ctx), ErrLeaseLost, "an RLock counted on the lost hold")
		require.ErrorIs(t, rw.RUnlock(ctx), ErrLeaseLost)
		require.ErrorIs(t, rw.RUnlock(ctx), ErrNotHeld)
	})
}

// A Semaphore keeps no lease: a lost permit is not counted by its next
// Acquire beyond the permit's TTL (its Client stopped extending it), and
// its Release reports the loss.
func TestLostPermitIsForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 10 * time.Second
		ctx := context.Background()
		c, h := memClient(t, newMemStore(), WithTTL(ttl))
		s := c.NewSemaphore("k", 1)
		first, err := s.Acquire(ctx)
		require.NoError(t, err)
		lose(h, first)

		wait, cancel := context.WithTimeout(ctx, time.Hour) // fail, rather than hang
		defer cancel()
		start := time.Now()
		second, err := s.Acquire(wait)
		require.NoError(t, err, "the next Acquire proceeds")
		assert.LessOrEqual(t, time.Since(start), ttl+DefaultMaxBackoff*3/2, "within the lost permit's TTL and a poll")
		assert.Greater(t, second.Token(), first.Token())
		require.ErrorIs(t, first.Release(ctx), ErrLeaseLost)
		require.NoError(t, second.Release(ctx))
	})
}

// Done and Lost close as the lease ends, whether they were first called
// while it was held or only after it ended (a lease makes its channels on
// the first call): Done at any end, Lost only at a loss; and each returns
// one channel from then on.
func TestLeaseChannels(t *testing.T) {
	const ttl = 10 * time.Second
	for _, tc := range []struct {
		name  string
		early bool // Done and Lost are first called while the lease is held
		lose  bool // the lease is lost at its deadline, not released
	}{
		{"released, asked before", true, false},
		{"released, asked after", false, false},
		{"lost, asked before", true, true},
		{"lost, asked after", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				clk := &manualClock{now: time.Unix(1e9, 0)}
				c, _ := memClient(t, newMemStore(), WithTTL(ttl), withClock(clk))
				m := c.NewMutex("k")
				require.NoError(t, m.Lock(ctx))
				l := m.Lease()
				var done, lost <-chan struct{}
				if tc.early {
					done, lost = l.Done(), l.Lost()
					assert.False(t, waitClosed(done, 0), "Done closed while held")
					assert.False(t, waitClosed(lost, 0), "Lost closed while held")
				}
				if tc.lose {
					clk.advance(holdFor(ttl))
					require.ErrorIs(t, l.Err(), ErrLeaseLost) // ends it at once
				} else {
					require.NoError(t, m.Unlock(ctx))
				}
				if !tc.early {
					done, lost = l.Done(), l.Lost()
				}
				assert.True(t, waitClosed(done, 0), "Done not closed")
				assert.Equal(t, tc.lose, waitClosed(lost, 0), "Lost closed: %v", waitClosed(lost, 0))
				assert.Equal(t, done, l.Done(), "Done returned another channel")
				assert.Equal(t, lost, l.Lost(), "Lost returned another channel")
			})
		})
	}
}
