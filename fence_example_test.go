package dlock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/dlock-go/dlock"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func ExampleUpsertFenced() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("upsert_fenced")
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

// A read-modify-write fenced at both ends: the read raises the fence to the
// holder's token, so that a holder paused past its lease cannot land a
// write between this read and this write.
func ExampleFindFenced() {
	ctx := context.Background()
	coll, disconnect := exampleCollection("find_fenced")
	defer disconnect()
	id := bson.D{{Key: "_id", Value: "counter"}}
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "counter"}, {Key: "n", Value: int64(0)}}); err != nil {
		fmt.Println(err)
		return
	}
	increment := func(tok dlock.Token) error {
		raw, err := dlock.FindFenced(ctx, coll, id, tok)
		if err != nil {
			return err
		}
		n := raw.Lookup("n").Int64() + 1
		_, err = dlock.UpdateFenced(ctx, coll, id, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: n}}}}, tok)
		return err
	}
	fmt.Println(increment(5)) // a holder
	fmt.Println(increment(6)) // the next one
	fmt.Println(increment(5)) // the first, paused past its lease
	// Output:
	// <nil>
	// <nil>
	// dlock: stale fencing token 5 (highest admitted 6)
}
