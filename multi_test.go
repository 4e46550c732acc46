package dlock

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Tests of MultiMutex on both backends (backends_test.go), and of its
// timing inside synctest bubbles.

// settled waits until c's background clean-up writes are done.
func settled(t *testing.T, c *Client) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.tidying.n == 0
	}, 5*time.Second, time.Millisecond)
}

// leasesOf returns the holds and registrations c's extender keeps.
func leasesOf(c *Client) []*Lease {
	c.ext.mu.Lock()
	defer c.ext.mu.Unlock()
	var ls []*Lease
	for l := range c.ext.leases {
		ls = append(ls, l)
	}
	return ls
}

// readRec returns key's record as the server has it (the zero record
// when it has none).
func readRec(t *testing.T, sp space, key string) record {
	t.Helper()
	if sp, ok := sp.(mongoKeys); ok {
		r, err := newMongoStore(sp.coll, func(context.Context, int) {}).read(context.Background(), key)
		require.NoError(t, err)
		return r
	}
	return sp.read(t, key)
}

// assertFree checks that nobody holds or waits for each of keys.
func assertFree(t *testing.T, sp space, keys ...string) {
	t.Helper()
	for _, k := range keys {
		r := readRec(t, sp, k)
		assert.Empty(t, r.Owner, "%q is held", k)
		assert.Empty(t, r.Waiters, "%q has registrations", k)
	}
}

func TestMultiMutexLocksEveryKey(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		a, b := sp.client(t), sp.client(t)
		m := a.NewMultiMutex([]string{"c", "a", "b", "a"})
		assert.Equal(t, []string{"a", "b", "c"}, m.Keys(), "sorted, without duplicates")
		require.NoError(t, m.Lock(ctx))
		ml := m.Lease()
		require.NotNil(t, ml)
		first := ml.Tokens()
		for i, k := range ml.Keys() {
			assert.Equal(t, a.Owner(), sp.read(t, k).Owner, "%q", k)
			assert.Equal(t, first[i], ml.Token(k))
			hs, err := b.Holders(ctx, k)
			require.NoError(t, err)
			require.Len(t, hs, 1)
			assert.Equal(t, a.Owner(), hs[0].Owner)
		}
		assert.Zero(t, ml.Token("d"), "not one of its keys")
		assert.ErrorIs(t, b.NewMutex("b").TryLock(ctx), ErrLocked)
		assert.ErrorIs(t, b.NewMultiMutex([]string{"x", "c"}).TryLock(ctx), ErrLocked)
		assertFree(t, sp, "x")

		require.NoError(t, m.Unlock(ctx))
		assert.ErrorIs(t, ml.Err(), ErrReleased)
		assert.Nil(t, m.Lease())
		assertFree(t, sp, "a", "b", "c")
		assert.ErrorIs(t, m.Unlock(ctx), ErrNotHeld)

		require.NoError(t, m.Lock(ctx))
		for i, tok := range m.Lease().Tokens() {
			assert.Greater(t, tok, first[i], "tokens rise on each key")
		}
		require.NoError(t, m.Unlock(ctx))
		assert.Empty(t, leasesOf(a))
	})
}

// Uncontended, a Lock of k free keys is two commands whatever k is (one
// for a single key that exists, which a Mutex's Lock is), Unlock one.
func TestMultiMutexRoundTrips(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		c := sp.client(t)
		first := c.NewMutex("first") // the collection's first key: mongoStore also makes the floor document, once
		require.NoError(t, first.Lock(ctx))
		require.NoError(t, first.Unlock(ctx))
		for _, k := range []int{1, 2, 8, 64} {
			keys := make([]string, k)
			for i := range keys {
				keys[i] = fmt.Sprintf("k%d-%03d", k, i)
			}
			m := c.NewMultiMutex(keys)
			for _, life := range []string{"new", "existing"} {
				mark := sp.commands()
				require.NoError(t, m.Lock(ctx))
				assert.LessOrEqual(t, sp.commands()-mark, int64(2), "commands for a Lock of %d %s keys", k, life)
				mark = sp.commands()
				require.NoError(t, m.Unlock(ctx))
				assert.EqualValues(t, 1, sp.commands()-mark, "commands for an Unlock of %d keys", k)
			}
			assertFree(t, sp, keys...)
		}
	})
}

// TryLock takes all the keys or none: what it took is given back before
// it returns.
func TestMultiMutexTryLockAllOrNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		a, b := sp.client(t), sp.client(t)
		mb := b.NewMutex("b")
		require.NoError(t, mb.Lock(ctx))
		m := a.NewMultiMutex([]string{"a", "b", "c"})
		err := m.TryLock(ctx)
		require.ErrorIs(t, err, ErrLocked)
		assert.Contains(t, err.Error(), `"b"`, "names the key that is held")
		assert.Nil(t, m.Lease())
		assertFree(t, sp, "a", "c")
		assert.Equal(t, b.Owner(), sp.read(t, "b").Owner)
		assert.Empty(t, leasesOf(a), "nothing kept or registered")

		// Held by another goroutine of the same Client: no command.
		require.NoError(t, mb.Unlock(ctx))
		ma := a.NewMutex("c")
		require.NoError(t, ma.Lock(ctx))
		mark := sp.commands()
		require.ErrorIs(t, m.TryLock(ctx), ErrLocked)
		assert.EqualValues(t, 0, sp.commands()-mark)
		require.NoError(t, ma.Unlock(ctx))

		require.NoError(t, m.TryLock(ctx))
		require.NoError(t, m.Unlock(ctx))
	})
}

