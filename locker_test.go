package dlock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// panicked runs f and returns what it panicked with, or nil.
func panicked(f func()) (v any) {
	defer func() { v = recover() }()
	f()
	return nil
}

// requirePanicIs checks that f panics with an error matching target whose
// message starts "dlock:".
func requirePanicIs(t *testing.T, f func(), target error) {
	t.Helper()
	v := panicked(f)
	require.NotNil(t, v, "no panic")
	err, ok := v.(error)
	require.True(t, ok, "panicked with %T %v, not an error", v, v)
	require.ErrorIs(t, err, target)
	assert.True(t, strings.HasPrefix(err.Error(), "dlock: "), "panic message %q", err)
}

func TestLocker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		a, _ := memClient(t, st)
		b, _ := memClient(t, st)
		m := a.NewMutex("k")
		var l sync.Locker = m.Locker()
		l.Lock()
		require.NotNil(t, m.Lease())
		require.NoError(t, m.Lease().Err())
		require.ErrorIs(t, b.NewMutex("k").TryLock(context.Background()), ErrLocked)

		// Lock blocks while the key is held, and returns once it is free.
		locked := make(chan struct{})
		other := b.NewMutex("k").Locker()
		go func() { other.Lock(); close(locked) }()
		synctest.Wait()
		select {
		case <-locked:
			t.Fatal("Lock returned while the key was held")
		default:
		}
		l.Unlock()
		assert.Nil(t, m.Lease())
		<-locked
		assert.Equal(t, b.owner, holder(st, "k").Owner)
		other.Unlock()
		assert.Equal(t, "", holder(st, "k").Owner, "Unlock left the key held")

		// One Locker's hold is the Mutex's.
		m.Locker().Lock()
		require.NoError(t, m.Unlock(context.Background()))
		require.NoError(t, m.Lock(context.Background()))
		m.Locker().Unlock()
		assert.Equal(t, "", holder(st, "k").Owner)
	})
}

// Lock retries what waiting may mend: a server that cannot be reached.
func TestLockerRetriesTransientErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, h := memClient(t, st)
		h.on("acquire", func(ctx context.Context, call func() error) error {
			if h.count("acquire") <= 3 {
				return errUnreachable
			}
			return call()
		})
		m := c.NewMutex("k")
		m.Locker().Lock()
		assert.Equal(t, 4, h.count("acquire"))
		require.NoError(t, m.Lease().Err())
	})
}

func TestLockerPanics(t *testing.T) {
	for _, tc := range []struct {
		name string
		// run makes a Mutex on c (with the store's hooks h) and does with
		// its Locker what must panic.
		run    func(t *testing.T, c *Client, h *hooked)
		target error
	}{
		{name: "Lock of the zero Mutex", target: ErrNoClient,
			run: func(*testing.T, *Client, *hooked) { new(Mutex).Locker().Lock() }},
		{name: "Lock of a nil Mutex", target: ErrNoClient,
			run: func(*testing.T, *Client, *hooked) { (*Mutex)(nil).Locker().Lock() }},
		{name: "Lock of an invalid key", target: ErrInvalidKey,
			run: func(_ *testing.T, c *Client, _ *hooked) { c.NewMutex("").Locker().Lock() }},
		{name: "Lock with an invalid option", target: ErrInvalidOption,
			run: func(_ *testing.T, c *Client, _ *hooked) { c.NewMutex("k", WithTTL(0)).Locker().Lock() }},
		{name: "Lock after Close", target: ErrClosed,
			run: func(t *testing.T, c *Client, _ *hooked) {
				require.NoError(t, c.Close(context.Background()))
				c.NewMutex("k").Locker().Lock()
			}},
		{name: "Lock waiting as the Client closes", target: ErrClosed,
			run: func(t *testing.T, c *Client, _ *hooked) {
				require.NoError(t, c.NewMutex("k").Lock(context.Background()))
				go func() {
					synctest.Wait() // the Lock below waits
					c.Close(context.Background())
				}()
				c.NewMutex("k").Locker().Lock()
			}},
		{name: "Lock failing in a way waiting will not mend", target: errInjected,
			run: func(_ *testing.T, c *Client, h *hooked) {
				h.on("acquire", failing)
				c.NewMutex("k").Locker().Lock()
			}},
		{name: "Unlock of an unlocked Mutex", target: ErrNotHeld,
			run: func(_ *testing.T, c *Client, _ *hooked) { c.NewMutex("k").Locker().Unlock() }},
		{name: "Unlock twice", target: ErrNotHeld,
			run: func(_ *testing.T, c *Client, _ *hooked) {
				l := c.NewMutex("k").Locker()
				l.Lock()
				//lint:ignore SA2001 nothing to do while held: the test is the second Unlock
				l.Unlock()
				l.Unlock()
			}},
		{name: "Unlock of the zero Mutex", target: ErrNotHeld,
			run: func(*testing.T, *Client, *hooked) { new(Mutex).Locker().Unlock() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, h := memClient(t, newMemStore())
				requirePanicIs(t, func() { tc.run(t, c, h) }, tc.target)
			})
		})
	}
}

// Unlock of a hold that ended without it neither panics nor waits: there
// is nothing left to release.
func TestLockerUnlockOfEndedHold(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, c *Client, h *hooked, m *Mutex)
	}{
		{name: "lost", end: func(t *testing.T, c *Client, h *hooked, m *Mutex) {
			h.on("extend", failing)
			<-m.Lease().Lost()
		}},
		{name: "taken over", end: func(t *testing.T, c *Client, h *hooked, m *Mutex) {
			h.on("extend", func(ctx context.Context, call func() error) error {
				h.on("extend", nil)
				st := h.store.(*memStore)
				st.mu.Lock()
				st.write("k", record{Owner: "intruder", Token: 99, Rev: 99, TTL: time.Second})
				st.mu.Unlock()
				return call()
			})
			<-m.Lease().Lost()
		}},
		{name: "lost to the cap", end: func(t *testing.T, c *Client, h *hooked, m *Mutex) {
			<-m.Lease().Lost()
		}},
		{name: "ended by Close", end: func(t *testing.T, c *Client, h *hooked, m *Mutex) {
			require.NoError(t, c.Close(context.Background()))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, h := memClient(t, newMemStore(), WithTTL(time.Second), WithMaxHold(time.Minute))
				m := c.NewMutex("k")
				l := m.Locker()
				l.Lock()
				lease := m.Lease()
				tc.end(t, c, h, m)
				require.Error(t, lease.Err())
				start := time.Now()
				assert.Nil(t, panicked(l.Unlock))
				assert.Zero(t, time.Since(start), "Unlock waited")
			})
		})
	}
}

// Unlock waits at most a TTL for a release the server does not answer:
// by then the key is free anyway.
func TestLockerUnlockBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ttl := 3 * time.Second
		c, h := memClient(t, newMemStore(), WithTTL(ttl))
		m := c.NewMutex("k")
		l := m.Locker()
		l.Lock()
		lease := m.Lease()
		h.on("release", hang)
		start := time.Now()
		assert.Nil(t, panicked(l.Unlock))
		assert.Equal(t, ttl, time.Since(start))
		require.ErrorIs(t, lease.Err(), ErrReleased)
		assert.Nil(t, m.Lease())
		assert.False(t, errors.Is(lease.Err(), ErrLeaseLost))
	})
}
