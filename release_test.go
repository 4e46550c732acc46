package dlock

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A release is clean-up: one given a ctx that has ended already (the
// request's ctx of a deferred Unlock) is still sent, and frees the key at
// once for another Client, whatever the primitive; so does Close.
func TestReleaseWithEndedContext(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	ctx := context.Background()
	forEachBackend(t, func(t *testing.T, sp space) {
		key := "" // each case's: its name
		for _, tc := range []struct {
			name string
			hold func(t *testing.T, c *Client) (free func() error) // takes key; free gives it back with ended
			try  func(c *Client) error                             // takes key at once, or fails
		}{
			{"Mutex.Unlock", func(t *testing.T, c *Client) func() error {
				m := c.NewMutex(key)
				require.NoError(t, m.Lock(ctx))
				return func() error { return m.Unlock(ended) }
			}, func(c *Client) error { return c.NewMutex(key).TryLock(ctx) }},
			{"RWMutex.Unlock", func(t *testing.T, c *Client) func() error {
				rw := c.NewRWMutex(key)
				require.NoError(t, rw.Lock(ctx))
				return func() error { return rw.Unlock(ended) }
			}, func(c *Client) error { return c.NewRWMutex(key).TryLock(ctx) }},
			{"RWMutex.RUnlock", func(t *testing.T, c *Client) func() error {
				rw := c.NewRWMutex(key)
				require.NoError(t, rw.RLock(ctx))
				return func() error { return rw.RUnlock(ended) }
			}, func(c *Client) error { return c.NewRWMutex(key).TryLock(ctx) }},
			{"Semaphore's Lease.Release", func(t *testing.T, c *Client) func() error {
				l, err := c.NewSemaphore(key, 1).Acquire(ctx)
				require.NoError(t, err)
				return func() error { return l.Release(ended) }
			}, func(c *Client) error { _, err := c.NewSemaphore(key, 1).TryAcquire(ctx); return err }},
			{"Election's resignation", func(t *testing.T, c *Client) func() error {
				term, err := c.NewElection(key).Campaign(ctx, "a")
				require.NoError(t, err)
				return func() error { return term.Release(ended) }
			}, func(c *Client) error {
				if _, err := c.NewElection(key).Leader(ctx); err == nil {
					return ErrLocked
				}
				tctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				_, err := c.NewElection(key).Campaign(tctx, "b")
				return err
			}},
			{"Client.Close", func(t *testing.T, c *Client) func() error {
				require.NoError(t, c.NewMutex(key).Lock(ctx))
				return func() error { return c.Close(ended) }
			}, func(c *Client) error { return c.NewMutex(key).TryLock(ctx) }},
		} {
			key = tc.name
			t.Run(tc.name, func(t *testing.T) {
				a, b := sp.client(t), sp.client(t)
				free := tc.hold(t, a)
				require.NoError(t, free(), "the release completed: no error, though ctx had ended")
				require.NoError(t, tc.try(b), "the key is free at once")
			})
		}
	})
}

// A release that ctx's end did not stop still fails when the server does
// not answer: it gets cleanupTimeout more, then Unlock returns an error
// that matches ctx's.
func TestReleaseWithEndedContextUnanswered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, h := memClient(t, newMemStore())
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(context.Background()))
		h.on("release", hang)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		start := time.Now()
		err := m.Unlock(ctx)
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, cleanupTimeout, time.Since(start))
		assert.Equal(t, 1, h.count("release"), "the release was sent")
	})
}
