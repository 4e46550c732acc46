package dlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Tests of fair queueing across Clients on the in-memory store,
// inside testing/synctest bubbles: the Clients share one clock, the
// bubble's, so every wait is measured exactly and a minute of contention
// costs no real time.

// fairPoll is the longest a waiter's poll waits, by default: the poller's
// interval, at most DefaultMaxBackoff, jittered by up to +50% (backoff.go).
const fairPoll = DefaultMaxBackoff * 3 / 2

// fairRun is what runFairQueue saw: each Client's acquisitions, and the
// wait of every Lock, the ones the end of the run cancelled included.
type fairRun struct {
	counts  []int
	waits   []time.Duration
	longest time.Duration
}

// runFairQueue has n Clients, built with opts on one memStore, each loop
// Lock, a hold of hold (the bubble's clock stands for the work), Unlock on
// the key "k" for d. Then the Locks still waiting are cancelled; their
// waits count too. Call it inside a bubble.
func runFairQueue(t *testing.T, n int, hold, d time.Duration, opts ...Option) fairRun {
	st := newMemStore()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		mu  sync.Mutex
		run = fairRun{counts: make([]int, n)} // guarded by mu
		wg  sync.WaitGroup
	)
	for i := range n {
		c, _ := memClient(t, st, opts...)
		m := c.NewMutex("k")
		wg.Go(func() {
			for ctx.Err() == nil {
				called := time.Now()
				err := m.Lock(ctx)
				waited := time.Since(called)
				mu.Lock()
				run.waits = append(run.waits, waited)
				if err == nil {
					run.counts[i]++
				}
				mu.Unlock()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("client %d: Lock: %v", i, err)
					}
					return
				}
				time.Sleep(hold)
				if err := m.Unlock(context.WithoutCancel(ctx)); err != nil {
					t.Errorf("client %d: Unlock: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	run.longest = slices.Max(run.waits)
	return run
}

// TestFairQueueNoStarvation: Clients that take turns at a key as fast as
// they can share it evenly, and none waits longer than the queue allows.
//
// The bound on a wait follows from the FIFO rule. A Client that unlocks
// and locks again within a TTL of its last wait registers at once, behind
// the n-1 others (registered already): it waits for n-1 holds, each taken
// within a poll of the previous one's Unlock, then for its own poll. A
// poll is at most fairPoll, so
//
//	wait <= (n-1)*hold + n*fairPoll + slack.
//
// (The rougher (n-1)*(hold+DefaultMaxBackoff) leaves out the jitter and
// the waiter's own poll: with polls paced by the backoff alone, before
// they were paced by how often the key changes hands, waits of 1.0-1.3 s
// were measured here, above its 0.81 s.) Without queueing (flawUnfair),
// the Client that unlocks takes the key again at once, before anyone's
// poll, and the others starve: the same checks must fail.
func TestFairQueueNoStarvation(t *testing.T) {
	const (
		n     = 4
		hold  = 20 * time.Millisecond
		run   = 60 * time.Second
		slack = 10 * time.Millisecond
	)
	const bound = (n-1)*hold + n*fairPoll + slack
	for _, tc := range []struct {
		name     string
		opts     []Option
		wantFair bool
	}{
		{"fair", nil, true},
		{"unfair (before fair queueing)", []Option{withFlaw(flawUnfair)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := runFairQueue(t, n, hold, run, tc.opts...)
				total := 0
				for _, k := range r.counts {
					total += k
				}
				mean := float64(total) / n
				shared := true
				for _, k := range r.counts {
					if float64(k) < mean/2 || float64(k) > 2*mean {
						shared = false
					}
				}
				bounded := r.longest <= bound
				t.Logf("acquisitions per Client %v (mean %.1f), longest wait %v (bound %v)", r.counts, mean, r.longest, bound)
				assert.Equal(t, tc.wantFair, shared && bounded,
					"fair: acquisitions within 0.5-2x the mean (%v), every wait within %v (%v)", shared, bound, bounded)
			})
		})
	}
}

// waiters returns the owners of the registrations in key's record, in
// queue order.
func waiters(st *memStore, key string) []string {
	r := holder(st, key)
	es := slices.SortedFunc(maps.Values(r.Waiters), func(a, b entry) int { return cmp.Compare(a.Q, b.Q) })
	owners := make([]string, len(es))
	for i, e := range es {
		owners[i] = e.Owner
	}
	return owners
}

// TestFairQueueWaiterLeaves: a waiter whose ctx ends leaves the queue. Its
// Lock returns the ctx's error, its registration is removed (Close waits
// for that clean-up write), and the waiter behind it takes the key within
// a poll of the Unlock, not after a TTL (as it would if it had to wait out
// a registration left behind).
func TestFairQueueWaiterLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		a, _ := memClient(t, st)
		b, _ := memClient(t, st)
		c, _ := memClient(t, st)
		ma := a.NewMutex("k")
		require.NoError(t, ma.Lock(context.Background()))

		bctx, bcancel := context.WithTimeout(context.Background(), time.Second)
		defer bcancel()
		bErr := make(chan error, 1)
		go func() { bErr <- b.NewMutex("k").Lock(bctx) }()
		synctest.Wait() // b is registered, waiting for its poll
		mc := c.NewMutex("k")
		cErr := make(chan error, 1)
		go func() { cErr <- mc.Lock(context.Background()) }()
		synctest.Wait()
		require.Equal(t, []string{b.owner, c.owner}, waiters(st, "k"), "b, then c, queued")

		require.ErrorIs(t, <-bErr, context.DeadlineExceeded)
		require.NoError(t, b.Close(context.Background()))
		assert.Equal(t, []string{c.owner}, waiters(st, "k"), "b's registration left behind")

		unlocked := time.Now()
		require.NoError(t, ma.Unlock(context.Background()))
		require.NoError(t, <-cErr)
		took := time.Since(unlocked)
		t.Logf("c took the key %v after the Unlock", took)
		assert.LessOrEqual(t, took, fairPoll+10*time.Millisecond, "c took the key too long after the Unlock")
		r := holder(st, "k")
		assert.Equal(t, c.owner, r.Owner)
		assert.Empty(t, r.Waiters, "c's registration ends with its acquire")
		require.NoError(t, mc.Unlock(context.Background()))
	})
}

