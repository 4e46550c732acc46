package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The examples run against the server at MONGODB_URI (the tests set it to
// the embedded server they start when it is not set).

// exampleCollection connects to MONGODB_URI with a mongo.Client of its own
// and returns a new, empty collection, so that each example starts from
// token 1; and a func that disconnects. In production one collection holds
// all the locks and is never dropped: its documents are what keep fencing
// tokens from going back.
func exampleCollection(name string) (*mongo.Collection, func()) {
	client, err := mongo.Connect(options.Client().ApplyURI(os.Getenv("MONGODB_URI")))
	if err != nil {
		log.Fatal(err)
	}
	coll := client.Database("dlock_examples").Collection(fmt.Sprintf("%s_%d", name, time.Now().UnixNano()))
	return coll, func() { client.Disconnect(context.Background()) }
}

func ExampleNewClient() {
	ctx := context.Background()
	mc, err := mongo.Connect(options.Client().ApplyURI(os.Getenv("MONGODB_URI")))
	if err != nil {
		log.Fatal(err)
	}
	defer mc.Disconnect(ctx)
	// One collection for all the locks of an application ("locks", say);
	// here a new one, so that the token below is 1.
	coll := mc.Database("dlock_examples").Collection(fmt.Sprintf("locks_%d", time.Now().UnixNano()))

	// One Client per process: no round trip, one goroutine that extends
	// every lease it holds.
	client, err := dlock.NewClient(coll, dlock.WithTTL(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx) // releases what it still holds, stops the goroutine

	mu := client.NewMutex("nightly-report")
	if err := mu.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("token", mu.Lease().Token())
	if err := mu.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: token 1
}

func ExampleClient_Close() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("close")
	defer disconnect()
	a, err := dlock.NewClient(coll)
	if err != nil {
		log.Fatal(err)
	}
	mu := a.NewMutex("job")
	if err := mu.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	lease := mu.Lease()

	// Close ends every lease of the Client and frees their keys.
	if err := a.Close(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(lease.Err())
	fmt.Println(errors.Is(mu.Lock(ctx), dlock.ErrClosed))

	// Another Client takes the key at once, with the next token.
	b, err := dlock.NewClient(coll)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close(ctx)
	other := b.NewMutex("job")
	if err := other.TryLock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("token", other.Lease().Token())
	// Output:
	// dlock: lease released
	// true
	// token 2
}

func ExampleMutex() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("mutex")
	defer disconnect()
	client, err := dlock.NewClient(coll)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	mu := client.NewMutex("nightly-report")
	if err := mu.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	lease := mu.Lease()
	fmt.Println("holding", lease.Key(), "with token", lease.Token())
	// Run the protected work under lease.Context() (see the Lease.Context
	// example): it is cancelled if the lease is lost.
	if err := mu.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("released:", lease.Err())
	// Output:
	// holding nightly-report with token 1
	// released: dlock: lease released
}

func ExampleMutex_TryLock() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("trylock")
	defer disconnect()
	a, err := dlock.NewClient(coll)
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close(ctx)
	b, err := dlock.NewClient(coll)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close(ctx)

	if err := a.NewMutex("job").TryLock(ctx); err != nil {
		log.Fatal(err)
	}
	err = b.NewMutex("job").TryLock(ctx)
	fmt.Println(errors.Is(err, dlock.ErrLocked))
	// Output: true
}

func ExampleMutex_Locker() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("locker")
	defer disconnect()
	client, err := dlock.NewClient(coll)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	mu := client.NewMutex("nightly-report")
	// Code written against sync.Locker takes the distributed lock: its Lock
	// blocks until the Mutex holds the key, and panics only on misuse (see
	// Mutex.Locker); its Unlock releases it.
	withLock := func(l sync.Locker, work func()) {
		l.Lock()
		defer l.Unlock()
		work()
	}
	withLock(mu.Locker(), func() {
		fmt.Println("working with token", mu.Lease().Token())
	})
	fmt.Println("held after:", mu.Lease() != nil)
	// Output:
	// working with token 1
	// held after: false
}

func ExampleLease_Context() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("context")
	defer disconnect()
	data := coll.Database().Collection(coll.Name() + "_data")
	if _, err := data.InsertOne(ctx, bson.D{{Key: "_id", Value: "report"}}); err != nil {
		log.Fatal(err)
	}
	client, err := dlock.NewClient(coll)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	mu := client.NewMutex("nightly-report")
	if err := mu.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	lease := mu.Lease()
	// The work runs under the lease's context, which is cancelled if the
	// lease is lost, and writes with its token, which the storage checks
	// in case this process was paused past the lease.
	work := lease.Context()
	_, err = dlock.UpdateFenced(work, data, bson.D{{Key: "_id", Value: "report"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: "done"}}}}, lease.Token())
	fmt.Println("write:", err)
	if err := mu.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// The context ends with the lease, and says why.
	fmt.Println("work context:", context.Cause(work))
	// Output:
	// write: <nil>
	// work context: dlock: lease released
}

