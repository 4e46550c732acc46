package dlock

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Campaign, Leader, Proclaim and resigning, on each backend: terms with
// increasing tokens, ErrNoLeader when nobody leads, ErrNotHeld from a
// Proclaim that does not lead.
func TestElectionTerms(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		a, b := sp.client(t), sp.client(t)
		ea, eb := a.NewElection("e"), b.NewElection("e")

		_, err := eb.Leader(ctx)
		require.ErrorIs(t, err, ErrNoLeader)
		require.ErrorIs(t, ea.Proclaim(ctx, "x"), ErrNotHeld, "Proclaim before any Campaign")

		la, err := ea.Campaign(ctx, "a1")
		require.NoError(t, err)
		assert.Equal(t, "a1", string(la.Data()))
		assert.Same(t, la, ea.Lease())
		got, err := eb.Leader(ctx)
		require.NoError(t, err)
		assert.Equal(t, Leader{Value: "a1", Owner: a.Owner(), Token: la.Token()}, got)

		// Proclaim: a new value, the same term.
		require.NoError(t, ea.Proclaim(ctx, "a2"))
		assert.Equal(t, "a2", string(la.Data()))
		got, err = eb.Leader(ctx)
		require.NoError(t, err)
		assert.Equal(t, Leader{Value: "a2", Owner: a.Owner(), Token: la.Token()}, got)
		require.NoError(t, la.Err())
		assert.Equal(t, la.Token(), sp.read(t, "e").Token, "Proclaim changed the token")

		// Another Client waits while a leads.
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err = eb.Campaign(short, "b1")
		require.ErrorIs(t, err, context.DeadlineExceeded)

		// Resign: nobody leads; the old leader may not proclaim.
		require.NoError(t, la.Release(ctx))
		assert.Nil(t, ea.Lease())
		_, err = eb.Leader(ctx)
		require.ErrorIs(t, err, ErrNoLeader)
		require.ErrorIs(t, ea.Proclaim(ctx, "a3"), ErrNotHeld)

		// The next term has a greater token.
		lb, err := eb.Campaign(ctx, "b1")
		require.NoError(t, err)
		assert.Greater(t, lb.Token(), la.Token())
		got, err = ea.Leader(ctx)
		require.NoError(t, err)
		assert.Equal(t, Leader{Value: "b1", Owner: b.Owner(), Token: lb.Token()}, got)
		require.ErrorIs(t, ea.Proclaim(ctx, "a4"), ErrNotHeld)

		// A third term, by a again.
		require.NoError(t, lb.Release(ctx))
		la2, err := ea.Campaign(ctx, "")
		require.NoError(t, err)
		assert.Greater(t, la2.Token(), lb.Token())
		got, err = eb.Leader(ctx)
		require.NoError(t, err)
		assert.Equal(t, Leader{Value: "", Owner: a.Owner(), Token: la2.Token()}, got)

		// Values longer than MaxDataLen are refused before any command.
		long := strings.Repeat("x", MaxDataLen+1)
		_, err = eb.Campaign(ctx, long)
		require.ErrorIs(t, err, ErrInvalidOption)
		require.ErrorIs(t, ea.Proclaim(ctx, long), ErrInvalidOption)
		got, err = eb.Leader(ctx)
		require.NoError(t, err)
		assert.Equal(t, "", got.Value)
	})
}

// A name is an Election's or another primitive's, never both.
func TestElectionKindMismatch(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		a, b := sp.client(t), sp.client(t)
		require.NoError(t, a.NewMutex("m").Lock(ctx))
		_, err := b.NewElection("m").Campaign(ctx, "v")
		require.ErrorIs(t, err, ErrKindMismatch)
		assert.Contains(t, err.Error(), `"m" is used as a Mutex, not as an Election`)
		_, err = b.NewElection("m").Leader(ctx)
		require.ErrorIs(t, err, ErrKindMismatch)

		_, err = a.NewElection("e").Campaign(ctx, "v")
		require.NoError(t, err)
		err = b.NewMutex("e").Lock(ctx)
		require.ErrorIs(t, err, ErrKindMismatch)
		assert.Contains(t, err.Error(), `"e" is used as an Election, not as a Mutex`)
		_, err = b.NewSemaphore("e", 2).TryAcquire(ctx)
		require.ErrorIs(t, err, ErrKindMismatch)
		require.ErrorIs(t, b.NewRWMutex("e").RLock(ctx), ErrKindMismatch)
	})
}