// TestRegisterCannotBeOutrun: Clients that start waiting together each
// register with one call (its two writes) and get distinct queue
// numbers, however many register at once: the first write takes a number
// from the counter, the second writes it, and no other registration can
// make either fail. Forty-seven Locks start at once behind a hold; every
// one is registered before any time passes.
func TestRegisterCannotBeOutrun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		h, _ := memClient(t, st)
		mh := h.NewMutex("k")
		require.NoError(t, mh.Lock(context.Background()))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const n = 47
		var hs []*hooked
		errs := make(chan error, n)
		for range n {
			c, hc := memClient(t, st)
			hs = append(hs, hc)
			go func() { errs <- c.NewMutex("k").Lock(ctx) }()
		}
		start := time.Now()
		synctest.Wait()
		assert.Zero(t, time.Since(start), "registered after waiting")
		r := holder(st, "k")
		assert.Len(t, r.Waiters, n, "every waiter registered")
		numbers := map[int64]bool{}
		for _, e := range r.Waiters {
			assert.NotZero(t, e.Q, "a pending registration")
			numbers[e.Q] = true
		}
		assert.Len(t, numbers, n, "queue numbers are distinct")
		for _, hc := range hs {
			assert.Equal(t, 1, hc.count("register"), "registrations of one wait")
		}
		cancel()
		for range n {
			require.ErrorIs(t, <-errs, context.Canceled)
		}
		require.NoError(t, mh.Unlock(context.Background()))
	})
}

// TestRequeueGuessesAgain: an Unlock whose requeue finds that a waiter
// registered since its Lock saw the queue counter, from the same view
// (the same guess plus one), requeues on a second guess queueSlack+1
// higher, rather than releasing the key and leaving its next Lock to
// register with a write of its own.
func TestRequeueGuessesAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		sc := requeueScene(t, st)
		ctx := context.Background()
		guess := holder(st, "k").Queue + queueSlack // a's, and another Client's requeue's from the same view
		_, err := st.register(ctx, attempt{key: "k", owner: "intruder", hold: 1, ttl: time.Minute})
		require.NoError(t, err)
		st.mu.Lock()
		r := st.records["k"]
		r.Queue = guess + 1 // as that requeue leaves it
		st.records["k"] = r
		st.mu.Unlock()
		requeues, releases := sc.ha.count("requeue"), sc.ha.count("release")
		time.Sleep(time.Second) // a hold too long to keep (keep.go)
		require.NoError(t, sc.ma.Unlock(ctx))
		assert.Equal(t, requeues+2, sc.ha.count("requeue"), "the requeue, outrun, and its second guess")
		assert.Equal(t, releases, sc.ha.count("release"), "a released the key instead")
		assert.Equal(t, []string{sc.b.owner, "intruder", sc.a.owner}, waiters(st, "k"))
		require.NoError(t, <-sc.bErr)
		require.NoError(t, sc.mb.Unlock(ctx))
	})
}

// TestQueuePollsWithinMaxBackoff: a waiter behind others, on the ordinary
// schedule, sleeps until about one waiter is left ahead of it, as
// estimated from how often the key changes hands, but never longer than
// the maximum backoff between two commands (WithBackoff: the schedule
// keeps within its bounds). Four Clients hold the key for a second each,
// and pause between Unlock and Lock longer than the requeue window, so
// every wait registers afresh and none is planned (pacer.go); the estimate
// then puts the last waiter's next read half a second or more away.
// Between two commands of a waiting Lock there is at most the maximum
// backoff, jittered by up to half (backoff.go).
func TestQueuePollsWithinMaxBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			n       = 4
			hold    = time.Second
			pause   = 20 * time.Millisecond // longer than the requeue window, the minimum backoff
			maxPoll = 100 * time.Millisecond
		)
		st := newMemStore()
		var (
			mu      sync.Mutex
			longest time.Duration          // guarded by mu: the longest gap between two commands of one waiting Lock
			last    = make([]time.Time, n) // guarded by mu: the last command of client i's wait under way; zero when it holds
		)
		ms := make([]*Mutex, n)
		for i := range n {
			c, h := memClient(t, st, WithBackoff(5*time.Millisecond, maxPoll))
			note := func(_ context.Context, call func() error) error {
				mu.Lock()
				if !last[i].IsZero() {
					longest = max(longest, time.Since(last[i]))
				}
				last[i] = time.Now()
				mu.Unlock()
				return call()
			}
			for _, op := range []string{"acquire", "read", "register"} {
				h.on(op, note)
			}
			ms[i] = c.NewMutex("k")
		}
		ringRoundsWork(t, ms, 6, func(i, r int) {
			mu.Lock()
			last[i] = time.Time{} // its wait is over
			mu.Unlock()
			time.Sleep(hold)
		}, pause)
		t.Logf("longest gap between two commands of a waiting Lock: %v", longest)
		assert.LessOrEqual(t, longest, maxPoll*3/2, "a waiting Lock slept past the maximum backoff")
	})
}

// TestFairQueueCrashedWaiter: a registered waiter whose Client stops (its
// every store call hangs, as a crashed or partitioned process's would)
// holds up the waiters behind it for at most about its TTL. While its
// Client extends the registration, the waiter behind it does not clear it
// (a live waiter keeps its place however long the holder holds); once the
// extensions stop, it waits for the registration's epoch to stand still
// for a TTL, clears it, and takes the key. The crashed waiter's last
// extension was at most a third of the TTL (the cadence) before the
// Unlock (here TTL/6), so the next waiter takes the key between
// TTL-TTL/3 and TTL+poll after the Unlock.
func TestFairQueueCrashedWaiter(t *testing.T) {
	for _, tc := range pacers() {
		t.Run(tc.name, func(t *testing.T) { crashedWaiterScene(t, withPacer(tc.pacer)) })
	}
}

func crashedWaiterScene(t *testing.T, pace Option) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		a, _ := memClient(t, st, pace)
		b, hb := memClient(t, st, pace)
		c, _ := memClient(t, st, pace)
		ma := a.NewMutex("k")
		require.NoError(t, ma.Lock(context.Background()))

		bctx, bcancel := context.WithCancel(context.Background())
		defer bcancel()
		bErr := make(chan error, 1)
		go func() { bErr <- b.NewMutex("k").Lock(bctx) }()
		synctest.Wait()
		mc := c.NewMutex("k")
		cErr := make(chan error, 1)
		go func() { cErr <- mc.Lock(context.Background()) }()
		synctest.Wait()
		require.Equal(t, []string{b.owner, c.owner}, waiters(st, "k"), "b, then c, queued")

		// a holds on; b's Client keeps its registration alive, extending it
		// every third of its TTL (registrationTTLs TTLs): last at most that
		// before the Unlock.
		time.Sleep(3*DefaultTTL + DefaultTTL/6)
		require.Equal(t, []string{b.owner, c.owner}, waiters(st, "k"), "a live registration was cleared")

		restart := hb.stop(t) // b's Client stops: nothing it sends arrives
		unlocked := time.Now()
		require.NoError(t, ma.Unlock(context.Background()))
		require.NoError(t, <-cErr)
		took := time.Since(unlocked)
		t.Logf("c took the key %v after the Unlock", took)
		regTTL := registrationTTLs * DefaultTTL
		assert.LessOrEqual(t, took, regTTL+fairPoll+10*time.Millisecond, "the crashed waiter held c up too long")
		assert.GreaterOrEqual(t, took, regTTL-regTTL/3, "c cleared b's registration before it stood still for its TTL")
		assert.Equal(t, c.owner, holder(st, "k").Owner)
		assert.Empty(t, waiters(st, "k"))

		restart()
		bcancel()
		require.ErrorIs(t, <-bErr, context.Canceled)
		require.NoError(t, mc.Unlock(context.Background()))
	})
}