func ExampleLease_Lost() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("lost")
	defer disconnect()
	client, err := dlock.NewClient(coll, dlock.WithTTL(300*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)
	mu := client.NewMutex("leader")
	if err := mu.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	lease := mu.Lease()

	// Cut the Client off from the server: from now on its extensions fail.
	coll.Database().Client().Disconnect(ctx)

	select {
	case <-lease.Lost(): // at the lease's local deadline, just under the TTL
		fmt.Println("lost:", errors.Is(lease.Err(), dlock.ErrLeaseLost))
	case <-time.After(10 * time.Second):
		fmt.Println("still held")
	}
	fmt.Println("unlock:", errors.Is(mu.Unlock(ctx), dlock.ErrLeaseLost))
	// Output:
	// lost: true
	// unlock: true
}

func ExampleFence() {
	var f dlock.Fence
	fmt.Println(f.Check(7))
	fmt.Println(f.Check(9))
	fmt.Println(f.Check(7)) // a holder that was overtaken
	// Output:
	// <nil>
	// <nil>
	// dlock: stale fencing token 7 (highest admitted 9)
}

func ExampleUpdateFenced() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("fenced")
	defer disconnect()
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "balance"}, {Key: "v", Value: 100}}); err != nil {
		log.Fatal(err)
	}
	id := bson.D{{Key: "_id", Value: "balance"}}
	set := func(v int) bson.D { return bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: v}}}} }

	_, err := dlock.UpdateFenced(ctx, coll, id, set(150), 8) // the current holder
	fmt.Println(err)
	_, err = dlock.UpdateFenced(ctx, coll, id, set(90), 5) // an old holder, late
	fmt.Println(err)
	// Output:
	// <nil>
	// dlock: stale fencing token 5 (highest admitted 8)
}

// Per-entity keys pile up; Prune deletes the idle ones without letting a
// key's tokens go back.
func ExampleClient_Prune() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("prune")
	defer disconnect()
	client, err := dlock.NewClient(coll) // or dlock.WithPruneIdle(24*time.Hour), to prune in the background
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	order := client.NewMutex("order-1017")
	for range 3 {
		if err := order.Lock(ctx); err != nil {
			log.Fatal(err)
		}
		fmt.Println("token", order.Lease().Token())
		if err := order.Unlock(ctx); err != nil {
			log.Fatal(err)
		}
	}

	n, err := client.Prune(ctx, 0) // in production: keys idle for a day, say
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pruned", n)

	if err := order.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("token after the prune", order.Lease().Token())
	order.Unlock(ctx)
	// Output:
	// token 1
	// token 2
	// token 3
	// pruned 1
	// token after the prune 4
}

// Readers share a key, a writer has it alone, and the writer's token is
// above every reader's before it.
func ExampleRWMutex() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("rwmutex")
	defer disconnect()
	client, err := dlock.NewClient(coll)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	catalog := client.NewRWMutex("catalog")
	if err := catalog.RLock(ctx); err != nil {
		log.Fatal(err)
	}
	other, err := dlock.NewClient(coll) // another process, say
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close(ctx)
	if err := other.NewRWMutex("catalog").TryRLock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("two readers; a writer now:", errors.Is(other.NewRWMutex("catalog").TryLock(ctx), dlock.ErrLocked))
	holders, err := client.Holders(ctx, "catalog")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holders:", len(holders), "shared:", holders[0].Shared && holders[1].Shared)

	catalog.RUnlock(ctx)
	other.NewRWMutex("catalog").RUnlock(ctx) // any RWMutex of that Client for the key
	if err := catalog.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("writer's token:", catalog.Lease().Token())
	catalog.Unlock(ctx)
	// Output:
	// two readers; a writer now: true
	// holders: 2 shared: true
	// writer's token: 3
}

// At most n holders at once, across Clients; each permit is a Lease.
func ExampleSemaphore() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("semaphore")
	defer disconnect()
	client, err := dlock.NewClient(coll)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	encoders := client.NewSemaphore("encoder", 2, dlock.WithData([]byte("host-a")))
	a, err := encoders.Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	b, err := encoders.Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	_, err = encoders.TryAcquire(ctx)
	fmt.Println("a third:", errors.Is(err, dlock.ErrLocked))
	holders, err := client.Holders(ctx, "encoder")
	if err != nil {
		log.Fatal(err)
	}
	for _, h := range holders {
		fmt.Printf("permit %d held by %s\n", h.Token, h.Data)
	}
	a.Release(ctx)
	c, err := encoders.TryAcquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("after a release, permit", c.Token())
	b.Release(ctx)
	c.Release(ctx)
	// Output:
	// a third: true
	// permit 1 held by host-a
	// permit 2 held by host-a
	// after a release, permit 3
}
