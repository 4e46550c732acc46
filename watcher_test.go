package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWatcherSharesReads: a Client whose goroutines wait on keys held by
// another reads them together, one find a round, from the first seconds
// of the holds, and each wait takes its key once it is freed. Without the
// watcher the same waits poll each on its own, which shows the check has
// teeth. (BenchmarkManyKeys measures the same at scale.)
func TestWatcherSharesReads(t *testing.T) {
	const keys = 20
	for _, tc := range []struct {
		name   string
		opts   []Option
		shares bool
	}{
		{"watcher", nil, true},
		{"no watcher", []Option{withPacer(withoutRule{ruleWatch})}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h, release := waitOnHeldKeys(t, keys, tc.opts...)
				defer release()
				time.Sleep(2 * time.Second)
				acquires, reads, rounds := h.count("acquire"), h.count("read"), h.count("readMany")
				time.Sleep(10 * time.Second)
				acquires, reads, rounds = h.count("acquire")-acquires, h.count("read")-reads, h.count("readMany")-rounds
				t.Logf("from 2 s to 12 s into the holds: %d acquires, %d reads, %d rounds", acquires, reads, rounds)
				if tc.shares {
					assert.Zero(t, acquires+reads, "a wait polled alone")
					assert.LessOrEqual(t, rounds, 30, "more rounds than the waits' own pace")
				} else {
					assert.Greater(t, acquires+reads, keys*5, "the waits polled less than the age rule says, alone")
				}
			})
		})
	}
}

// TestStaleViewLeavesTheQueue: a view from before the wait's registration
// was numbered (one that shows its hold key under an older number, or a
// queue counter below its number) leaves the wait's place in the queue as
// it last saw it: read as news, it would count too few waiters ahead, and
// a Semaphore's waiter would take a permit owed to one of them (the
// simulation found that with stale rounds).
func TestStaleViewLeavesTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, _ := memClient(t, st)
		m := c.NewMutex("k")
		cl := m.claim()
		a := cl.attempt
		a.owner, a.hold = c.owner, 7
		other := func(hold int64) string { return holdKey("other", hold) }
		fresh := record{Rev: 3, Owner: "holder", Queue: 9, Waiters: map[string]entry{
			other(1): {Owner: "other", Hold: 1, Q: 5}, other(2): {Owner: "other", Hold: 2, Q: 8},
			a.holdKey(): {Owner: a.owner, Hold: a.hold, Q: 9},
		}}
		a.queue = 8 // registered with number 9
		q := queueing{reg: c.registration(cl.cfg.registrations(), a, time.Now())}
		var ew entryWatch
		require.NoError(t, c.view(cl, a, fresh, &ew, &q))
		require.Len(t, q.ahead, 2, "the fresh view's waiters ahead")

		for name, stale := range map[string]record{
			"its old number": {Rev: 2, Owner: "holder", Queue: 9, Waiters: map[string]entry{
				other(1): {Owner: "other", Hold: 1, Q: 5}, a.holdKey(): {Owner: a.owner, Hold: a.hold, Q: 6}, other(2): {Owner: "other", Hold: 2, Q: 8},
			}},
			"before it registered": {Rev: 2, Owner: "holder", Queue: 5, Waiters: map[string]entry{
				other(1): {Owner: "other", Hold: 1, Q: 5},
			}},
		} {
			require.NoError(t, c.view(cl, a, stale, &ew, &q), name)
			assert.Len(t, q.ahead, 2, "%s: a stale view changed the waiters ahead", name)
			assert.True(t, q.registered(), "%s: a stale view ended the registration", name)
		}
	})
}

// TestWatcherRetriesAFailedRound: while the server fails every round of a
// Client waiting on many keys, the waits retry the round as a round, after
// a backoff, rather than each sending its own command at once: with a
// thousand waits and a server in trouble, that was a burst of a thousand
// commands into it at every failed round. Each wait still polls alone once
// its own bounds say it must (pollFor's limit and watches).
func TestWatcherRetriesAFailedRound(t *testing.T) {
	const keys = 20
	synctest.Test(t, func(t *testing.T) {
		h, release := waitOnHeldKeys(t, keys)
		defer release()
		time.Sleep(2 * time.Second)
		h.on("readMany", func(context.Context, func() error) error { return errors.New("down") })
		singles, rounds := h.count("acquire")+h.count("read"), h.count("readMany")
		time.Sleep(2 * time.Second)
		singles, rounds = h.count("acquire")+h.count("read")-singles, h.count("readMany")-rounds
		t.Logf("in 2 s of failed rounds: %d rounds, %d commands of single waits", rounds, singles)
		assert.Less(t, singles, keys, "the waits of failed rounds polled alone")
		assert.Less(t, rounds, 2*int(time.Second/DefaultMinBackoff), "rounds retried faster than the backoff")
		h.on("readMany", nil)
	})
}

// waitOnHeldKeys has one Client hold keys keys and another, made with
// opts, wait on each of them in a goroutine of its own, in a synctest
// bubble. It returns the waiting Client's store hooks, and release, which
// frees the keys and waits for each wait to take its key and free it.
func waitOnHeldKeys(t *testing.T, keys int, opts ...Option) (h *hooked, release func()) {
	ctx := context.Background()
	st := newMemStore()
	holder, _ := memClient(t, st)
	waiter, h := memClient(t, st, opts...)
	holds := make([]*Mutex, keys)
	for i := range holds {
		holds[i] = holder.NewMutex(fmt.Sprint("key-", i))
		require.NoError(t, holds[i].Lock(ctx))
	}
	var wg sync.WaitGroup
	for i := range holds {
		wg.Go(func() {
			m := waiter.NewMutex(fmt.Sprint("key-", i))
			if assert.NoError(t, m.Lock(ctx)) {
				assert.NoError(t, m.Unlock(ctx))
			}
		})
	}
	return h, func() {
		for _, m := range holds {
			require.NoError(t, m.Unlock(ctx))
		}
		wg.Wait()
	}
}