// TestCrashedWaiterOnServer is TestFairQueueCrashedWaiter on the test
// server, in real time, with a short TTL: there a registration is one
// string (waiterValue) that each extension replaces, and a reap matches
// the string it read. b's live registration, extended, is not cleared by
// c, which watches it; once b's Client stops, c clears it after it stood
// still for a TTL, and takes the key. Then an older document's form of a
// registration, a sub-document, is read and cleared as well.
func TestCrashedWaiterOnServer(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out TTLs in real time")
	}
	// A TTL long enough that extensions get through while other packages'
	// tests load the machine, as in CI (go test ./... runs packages side by
	// side): with 300 ms, b's registration, or a's hold, lapsed in 2 of 20
	// runs beside them, their extensions delayed past the deadline.
	const ttl = time.Second
	coll := newColl(t)
	onServer := func() (*Client, *hooked) {
		return memClient(t, newMongoStore(coll, func(context.Context, int) {}), WithTTL(ttl), WithBackoff(5*time.Millisecond, 50*time.Millisecond))
	}
	a, _ := onServer()
	b, hb := onServer()
	c, _ := onServer()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ma := a.NewMutex("k")
	require.NoError(t, ma.Lock(ctx))
	read := func() record { return readDoc(t, coll, "k").record() }
	queued := func() []string {
		es := slices.SortedFunc(maps.Values(read().Waiters), func(a, b entry) int { return cmp.Compare(a.Q, b.Q) })
		owners := make([]string, len(es))
		for i, e := range es {
			owners[i] = e.Owner
		}
		return owners
	}
	// numbered: n registrations, each past its second write (a pending
	// one has number 0, and sorts first).
	numbered := func(n int) bool {
		ws := read().Waiters
		for _, e := range ws {
			if e.Q == 0 {
				return false
			}
		}
		return len(ws) == n
	}

	bctx, bcancel := context.WithCancel(ctx)
	defer bcancel()
	bErr := make(chan error, 1)
	go func() { bErr <- b.NewMutex("k").Lock(bctx) }()
	require.Eventually(t, func() bool { return numbered(1) }, 5*time.Second, 5*time.Millisecond, "b registers")
	mc := c.NewMutex("k")
	cErr := make(chan error, 1)
	go func() { cErr <- mc.Lock(ctx) }()
	require.Eventually(t, func() bool { return numbered(2) }, 5*time.Second, 5*time.Millisecond, "c registers")
	require.Equal(t, []string{b.owner, c.owner}, queued(), "b, then c, queued")
	var stored string
	for hk, e := range read().Waiters {
		if e.Owner == b.owner {
			stored = e.Stored
			require.Equal(t, waiterValue(e.Q, registrationTTLs*ttl, e.Epoch), storedValue(e.Stored).StringValue(), "registration %s stored as one string", hk)
		}
	}

	// a holds on for two TTLs: b's Client extends its registration (a new
	// string each time), so c, which reads and watches it, must not clear
	// it.
	deadline := time.Now().Add(2 * ttl)
	for time.Now().Before(deadline) {
		require.Equal(t, []string{b.owner, c.owner}, queued(), "a live registration was cleared")
		time.Sleep(ttl / 10) // sampling the document, not waiting for an event
	}
	for _, e := range read().Waiters {
		if e.Owner == b.owner {
			assert.NotEqual(t, stored, e.Stored, "b's registration was not extended")
		}
	}

	for _, op := range []string{"acquire", "extend", "release", "read", "register", "requeue", "reap"} {
		hb.on(op, hang) // b's Client stops: nothing it sends arrives
	}
	unlocked := time.Now()
	require.NoError(t, ma.Unlock(ctx))
	require.NoError(t, <-cErr, "c takes the key once b's registration is cleared")
	took := time.Since(unlocked)
	t.Logf("c took the key %v after the Unlock", took)
	assert.GreaterOrEqual(t, took, registrationTTLs*(ttl-ttl/3), "c cleared b's registration before it stood still for its TTL")
	assert.Equal(t, c.owner, read().Owner)
	assert.Empty(t, read().Waiters)
	bcancel()
	require.ErrorIs(t, <-bErr, context.Canceled)

	// A registration in the older form, a sub-document, of a waiter that
	// is gone: read as a registration, and cleared after a TTL.
	old := entryDoc{Owner: "gone", Hold: 1, TTL: ttlMillis(ttl), Epoch: 7, Q: read().Queue + 1}
	_, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "k"}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: path(fW, holdKey("gone", 1)), Value: old}, {Key: fQueue, Value: old.Q}}}})
	require.NoError(t, err)
	e, ok := read().Waiters[holdKey("gone", 1)]
	require.True(t, ok)
	e.Stored = "" // TestDecodeWaiters has it
	assert.Equal(t, entry{Owner: "gone", Hold: 1, TTL: ttl, Epoch: 7, Q: old.Q}, e)
	require.NoError(t, mc.Unlock(ctx))
	d, _ := onServer()
	require.NoError(t, d.NewMutex("k").Lock(ctx), "d takes the key once the old registration is cleared")
	assert.Equal(t, d.owner, read().Owner)
}

// TestMalformedRegistrationOnServer: a registration that no dlock wrote
// (a malformed string, another type, a sub-document that is not an older
// dlock's) is cleared at once by the waiter that finds it ahead, which
// then takes the key: a reap matches the value as read, whatever it is
// (matching by an epoch that such a value lacks, none of them would ever
// go, and the queue would stand still for good).
func TestMalformedRegistrationOnServer(t *testing.T) {
	coll := newColl(t)
	c := newClient(t, coll)
	for i, v := range []any{"", "7:x:99", "1:9223372036854775807:1", int64(3), nil, bson.D{{Key: "o", Value: "x"}}} {
		key := fmt.Sprintf("k%d", i)
		t.Run(fmt.Sprintf("%#v", v), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			m := c.NewMutex(key)
			require.NoError(t, m.Lock(ctx))
			require.NoError(t, m.Unlock(ctx))
			hk := holdKey("not dlock", 1)
			_, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: key}}, bson.D{{Key: "$set", Value: bson.D{{Key: path(fW, hk), Value: v}}}})
			require.NoError(t, err)
			require.Contains(t, readDoc(t, coll, key).record().Waiters, hk)

			require.NoError(t, m.Lock(ctx), "the registration ahead is cleared, and the key taken")
			assert.NotContains(t, readDoc(t, coll, key).record().Waiters, hk)
			require.NoError(t, m.Unlock(ctx))
		})
	}
}