// Observe against each backend: the current leader first, then every
// change, in order, for an observer that keeps up.
func TestElectionObserve(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		a, b := sp.client(t), sp.client(t)
		ea, eb := a.NewElection("e"), b.NewElection("e")
		obsCtx, stop := context.WithCancel(ctx)
		ch := sp.client(t).NewElection("e", WithObserveInterval(10*time.Millisecond)).Observe(obsCtx)
		next := func() Leader {
			t.Helper()
			select {
			case l, ok := <-ch:
				require.True(t, ok, "closed")
				return l
			case <-time.After(10 * time.Second):
				t.Fatal("no change observed")
			}
			return Leader{}
		}
		assert.Equal(t, Leader{}, next(), "nobody leads")
		la, err := ea.Campaign(ctx, "a1")
		require.NoError(t, err)
		assert.Equal(t, Leader{Value: "a1", Owner: a.Owner(), Token: la.Token()}, next())
		require.NoError(t, ea.Proclaim(ctx, "a2"))
		assert.Equal(t, Leader{Value: "a2", Owner: a.Owner(), Token: la.Token()}, next())
		require.NoError(t, la.Release(ctx))
		assert.Equal(t, Leader{}, next())
		lb, err := eb.Campaign(ctx, "b1")
		require.NoError(t, err)
		assert.Equal(t, Leader{Value: "b1", Owner: b.Owner(), Token: lb.Token()}, next())
		stop()
		for range ch { // closed once ctx ends
		}
	})
}

// electionClients returns two Clients on one in-memory store, each on a
// link of its own that a test can cut (down), with hooks.
func electionClients(t *testing.T, opts ...Option) (a, b *Client, linkA *memLink, ha, hb *hooked) {
	st := newMemStore()
	linkA = &memLink{memStore: st}
	a, ha = memClient(t, linkA, opts...)
	b, hb = memClient(t, &memLink{memStore: st}, opts...)
	return a, b, linkA, ha, hb
}

// Flapping: the leader's link is down for less than the TTL, then up. Its
// extensions fail meanwhile, but its lease never ends, no other Client
// leads, and Leader keeps reporting it.
func TestElectionBriefPartitionKeepsLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ttl := 3 * time.Second
		a, b, linkA, ha, _ := electionClients(t, WithTTL(ttl))
		ctx := context.Background()
		la, err := a.NewElection("e").Campaign(ctx, "a")
		require.NoError(t, err)

		eb := b.NewElection("e")
		campaignCtx, cancel := context.WithCancel(ctx)
		won := make(chan error, 1)
		go func() {
			_, err := eb.Campaign(campaignCtx, "b")
			won <- err
		}()

		time.Sleep(ttl/3 + ttl/6) // just after the first extension
		linkA.down.Store(true)
		time.Sleep(2 * ttl / 3) // two cadences without a successful extension
		failed := ha.count("extend")
		linkA.down.Store(false)
		for range 10 { // ten TTLs more
			time.Sleep(ttl)
			require.NoError(t, la.Err(), "the leader's term ended")
			got, err := eb.Leader(ctx)
			require.NoError(t, err)
			assert.Equal(t, Leader{Value: "a", Owner: a.Owner(), Token: la.Token()}, got)
		}
		assert.Greater(t, ha.count("extend"), failed, "extensions resumed")
		select {
		case err := <-won:
			t.Fatalf("another Client was elected while the leader's term was valid: %v", err)
		default:
		}
		cancel()
		require.ErrorIs(t, <-won, context.Canceled)
		assert.False(t, waitClosed(la.Lost(), 0))
	})
}

