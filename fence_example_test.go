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

// fenceExampleCollection connects to the test server (MONGODB_URI, or the
// one the tests started) and returns a fresh collection, and a func that
// disconnects.
func fenceExampleCollection(name string) (*mongo.Collection, func()) {
	client, err := mongo.Connect(options.Client().ApplyURI(os.Getenv("DLOCK_EXAMPLE_URI")))
	if err != nil {
		log.Fatal(err)
	}
	coll := client.Database("dlock_examples").Collection(name)
	coll.Drop(context.Background())
	return coll, func() { client.Disconnect(context.Background()) }
}

func ExampleUpsertFenced() {
	ctx := context.Background()
	coll, disconnect := fenceExampleCollection("upsert_fenced")
	defer disconnect()
	id := bson.D{{Key: "_id", Value: "report"}} // the _id, by equality
	set := func(v string) bson.D { return bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: v}}}} }

	res, err := dlock.UpsertFenced(ctx, coll, id, set("draft"), 3) // no document yet
	fmt.Println("created:", res.UpsertedCount, err)
	res, err = dlock.UpsertFenced(ctx, coll, id, set("final"), 4) // the next holder
	fmt.Println("updated:", res.MatchedCount, err)
	_, err = dlock.UpsertFenced(ctx, coll, id, set("late"), 3) // the old holder, late
	fmt.Println(err)
	_, err = dlock.UpsertFenced(ctx, coll, bson.D{{Key: "name", Value: "report"}}, set("x"), 5)
	fmt.Println(errors.Is(err, dlock.ErrInvalidOption)) // no _id: could create a second document
	// Output:
	// created: 1 <nil>
	// updated: 1 <nil>
	// dlock: stale fencing token 3 (highest admitted 4)
	// true
}
