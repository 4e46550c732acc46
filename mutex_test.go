package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// readDoc returns the lock document for key.
func readDoc(t testing.TB, coll *mongo.Collection, key string) lockDoc {
	t.Helper()
	var d lockDoc
	require.NoError(t, coll.FindOne(context.Background(), bson.D{{Key: "_id", Value: key}}).Decode(&d))
	return d
}

// Behaviour 1: at most one holder at a time, across Clients, Mutex values
// and goroutines sharing one Mutex.
func TestExclusion(t *testing.T) {
	forEachBackend(t, func(t *testing.T, keys space) {
		sp := keys
		ctx := context.Background()
		clients := []*Client{sp.client(t, WithBackoff(time.Millisecond, 20*time.Millisecond)), sp.client(t, WithBackoff(time.Millisecond, 20*time.Millisecond)), sp.client(t, WithBackoff(time.Millisecond, 20*time.Millisecond))}
		shared := clients[0].NewMutex("k")
		var holders, maxHolders, total atomic.Int64
		var lastToken atomic.Uint64
		var wg sync.WaitGroup
		work := func(m *Mutex) {
			defer wg.Done()
			for i := 0; i < 15; i++ {
				if err := m.Lock(ctx); err != nil {
					t.Error(err)
					return
				}
				n := holders.Add(1)
				for seen := maxHolders.Load(); n > seen && !maxHolders.CompareAndSwap(seen, n); seen = maxHolders.Load() {
				}
				tok := uint64(m.Lease().Token())
				if prev := lastToken.Swap(tok); prev >= tok {
					t.Errorf("token %d after %d", tok, prev)
				}
				time.Sleep(time.Millisecond) // the critical section: others poll meanwhile
				require.NoError(t, m.Lease().Err())
				total.Add(1)
				holders.Add(-1)
				if err := m.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}
		for _, c := range clients {
			for range 2 {
				wg.Add(1)
				go work(c.NewMutex("k")) // two Mutex values per Client
			}
		}
		for range 2 {
			wg.Add(1)
			go work(shared) // goroutines sharing one Mutex
		}
		wg.Wait()
		assert.EqualValues(t, 1, maxHolders.Load(), "holders at once")
		assert.EqualValues(t, 8*15, total.Load())
		assert.Equal(t, "", sp.read(t, "k").Owner, "left held")
	})
}

// Behaviour 2: a cancelled Lock returns the context's error promptly and
// leaves nothing held.
func TestLockCancelled(t *testing.T) {
	forEachBackend(t, func(t *testing.T, keys space) {
		sp := keys
		a, b := sp.client(t), sp.client(t)
		ctx := context.Background()
		require.NoError(t, a.NewMutex("k").Lock(ctx))

		for _, tc := range []struct {
			name string
			ctx  func() (context.Context, context.CancelFunc)
			want error
		}{
			{"deadline", func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 50*time.Millisecond) }, context.DeadlineExceeded},
			{"cancel", func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(ctx)
				time.AfterFunc(50*time.Millisecond, cancel)
				return ctx, cancel
			}, context.Canceled},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx, cancel := tc.ctx()
				defer cancel()
				start := time.Now()
				err := b.NewMutex("k").Lock(ctx)
				require.ErrorIs(t, err, tc.want)
				assert.Less(t, time.Since(start), time.Second, "returned promptly")
			})
		}
		// A Lock cancelled while its acquire is in flight gives the hold back.
		free := keys // other keys, same space
		c := free.client(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := c.store.acquire(cctx, attempt{key: "x", owner: c.owner, hold: 1, ttl: time.Minute}, stamp{})
		require.ErrorIs(t, err, context.Canceled)
		m := c.NewMutex("y")
		cctx, cancel = context.WithCancel(ctx)
		c2 := free.client(t, withStoreWrapper(func(s store) store { return &cancelAfterAcquire{store: s, cancel: cancel} }))
		err = c2.NewMutex("y").Lock(cctx)
		require.ErrorIs(t, err, context.Canceled)
		require.NoError(t, c2.Close(ctx)) // waits for the clean-up write, which runs in the background
		assert.Equal(t, "", free.read(t, "y").Owner, "a hold won as ctx ended must be given back")
		require.NoError(t, m.TryLock(ctx), "key is free again")
	})
}