// A leader that stops (its process paused: no extension, its link down)
// learns of its loss, at its local deadline, before the next leader is
// elected; and the next is elected within the crashed-holder bound.
func TestElectionPausedLeaderLosesBeforeNextIsElected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ttl := 3 * time.Second
		a, b, linkA, _, _ := electionClients(t, WithTTL(ttl))
		ctx := context.Background()
		la, err := a.NewElection("e").Campaign(ctx, "a")
		require.NoError(t, err)
		work := la.Context()

		var lostAt time.Time
		lost := make(chan struct{})
		go func() {
			<-la.Lost()
			lostAt = time.Now()
			close(lost)
		}()
		time.Sleep(ttl / 2) // after the first extension, at ttl/3
		lastWrite := time.Now().Add(-ttl / 6)
		linkA.down.Store(true)

		eb := b.NewElection("e")
		lb, err := eb.Campaign(ctx, "b")
		require.NoError(t, err)
		electedAt := time.Now()
		require.True(t, waitClosed(lost, 0), "the next leader was elected before the old one's Lost closed")
		assert.True(t, lostAt.Before(electedAt), "lost at %v, next elected at %v", lostAt, electedAt)
		require.ErrorIs(t, la.Err(), ErrLeaseLost)
		require.Error(t, work.Err(), "work under the old term still running")
		assert.LessOrEqual(t, electedAt.Sub(lastWrite), 2*ttl+DefaultMaxBackoff, "elected later than the crashed-holder bound")
		assert.Greater(t, lb.Token(), la.Token())
		got, err := eb.Leader(ctx)
		require.NoError(t, err)
		assert.Equal(t, Leader{Value: "b", Owner: b.Owner(), Token: lb.Token()}, got)
	})
}

// Proclaim keeps the token, bumps the revision (a sign of life for
// waiters), costs one command, and does not extend the lease. A Proclaim
// that finds the key taken over ends the term as lost.
func TestElectionProclaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ttl := 3 * time.Second
		c, h := memClient(t, st, WithTTL(ttl))
		ctx := context.Background()
		e := c.NewElection("e")
		l, err := e.Campaign(ctx, "v1")
		require.NoError(t, err)
		before := holder(st, "e")
		require.NoError(t, e.Proclaim(ctx, "v2"))
		after := holder(st, "e")
		assert.Equal(t, 1, h.count("setData"))
		assert.Equal(t, before.Token, after.Token)
		assert.Equal(t, before.Rev+1, after.Rev)
		assert.Equal(t, "v2", string(after.Data))

		// Not an extension: with extensions failing, the lease ends at
		// the deadline of the acquire, however late the Proclaim.
		start := time.Now()
		h.on("extend", failing)
		time.Sleep(ttl / 2)
		require.NoError(t, e.Proclaim(ctx, "v3"))
		<-l.Lost()
		assert.Equal(t, holdFor(ttl), time.Since(start))

		// Taken over: Proclaim ends the term.
		h.on("extend", nil)
		l, err = e.Campaign(ctx, "v4")
		require.NoError(t, err)
		st.mu.Lock()
		r := st.records["e"]
		r.Owner, r.Token = "intruder", r.Token+1
		st.write("e", r)
		st.mu.Unlock()
		err = e.Proclaim(ctx, "v5")
		var lostErr *LeaseLostError
		require.ErrorAs(t, err, &lostErr)
		assert.Nil(t, lostErr.Cause, "taken over, not expired")
		assert.True(t, waitClosed(l.Lost(), 0))
		require.ErrorIs(t, e.Proclaim(ctx, "v6"), ErrLeaseLost)
		assert.Equal(t, "intruder", holder(st, "e").Owner)
	})
}

// recv returns what ch delivers within d, or ok=false when nothing comes
// (inside a bubble, d passes in no real time).
func recv(ch <-chan Leader, d time.Duration) (l Leader, ok bool) {
	select {
	case l, ok = <-ch:
		return l, ok
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case l, ok = <-ch:
		return l, ok
	case <-t.C:
		return Leader{}, false
	}
}

// However many goroutines observe an election through one Client, the
// Client reads its key once per interval, in one goroutine that stops
// when the last observer leaves; every observer that keeps up sees every
// change, in order, once.
func TestElectionObserveCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, h := memClient(t, st)
		leader, _ := memClient(t, st)
		ctx, stop := context.WithCancel(context.Background())
		const observers = 5
		seen := make([][]Leader, observers)
		done := make(chan struct{})
		for i := range observers {
			ch := c.NewElection("e").Observe(ctx) // an Election each, or one for all: the same
			go func() {
				defer func() { done <- struct{}{} }()
				for l := range ch {
					seen[i] = append(seen[i], l)
				}
			}()
		}
		start := time.Now()
		e := leader.NewElection("e")
		time.Sleep(2500 * time.Millisecond)
		l, err := e.Campaign(context.Background(), "v1")
		require.NoError(t, err)
		time.Sleep(2 * time.Second)
		require.NoError(t, e.Proclaim(context.Background(), "v2"))
		time.Sleep(2 * time.Second)
		require.NoError(t, l.Release(context.Background()))
		time.Sleep(2 * time.Second)
		elapsed := time.Since(start)
		stop()
		for range observers {
			<-done
		}
		reads := h.count("read")
		assert.LessOrEqual(t, reads, int(elapsed/DefaultObserveInterval)+1, "reads in %v", elapsed)
		want := []Leader{{}, {Value: "v1", Owner: leader.Owner(), Token: l.Token()}, {Value: "v2", Owner: leader.Owner(), Token: l.Token()}, {}}
		for i := range observers {
			assert.Equal(t, want, seen[i], "observer %d", i)
		}
		time.Sleep(10 * time.Second)
		assert.Equal(t, reads, h.count("read"), "reads after the last observer left")
	})
}

