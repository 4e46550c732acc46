package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The Go snippets of README.md, each a part of one of these examples,
// verbatim but for the database: the README's quick start writes to "app",
// its example to "dlock_examples", as the other examples do (readmeRewrites
// in readme_test.go). TestREADMESnippets (readme_test.go) fails when a
// snippet and its example differ otherwise, so every snippet compiles, and
// the examples with an Output comment run with the tests. Edit a snippet
// here first, then copy it into the README.

// The quick start: the body of its main.
func Example_readmeQuickStart() {
	// A deadline for the whole run: with a wrong URI, Lock fails with the
	// server's error rather than wait in silence.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mc, err := mongo.Connect(options.Client().ApplyURI(os.Getenv("MONGODB_URI")))
	if err != nil {
		log.Fatal(err)
	}
	defer mc.Disconnect(ctx)
	db := mc.Database("dlock_examples")

	// One Client per process; one collection holds all the locks.
	client, err := dlock.NewClient(db.Collection("locks"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx) // releases whatever it still holds

	mu := client.NewMutex("nightly-report", dlock.WithTTL(30*time.Second))
	if err := mu.Lock(ctx); err != nil { // waits while another process holds it
		log.Fatal(err)
	}
	lease := mu.Lease()

	// Work under lease.Context(): it is cancelled if the lease is lost.
	// Fence writes with lease.Token(): then a holder paused past its lease
	// cannot overwrite the work of the holder after it.
	_, err = dlock.UpsertFenced(lease.Context(), db.Collection("reports"),
		bson.D{{Key: "_id", Value: "nightly"}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "status", Value: "done"}}}},
		lease.Token())
	if err != nil { // the lease was lost, or a newer holder wrote (ErrStaleToken)
		log.Fatal(err)
	}

	if err := mu.Unlock(ctx); err != nil { // ErrLeaseLost if it was lost meanwhile
		log.Fatal(err)
	}
	fmt.Println("report written")
	// Output: report written
}

// readmeSetup returns a Client on a new collection, as exampleCollection
// does, and a func that closes both.
func readmeSetup(name string) (*dlock.Client, func()) {
	coll, disconnect := exampleCollection(name)
	client, err := dlock.NewClient(coll)
	if err != nil {
		log.Fatal(err)
	}
	return client, func() {
		client.Close(context.Background())
		disconnect()
	}
}

func runReport(ctx context.Context) error { return ctx.Err() }

func Example_readmeMutex() {
	ctx := context.Background()
	client, done := readmeSetup("readme_mutex")
	defer done()

	report := func() error {
		mu := client.NewMutex("nightly-report")
		if err := mu.TryLock(ctx); errors.Is(err, dlock.ErrLocked) {
			return nil // another process is at it: skip this run
		} else if err != nil {
			return err
		}
		defer mu.Unlock(ctx)
		return runReport(mu.Lease().Context()) // cancelled if the lease is lost
	}
	fmt.Println(report())
	// Output: <nil>
}

func readCatalog()                     {}
func writeCatalog(t dlock.Token) error { fmt.Println("writer's token", t); return nil }

func Example_readmeRWMutex() {
	ctx := context.Background()
	client, done := readmeSetup("readme_rwmutex")
	defer done()

	update := func() error {
		catalog := client.NewRWMutex("catalog")

		// Readers: any number at once, across processes.
		if err := catalog.RLock(ctx); err != nil {
			return err
		}
		readCatalog()
		if err := catalog.RUnlock(ctx); err != nil {
			return err
		}

		// A writer: alone. Not while this goroutine holds a read lock: that waits forever.
		if err := catalog.Lock(ctx); err != nil {
			return err
		}
		defer catalog.Unlock(ctx)
		return writeCatalog(catalog.Lease().Token()) // above every reader's token before it
	}
	fmt.Println(update())
	// Output:
	// writer's token 2
	// <nil>
}

func Example_readmeSemaphore() {
	ctx := context.Background()
	client, done := readmeSetup("readme_semaphore")
	defer done()

	encode := func() error {
		encoders := client.NewSemaphore("encoder", 4, dlock.WithData([]byte("host-a")))
		permit, err := encoders.Acquire(ctx) // one of 4 permits, across all processes
		if err != nil {
			return err
		}
		defer permit.Release(ctx)

		holders, err := client.Holders(ctx, "encoder") // one read: owner, token, data
		if err != nil {
			return err
		}
		for _, h := range holders {
			fmt.Printf("%s holds permit %d\n", h.Data, h.Token)
		}
		return nil
	}
	fmt.Println(encode())
	// Output:
	// host-a holds permit 1
	// <nil>
}

func runScheduler(ctx context.Context, t dlock.Token) error { return nil }

func Example_readmeElection() {
	ctx := context.Background()
	client, done := readmeSetup("readme_election")
	defer done()

	lead := func() error {
		e := client.NewElection("scheduler")
		term, err := e.Campaign(ctx, "web3:8080") // blocks until this Client leads
		if err != nil {
			return err
		}
		defer term.Release(ctx) // resign

		// In any process: who leads, in one read (ErrNoLeader when nobody does).
		leader, err := e.Leader(ctx)
		if err != nil {
			return err
		}
		fmt.Println("leader", leader.Value, "term", leader.Token)

		return runScheduler(term.Context(), term.Token()) // cancelled if leadership is lost
	}
	fmt.Println(lead())
	// Output:
	// leader web3:8080 term 1
	// <nil>
}

func Example_readmeFence() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("readme_fence")
	defer disconnect()
	counters := coll.Database().Collection(coll.Name() + "_counters")
	id := bson.D{{Key: "_id", Value: "orders"}}
	if _, err := counters.InsertOne(ctx, bson.D{{Key: "_id", Value: "orders"}, {Key: "n", Value: int64(0)}}); err != nil {
		log.Fatal(err)
	}

	increment := func(token dlock.Token) error {
		doc, err := dlock.FindFenced(ctx, counters, id, token) // raises the fence, then reads
		if err != nil {
			return err // ErrStaleToken: a newer holder has been here
		}
		n := doc.Lookup("n").Int64() + 1
		_, err = dlock.UpdateFenced(ctx, counters, id,
			bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: n}}}}, token)
		return err
	}
	fmt.Println(increment(7))
	fmt.Println(increment(6)) // an older holder, late
	// Output:
	// <nil>
	// dlock: stale fencing token 6 (highest admitted 7)
}

func runJob(ctx context.Context) { <-ctx.Done() }

// readmeJobTest is the README's dlocktest snippet, set by
// Example_readmeTesting (which has no Output, so go test compiles it and
// does not run it) and run by TestREADMEJobTest.
var readmeJobTest func(t *testing.T)

func Example_readmeTesting() {
	readmeJobTest = func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := dlocktest.NewServer()
			c := srv.Client(dlock.WithTTL(time.Hour))
			defer c.Close(context.Background())
			mu := c.NewMutex("job")
			if err := mu.Lock(t.Context()); err != nil {
				t.Fatal(err)
			}
			stopped := make(chan struct{})
			go func() { runJob(mu.Lease().Context()); close(stopped) }() // the code under test

			srv.Partition(c) // every extension fails from now on
			<-stopped        // the job stopped at the lease's deadline: an hour, in no real time
			srv.Heal(c)
		})
	}
}
