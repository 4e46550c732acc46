package dlock

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestMultiMutexSlowBulkWrites: a MultiMutex's Lock finishes when its
// bulk writes are slow against the TTL, on the test server, whose bulk
// writes of more than 64 statements are split in commands of 64. Each
// bulk acquire is held back before it is sent (a command monitor): by
// less than the TTL, so that each write is in time but all of them
// together are not (each write's holds are timed from its own send); and
// by more than the TTL, so that every bulk write is late (each halves the
// next, and single-key acquires, in time, take the rest). Timed from the
// first write's send, every hold of the first case was late, and the
// Lock gave every key back and started again, for ever.
func TestMultiMutexSlowBulkWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("about 18 s of slow writes")
	}
	for _, tc := range []struct {
		name       string
		ttl, delay time.Duration
		keys       int
		most       int // bulk acquires sent
	}{
		// Each write answered within about 2.5 s, under -race on a busy
		// machine; the three take 6 s and more.
		{"each write in time, not all", 6 * time.Second, 2 * time.Second, 130, 3}, // 64, 64, 2
		{"every write late", time.Second, 1200 * time.Millisecond, 20, 4},         // 20, 10, 5, 2
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bulks atomic.Int64
			coll := slowBulkColl(t, tc.delay, &bulks)
			c := newClient(t, coll, WithTTL(tc.ttl))
			names := make([]string, tc.keys)
			for i := range names {
				names[i] = fmt.Sprintf("k%03d", i)
			}
			m := c.NewMultiMutex(names)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			start := time.Now()
			require.NoError(t, m.Lock(ctx))
			t.Logf("%d keys locked in %v with %d bulk acquires", tc.keys, time.Since(start).Round(time.Millisecond), bulks.Load())
			assert.LessOrEqual(t, bulks.Load(), int64(tc.most))
			for _, k := range names {
				assert.Equal(t, c.owner, readRec(t, mongoKeys{coll}, k).Owner, "%q", k)
			}
			require.NoError(t, m.Unlock(ctx))
		})
	}
}

// slowBulkColl returns a new collection on the test server, through a
// driver client that holds back each bulk acquire (an update of several
// upserts) by delay before it sends it, counting them in bulks.
func slowBulkColl(t *testing.T, delay time.Duration, bulks *atomic.Int64) *mongo.Collection {
	started := func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName != "update" {
			return
		}
		ups, ok := e.Command.Lookup("updates").ArrayOK()
		if !ok {
			return
		}
		vals, _ := ups.Values()
		if len(vals) < 2 {
			return
		}
		first, _ := vals[0].DocumentOK()
		if up, _ := first.Lookup("upsert").BooleanOK(); up {
			bulks.Add(1)
			time.Sleep(delay) // in the sending goroutine, after the Client timed the send
		}
	}
	mc, err := mongo.Connect(options.Client().ApplyURI(testURI).SetMonitor(&event.CommandMonitor{Started: started}))
	require.NoError(t, err)
	t.Cleanup(func() { mc.Disconnect(context.Background()) })
	return mc.Database(testDB.Name()).Collection(newColl(t).Name())
}

// TestMultiTryLockGivesBackBeforeReturning: a TryLock whose bulk read
// fails (the write applied) gives back what the write took before it
// returns, with its own ctx, not in the background.
func TestMultiTryLockGivesBackBeforeReturning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		c, h := memClient(t, st)
		h.on("readAll", func(_ context.Context, call func() error) error {
			call()
			return errUnreachable
		})
		type mark struct{}
		var withCallers atomic.Bool
		h.on("releaseAll", func(ctx context.Context, call func() error) error {
			withCallers.Store(ctx.Value(mark{}) != nil)
			return call()
		})
		ctx := context.WithValue(context.Background(), mark{}, true)
		m := c.NewMultiMutex([]string{"a", "b", "c"})
		require.ErrorIs(t, m.TryLock(ctx), errUnreachable)
		assert.True(t, withCallers.Load(), "given back with the caller's ctx, before TryLock returned")
		assertFree(t, memKeys{st}, "a", "b", "c")
	})
}

// TestMultiLockGivesUpOnHoldsItCannotKeep: a Lock whose holds are lost
// while it waits for a later key (its Client's extensions never answered)
// starts again, and the third loss in a row ends it with the loss's
// error, long before its ctx ends.
func TestMultiLockGivesUpOnHoldsItCannotKeep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		a, h := memClient(t, st)
		b, _ := memClient(t, st)
		h.on("extend", hang)
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		require.NoError(t, b.NewMutex("y").Lock(ctx)) // held for good: a waits for it while holding x
		start := time.Now()
		err := a.NewMultiMutex([]string{"x", "y"}).Lock(ctx)
		require.ErrorIs(t, err, ErrLeaseLost)
		require.NoError(t, ctx.Err(), "the Lock ran until its ctx ended")
		t.Logf("%v after %v", err, time.Since(start))
		assert.Less(t, time.Since(start), maxKeyLosses*2*DefaultTTL)
		settled(t, a)
		assertFree(t, memKeys{st}, "x")
	})
}