// A lagging observer gets the newest state when it next receives, never a
// stale one, and never the same state twice in a row; a second observer
// starts from the state of the last read; Close closes the channels.
func TestElectionObserveCoalesces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, h := memClient(t, st)
		leader, _ := memClient(t, st)
		ctx := context.Background()
		iv := time.Second
		ch := c.NewElection("e").Observe(ctx)
		synctest.Wait()
		got, ok := recv(ch, 0)
		require.True(t, ok)
		assert.Equal(t, Leader{}, got)
		time.Sleep(iv / 2) // from here on, between the poller's reads: no ties on the fake clock

		e := leader.NewElection("e")
		l, err := e.Campaign(ctx, "x")
		require.NoError(t, err)
		time.Sleep(iv) // the poller sees it
		for _, v := range []string{"y", "z"} {
			require.NoError(t, e.Proclaim(ctx, v))
			time.Sleep(iv)
		}
		synctest.Wait()
		got, ok = recv(ch, 0)
		require.True(t, ok)
		assert.Equal(t, Leader{Value: "z", Owner: leader.Owner(), Token: l.Token()}, got, "not the newest state")
		_, ok = recv(ch, 5*iv)
		require.False(t, ok, "a state delivered twice")

		// z, then w, then z again while the observer lags: nothing new.
		require.NoError(t, e.Proclaim(ctx, "w"))
		time.Sleep(iv)
		require.NoError(t, e.Proclaim(ctx, "z"))
		time.Sleep(iv)
		_, ok = recv(ch, 5*iv)
		require.False(t, ok, "the state the observer has, delivered again")

		// A second observer starts from the last read, at no cost.
		reads := h.count("read")
		ch2 := c.NewElection("e").Observe(ctx)
		synctest.Wait()
		got, ok = recv(ch2, 0)
		require.True(t, ok)
		assert.Equal(t, Leader{Value: "z", Owner: leader.Owner(), Token: l.Token()}, got)
		assert.Equal(t, reads, h.count("read"))

		require.NoError(t, c.Close(ctx))
		_, ok = <-ch
		require.False(t, ok, "open after Close")
		_, ok = <-ch2
		require.False(t, ok, "open after Close")
		_, ok = <-c.NewElection("e").Observe(ctx)
		require.False(t, ok, "Observe after Close")
	})
}

// Zero and invalid Elections fail, with no command sent.
func TestElectionMisuse(t *testing.T) {
	var zero Election
	ctx := context.Background()
	_, err := zero.Campaign(ctx, "v")
	require.ErrorIs(t, err, ErrNoClient)
	_, err = zero.Leader(ctx)
	require.ErrorIs(t, err, ErrNoClient)
	require.ErrorIs(t, zero.Proclaim(ctx, "v"), ErrNotHeld)
	_, ok := <-zero.Observe(ctx)
	require.False(t, ok)

	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, _ := memClient(t, st)
		_, err := c.NewElection("e", WithObserveInterval(0)).Campaign(ctx, "v")
		require.ErrorIs(t, err, ErrInvalidOption)
		_, err = c.NewElection("").Leader(ctx)
		require.ErrorIs(t, err, ErrInvalidKey)
		_, ok := <-c.NewElection("").Observe(ctx)
		require.False(t, ok)
		assert.Zero(t, st.commands.Load())
	})
}