// A Lock whose ctx ends leaves nothing held and nothing registered, on any
// key: the key it took is given back, and its wait for the next leaves the
// queue.
func TestMultiMutexLockCancelled(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		a, b := sp.client(t), sp.client(t)
		mb := b.NewMutex("b")
		require.NoError(t, mb.Lock(ctx))
		m := a.NewMultiMutex([]string{"c", "b", "a"})
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		err := m.Lock(wctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		var we *WaitError
		require.ErrorAs(t, err, &we)
		assert.Equal(t, "b", we.Key, "it waited for b")
		assert.Nil(t, m.Lease())
		settled(t, a)
		assert.Empty(t, leasesOf(a), "nothing kept or registered")
		assertFree(t, sp, "a", "c")
		assert.Empty(t, sp.read(t, "b").Waiters, "its registration was removed")
		assert.Equal(t, b.Owner(), sp.read(t, "b").Owner)
		require.NoError(t, mb.Unlock(ctx))
	})
}

// A Lock that must wait holds the keys before the one it waits for, and
// none after it; it waits in that key's queue, and takes the rest once it
// has it.
func TestMultiMutexWaitsInOrder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		a, b := sp.client(t), sp.client(t)
		mb := b.NewMutex("b")
		require.NoError(t, mb.Lock(ctx))
		m := a.NewMultiMutex([]string{"c", "b", "a"})
		done := make(chan error, 1)
		go func() { done <- m.Lock(ctx) }()
		require.Eventually(t, func() bool { return len(sp.read(t, "b").Waiters) == 1 }, 5*time.Second, time.Millisecond)
		assert.Equal(t, a.Owner(), sp.read(t, "a").Owner, "the key before")
		assertFree(t, sp, "c")
		require.NoError(t, mb.Unlock(ctx))
		require.NoError(t, <-done)
		for _, k := range m.Keys() {
			assert.Equal(t, a.Owner(), sp.read(t, k).Owner, "%q", k)
		}
		assert.Empty(t, sp.read(t, "b").Waiters)
		require.NoError(t, m.Unlock(ctx))
	})
}

// Another goroutine of the same Client holding a key: the MultiMutex
// queues for it in the Client, and gets it when it is unlocked.
func TestMultiMutexLocalQueue(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		c := sp.client(t)
		mu := c.NewMutex("b")
		require.NoError(t, mu.Lock(ctx))
		m := c.NewMultiMutex([]string{"a", "b"})
		done := make(chan error, 1)
		go func() { done <- m.Lock(ctx) }()
		waitQueued(t, c, "b")
		require.NoError(t, mu.Unlock(ctx))
		require.NoError(t, <-done)
		require.NoError(t, m.Unlock(ctx))
		assertFree(t, sp, "a", "b")
	})
}

// When the hold of one key is lost (here the document shows another
// owner, as after a takeover), Lost closes and Context is cancelled with
// that key's LeaseLostError; Unlock frees the other keys and reports it.
func TestMultiLeaseLostWhenOneKeyIs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		c := sp.client(t, WithTTL(2*time.Second), WithExtendInterval(100*time.Millisecond))
		m := c.NewMultiMutex([]string{"a", "b", "c"})
		require.NoError(t, m.Lock(ctx))
		ml := m.Lease()
		require.NotNil(t, ml)
		steal(t, sp, "b")
		require.True(t, waitClosed(ml.Lost(), 5*time.Second), "Lost closes")
		assert.True(t, waitClosed(ml.Done(), 0))
		var lost *LeaseLostError
		require.ErrorAs(t, ml.Err(), &lost)
		assert.Equal(t, "b", lost.Key)
		assert.ErrorIs(t, context.Cause(ml.Context()), ErrLeaseLost)
		assert.Nil(t, m.Lease())
		assert.Equal(t, c.Owner(), sp.read(t, "a").Owner, "the other keys stay held until Unlock")
		assert.ErrorIs(t, m.Unlock(ctx), ErrLeaseLost)
		assertFree(t, sp, "a", "c")
		assert.Equal(t, "intruder", sp.read(t, "b").Owner)
	})
}

// steal makes key's document show another owner, as a takeover would.
func steal(t *testing.T, sp space, key string) {
	t.Helper()
	switch sp := sp.(type) {
	case mongoKeys:
		_, err := sp.coll.UpdateOne(context.Background(), bson.D{{Key: "_id", Value: key}},
			bson.D{{Key: "$set", Value: bson.D{{Key: fOwner, Value: "intruder"}, {Key: fHold, Value: int64(1)}}}})
		require.NoError(t, err)
	case memKeys:
		sp.st.mu.Lock()
		r := sp.st.records[key]
		r.Owner, r.Hold = "intruder", 1
		sp.st.records[key] = r
		sp.st.mu.Unlock()
	}
}