// TestLateExtensionAfterReregistration: a wait whose registration was
// cleared (by a waiter behind it, while its Client could not extend it)
// registers again under the same hold key, behind those who registered
// meanwhile. An extension of the first registration that arrives after
// that must not match the second and put its old queue number back, or
// the wait would stand ahead of waiters that registered before it (and
// they, once they read that, behind it: both gates open, or both shut);
// nor may a late removal remove it. And a batch of extensions reports
// which of them matched: one that did not must not make the others look
// lost. On both stores.
func TestLateExtensionAfterReregistration(t *testing.T) {
	const ttl = 10 * time.Second
	for name, st := range map[string]func() store{
		"mongo": func() store { return newMongoStore(newColl(t), func(context.Context, int) {}) },
		"mem":   func() store { return newMemStore() },
	} {
		t.Run(name, func(t *testing.T) {
			s, ctx, key := st(), context.Background(), "k"
			h, err := s.acquire(ctx, attempt{key: key, owner: "holder", hold: 1, ttl: ttl}, stamp{})
			require.NoError(t, err)
			holding := leaseRef{key: key, owner: "holder", hold: 1, ttl: ttl, token: h.Token, role: roleExclusive}
			register := func(owner string, hold, queue int64) entry {
				t.Helper()
				r, err := s.register(ctx, attempt{key: key, owner: owner, hold: hold, ttl: ttl, queue: queue})
				require.NoError(t, err)
				return r.Waiters[holdKey(owner, hold)]
			}
			hk := holdKey("w", 7)
			first := register("w", 7, 0)
			require.EqualValues(t, 1, first.Q)
			r, err := s.read(ctx, key)
			require.NoError(t, err)
			ok, err := s.reap(ctx, key, stamp{}, []staleEntry{{role: roleWaiter, key: hk, epoch: first.Epoch, stored: r.Waiters[hk].Stored}})
			require.NoError(t, err)
			require.True(t, ok, "the first registration cleared")
			require.EqualValues(t, 2, register("b", 1, 1).Q)
			require.EqualValues(t, 3, register("w", 7, 2).Q, "registered again, same hold key, behind b")

			// The late extension in one batch with a hold that is live: the
			// batch reports which of them matched.
			late := leaseRef{key: key, owner: "w", hold: 7, ttl: ttl, token: Token(first.Q), role: roleWaiter}
			oks, err := s.extend(ctx, []leaseRef{holding, late})
			require.NoError(t, err)
			assert.Equal(t, []bool{true, false}, oks, "the live hold extended; the late extension of the first registration not matched")
			r, err = s.read(ctx, key)
			require.NoError(t, err)
			assert.EqualValues(t, 3, r.Waiters[hk].Q, "the queue number after the late extension")
			assert.Equal(t, "holder", r.Owner)
			assert.ErrorIs(t, s.release(ctx, late), errNotOwner, "a late removal of the first registration")
			r, err = s.read(ctx, key)
			require.NoError(t, err)
			require.Contains(t, r.Waiters, hk, "the second registration, after a late removal of the first")

			now := late
			now.token = 3
			oks, err = s.extend(ctx, []leaseRef{now})
			require.NoError(t, err)
			assert.True(t, oks[0], "the second registration's own extension")
			r2, err := s.read(ctx, key)
			require.NoError(t, err)
			assert.EqualValues(t, 3, r2.Waiters[hk].Q)
			assert.NotEqual(t, r.Waiters[hk].Epoch, r2.Waiters[hk].Epoch, "extended: a new epoch")
		})
	}
}

// TestDecodeWaiters: a registration is read from its string, or from the
// sub-document an older dlock wrote; one that is neither, or whose TTL is
// negative or too long for a time.Duration, is read with queue number 0
// and no TTL, so the waiters that read it clear it at once. Each keeps
// its value as stored, whatever it is, for a reap to match.
func TestDecodeWaiters(t *testing.T) {
	raw := func(v any) bson.RawValue {
		if rv, ok := v.(bson.RawValue); ok {
			return rv
		}
		typ, data, err := bson.MarshalValue(v)
		require.NoError(t, err)
		return bson.RawValue{Type: typ, Value: data}
	}
	hk := holdKey("owner-1", 42)
	for _, tc := range []struct {
		name string
		v    any
		want entry
	}{
		{"string", waiterValue(7, 1500*time.Millisecond, 99), entry{Q: 7, TTL: 1500 * time.Millisecond, Epoch: 99}},
		{"older sub-document", entryDoc{Owner: "owner-1", Hold: 42, TTL: 1500, Epoch: 99, Q: 7}, entry{Q: 7, TTL: 1500 * time.Millisecond, Epoch: 99}},
		{"malformed string", "7:x:99", entry{}},
		{"too few fields", "7:1500", entry{}},
		{"empty string", "", entry{}},
		{"negative TTL", "7:-1500:99", entry{}},
		{"TTL too long for a Duration", "7:9223372036854775807:99", entry{}},
		{"sub-document, TTL too long", entryDoc{TTL: math.MaxInt64, Epoch: 99, Q: 7}, entry{}},
		{"a number", int64(3), entry{}},
		{"null", bson.RawValue{Type: bson.TypeNull}, entry{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := raw(tc.v)
			tc.want.Owner, tc.want.Hold = "owner-1", 42
			got := decodeWaiters(map[string]bson.RawValue{hk: v})
			require.Contains(t, got, hk)
			e := got[hk]
			assert.True(t, v.Equal(storedValue(e.Stored)), "the value as stored: %v, kept %q", v, e.Stored)
			e.Stored = ""
			assert.Equal(t, tc.want, e)
		})
	}
	owner, hold := parseHoldKey("not a hold key")
	assert.Equal(t, "", owner)
	assert.Zero(t, hold)
}

// ringRounds has the Mutexes ms, of separate Clients on one key, take
// turns, each locking again at once after it unlocks, for rounds
// acquisitions each, holding the key for hold each time. It returns the
// order of the acquisitions, as indexes into ms. Call it inside a bubble.
func ringRounds(t *testing.T, ms []*Mutex, rounds int, hold time.Duration) []int {
	return ringRoundsWork(t, ms, rounds, func(int, int) { time.Sleep(hold) }, 0)
}

