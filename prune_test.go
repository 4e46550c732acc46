package dlock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.opentelemetry.io/otel/codes"
)

// Prune deletes free, idle keys, never a held one, and a pruned
// key's next token is above every token it had (a Fence that saw the old
// ones admits it).
func TestPrune(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		c := sp.client(t)
		var last = map[string]Token{}
		for range 3 { // tokens 1..3 on each key
			for _, key := range []string{"a", "b", "c"} {
				m := c.NewMutex(key)
				require.NoError(t, m.Lock(ctx))
				last[key] = m.Lease().Token()
				require.NoError(t, m.Unlock(ctx))
			}
		}
		held := c.NewMutex("b")
		require.NoError(t, held.Lock(ctx))

		n, err := c.Prune(ctx, time.Hour)
		require.NoError(t, err)
		assert.Zero(t, n, "nothing has been idle for an hour")

		n, err = c.Prune(ctx, 0)
		require.NoError(t, err)
		assert.Equal(t, 2, n, "a and c are free; b is held")
		assert.Equal(t, held.Lease().Token(), sp.read(t, "b").Token, "b's document is still there")
		n, err = c.Prune(ctx, 0)
		require.NoError(t, err)
		assert.Zero(t, n, "a and c are gone, b is held")

		require.NoError(t, held.Unlock(ctx)) // no extension among the commands counted below

		var fence Fence
		require.NoError(t, fence.Check(last["c"]))
		for _, key := range []string{"a", "c"} {
			m := c.NewMutex(key)
			mark := sp.commands()
			require.NoError(t, m.Lock(ctx))
			assert.EqualValues(t, 2, sp.commands()-mark, "%s's first Lock after the prune: the acquire that creates the document, the floor read", key)
			assert.Greater(t, m.Lease().Token(), last["c"], "%s after the prune: above every token of the collection's pruned keys", key)
			assert.NoError(t, fence.Check(m.Lease().Token()), "a fence that saw the old tokens admits the new one")
			r, tok := sp.read(t, key), m.Lease().Token()
			assert.True(t, r.Raw, "the base is left to the hold's first write")
			assert.Less(t, r.Token, tok, "the counter counts from 0 while raw")
			mark = sp.commands()
			require.NoError(t, m.Unlock(ctx))
			assert.EqualValues(t, 1, sp.commands()-mark, "its Unlock, which writes the base")
			r = sp.read(t, key)
			assert.False(t, r.Raw, "the Unlock wrote the base")
			assert.Equal(t, tok, r.Token, "the counter is the hold's token")
		}

		_, err = c.Prune(ctx, -time.Second)
		assert.ErrorIs(t, err, ErrInvalidOption)
	})
}

// Pruners and lockers at once, on the real server. Per key, the
// tokens handed out strictly increase across every prune, and no two
// holders overlap.
func TestPruneWhileLocking(t *testing.T) {
	coll := newColl(t)
	ctx := context.Background()
	const (
		lockers = 4
		pruners = 2
		cycles  = 40
	)
	keys := []string{"x", "y", "z"}
	var (
		mu      sync.Mutex
		last    = map[string]Token{}
		inUse   = map[string]*atomic.Int32{}
		failure string
	)
	for _, k := range keys {
		inUse[k] = new(atomic.Int32)
	}
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if failure == "" {
			failure = fmt.Sprintf(format, args...)
		}
	}
	var lockWG, pruneWG sync.WaitGroup
	stop := make(chan struct{})
	var pruned atomic.Int64
	for range pruners {
		c := newClient(t, coll)
		pruneWG.Add(1)
		go func() {
			defer pruneWG.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				n, err := c.Prune(ctx, 0)
				if err != nil {
					fail("Prune: %v", err)
					return
				}
				pruned.Add(int64(n))
			}
		}()
	}
	for i := range lockers {
		c := newClient(t, coll, WithBackoff(time.Millisecond, 10*time.Millisecond))
		r := rand.New(rand.NewPCG(uint64(i), 17))
		lockWG.Add(1)
		go func() {
			defer lockWG.Done()
			for range cycles {
				key := keys[r.IntN(len(keys))]
				m := c.NewMutex(key)
				if err := m.Lock(ctx); err != nil {
					fail("Lock: %v", err)
					return
				}
				if inUse[key].Add(1) != 1 {
					fail("two holders of %s", key)
				}
				tok := m.Lease().Token()
				mu.Lock()
				if tok <= last[key] {
					if failure == "" {
						failure = fmt.Sprintf("%s: token %d after token %d", key, tok, last[key])
					}
				}
				last[key] = max(last[key], tok)
				mu.Unlock()
				inUse[key].Add(-1)
				if err := m.Unlock(ctx); err != nil {
					fail("Unlock: %v", err)
					return
				}
			}
		}()
	}
	lockWG.Wait()
	close(stop)
	pruneWG.Wait()
	require.Empty(t, failure)
	t.Logf("%d acquisitions, %d documents pruned meanwhile; last tokens %v", lockers*cycles, pruned.Load(), last)
	assert.Positive(t, pruned.Load(), "the pruners deleted documents while the lockers ran (else this shows nothing)")
}