// Lost closes at the lost key's local deadline, before another Client can
// take that key.
func TestMultiLeaseLostBeforeTakeover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		const ttl = 10 * time.Second
		a, h := memClient(t, st, WithTTL(ttl))
		b, _ := memClient(t, st, WithTTL(ttl))
		ctx := context.Background()
		m := a.NewMultiMutex([]string{"x", "y"})
		start := time.Now()
		require.NoError(t, m.Lock(ctx))
		ml := m.Lease()
		h.on("extend", hang) // a's Client is cut off
		taken := make(chan time.Time, 1)
		go func() {
			mb := b.NewMutex("y")
			if mb.Lock(ctx) == nil {
				taken <- time.Now()
				mb.Unlock(ctx)
			}
		}()
		<-ml.Lost()
		lostAt := time.Now()
		assert.Equal(t, holdFor(ttl), lostAt.Sub(start), "at the deadline of the Lock's writes")
		assert.True(t, (<-taken).After(lostAt), "taken over only after")
		h.on("extend", nil)
	})
}

func TestMultiMutexBadInput(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		c := sp.client(t)
		many := make([]string, MaxMultiKeys+1)
		for i := range many {
			many[i] = fmt.Sprint("k", i)
		}
		for _, tc := range []struct {
			name string
			keys []string
			want error
		}{
			{"no keys", nil, ErrInvalidKey},
			{"an empty key", []string{"a", ""}, ErrInvalidKey},
			{"a key too long", []string{"a", strings.Repeat("x", MaxKeyLen+1)}, ErrInvalidKey},
			{"a NUL", []string{"a\x00"}, ErrInvalidKey},
			{"too many", many, ErrTooManyKeys},
		} {
			t.Run(tc.name, func(t *testing.T) {
				m := c.NewMultiMutex(tc.keys)
				mark := sp.commands()
				assert.ErrorIs(t, m.Lock(ctx), tc.want)
				assert.ErrorIs(t, m.TryLock(ctx), tc.want)
				assert.ErrorIs(t, m.Unlock(ctx), ErrNotHeld)
				assert.EqualValues(t, 0, sp.commands()-mark, "nothing sent")
			})
		}
		assert.Empty(t, leasesOf(c))
		exactly := c.NewMultiMutex(many[:MaxMultiKeys])
		assert.NoError(t, exactly.err, "%d keys are allowed", MaxMultiKeys)
		var zero MultiMutex
		assert.ErrorIs(t, zero.Lock(ctx), ErrNoClient)
		assert.ErrorIs(t, (*MultiMutex)(nil).Unlock(ctx), ErrNotHeld)
	})
}

// Close ends a held MultiLease as released (not lost) and frees its keys;
// a Lock waiting on the Client returns ErrClosed, holding nothing.
func TestMultiMutexClose(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		a, b := sp.client(t), sp.client(t)
		m := a.NewMultiMutex([]string{"a", "b"})
		require.NoError(t, m.Lock(ctx))
		ml := m.Lease()
		mb := b.NewMutex("y")
		require.NoError(t, mb.Lock(ctx))
		w := a.NewMultiMutex([]string{"x", "y"})
		done := make(chan error, 1)
		go func() { done <- w.Lock(ctx) }()
		require.Eventually(t, func() bool { return len(sp.read(t, "y").Waiters) == 1 }, 5*time.Second, time.Millisecond)
		require.NoError(t, a.Close(ctx))
		assert.ErrorIs(t, <-done, ErrClosed)
		assert.True(t, waitClosed(ml.Done(), time.Second))
		assert.False(t, waitClosed(ml.Lost(), 0))
		assert.ErrorIs(t, ml.Err(), ErrReleased)
		assert.ErrorIs(t, m.Unlock(ctx), ErrClosed)
		assertFree(t, sp, "a", "b", "x")
		require.NoError(t, mb.Unlock(ctx))
	})
}

// Keys come out sorted whatever order they go in, so that every caller
// takes them in one order.
func TestMultiMutexCanonicalOrder(t *testing.T) {
	c, err := newClientOn(func(*telemetry) store { return newMemStore() })
	require.NoError(t, err)
	defer c.Close(context.Background())
	for _, keys := range [][]string{{"b", "a"}, {"a", "b"}, {"b", "b", "a", "b"}} {
		assert.Equal(t, []string{"a", "b"}, c.NewMultiMutex(keys).Keys())
	}
	in := []string{"é", "z", "A", "a"}
	keys := c.NewMultiMutex(in).Keys()
	assert.True(t, slices.IsSorted(keys), "byte order: %q", keys)
	assert.Equal(t, []string{"é", "z", "A", "a"}, in, "the caller's slice is left alone")
}