// ringRoundsWork is ringRounds with each hold's work given: work(i, r)
// runs while ms[i] holds the key in its round r; after each Unlock, a
// Mutex sleeps for pause before it locks again.
func ringRoundsWork(t *testing.T, ms []*Mutex, rounds int, work func(i, r int), pause time.Duration) []int {
	var (
		mu    sync.Mutex
		order []int // guarded by mu
		wg    sync.WaitGroup
	)
	for i, m := range ms {
		wg.Go(func() {
			for r := range rounds {
				if err := m.Lock(context.Background()); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				work(i, r)
				if err := m.Unlock(context.Background()); err != nil {
					t.Error(err)
					return
				}
				if pause > 0 {
					time.Sleep(pause)
				}
			}
		})
	}
	wg.Wait()
	return order
}

// TestRequeue: two Clients that each lock again as soon as they unlock
// take turns, and from their second turns on each Unlock queues the
// Client's next Lock in the release's own write: the Lock adopts that
// registration and sends no write to register. The turns alternate.
func TestRequeue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		a, ha := memClient(t, st)
		b, hb := memClient(t, st)
		const rounds = 20
		order := ringRounds(t, []*Mutex{a.NewMutex("k"), b.NewMutex("k")}, rounds, 10*time.Millisecond)
		for i := 2; i < len(order); i++ {
			require.NotEqual(t, order[i-1], order[i], "turn %d: the same Client twice in a row: %v", i, order)
		}
		for _, h := range []*hooked{ha, hb} {
			t.Logf("requeue %d, release %d, register %d", h.count("requeue"), h.count("release"), h.count("register"))
			assert.GreaterOrEqual(t, h.count("requeue"), rounds-3, "Unlocks that requeued")
			assert.LessOrEqual(t, h.count("register"), 3, "Locks that registered themselves")
		}
		// The last Unlocks requeued too, with no Lock to follow: the
		// window gives those registrations up.
		time.Sleep(requeueWindow(&a.cfg))
		synctest.Wait()
		assert.Empty(t, waiters(st, "k"), "a registration left behind")
	})
}

// TestRequeueOnlySoon: an Unlock requeues only when the primitive's last
// Lock came within the requeue window after the Unlock before it.
func TestRequeueOnlySoon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		a, ha := memClient(t, st)
		b, _ := memClient(t, st)
		ma, mb := a.NewMutex("k"), b.NewMutex("k")
		ctx := context.Background()
		require.NoError(t, mb.Lock(ctx))
		for range 5 { // a waits for b each time, and locks a second after it unlocks
			aErr, bErr := make(chan error, 1), make(chan error, 1)
			go func() { aErr <- ma.Lock(ctx) }()
			synctest.Wait()
			require.NoError(t, mb.Unlock(ctx))
			require.NoError(t, <-aErr)
			go func() { bErr <- mb.Lock(ctx) }()
			synctest.Wait()
			require.NoError(t, ma.Unlock(ctx))
			require.NoError(t, <-bErr)
			time.Sleep(time.Second)
		}
		assert.Zero(t, ha.count("requeue"), "an Unlock requeued, though its Lock came a second after the Unlock before it")
		require.NoError(t, mb.Unlock(ctx))
	})
}

// A scene is three Clients on one key, set up by requeueScene.
type scene struct {
	a, b, c    *Client
	ha         *hooked // a's
	ma, mb, mc *Mutex
	bErr       chan error // b's Lock, waiting
}

// requeueScene sets up three Clients on key "k" of st so that a holds the
// key, its Lock having waited and come at once after its last Unlock (so
// its next Unlock requeues), and b's Lock waits, registered behind a.
// Call it inside a bubble.
func requeueScene(t *testing.T, st *memStore) scene {
	t.Helper()
	var sc scene
	sc.a, sc.ha = memClient(t, st)
	sc.b, _ = memClient(t, st)
	sc.c, _ = memClient(t, st)
	sc.ma, sc.mb, sc.mc = sc.a.NewMutex("k"), sc.b.NewMutex("k"), sc.c.NewMutex("k")
	ctx := context.Background()
	require.NoError(t, sc.mc.Lock(ctx))
	aErr, bErr := lockAsync(sc.ma), lockAsync(sc.mb)
	require.NoError(t, sc.mc.Unlock(ctx))
	require.NoError(t, <-aErr)
	require.NoError(t, sc.ma.Unlock(ctx))
	aErr = lockAsync(sc.ma) // at once: a's next Unlock requeues
	require.NoError(t, <-bErr)
	require.NoError(t, sc.mb.Unlock(ctx))
	sc.bErr = lockAsync(sc.mb) // b registers before a takes the key
	require.NoError(t, <-aErr)
	require.Equal(t, []string{sc.b.owner}, waiters(st, "k"))
	return sc
}

// lockAsync starts m.Lock in a goroutine, waits until every goroutine of
// the bubble is blocked (the Lock holds the key, or waits), and returns
// the channel its error will come on.
func lockAsync(m *Mutex) chan error {
	ch := make(chan error, 1)
	go func() { ch <- m.Lock(context.Background()) }()
	synctest.Wait()
	return ch
}

// TestRequeueGivenUp: a registration that an Unlock requeued, and that no
// Lock adopts within the requeue window, is removed, so it does not hold
// up the waiters behind it: the next waiter takes the key when the holder
// unlocks, with no TTL to wait out. No goroutine is left behind (goleak,
// in TestMain).
func TestRequeueGivenUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		sc := requeueScene(t, st)
		a, b, c, ha, ma, mb, mc, bErr := sc.a, sc.b, sc.c, sc.ha, sc.ma, sc.mb, sc.mc, sc.bErr
		ctx := context.Background()

		requeues := ha.count("requeue")
		time.Sleep(10 * time.Millisecond)  // work: a hold too long to keep (keep.go)
		require.NoError(t, ma.Unlock(ctx)) // requeues a behind b; a does not lock again
		require.Equal(t, requeues+1, ha.count("requeue"))
		require.Equal(t, []string{b.owner, a.owner}, waiters(st, "k"), "a requeued behind b")
		cErr := make(chan error, 1)
		go func() { cErr <- mc.Lock(ctx) }()
		synctest.Wait() // c fails its attempt and registers, at this instant
		require.Equal(t, []string{b.owner, a.owner, c.owner}, waiters(st, "k"), "c queued behind a's unused registration")
		require.NoError(t, <-bErr)
		time.Sleep(requeueWindow(&a.cfg))
		synctest.Wait()
		assert.Equal(t, []string{c.owner}, waiters(st, "k"), "the unused registration is still queued after the window")

		unlocked := time.Now()
		require.NoError(t, mb.Unlock(ctx))
		require.NoError(t, <-cErr)
		assert.Less(t, time.Since(unlocked), fairPoll+10*time.Millisecond, "c waited for a's unused registration")
		require.NoError(t, mc.Unlock(ctx))
	})
}