// cancelAfterAcquire applies the acquire and then cancels the caller's
// context and reports the cancellation: the reply "lost" to a cancel.
type cancelAfterAcquire struct {
	store
	cancel context.CancelFunc
}

func (s *cancelAfterAcquire) acquire(ctx context.Context, a attempt, takeover stamp) (record, error) {
	if _, err := s.store.acquire(ctx, a, takeover); err != nil {
		return record{}, err
	}
	s.cancel()
	return record{}, ctx.Err()
}

// Behaviour 3: when extensions keep failing, the lease is lost at its local
// deadline, before another client can take the key.
func TestLostBeforeTakeover(t *testing.T) {
	forEachBackend(t, func(t *testing.T, keys space) {
		sp := keys
		ttl := time.Second // the margin is 3% of it: room for a busy scheduler
		f := &faultyStore{}
		a := sp.client(t, WithTTL(ttl), withFaults(f))
		b := sp.client(t, WithBackoff(time.Millisecond, 5*time.Millisecond))
		ctx := context.Background()
		ma := a.NewMutex("k")
		require.NoError(t, ma.Lock(ctx))
		l := ma.Lease()
		lctx := l.Context()
		f.crash()

		var lostAt atomic.Int64
		go func() { <-l.Lost(); lostAt.Store(time.Now().UnixNano()) }()
		require.NoError(t, b.NewMutex("k").Lock(ctx))
		took := time.Now()
		require.True(t, waitClosed(l.Lost(), 0), "Lost must be closed before another client acquires")
		require.True(t, waitClosed(l.Done(), 0))
		require.ErrorIs(t, l.Err(), ErrLeaseLost)
		require.ErrorIs(t, l.Err(), errInjected, "the cause is the failed extension")
		require.ErrorIs(t, context.Cause(lctx), ErrLeaseLost)
		if at := lostAt.Load(); at != 0 {
			t.Logf("lost-to-takeover margin: %v (TTL %v)", took.Sub(time.Unix(0, at)), ttl)
		}
		// The old holder's late release changes nothing for the new holder.
		err := ma.Unlock(ctx)
		require.ErrorIs(t, err, ErrLeaseLost)
		assert.Equal(t, b.owner, sp.read(t, "k").Owner)
	})
}

// Behaviour 4: exclusion with clocks hours apart and running at rates 1%
// apart: a holder that stops extending loses its lease before a waiter
// with a fast clock takes over.
func TestSkewedClocks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, keys space) {
		sp := keys
		ttl := time.Second
		for _, tc := range []struct {
			name                       string
			holderOffset, waiterOffset time.Duration
			holderRate, waiterRate     float64
		}{
			{"holder slow, waiter fast", -3 * time.Hour, 5 * time.Hour, 1 - MaxClockDrift, 1 + MaxClockDrift},
			{"holder fast, waiter slow", 7 * time.Hour, -9 * time.Hour, 1 + MaxClockDrift, 1 - MaxClockDrift},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f := &faultyStore{}
				a := sp.client(t, WithTTL(ttl), withFaults(f), withClock(newSkewedClock(tc.holderOffset, tc.holderRate)))
				b := sp.client(t, WithBackoff(time.Millisecond, 5*time.Millisecond), withClock(newSkewedClock(tc.waiterOffset, tc.waiterRate)))
				ctx := context.Background()
				ma := a.NewMutex(tc.name)
				require.NoError(t, ma.Lock(ctx))
				held := ma.Lease()
				f.crash()
				require.NoError(t, b.NewMutex(tc.name).Lock(ctx))
				require.True(t, waitClosed(held.Lost(), 0), "holder still believed it held the key")
			})
		}
	})
}

// Behaviour 5: tokens strictly increase across release, takeover, handoff
// and new Clients.
func TestTokensIncrease(t *testing.T) {
	forEachBackend(t, func(t *testing.T, keys space) {
		sp := keys
		ctx := context.Background()
		var seen []Token
		note := func(m *Mutex) { seen = append(seen, m.Lease().Token()) }

		a := sp.client(t)
		m := a.NewMutex("k")
		require.NoError(t, m.Lock(ctx))
		note(m)
		require.NoError(t, m.Unlock(ctx)) // release
		require.NoError(t, m.Lock(ctx))
		note(m)
		require.NoError(t, a.Close(ctx)) // release by Close

		f := &faultyStore{}
		b := sp.client(t, WithTTL(200*time.Millisecond), withFaults(f)) // a new Client
		mb := b.NewMutex("k")
		require.NoError(t, mb.Lock(ctx))
		note(mb)
		f.crash()
		c := sp.client(t)
		mc := c.NewMutex("k")
		require.NoError(t, mc.Lock(ctx)) // takeover after expiry
		note(mc)

		// Handoff inside one Client.
		mc2 := c.NewMutex("k")
		got := make(chan error)
		go func() { got <- mc2.Lock(ctx) }()
		waitQueued(t, c, "k")
		require.NoError(t, mc.Unlock(ctx))
		require.NoError(t, <-got)
		note(mc2)
		for i := 1; i < len(seen); i++ {
			assert.Greater(t, seen[i], seen[i-1], "tokens %v", seen)
		}
	})
}

