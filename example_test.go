package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/dlock-go/dlock"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// exampleCollection connects to the test server (MONGODB_URI, or the one the
// tests started) and returns a fresh collection, and a func that disconnects.
func exampleCollection(name string) (*mongo.Collection, func()) {
	client, err := mongo.Connect(options.Client().ApplyURI(os.Getenv("DLOCK_EXAMPLE_URI")))
	if err != nil {
		log.Fatal(err)
	}
	coll := client.Database("dlock_examples").Collection(name)
	coll.Drop(context.Background())
	return coll, func() { client.Disconnect(context.Background()) }
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
	// Run the protected work under lease.Context(): it is cancelled if the
	// lease is lost.
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
	a, _ := dlock.NewClient(coll)
	defer a.Close(ctx)
	b, _ := dlock.NewClient(coll)
	defer b.Close(ctx)

	if err := a.NewMutex("job").TryLock(ctx); err != nil {
		log.Fatal(err)
	}
	err := b.NewMutex("job").TryLock(ctx)
	fmt.Println(errors.Is(err, dlock.ErrLocked))
	// Output: true
}

func ExampleLease_Lost() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("lost")
	defer disconnect()
	client, _ := dlock.NewClient(coll)
	defer client.Close(ctx)
	mu := client.NewMutex("leader")
	if err := mu.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	lease := mu.Lease()
	work := make(chan struct{})
	close(work) // stands for the leader's work finishing
	select {
	case <-lease.Lost():
		fmt.Println("lost the lease:", lease.Err())
	case <-work:
		fmt.Println("work done, token", lease.Token())
	}
	mu.Unlock(ctx)
	// Output: work done, token 1
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
	coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "balance"}, {Key: "v", Value: 100}})
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