// TestRequeueDuringClose: an Unlock whose requeue write is still under
// way when Close, its context ended, stops waiting for it removes the
// registration it made itself: no clean-up runs after Close, and the
// registration would otherwise hold up the waiters behind it for a TTL.
func TestRequeueDuringClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		sc := requeueScene(t, st)
		a, ha, ma, mb, bErr := sc.a, sc.ha, sc.ma, sc.mb, sc.bErr
		ctx := context.Background()

		requeues := ha.count("requeue")
		time.Sleep(10 * time.Millisecond) // work: a hold too long to keep (keep.go)
		gate := make(chan struct{})
		ha.on("requeue", func(_ context.Context, call func() error) error { <-gate; return call() })
		unlocked := make(chan error, 1)
		go func() { unlocked <- ma.Unlock(ctx) }()
		synctest.Wait() // the requeue write waits at the gate
		closing, cancel := context.WithCancel(ctx)
		cancel()
		a.Close(closing) // cannot wait for the Unlock: its error is the cancelled releases'
		close(gate)
		require.NoError(t, <-unlocked)
		require.Equal(t, requeues+1, ha.count("requeue"), "the Unlock requeued")
		require.NoError(t, <-bErr, "b takes the key a's requeue freed")
		assert.Empty(t, waiters(st, "k"), "the requeued registration outlived Close")
		require.NoError(t, mb.Unlock(ctx))
	})
}

// TestTryAfterDeadWaiter: a waiter whose Client stopped, with no waiting
// Lock behind it to clear its registration, blocks a try on the free key
// for at most two TTLs and a poll interval: a try that finds the key free
// but for registrations none of which was extended for its TTL, by the
// server's clock, clears them and takes the key. While it blocks, Holders
// names it. A Mutex's TryLock, an RWMutex's TryLock and TryRLock.
func TestTryAfterDeadWaiter(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait func(c *Client) func(ctx context.Context) error // a waiting Lock
		try  func(c *Client) (func(ctx context.Context) error, func(ctx context.Context) error)
	}{
		{"Mutex", func(c *Client) func(ctx context.Context) error { return c.NewMutex("k").Lock },
			func(c *Client) (func(ctx context.Context) error, func(ctx context.Context) error) {
				m := c.NewMutex("k")
				return m.TryLock, m.Unlock
			}},
		{"RWMutex.TryLock", func(c *Client) func(ctx context.Context) error { return c.NewRWMutex("k").Lock },
			func(c *Client) (func(ctx context.Context) error, func(ctx context.Context) error) {
				m := c.NewRWMutex("k")
				return m.TryLock, m.Unlock
			}},
		{"RWMutex.TryRLock", func(c *Client) func(ctx context.Context) error { return c.NewRWMutex("k").Lock },
			func(c *Client) (func(ctx context.Context) error, func(ctx context.Context) error) {
				m := c.NewRWMutex("k")
				return m.TryRLock, m.RUnlock
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newMemStore()
				a, _ := memClient(t, st)
				b, hb := memClient(t, st)
				c, _ := memClient(t, st)
				ctx := context.Background()
				lockA, unlockA := tc.try(a)
				require.NoError(t, lockA(ctx))
				bctx, bcancel := context.WithCancel(ctx)
				defer bcancel()
				bErr := make(chan error, 1)
				go func() { bErr <- tc.wait(b)(bctx) }()
				synctest.Wait()
				require.Equal(t, []string{b.owner}, waiters(st, "k"), "b waits, registered")
				restart := hb.stop(t) // b's Client stops: nothing it sends arrives
				require.NoError(t, unlockA(ctx))
				tryC, unlockC := tc.try(c)
				require.ErrorIs(t, tryC(ctx), ErrLocked, "b's registration is fresh: it may be alive")
				hs, err := c.Holders(ctx, "k")
				require.NoError(t, err)
				assert.Equal(t, []Holder{{Owner: b.owner, Waiting: true}}, hs, "Holders names what blocks the key")

				time.Sleep(2*DefaultTTL + fairPoll)
				require.NoError(t, tryC(ctx), "b's dead registration still blocks a try")
				assert.Empty(t, waiters(st, "k"))
				require.NoError(t, unlockC(ctx))
				restart()
				bcancel()
				<-bErr
			})
		})
	}
}

// TestTryAfterDeadWaiterOnServer is TestTryAfterDeadWaiter's clearing on
// the test server, whose clock judges the registration (hello's
// localTime against the document's stamp): a registration of 300 ms that
// no one extends blocks a TryLock until it is 300 ms old, and no longer.
// The server's clock cannot be injected: the test waits it out.
func TestTryAfterDeadWaiterOnServer(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, newColl(t))
	m := c.NewMutex("k")
	require.NoError(t, m.Lock(ctx))
	require.NoError(t, m.Unlock(ctx))
	dead := attempt{key: "k", owner: "dead", hold: 1, ttl: 300 * time.Millisecond, queue: 64}
	_, err := c.store.register(ctx, dead)
	require.NoError(t, err)
	require.ErrorIs(t, m.TryLock(ctx), ErrLocked, "a fresh registration blocks a try")
	time.Sleep(dead.ttl + 100*time.Millisecond)
	require.NoError(t, m.TryLock(ctx), "the dead registration still blocks a try")
	assert.Empty(t, readDoc(t, c.store.(*mongoStore).coll, "k").W)
	require.NoError(t, m.Unlock(ctx))
}

// TestQueueFull: a Lock, or a Semaphore's Acquire, that would register
// past MaxQueue waiters fails with ErrQueueFull, and leaves no
// registration behind; the queue's waiters keep their places.
func TestQueueFull(t *testing.T) {
	for _, kind := range []string{"mutex", "semaphore"} {
		t.Run(kind, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newMemStore()
				a, _ := memClient(t, st)
				b, _ := memClient(t, st)
				ctx := context.Background()
				lock := func(ctx context.Context, c *Client) error {
					if kind == "mutex" {
						return c.NewMutex("k").Lock(ctx)
					}
					_, err := c.NewSemaphore("k", 1).Acquire(ctx)
					return err
				}
				require.NoError(t, lock(ctx, a))
				st.mu.Lock()
				r := st.records["k"]
				r.Waiters = map[string]entry{}
				for i := range MaxQueue {
					r.Queue = int64(i + 1)
					r.Waiters[holdKey("w", int64(i+1))] = entry{Owner: "w", Hold: int64(i + 1), TTL: time.Hour, Q: r.Queue}
				}
				st.records["k"] = r
				st.mu.Unlock()

				lctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				err := lock(lctx, b)
				require.ErrorIs(t, err, ErrQueueFull)
				t.Log(err)
				synctest.Wait() // the registration's removal, in the background
				assert.Len(t, holder(st, "k").Waiters, MaxQueue)
				for _, e := range holder(st, "k").Waiters {
					assert.Equal(t, "w", e.Owner)
				}
			})
		})
	}
}