// waitQueued waits until a goroutine is queued for key in c.
func waitQueued(t *testing.T, c *Client, key string) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.slots[key] != nil && len(c.slots[key].waiters) > 0
	}, 5*time.Second, time.Millisecond)
}

// Behaviour 6: one command for an uncontended Lock, one for Unlock, one for
// an extension; a local handoff costs one command in all.
func TestRoundTrips(t *testing.T) {
	forEachBackend(t, func(t *testing.T, keys space) {
		sp := keys
		ctx := context.Background()
		extended := make(chan struct{}, 1)
		f := &faultyStore{}
		f.onExtend = func(extendRound) {
			select {
			case extended <- struct{}{}:
			default:
			}
		}
		c := sp.client(t, WithTTL(3*time.Second), WithExtendInterval(time.Second), withFaults(f))
		m := c.NewMutex("k")

		first := c.NewMutex("first") // the collection's first key: mongoStore also makes the floor document, once
		require.NoError(t, first.Lock(ctx))
		require.NoError(t, first.Unlock(ctx))

		mark := sp.commands()
		require.NoError(t, m.Lock(ctx))
		assert.EqualValues(t, 2, (sp.commands() - mark), "commands for the Lock that creates the document: acquire, read the floor")
		assert.True(t, sp.read(t, "k").Raw, "the base is left to the hold's first write")

		mark = sp.commands()
		<-extended
		assert.EqualValues(t, 1, (sp.commands() - mark), "commands per extension")
		assert.Equal(t, m.Lease().Token(), sp.read(t, "k").Token, "the first extension wrote the base")

		mark = sp.commands()
		require.NoError(t, m.Unlock(ctx))
		assert.EqualValues(t, 1, (sp.commands() - mark), "commands per Unlock")

		mark = sp.commands()
		require.NoError(t, m.Lock(ctx))
		assert.EqualValues(t, 1, (sp.commands() - mark), "commands per uncontended Lock of an existing key")
		m2 := c.NewMutex("k")
		got := make(chan error)
		go func() { got <- m2.Lock(ctx) }()
		waitQueued(t, c, "k")
		mark = sp.commands()
		require.NoError(t, m.Unlock(ctx))
		require.NoError(t, <-got)
		assert.EqualValues(t, 1, (sp.commands() - mark), "commands per local handoff (Unlock + the waiter's Lock)")
		require.NoError(t, m2.Unlock(ctx))
	})
}