// WithPruneIdle prunes in the background, at most once a period,
// and Close stops it (synctest fails the test if its goroutine outlives the
// bubble).
func TestPruneInBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ctx := context.Background()
		c, h := memClient(t, st, WithPruneIdle(time.Minute))
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(ctx))
		require.NoError(t, m.Unlock(ctx))

		time.Sleep(90 * time.Second) // one scan (at 54 to 60 s): k was written less than a minute before
		synctest.Wait()
		assert.Equal(t, 1, h.count("idle"), "scans in the first period")
		assert.NotZero(t, holder(st, "k").Rev, "k not idle for a minute yet")

		time.Sleep(60 * time.Second) // the second scan prunes k
		synctest.Wait()
		assert.Equal(t, 2, h.count("idle"), "one scan a period")
		assert.Zero(t, holder(st, "k").Rev, "k pruned")
		require.NoError(t, c.Close(ctx))
	})

	_, err := newClientOn(func(*telemetry) store { return newMemStore() }, WithPruneIdle(-time.Second))
	assert.ErrorIs(t, err, ErrInvalidOption)
	c, err := newClientOn(func(*telemetry) store { return newMemStore() }, WithTTL(time.Second), WithPruneIdle(time.Second))
	require.NoError(t, err)
	require.NoError(t, c.Close(context.Background()))
	m := (&Client{cfg: defaultConfig()}).NewMutex("k", WithPruneIdle(time.Minute))
	assert.ErrorIs(t, m.err, ErrInvalidOption, "WithPruneIdle applies to a Client")
}

// A creator that stops between its acquire and its floor read leaves a
// raw document; whoever takes it over counts its token from the floor
// itself, and the creator's late reply cannot touch the new hold.
func TestRawDocumentTakenOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		ctx := context.Background()
		st.floorTok = 41 // as if keys with tokens up to 41 had been pruned

		c1, h1 := memClient(t, st, WithTTL(time.Second))
		stuck := make(chan struct{})
		h1.on("floor", func(ctx context.Context, call func() error) error {
			<-stuck // the creator pauses after creating the document
			return call()
		})
		m1 := c1.NewMutex("k")
		got1 := make(chan error, 1)
		go func() { got1 <- m1.Lock(ctx) }()
		synctest.Wait()
		require.True(t, holder(st, "k").Raw, "created, not raised")

		c2, _ := memClient(t, st, WithTTL(time.Second))
		m2 := c2.NewMutex("k")
		require.NoError(t, m2.Lock(ctx), "taken over after a TTL")
		t2 := m2.Lease().Token()
		assert.Greater(t, t2, Token(41), "the taker counts its token from the floor")
		before := holder(st, "k")

		close(stuck) // the creator wakes: its reply is too late to rely on, and it waits
		synctest.Wait()
		assert.Equal(t, before, holder(st, "k"), "the creator's late floor read changed nothing")
		require.NoError(t, m2.Unlock(ctx))
		assert.Equal(t, t2, holder(st, "k").Token, "the taker's Unlock wrote its base")
		assert.False(t, holder(st, "k").Raw)
		require.NoError(t, <-got1)
		assert.Greater(t, m1.Lease().Token(), t2)
		require.NoError(t, m1.Unlock(ctx))
	})
}