// TestShortHoldsAfterLongHold: once a long hold ends, a queue of waiters
// takes short turns at the pace of short turns, not of the long hold:
// every turn comes within a poll interval of the one before, on average.
// A wait paced by an estimate of the turns ahead of it (how often the key
// changed hands so far) sleeps through a queue whose holds became short,
// and the key then sits free while the new head sleeps: a pacing that let
// waiters two or more places back sleep up to a TTL whenever the key had
// changed hands slowly took 1.4 s a turn here. Letting every waiter
// sleep up to a quarter TTL once the key has stood still for a TTL
// (schedule.limit) costs one wait of at most a quarter TTL when the long
// hold ends.
func TestShortHoldsAfterLongHold(t *testing.T) {
	const (
		clients = 16
		hold    = 20 * time.Millisecond
		rounds  = 3
	)
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ctx := context.Background()
		var ms []*Mutex
		for range clients {
			c, _ := memClient(t, slowStore{st, time.Millisecond})
			ms = append(ms, c.NewMutex("k"))
		}
		require.NoError(t, ms[0].Lock(ctx))
		var wg sync.WaitGroup
		var mu sync.Mutex
		var last time.Time // guarded by mu: when the last short hold ended
		for _, m := range ms[1:] {
			wg.Go(func() {
				for range rounds {
					if !assert.NoError(t, m.Lock(ctx)) {
						return
					}
					time.Sleep(hold)
					mu.Lock()
					last = time.Now()
					mu.Unlock()
					assert.NoError(t, m.Unlock(ctx))
				}
			})
		}
		time.Sleep(time.Minute) // the long hold
		ended := time.Now()
		require.NoError(t, ms[0].Unlock(ctx))
		wg.Wait()
		turn := last.Sub(ended) / ((clients - 1) * rounds)
		t.Logf("%d short holds after a long one: %v a turn", (clients-1)*rounds, turn)
		assert.LessOrEqual(t, turn, hold+fairPoll, "short turns after a long hold came at the long hold's pace")
	})
}

// TestWaitingThroughLongHold: while a key stands still, its waiters read
// less often the longer it stands (schedule.age), whatever they wait
// in: a Lock at the head of the queue, next, or further back, an RLock
// behind a writer, a Semaphore's Acquire. Each key is held for two
// minutes; in the second, every waiter sends about one command a quarter
// TTL (and a read a TTL that watches the holder), besides its
// registration's upkeep (not counted: the extensions). Without the rule
// (ruleAge off), each polls about four times a second, which shows the
// check has teeth. When the hold ends, the head takes the key within an
// eighth of the hold, at most a quarter TTL, and a poll.
func TestWaitingThroughLongHold(t *testing.T) {
	const hold = 2 * time.Minute
	for _, tc := range []struct {
		name  string
		opts  []Option
		cheap bool
	}{
		{"rules", nil, true},
		{"no age rule", []Option{withPacer(withoutRule{ruleAge})}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newMemStore()
				ctx := context.Background()
				holder, _ := memClient(t, st)
				mu, rw, sem := holder.NewMutex("k"), holder.NewRWMutex("rw"), holder.NewSemaphore("s", 1)
				require.NoError(t, mu.Lock(ctx))
				require.NoError(t, rw.Lock(ctx))
				permit, err := sem.Acquire(ctx)
				require.NoError(t, err)

				type waiter struct {
					name string
					h    *hooked
					most int // commands in the second minute, at most, with the rule
				}
				var ws []waiter
				var wg sync.WaitGroup
				var headTook time.Time
				// A poll a quarter TTL, and a read a TTL of the holder's
				// revision (the watch), at every place and shared.
				quarter := int(time.Minute/(DefaultTTL/4)) + int(time.Minute/DefaultTTL) + 2
				for i, most := range []int{quarter, quarter, quarter, quarter} {
					c, h := memClient(t, st, tc.opts...)
					ws = append(ws, waiter{fmt.Sprint("Lock, place ", i), h, most})
					m := c.NewMutex("k")
					wg.Go(func() {
						if assert.NoError(t, m.Lock(ctx)) {
							if i == 0 {
								headTook = time.Now()
							}
							assert.NoError(t, m.Unlock(ctx))
						}
					})
					synctest.Wait() // registered, in this order
				}
				c, h := memClient(t, st, tc.opts...)
				ws = append(ws, waiter{"RLock", h, quarter})
				r := c.NewRWMutex("rw")
				wg.Go(func() {
					if assert.NoError(t, r.RLock(ctx)) {
						assert.NoError(t, r.RUnlock(ctx))
					}
				})
				c, h = memClient(t, st, tc.opts...)
				ws = append(ws, waiter{"Semaphore.Acquire", h, quarter})
				s := c.NewSemaphore("s", 1)
				wg.Go(func() {
					if l, err := s.Acquire(ctx); assert.NoError(t, err) {
						assert.NoError(t, l.Release(ctx))
					}
				})

				time.Sleep(hold / 2)
				before := make([]int, len(ws))
				for i, w := range ws {
					before[i] = w.h.total() - w.h.count("extend")
				}
				time.Sleep(hold / 2)
				for i, w := range ws {
					n := w.h.total() - w.h.count("extend") - before[i]
					t.Logf("%s: %d commands in the second minute", w.name, n)
					if tc.cheap {
						assert.LessOrEqual(t, n, w.most, w.name)
					} else {
						assert.Greater(t, n, 100, "%s: the check has no teeth", w.name)
					}
				}
				ended := time.Now()
				require.NoError(t, mu.Unlock(ctx))
				require.NoError(t, rw.Unlock(ctx))
				require.NoError(t, permit.Release(ctx))
				wg.Wait()
				took := headTook.Sub(ended)
				t.Logf("the head took the key %v after the hold ended", took)
				assert.LessOrEqual(t, took, min(hold/8, DefaultTTL/4)+fairPoll, "the head came late")
			})
		})
	}
}

// TestHeadAfterWaitersAheadLeft: a sleep does not outlive the view it was
// decided on. After a long hold, a waiter two places back whose waiters
// ahead give up (a Lock with a timeout) is the head without knowing it;
// when the hold ends it takes the key within a quarter TTL and a poll, as
// a head does, not after the sleep of a waiter two places back (a TTL,
// when deep waiters slept that long). The waiters ahead leave, and the
// hold ends, just after its read, when it has the longest sleep ahead of
// it. On the in-memory store in virtual time (the default TTL), and on
// the embedded server (a TTL of 2 s).
func TestHeadAfterWaitersAheadLeft(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newMemStore()
			headAfterWaitersAheadLeft(t, func() store { return st }, DefaultTTL, synctest.Wait)
		})
	})
	t.Run("server", func(t *testing.T) {
		coll := newColl(t)
		st := func() store { return newMongoStore(coll, func(context.Context, int) {}) }
		headAfterWaitersAheadLeft(t, st, 2*time.Second, func() {})
	})
}