// Behaviour 7: release is conditional; Unlock twice; an extension whose
// reply is lost does not cost the lease.
func TestReleaseAndExtendAreConditional(t *testing.T) {
	forEachBackend(t, func(t *testing.T, keys space) {
		sp := keys
		ctx := context.Background()
		c := sp.client(t)
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(ctx))
		require.NoError(t, m.Unlock(ctx))
		require.ErrorIs(t, m.Unlock(ctx), ErrNotHeld)

		// A hostile Client that knows the key cannot release or extend it.
		require.NoError(t, m.Lock(ctx))
		held := sp.read(t, "k")
		evil := sp.client(t)
		for _, ref := range []leaseRef{
			{key: "k", owner: evil.owner, token: Token(held.Token)},
			{key: "k", owner: evil.owner, token: Token(held.Token) + 1},
			{key: "k", owner: held.Owner, token: Token(held.Token) - 1},
		} {
			require.ErrorIs(t, evil.store.release(ctx, ref), errNotOwner)
			ok, err := evil.store.extend(ctx, []leaseRef{ref})
			require.NoError(t, err)
			assert.Equal(t, []bool{false}, ok)
		}
		// Nor can it through the public API.
		em := evil.NewMutex("k")
		require.ErrorIs(t, em.Unlock(ctx), ErrNotHeld)
		require.ErrorIs(t, em.TryLock(ctx), ErrLocked)
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		require.ErrorIs(t, em.Lock(short), context.DeadlineExceeded)
		cancel()
		require.NoError(t, evil.Close(ctx)) // and waits for its clean-up writes
		now := sp.read(t, "k")
		assert.Equal(t, []any{held.Owner, held.Token, held.Hold, held.Rev, held.TTL}, []any{now.Owner, now.Token, now.Hold, now.Rev, now.TTL}, "hold unchanged")
		assert.Empty(t, now.Waiters, "the Lock that gave up left the queue")
		require.NoError(t, m.Lease().Err())

		// Lost extension replies: the extension applied, the lease lives on.
		f := &faultyStore{}
		f.loseExtReply.Store(true)
		d := sp.client(t, WithTTL(300*time.Millisecond), withFaults(f))
		md := d.NewMutex("lostreply")
		require.NoError(t, md.Lock(ctx))
		require.Eventually(t, func() bool { return f.extends.Load() >= 2 }, 10*time.Second, time.Millisecond, "extensions")
		f.loseExtReply.Store(false)
		n := f.extends.Load()
		require.Eventually(t, func() bool { return f.extends.Load() >= n+2 }, 10*time.Second, time.Millisecond, "extensions")
		require.NoError(t, md.Lease().Err(), "an extension whose reply was lost must not cost the lease")
		require.NoError(t, md.Unlock(ctx))
	})
}

// Behaviour 8: a crashed holder blocks others for at most a TTL after its
// last write; a holder abandoned more than a TTL ago (by the server's
// clock) is taken over at once.
func TestCrashedHolder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, keys space) {
		sp := keys
		ctx := context.Background()
		ttl := 500 * time.Millisecond
		f := &faultyStore{}
		a := sp.client(t, WithTTL(ttl), withFaults(f))
		b := sp.client(t, WithBackoff(time.Millisecond, 10*time.Millisecond))
		require.NoError(t, a.NewMutex("k").Lock(ctx))
		crashed := time.Now()
		f.crash()
		require.NoError(t, b.NewMutex("k").Lock(ctx))
		blocked := time.Since(crashed)
		t.Logf("crashed holder blocked others for %v (TTL %v)", blocked, ttl)
		assert.Less(t, blocked, 2*ttl)

		// Abandoned long ago: with WithServerClockTakeover a newcomer's
		// TryLock takes it at once; without, it does not trust the server's
		// clock and finds the key locked.
		g := &faultyStore{}
		a2 := sp.client(t, WithTTL(ttl), withFaults(g))
		require.NoError(t, a2.NewMutex("old").Lock(ctx))
		g.crash()
		time.Sleep(ttl + 50*time.Millisecond) // the scenario: the holder died more than a TTL ago
		mark := sp.commands()
		require.ErrorIs(t, sp.client(t).NewMutex("old").TryLock(ctx), ErrLocked)
		assert.EqualValues(t, 2, (sp.commands() - mark), "acquire, read")
		c := sp.client(t, WithServerClockTakeover(true))
		mark = sp.commands()
		start := time.Now()
		require.NoError(t, c.NewMutex("old").TryLock(ctx))
		t.Logf("abandoned lock taken in %v with %d commands", time.Since(start), (sp.commands() - mark))
		assert.EqualValues(t, 5, (sp.commands() - mark), "acquire, read, server time, takeover, and the floor read: the crashed holder's first Lock never wrote its base")
	})
}

// Behaviour 9: lock writes use majority write concern.
func TestMajorityWriteConcern(t *testing.T) {
	coll := newColl(t)
	ctx := context.Background()
	c := newClient(t, coll)
	m := c.NewMutex("k")
	require.NoError(t, m.Lock(ctx))                                              // findAndModify
	require.ErrorIs(t, newClient(t, coll).NewMutex("k").TryLock(ctx), ErrLocked) // and a find
	require.NoError(t, m.Unlock(ctx))                                            // update
	commands.mu.Lock()
	defer commands.mu.Unlock()
	found := map[string]bool{}
	for _, e := range commands.last {
		if name, _ := e.Command.Lookup(e.CommandName).StringValueOK(); name != coll.Name() {
			continue // another test's, or the test's own reads
		}
		switch e.CommandName {
		case "findAndModify", "update":
			found[e.CommandName] = true
			w, _ := e.Command.Lookup("writeConcern", "w").StringValueOK()
			assert.Equal(t, "majority", w, "write concern of %s", e.Command)
		case "find":
			found[e.CommandName] = true
			rc, _ := e.Command.Lookup("readConcern", "level").StringValueOK()
			assert.Equal(t, "majority", rc, "read concern of %s", e.Command)
		}
	}
	assert.Equal(t, map[string]bool{"findAndModify": true, "update": true, "find": true}, found, "commands seen")
}

