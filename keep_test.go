package dlock

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// keptBy sets up a hold that a's Unlock keeps (keep.go): a and b take
// turns, each Lock waiting for the other's hold, until a's Lock came at
// once after its Unlock before it, and waited (registered) for the key:
// that Unlock keeps the hold. It returns the token of the hold it ends
// (the kept hold's is the next). It calls before, if not nil, just before
// that Unlock. Call it inside a bubble.
func keptBy(t *testing.T, ma, mb *Mutex, before func()) Token {
	ctx := context.Background()
	waits := lockAsync
	require.NoError(t, mb.Lock(ctx))
	aErr := waits(ma)
	require.NoError(t, mb.Unlock(ctx))
	require.NoError(t, <-aErr)
	bErr := waits(mb)
	require.NoError(t, ma.Unlock(ctx)) // its Lock was not soon after an Unlock: released
	require.NoError(t, <-bErr)
	aErr = waits(ma) // soon after its Unlock
	require.NoError(t, mb.Unlock(ctx))
	require.NoError(t, <-aErr)
	tok := ma.Lease().Token()
	if before != nil {
		before()
	}
	require.NoError(t, ma.Unlock(ctx)) // kept
	return tok
}

// TestKeep: an Unlock under contention keeps a short hold for its
// Mutex's next Lock, which takes it with no command, under the spare
// token its acquire reserved; a kept hold no Lock takes within the
// requeue window is released; Close releases a kept hold.
func TestKeep(t *testing.T) {
	t.Run("the next Lock takes it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newMemStore()
			a, ha := memClient(t, st)
			b, _ := memClient(t, st)
			ma := a.NewMutex("k")
			tok := keptBy(t, ma, b.NewMutex("k"), nil)
			r := holder(st, "k")
			require.Equal(t, a.owner, r.Owner, "the Unlock kept the hold")
			require.Equal(t, tok+1, r.Token, "the hold's acquire reserved the next token")
			hs, err := a.Holders(context.Background(), "k")
			require.NoError(t, err)
			require.Len(t, hs, 1)
			assert.Equal(t, tok+1, hs[0].Token, "Holders shows the key's counter")
			assert.Nil(t, ma.Lease(), "the Mutex holds nothing after its Unlock")
			cmds := ha.total()
			require.NoError(t, ma.Lock(context.Background()))
			assert.Equal(t, cmds, ha.total(), "no command")
			assert.Equal(t, tok+1, ma.Lease().Token(), "a new token: the spare")
			assert.Equal(t, r.Rev, holder(st, "k").Rev, "the document is as the Unlock left it")
			time.Sleep(DefaultTTL / 2)
			synctest.Wait()
			require.NoError(t, ma.Lease().Err(), "the kept hold is extended")
			assert.Greater(t, holder(st, "k").Rev, r.Rev)
			require.NoError(t, ma.Unlock(context.Background()))
			assert.Equal(t, "", holder(st, "k").Owner, "the Unlock after a kept hold keeps nothing")
		})
	})
	t.Run("released after the window", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newMemStore()
			a, ha := memClient(t, st)
			b, _ := memClient(t, st)
			keptBy(t, a.NewMutex("k"), b.NewMutex("k"), nil)
			releases := ha.count("release")
			time.Sleep(requeueWindow(&a.cfg))
			synctest.Wait()
			assert.Equal(t, "", holder(st, "k").Owner, "the kept hold is still there after the window")
			assert.Equal(t, releases+1, ha.count("release"))
		})
	})
	t.Run("a waiter gets it after the window", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newMemStore()
			a, _ := memClient(t, st)
			b, _ := memClient(t, st)
			ma, mb := a.NewMutex("k"), b.NewMutex("k")
			ctx := context.Background()
			bErr := make(chan error, 1)
			keptBy(t, ma, mb, func() {
				go func() { bErr <- mb.Lock(ctx) }()
				synctest.Wait() // b waits, registered
			})
			unlocked := time.Now() // a kept its hold, and does not lock again
			require.Equal(t, a.owner, holder(st, "k").Owner)
			require.NoError(t, <-bErr)
			assert.Less(t, time.Since(unlocked), requeueWindow(&a.cfg)+fairPoll, "b waited for a hold no one used")
			require.NoError(t, mb.Unlock(ctx))
		})
	})
	t.Run("another Mutex takes it by a write, with its data", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newMemStore()
			a, ha := memClient(t, st)
			b, _ := memClient(t, st)
			ctx := context.Background()
			tok := keptBy(t, a.NewMutex("k", WithData([]byte("A"))), b.NewMutex("k"), nil)
			require.Equal(t, "A", string(holder(st, "k").Data), "the kept hold")
			mc := a.NewMutex("k", WithData([]byte("C")))
			cmds := ha.total()
			require.NoError(t, mc.Lock(ctx))
			assert.Equal(t, cmds+1, ha.total(), "one command: the handoff")
			assert.Equal(t, "C", string(holder(st, "k").Data), "the document shows the other Mutex's data")
			assert.Equal(t, "C", string(mc.Lease().Data()))
			assert.Greater(t, mc.Lease().Token(), tok+1, "a new token, above the kept hold's spare")
			hs, err := b.Holders(ctx, "k")
			require.NoError(t, err)
			require.Len(t, hs, 1)
			assert.Equal(t, "C", string(hs[0].Data))
			require.NoError(t, mc.Unlock(ctx))
		})
	})
	t.Run("another Mutex queues behind other Clients' waiters", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newMemStore()
			a, _ := memClient(t, st)
			b, _ := memClient(t, st)
			ctx := context.Background()
			mb := b.NewMutex("k")
			bErr := make(chan error, 1)
			keptBy(t, a.NewMutex("k"), mb, func() {
				go func() { bErr <- mb.Lock(ctx) }()
				synctest.Wait() // b waits, registered
			})
			mc := a.NewMutex("k", WithData([]byte("C")))
			cErr := make(chan error, 1)
			go func() { cErr <- mc.Lock(ctx) }()
			select {
			case err := <-bErr:
				require.NoError(t, err, "b, queued first, gets the key")
			case <-cErr:
				require.FailNow(t, "the other Mutex took the kept hold past b, queued first")
			}
			synctest.Wait()
			assert.Equal(t, b.owner, holder(st, "k").Owner)
			require.NoError(t, mb.Unlock(ctx))
			require.NoError(t, <-cErr)
			assert.Equal(t, "C", string(holder(st, "k").Data))
			require.NoError(t, mc.Unlock(ctx))
		})
	})
	t.Run("Close releases it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newMemStore()
			a, _ := memClient(t, st)
			b, _ := memClient(t, st)
			keptBy(t, a.NewMutex("k"), b.NewMutex("k"), nil)
			require.NoError(t, a.Close(context.Background()))
			assert.Equal(t, "", holder(st, "k").Owner, "Close left the kept hold")
		})
	})
}