// lateRemove holds each of Prune's deletes until release closes: a delete
// that reaches the server long after its scan.
type lateRemove struct {
	store
	sent chan struct{} // closed when the first delete is held
	free chan struct{} // closed to let the deletes through
	once sync.Once
}

func (s *lateRemove) remove(ctx context.Context, recs []idleRecord) (int, error) {
	s.once.Do(func() { close(s.sent) })
	<-s.free
	return s.store.remove(ctx, recs)
}

// latePruner returns a Client whose Prune scans now and deletes when the
// returned release is called, and the channel of that Prune's result.
func latePruner(t *testing.T, sp space) (release func() (int, error)) {
	t.Helper()
	late := &lateRemove{sent: make(chan struct{}), free: make(chan struct{})}
	p := sp.client(t, withStoreWrapper(func(s store) store { late.store = s; return late }))
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := p.Prune(context.Background(), 0)
		done <- result{n, err}
	}()
	<-late.sent
	return func() (int, error) {
		close(late.free)
		r := <-done
		return r.n, r.err
	}
}

// A Prune whose delete arrives after another Prune deleted the document
// and a Lock created it anew does not delete the new one: the new one's
// revision may be the same, its token is not. Otherwise the next Lock
// would get the new document's token again.
func TestPruneLateDeleteAfterRecreation(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		c := sp.client(t)
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(ctx))
		require.NoError(t, m.Unlock(ctx))
		old := sp.read(t, "k")

		release := latePruner(t, sp) // scanned k as old, its delete held
		n, err := c.Prune(ctx, 0)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.NoError(t, m.Lock(ctx))
		second := m.Lease().Token()
		require.NoError(t, m.Unlock(ctx))
		require.Equal(t, old.Rev, sp.read(t, "k").Rev, "the new document is at the old one's revision")

		n, err = release()
		require.NoError(t, err)
		assert.Zero(t, n, "the late delete matched the new document")
		require.NoError(t, m.Lock(ctx))
		assert.Greater(t, m.Lease().Token(), second, "a token repeated")
		require.NoError(t, m.Unlock(ctx))
	})
}

// A Prune whose delete arrives after a waiter registered on the document,
// or a reader took a shared hold of it, does not delete it: the waiter
// keeps its place and a writer does not hold beside the reader.
func TestPruneLateDeleteOfBusyDocument(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		c, other := sp.client(t), sp.client(t)
		m := c.NewMutex("k")
		require.NoError(t, m.Lock(ctx))
		require.NoError(t, m.Unlock(ctx))
		release := latePruner(t, sp)
		a := attempt{key: "k", owner: "waiter", hold: 1, ttl: time.Minute}
		_, err := c.store.register(ctx, a)
		require.NoError(t, err)
		n, err := release()
		require.NoError(t, err)
		assert.Zero(t, n)
		assert.Contains(t, sp.read(t, "k").Waiters, a.holdKey(), "the waiter lost its place")

		rw := c.NewRWMutex("rw")
		require.NoError(t, rw.Lock(ctx))
		require.NoError(t, rw.Unlock(ctx))
		release = latePruner(t, sp)
		require.NoError(t, rw.RLock(ctx))
		n, err = release()
		require.NoError(t, err)
		assert.Zero(t, n)
		assert.ErrorIs(t, other.NewRWMutex("rw").TryLock(ctx), ErrLocked, "a writer holds beside a reader")
		require.NoError(t, rw.RUnlock(ctx))
	})
}