// Behaviour 11: bad input gets a clear error.
func TestBadInput(t *testing.T) {
	coll := newColl(t)
	ctx := context.Background()
	_, err := NewClient(nil)
	require.ErrorIs(t, err, ErrInvalidOption)
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"zero TTL", []Option{WithTTL(0)}},
		{"negative TTL", []Option{WithTTL(-time.Second)}},
		{"cadence equal to TTL", []Option{WithTTL(time.Second), WithExtendInterval(time.Second)}},
		{"cadence 99% of the TTL", []Option{WithTTL(time.Second), WithExtendInterval(990 * time.Millisecond)}},
		{"cadence past half the local deadline", []Option{WithTTL(time.Second), WithExtendInterval(490 * time.Millisecond)}},
		{"cadence zero", []Option{WithExtendInterval(0)}},
		{"backoff inverted", []Option{WithBackoff(time.Second, time.Millisecond)}},
		{"empty owner", []Option{WithOwner("")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewClient(coll, tc.opts...)
			require.ErrorIs(t, err, ErrInvalidOption)
			c := newClient(t, coll)
			require.ErrorIs(t, c.NewMutex("k", tc.opts...).Lock(ctx), ErrInvalidOption)
		})
	}
	c := newClient(t, coll)
	require.ErrorIs(t, c.NewMutex("k", WithOwner("x")).Lock(ctx), ErrInvalidOption, "client-only option on a Mutex")
	for _, tc := range []struct{ name, key string }{
		{"empty", ""},
		{"too long", strings.Repeat("x", MaxKeyLen+1)},
		{"NUL", "a\x00b"},
		{"invalid UTF-8", "a\xffb"},
	} {
		t.Run("key "+tc.name, func(t *testing.T) {
			m := c.NewMutex(tc.key)
			require.ErrorIs(t, m.Lock(ctx), ErrInvalidKey)
			require.ErrorIs(t, m.TryLock(ctx), ErrInvalidKey)
			require.ErrorIs(t, m.Unlock(ctx), ErrNotHeld)
		})
	}
	for _, key := range []string{"$where", "a.b", "$", strings.Repeat("é", MaxKeyLen/2), "日本"} {
		m := c.NewMutex(key)
		require.NoError(t, m.Lock(ctx), "key %q", key)
		assert.Equal(t, c.owner, readDoc(t, coll, key).Owner)
		require.NoError(t, m.Unlock(ctx))
	}

	// Use after Close.
	d := newClient(t, coll)
	m := d.NewMutex("held")
	require.NoError(t, m.Lock(ctx))
	l := m.Lease()
	require.NoError(t, d.Close(ctx))
	require.True(t, waitClosed(l.Done(), 0))
	require.ErrorIs(t, l.Err(), ErrReleased)
	assert.False(t, waitClosed(l.Lost(), 0), "Close is a clean release")
	assert.Equal(t, "", readDoc(t, coll, "held").Owner, "Close released the key")
	require.ErrorIs(t, m.Lock(ctx), ErrClosed)
	require.ErrorIs(t, d.NewMutex("other").TryLock(ctx), ErrClosed)
	require.ErrorIs(t, d.Close(ctx), ErrClosed)
}

// Close wakes waiting Lock calls with ErrClosed.
func TestCloseWakesWaiters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, keys space) {
		sp := keys
		ctx := context.Background()
		a := sp.client(t)
		require.NoError(t, a.NewMutex("k").Lock(ctx))
		b := sp.client(t)
		errs := make(chan error, 2)
		go func() { errs <- b.NewMutex("k").Lock(ctx) }() // polls the server
		go func() { errs <- b.NewMutex("k").Lock(ctx) }() // queued locally
		waitQueued(t, b, "k")
		require.NoError(t, b.Close(ctx))
		for range 2 {
			require.ErrorIs(t, <-errs, ErrClosed)
		}
	})
}