// TestKeepTurns: Clients that take turns at a key with short holds take
// two turns in a row, never more, once they keep their holds.
func TestKeepTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		const n = 3
		var ms []*Mutex
		for range n {
			c, _ := memClient(t, slowStore{st, time.Millisecond})
			ms = append(ms, c.NewMutex("k"))
		}
		order := ringRounds(t, ms, 40, time.Millisecond)
		run, longest := 1, 1
		for i := 1; i < len(order); i++ {
			if order[i] == order[i-1] {
				run++
			} else {
				run = 1
			}
			longest = max(longest, run)
		}
		kept := 0 // a turn of the Client that had the turn before
		for i := 1; i < len(order); i++ {
			if order[i] == order[i-1] {
				kept++
			}
		}
		t.Logf("%d acquisitions, %d of them kept holds; longest run of one Client %d", len(order), kept, longest)
		assert.Greater(t, kept, len(order)/4, "too few kept holds")
		assert.LessOrEqual(t, longest, 2, "a Client took more than two turns in a row: %v", order)
	})
}

// TestKeepOnEachBackend: the keep on the test server as in memory. Client
// x's Lock waits for y's hold twice, the second time soon after its own
// Unlock, so its acquire reserves a spare token; the Unlock of that hold
// keeps it (the document still names x), and x's next Lock takes it with
// no command, under the spare token, one above the hold's, as the key's
// counter shows. Tokens increase throughout. A long minimum backoff makes
// every hold here short (keep.go), and is the requeue window.
func TestKeepOnEachBackend(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		opts := []Option{WithBackoff(time.Second, 2*time.Second)}
		mx, my := sp.client(t, opts...).NewMutex("k"), sp.client(t, opts...).NewMutex("k")
		var seen []Token
		note := func(m *Mutex) { seen = append(seen, m.Lease().Token()) }
		waits := func(m *Mutex) chan error { // m's Lock, once it is registered behind the holder
			errc := make(chan error, 1)
			before := len(sp.read(t, "k").Waiters)
			go func() { errc <- m.Lock(ctx) }()
			require.Eventually(t, func() bool { return len(sp.read(t, "k").Waiters) > before }, 10*time.Second, time.Millisecond)
			return errc
		}
		require.NoError(t, my.Lock(ctx))
		note(my)
		xLocked := waits(mx)
		require.NoError(t, my.Unlock(ctx))
		require.NoError(t, <-xLocked)
		note(mx)
		yLocked := waits(my)
		require.NoError(t, mx.Unlock(ctx))
		require.NoError(t, <-yLocked)
		note(my)
		xLocked = waits(mx) // soon after x's Unlock
		require.NoError(t, my.Unlock(ctx))
		require.NoError(t, <-xLocked)
		note(mx)
		tok := mx.Lease().Token()
		require.Equal(t, tok+1, sp.read(t, "k").Token, "the acquire reserved a spare")
		require.NoError(t, mx.Unlock(ctx))
		r := sp.read(t, "k")
		require.Equal(t, mx.c.owner, r.Owner, "the Unlock kept the hold")
		cmds := sp.commands()
		require.NoError(t, mx.Lock(ctx))
		assert.Equal(t, cmds, sp.commands(), "the kept hold taken with no command")
		note(mx)
		assert.Equal(t, tok+1, mx.Lease().Token())
		require.NoError(t, mx.Lease().Err())
		yLocked = waits(my)
		require.NoError(t, mx.Unlock(ctx)) // after a kept hold: frees the key for y
		require.NoError(t, <-yLocked)
		note(my)
		require.NoError(t, my.Unlock(ctx))
		for i := 1; i < len(seen); i++ {
			assert.Greater(t, seen[i], seen[i-1], "tokens %v", seen)
		}
	})
}