// An Unlock hands its hold to the Client's next caller for the key only
// when that caller asks for a hold of the same kind: a Campaign, or an
// RWMutex's Lock, queued in the Client behind a Mutex of the same key
// (or a Mutex's Lock behind them) returns ErrKindMismatch, as it would
// behind another Client's hold, and the key's document stays the
// holder's kind, free.
func TestLocalHandoffKind(t *testing.T) {
	ctx := context.Background()
	mutex := func(c *Client) (func() error, error) {
		m := c.NewMutex("k")
		err := m.Lock(ctx)
		return func() error { return m.Unlock(ctx) }, err
	}
	election := func(c *Client) (func() error, error) {
		l, err := c.NewElection("k").Campaign(ctx, "v")
		if err != nil {
			return nil, err
		}
		return func() error { return l.Release(ctx) }, nil
	}
	writer := func(c *Client) (func() error, error) {
		rw := c.NewRWMutex("k")
		err := rw.Lock(ctx)
		return func() error { return rw.Unlock(ctx) }, err
	}
	for _, tc := range []struct {
		name       string
		hold, wait func(c *Client) (func() error, error)
		kind       string // the key's, as the holder made it
	}{
		{"Campaign behind a Mutex", mutex, election, ""},
		{"RWMutex.Lock behind a Mutex", mutex, writer, ""},
		{"Mutex.Lock behind an Election", election, mutex, kindElection},
		{"Mutex.Lock behind an RWMutex", writer, mutex, kindRW},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newMemStore()
				a, ha := memClient(t, st)
				b, _ := memClient(t, st)
				unlock, err := tc.hold(a)
				require.NoError(t, err)
				waited := make(chan error, 1)
				go func() {
					release, err := tc.wait(a)
					if err == nil {
						release()
					}
					waited <- err
				}()
				synctest.Wait() // queued in a, behind the hold
				require.NoError(t, unlock())
				require.ErrorIs(t, <-waited, ErrKindMismatch)
				assert.Zero(t, ha.count("handoff"), "the hold was handed over")
				r := holder(st, "k")
				assert.Equal(t, tc.kind, r.Kind)
				assert.Empty(t, r.Owner, "the key is held")
				_, err = b.NewElection("k").Leader(ctx)
				if tc.kind == kindElection {
					assert.ErrorIs(t, err, ErrNoLeader)
				} else {
					assert.ErrorIs(t, err, ErrKindMismatch)
				}
			})
		})
	}
}

// With WithMaxHold, a term writes nothing after its last extension, a
// TTL before the cap: a Proclaim then fails with ErrMaxHold and leaves
// the document as it was, so a Client that began to campaign after the
// last extension takes over at most a TTL after the cap. (A Proclaim
// written then would change the revision that the waiting Client times
// the term's silence from, and put it off by up to a TTL more.)
func TestElectionProclaimAfterLastExtension(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl, d = 10 * time.Second, time.Minute
		lastDue := d - ttl - lastGuard(ttl)
		ctx := context.Background()
		st := newMemStore()
		a, ha := memClient(t, st, WithTTL(ttl), WithMaxHold(d))
		b, _ := memClient(t, st, WithTTL(ttl))
		ea := a.NewElection("e")
		start := time.Now()
		l, err := ea.Campaign(ctx, "v1")
		require.NoError(t, err)
		time.Sleep(lastDue - time.Millisecond)
		require.NoError(t, ea.Proclaim(ctx, "v2"), "before the last extension")

		time.Sleep(ttl / 10)
		won := make(chan error, 1)
		go func() {
			_, err := b.NewElection("e").Campaign(ctx, "b")
			won <- err
		}()
		synctest.Wait() // b waits, its watch of the term begun
		time.Sleep(ttl / 2)
		require.NoError(t, l.Err(), "the term still leads")
		before, writes := holder(st, "e"), ha.count("setData")
		err = ea.Proclaim(ctx, "v3")
		assert.ErrorIs(t, err, ErrMaxHold)
		assert.NotErrorIs(t, err, ErrLeaseLost, "the term has not ended")
		assert.Equal(t, writes, ha.count("setData"), "a command was sent")
		assert.Equal(t, before.Rev, holder(st, "e").Rev, "the document was written")
		assert.Equal(t, "v2", string(l.Data()))

		require.NoError(t, <-won)
		took := time.Since(start)
		t.Logf("b took over %v after the cap", took-d)
		assert.LessOrEqual(t, took, d+ttl, "taken over more than a TTL after the cap")
		requireMaxHoldLost(t, l)
	})
}