func TestErrorsWrap(t *testing.T) {
	lost := fmt.Errorf("outer: %w", &LeaseLostError{Key: "k", Token: 3, Cause: errInjected})
	assert.ErrorIs(t, lost, ErrLeaseLost)
	assert.ErrorIs(t, lost, errInjected)
	var lle *LeaseLostError
	require.ErrorAs(t, lost, &lle)
	assert.Equal(t, Token(3), lle.Token)
	stale := fmt.Errorf("outer: %w", &StaleTokenError{Token: 2, Highest: 5})
	assert.ErrorIs(t, stale, ErrStaleToken)
	assert.False(t, errors.Is(stale, ErrLeaseLost))
}

// A Client holding more leases than FerretDB takes in one command keeps
// them all, extending them in as few commands as the server allows: one on
// MongoDB, a few on FerretDB (ferretBatch).
func TestManyLeasesAreExtended(t *testing.T) {
	const n = 2*ferretBatch + 22
	coll := newColl(t)
	ctx := context.Background()
	rounds := make(chan extendRound, 100)
	f := &faultyStore{onExtend: func(r extendRound) { rounds <- r }}
	// FerretDB takes a second or more for such a bulk: the TTL leaves each
	// extension several seconds (half the time to the deadline).
	c := newClient(t, coll, WithTTL(10*time.Second), WithExtendInterval(time.Second), withFaults(f))
	mutexes := make([]*Mutex, n)
	for i := range mutexes {
		mutexes[i] = c.NewMutex(fmt.Sprint("many-", i))
		require.NoError(t, mutexes[i].Lock(ctx))
	}
	// Leases taken over a while fall into step: wait for a round of all.
	timeout := time.After(time.Minute)
	for full := 0; full < 2; {
		var r extendRound
		select {
		case r = <-rounds:
		case <-timeout:
			t.Fatalf("no two full rounds of extensions in a minute (%d)", full)
		}
		require.NoError(t, r.err)
		if r.leases == n {
			full++
			limit := c.store.(*faultyStore).store.(*mongoStore).maxBatch
			want := int64(1)
			if limit > 0 {
				want = int64((n + limit - 1) / limit)
			}
			assert.LessOrEqual(t, r.commands, want+1, "commands for one round (and a buildInfo once)")
		}
	}
	for _, m := range mutexes {
		require.NoError(t, m.Lease().Err())
	}
}

// Concurrent first Locks of a key that has no document yet, from several
// Clients: the upserts race on the _id index; exactly one wins each round,
// and the losers see the key held, not an error.
func TestConcurrentFirstLocks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, keys space) {
		sp := keys
		ctx := context.Background()
		clients := make([]*Client, 4)
		for i := range clients {
			clients[i] = sp.client(t)
		}
		for round := range 10 {
			key := fmt.Sprint("new-", round)
			errs := make(chan error, len(clients))
			start := make(chan struct{})
			for _, c := range clients {
				go func() {
					<-start
					errs <- c.NewMutex(key).TryLock(ctx)
				}()
			}
			close(start)
			won := 0
			for range clients {
				if err := <-errs; err == nil {
					won++
				} else {
					require.ErrorIs(t, err, ErrLocked)
				}
			}
			assert.Equal(t, 1, won, "round %d", round)
			assert.EqualValues(t, 1, sp.read(t, key).Token)
		}
	})
}

// Two Clients given the same WithOwner label are two owners: the second
// does not take the first's live hold as its own abandoned one, and cannot
// release it.
func TestSameOwnerLabelTwoClients(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		a, b := sp.client(t, WithOwner("web-1")), sp.client(t, WithOwner("web-1"))
		require.NotEqual(t, a.Owner(), b.Owner())
		assert.True(t, strings.HasPrefix(a.Owner(), "web-1#"), "the label leads the identity: %q", a.Owner())
		ma := a.NewMutex("k")
		require.NoError(t, ma.Lock(ctx))
		assert.ErrorIs(t, b.NewMutex("k").TryLock(ctx), ErrLocked, "b took a's live hold")
		err := b.store.release(ctx, leaseRef{key: "k", owner: b.Owner(), token: ma.Lease().Token(), hold: ma.Lease().hold})
		assert.ErrorIs(t, err, errNotOwner, "b released a's hold")
		assert.NoError(t, ma.Lease().Err())
		require.NoError(t, ma.Unlock(ctx))
	})
}