// A raiseSlowStore is a slowStore whose floor read takes longer than its
// other commands.
type raiseSlowStore struct {
	slowStore
	slow time.Duration
}

func (s raiseSlowStore) floor(ctx context.Context) (Token, error) {
	time.Sleep(s.slow)
	return s.slowStore.floor(ctx)
}

// TestKeepRoundTripWithoutRaise: the round trip a Mutex tracks, by which
// it judges a hold short enough to keep (keep.go), is its acquire's
// alone, not the floor read that follows a key's first acquire.
// Counted with them, a first acquire slowed by a Client's start made a
// 300 ms hold look short on the test server (32 round trips of 10 ms),
// and the next acquire reserved a spare token it did not use.
func TestKeepRoundTripWithoutRaise(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := memClient(t, raiseSlowStore{slowStore{newMemStore(), time.Millisecond}, 10 * time.Millisecond})
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(context.Background()))
		m.pace.mu.Lock()
		rtt := m.pace.rtt
		m.pace.mu.Unlock()
		assert.Equal(t, time.Millisecond, rtt)
		require.NoError(t, m.Unlock(context.Background()))
	})
}

// TestCloseWithEndedContextFreesLeftovers: the usual shutdown under
// contention (Unlock, then Close with a context that ended, as after a
// signal) frees what the last Unlock left for a next Lock that will not
// come: the hold it kept, or the registration it requeued. Close sends
// them in its one detached release; the background clean-up that would
// free them otherwise is cancelled at once, and another Client would wait
// a TTL. Without that, the kept hold stays every time; the registration
// only when its disposer ends it before Close does (2 runs in 30).
func TestCloseWithEndedContextFreesLeftovers(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	t.Run("a kept hold", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newMemStore()
			a, ha := memClient(t, st)
			b, _ := memClient(t, st)
			keptBy(t, a.NewMutex("k"), b.NewMutex("k"), nil)
			require.Equal(t, a.owner, holder(st, "k").Owner, "kept")
			ha.on("release", asDriver)
			a.Close(ended)
			assert.Equal(t, "", holder(st, "k").Owner, "Close left the kept hold")
		})
	})
	t.Run("a requeued registration", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := newMemStore()
			sc := requeueScene(t, st)
			time.Sleep(10 * time.Millisecond) // work: a hold too long to keep
			require.NoError(t, sc.ma.Unlock(context.Background()))
			require.NoError(t, <-sc.bErr)
			require.Equal(t, []string{sc.a.owner}, waiters(st, "k"), "a requeued")
			sc.ha.on("release", asDriver)
			sc.a.Close(ended)
			assert.Empty(t, waiters(st, "k"), "Close left the requeued registration")
			require.NoError(t, sc.mb.Unlock(context.Background()))
		})
	})
}

// asDriver takes a millisecond to reach the store, fails a command whose
// ctx ended before then, as the driver does, and applies it otherwise.
func asDriver(ctx context.Context, call func() error) error {
	time.Sleep(time.Millisecond)
	if err := ctx.Err(); err != nil {
		return err
	}
	return call()
}