// headAfterWaitersAheadLeft runs TestHeadAfterWaitersAheadLeft's scene
// on the stores st returns, with ttl; settle waits until the goroutines
// of a bubble are blocked, or does nothing outside one.
func headAfterWaitersAheadLeft(t *testing.T, st func() store, ttl time.Duration, settle func()) {
	ctx := context.Background()
	holder, _ := memClient(t, st(), WithTTL(ttl))
	mh := holder.NewMutex("k")
	require.NoError(t, mh.Lock(ctx))
	var leave []context.CancelFunc
	left := make(chan error, 2)
	for range 2 {
		c, h := memClient(t, st(), WithTTL(ttl))
		m := c.NewMutex("k")
		wctx, cancel := context.WithCancel(ctx)
		leave = append(leave, cancel)
		registered := h.answered("register")
		go func() { left <- m.Lock(wctx) }() // gives up when cancelled
		<-registered                         // registered, in this order
	}
	c, h := memClient(t, st(), WithTTL(ttl))
	m := c.NewMutex("k")
	took := make(chan time.Time, 1)
	go func() { // sends once done with the Client, which the test's end closes
		defer close(took)
		if assert.NoError(t, m.Lock(ctx)) {
			at := time.Now()
			assert.NoError(t, m.Unlock(ctx))
			took <- at
		}
	}()
	time.Sleep(ttl * 3 / 2) // the long hold: the key stands still past a TTL
	<-h.answered("read")
	settle() // its read answered, it sleeps
	for _, cancel := range leave {
		cancel()
	}
	for range leave {
		require.ErrorIs(t, <-left, context.Canceled)
	}
	ended := time.Now()
	require.NoError(t, mh.Unlock(ctx))
	at, ok := <-took
	require.True(t, ok, "the waiter did not take the key")
	wait := at.Sub(ended)
	t.Logf("the waiter took the key %v after the hold ended", wait)
	assert.LessOrEqual(t, wait, ttl/4+fairPoll, "the key waited for a sleeper")
}

// dozer is dlock's pacer, but its waits are asleep or awake as sleep says,
// whatever their place.
type dozer struct {
	rulesPacer
	asleep *atomic.Bool
}

func (p dozer) doze(_, _ int, asleep bool) (bool, bool) {
	s := p.asleep.Load()
	return s, s != asleep
}

// TestPassSleeper: no free key waits for a sleeper, and a sleeper keeps
// its place. a registers first, marked asleep, and sleeps; b registers
// behind it, awake. When the holder unlocks, b takes the key within a poll
// while a sleeps on (were the key to wait for a, b would wait for as long
// as a sleeps, here for ever). Then a wakes: it marks itself awake, and
// takes the key before c, which registered after it.
func TestPassSleeper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		var sleep atomic.Bool
		sleep.Store(true)
		h, _ := memClient(t, st)
		a, ha := memClient(t, st, withPacer(dozer{asleep: &sleep}))
		b, _ := memClient(t, st)
		c, _ := memClient(t, st)
		ctx := context.Background()
		mh, ma, mb, mc := h.NewMutex("k"), a.NewMutex("k"), b.NewMutex("k"), c.NewMutex("k")
		require.NoError(t, mh.Lock(ctx))
		aErr := lockAsync(ma)
		bErr := lockAsync(mb)
		require.Equal(t, []string{a.owner, b.owner}, waiters(st, "k"))
		require.True(t, holder(st, "k").Waiters[holdKeyOf(st, a.owner)].Sleep, "a's registration is marked asleep")

		require.NoError(t, mh.Unlock(ctx))
		freed := time.Now()
		select {
		case err := <-bErr:
			require.NoError(t, err)
		case <-time.After(DefaultTTL):
			t.Fatal("b waited a TTL for the sleeper ahead of it")
		}
		assert.LessOrEqual(t, time.Since(freed), fairPoll, "b waited for the sleeper")
		assert.Equal(t, []string{a.owner}, waiters(st, "k"), "a keeps its place")

		cErr := lockAsync(mc)
		require.Equal(t, []string{a.owner, c.owner}, waiters(st, "k"))
		sleep.Store(false) // a wakes on its next read
		marks := ha.count("mark")
		time.Sleep(DefaultTTL / 4)
		require.Equal(t, marks+1, ha.count("mark"), "a marked itself awake")
		require.NoError(t, mb.Unlock(ctx))
		require.NoError(t, <-aErr, "a, awake, takes the key before c")
		assert.Equal(t, []string{c.owner}, waiters(st, "k"))
		require.NoError(t, ma.Unlock(ctx))
		require.NoError(t, <-cErr)
		require.NoError(t, mc.Unlock(ctx))
	})
}

// holdKeyOf returns the hold key of owner's registration for key "k" in st.
func holdKeyOf(st *memStore, owner string) string {
	for hk, e := range holder(st, "k").Waiters {
		if e.Owner == owner {
			return hk
		}
	}
	return ""
}

// TestSecondInLineAfterAShortHold: a waiter second in line behind a long
// hold sleeps by what it last saw, an eighth of that hold's age, so it may
// take the key well after the short hold that follows ends, but never more
// than a quarter TTL after: the bound docs/fairness.md states (an eighth
// of how long the key had stood still when the waiter last read it, at
// most TTL/4), not an eighth of the hold that just ended.
func TestSecondInLineAfterAShortHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := newMemStore()
		h, _ := memClient(t, st)
		first, _ := memClient(t, st)
		second, _ := memClient(t, st)
		long := h.NewMutex("k")
		require.NoError(t, long.Lock(ctx))
		freed := make(chan time.Time, 1)
		var wg sync.WaitGroup
		wg.Go(func() {
			m := first.NewMutex("k")
			if assert.NoError(t, m.Lock(ctx)) {
				time.Sleep(10 * time.Millisecond)
				assert.NoError(t, m.Unlock(ctx))
				freed <- time.Now()
			}
		})
		time.Sleep(time.Second) // first, then second, in line
		var late time.Duration
		wg.Go(func() {
			m := second.NewMutex("k")
			if assert.NoError(t, m.Lock(ctx)) {
				late = time.Since(<-freed)
				assert.NoError(t, m.Unlock(ctx))
			}
		})
		time.Sleep(DefaultTTL)
		require.NoError(t, long.Unlock(ctx))
		wg.Wait()
		t.Logf("the second in line took the key %v after the 10 ms hold ended", late)
		assert.LessOrEqual(t, late, DefaultTTL/4, "later than a quarter TTL")
	})
}