// A collection whose floor a dlock kept at the numeric _id 0: the first
// floor read copies it to its string _id, and Prune, before it raises the
// floor, copies it too; tokens stay above the old floor either way.
func TestFloorMovedFromNumericID(t *testing.T) {
	ctx := context.Background()
	for _, first := range []string{"lock", "prune"} {
		t.Run(first, func(t *testing.T) {
			coll := newColl(t)
			_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: oldFloorID}, {Key: fFloor, Value: int64(41)}})
			require.NoError(t, err)
			c := newClient(t, coll)
			if first == "prune" { // a key of token 1 to prune: the floor must not become 1
				_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "idle"}, {Key: fOwner, Value: ""}, {Key: fToken, Value: int64(1)}, {Key: fRev, Value: int64(2)}, {Key: fAt, Value: time.Now().Add(-time.Hour)}})
				require.NoError(t, err)
				n, err := c.Prune(ctx, 0)
				require.NoError(t, err)
				require.Equal(t, 1, n)
			}
			m := c.NewMutex("idle")
			require.NoError(t, m.Lock(ctx))
			assert.Greater(t, m.Lease().Token(), Token(41))
			require.NoError(t, m.Unlock(ctx))
			var d struct {
				Floor int64 `bson:"floor"`
			}
			require.NoError(t, coll.FindOne(ctx, bson.D{{Key: "_id", Value: floorID}}).Decode(&d))
			assert.Equal(t, int64(41), d.Floor, "the floor at its string _id")
		})
	}
}

// A Semaphore's key pruned and re-created again and again: each new life
// counts from the floor, not from the counter the Semaphore last saw (its
// shared acquire sets that, plus one, in the record it creates), so the
// tokens grow by one a life, not by the old counter each time.
func TestSharedRecreationTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMemStore()
		a, _ := memClient(t, st)
		b, _ := memClient(t, st)
		ctx := context.Background()
		sa, sb := a.NewSemaphore("s", 2), b.NewSemaphore("s", 2)
		var last Token
		for i := range 40 {
			la, err := sa.Acquire(ctx)
			require.NoError(t, err)
			lb, err := sb.Acquire(ctx)
			require.NoError(t, err)
			require.Greater(t, lb.Token(), la.Token())
			require.Greater(t, la.Token(), last)
			last = lb.Token()
			require.NoError(t, la.Release(ctx))
			require.NoError(t, lb.Release(ctx))
			_, err = a.Prune(ctx, 0)
			require.NoError(t, err)
			require.LessOrEqual(t, last, Token(3*(i+1)), "life %d: the tokens grow by more than the holds", i)
		}
	})
}

// A write of a hold that lands after its key's document was pruned and
// created anew matches nothing in the new document, even a hold of the
// same Client whose raw counter shows the old hold's token: a hold is
// named by its owner and hold id, never by its token alone. Otherwise the
// late release would free the new hold and let another Client take the
// key while the new hold's lease is valid; a late requeue would leave a
// phantom registration, a late handoff would move the new hold, a late
// setData would replace an Election's value.
func TestLateWriteFromEarlierLife(t *testing.T) {
	type lateWrite func(ctx context.Context, s store, old leaseRef) error
	next := func(old leaseRef) attempt {
		return attempt{key: old.key, owner: old.owner, hold: old.hold + 100, ttl: old.ttl}
	}
	for name, write := range map[string]lateWrite{
		"release": func(ctx context.Context, s store, old leaseRef) error { return s.release(ctx, old) },
		"requeue": func(ctx context.Context, s store, old leaseRef) error {
			_, err := s.requeue(ctx, old, next(old))
			return err
		},
		"handoff": func(ctx context.Context, s store, old leaseRef) error {
			_, err := s.handoff(ctx, old, next(old))
			return err
		},
		"setData": func(ctx context.Context, s store, old leaseRef) error { return s.setData(ctx, old, []byte("late")) },
		"extend": func(ctx context.Context, s store, old leaseRef) error {
			ok, err := s.extend(ctx, []leaseRef{old})
			if err == nil && !ok[0] {
				err = errNotOwner
			}
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, sp space) {
				ctx := context.Background()
				c, other := sp.client(t), sp.client(t)
				m := c.NewMutex("k")
				require.NoError(t, m.Lock(ctx)) // a new deployment: floor 0, token 1
				m.Lease().settle(ctx)           // its base written: its writes are no longer raw
				old := m.Lease().ref()
				require.False(t, old.raw)
				require.NoError(t, m.Unlock(ctx))
				n, err := c.Prune(ctx, 0)
				require.NoError(t, err)
				require.Equal(t, 1, n)

				require.NoError(t, m.Lock(ctx)) // the key's next life: raw, its counter at 1 again
				before := sp.read(t, "k")
				require.True(t, before.Raw)
				require.Equal(t, old.token, before.Token, "the new counter shows the old hold's token")

				assert.ErrorIs(t, write(ctx, c.store, old), errNotOwner, "the late write matched the new hold")
				after := sp.read(t, "k")
				assert.Equal(t, describe(before), describe(after), "the late write changed the document")
				assert.ErrorIs(t, other.NewMutex("k").TryLock(ctx), ErrLocked)
				assert.NoError(t, m.Lease().Err())
				require.NoError(t, m.Unlock(ctx))
			})
		})
	}
}

// indexRequests returns the createIndexes commands sent for coll among the
// test client's recent commands.
func indexRequests(coll *mongo.Collection) []bson.Raw {
	commands.mu.Lock()
	defer commands.mu.Unlock()
	var out []bson.Raw
	for _, e := range commands.last {
		if name, _ := e.Command.Lookup(e.CommandName).StringValueOK(); e.CommandName == "createIndexes" && name == coll.Name() {
			out = append(out, e.Command)
		}
	}
	return out
}

// indexes returns coll's indexes by name, as listIndexes gives them.
func indexes(t *testing.T, coll *mongo.Collection) map[string]bson.Raw {
	t.Helper()
	cur, err := coll.Indexes().List(context.Background())
	require.NoError(t, err)
	var all []bson.Raw
	require.NoError(t, cur.All(context.Background(), &all))
	out := map[string]bson.Raw{}
	for _, ix := range all {
		out[ix.Lookup("name").StringValue()] = ix
	}
	return out
}

// partialIndexes reports whether the test server creates partial indexes
// (MongoDB and FerretDB v2 do, FerretDB v1 does not), asking it on a
// collection of its own.
func partialIndexes(t *testing.T) bool {
	t.Helper()
	_, err := newColl(t).Indexes().CreateOne(context.Background(), mongo.IndexModel{
		Keys: bson.D{{Key: "x", Value: 1}}, Options: options.Index().SetPartialFilterExpression(bson.D{{Key: "y", Value: ""}})})
	return err == nil
}

// The first Prune of a Client asks the server for the index of Prune's
// query, once: the free documents (owner "") by their last write. Where
// the server has partial indexes (MongoDB, FerretDB v2), the collection
// has it afterwards; FerretDB v1, the embedded test server, refuses it,
// and Prune goes on without it.
func TestPruneIndex(t *testing.T) {
	ctx := context.Background()
	coll := newColl(t)
	c := newClient(t, coll)
	m := c.NewMutex("k")
	require.NoError(t, m.Lock(ctx))
	require.NoError(t, m.Unlock(ctx))
	require.Empty(t, indexRequests(coll), "NewClient, Lock and Unlock create no index")

	n, err := c.Prune(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	reqs := indexRequests(coll)
	require.Len(t, reqs, 1, "the first Prune asks for the index")
	spec := reqs[0].Lookup("indexes").Array().Index(0).Document()
	assert.Equal(t, pruneIndexName, spec.Lookup("name").StringValue())
	assert.Equal(t, `{"at": {"$numberInt":"1"}}`, spec.Lookup("key").String())
	assert.Equal(t, `{"owner": ""}`, spec.Lookup("partialFilterExpression").String())

	require.NoError(t, m.Lock(ctx))
	require.NoError(t, m.Unlock(ctx))
	n, err = c.Prune(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Len(t, indexRequests(coll), 1, "a later Prune does not ask again")

	ix, ok := indexes(t, coll)[pruneIndexName]
	if !partialIndexes(t) {
		assert.False(t, ok, "the server refuses partial indexes, yet has %s", ix)
		t.Log("the server refuses partial indexes (FerretDB v1): Prune runs without its index")
		return
	}
	require.True(t, ok, "no index %s", pruneIndexName)
	assert.Equal(t, `{"at": {"$numberInt":"1"}}`, ix.Lookup("key").String())
	assert.Equal(t, `{"owner": ""}`, ix.Lookup("partialFilterExpression").String())
}

// A server's refusal of Prune's index does not fail Prune: here another
// index already has its name, which every server refuses to replace (and
// FerretDB v1 refuses any partial index). Prune deletes what it would
// with the index, records the refusal on its span, and the Client does
// not ask again.
func TestPruneIndexRefused(t *testing.T) {
	ctx := context.Background()
	coll := newColl(t)
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: bson.D{{Key: fOwner, Value: 1}}, Options: options.Index().SetName(pruneIndexName)})
	require.NoError(t, err)
	asked := len(indexRequests(coll)) // the test's own
	rig := newTelemetryRig()
	c := newClient(t, coll, rig.opts...)
	for _, key := range []string{"a", "b"} {
		m := c.NewMutex(key)
		require.NoError(t, m.Lock(ctx))
		require.NoError(t, m.Unlock(ctx))
	}

	n, err := c.Prune(ctx, 0)
	require.NoError(t, err, "the refusal is not Prune's failure")
	assert.Equal(t, 2, n)
	require.Len(t, indexRequests(coll), asked+1, "Prune asks for its index")
	spans := rig.ended("dlock.Prune")
	require.Len(t, spans, 1)
	assert.Equal(t, codes.Unset, spans[0].Status().Code, "Prune succeeded")
	var refusal []string
	for _, e := range spans[0].Events() {
		for _, kv := range e.Attributes {
			if kv.Key == "exception.message" {
				refusal = append(refusal, kv.Value.AsString())
			}
		}
	}
	require.Len(t, refusal, 1, "the refusal, on the span")
	assert.Contains(t, refusal[0], "dlock: prune without the index "+pruneIndexName)

	_, err = c.Prune(ctx, 0)
	require.NoError(t, err)
	assert.Len(t, indexRequests(coll), asked+1, "a refused index is not asked for again")
	assert.Equal(t, `{"owner": {"$numberInt":"1"}}`, indexes(t, coll)[pruneIndexName].Lookup("key").String(), "the other index stays")
}

// TestFloorRaise: the floor only rises, from no floor document, past a
// lower floor and not past a higher one; and its upsert's filter is never
// the floor's _id alone, which FerretDB v2 (DocumentDB 0.107) runs as an
// insert that replaces a floor created meanwhile, perhaps a higher one.
func TestFloorRaise(t *testing.T) {
	ctx := context.Background()
	s := newMongoStore(newColl(t), func(context.Context, int) {})
	for _, step := range []struct{ raise, want Token }{{5, 5}, {3, 5}, {5, 5}, {8, 8}} {
		require.NoError(t, s.maxFloor(ctx, step.raise))
		f, err := s.floor(ctx)
		require.NoError(t, err)
		assert.Equal(t, step.want, f, "after a raise to %d", step.raise)
	}
	filter, _ := floorRaise(9)
	assert.Greater(t, len(filter), 1, "the floor's upsert filtered on its _id alone: %v", filter)
}
