package testserver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// race has clients grab one document with a compare-and-set
// findOneAndUpdate({owner: ""} -> {owner: me}) and let it go, for d, and
// returns how many of the wins overlapped another holder.
func race(t *testing.T, raw bool, clients int, d time.Duration) (wins, overlaps int64) {
	srv, err := Start(Config{Dir: t.TempDir(), Raw: raw})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	var holders atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(d)
	for i := range clients {
		c, err := mongo.Connect(options.Client().ApplyURI(srv.URI()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Disconnect(ctx)
		coll := c.Database("race").Collection("locks")
		if i == 0 {
			if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: "owner", Value: ""}}); err != nil {
				t.Fatal(err)
			}
		}
		me := fmt.Sprint("c", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				err := coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: "owner", Value: ""}},
					bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: me}}}}).Err()
				if errors.Is(err, mongo.ErrNoDocuments) {
					continue
				} else if err != nil {
					t.Error(err)
					return
				}
				atomic.AddInt64(&wins, 1)
				if holders.Add(1) > 1 {
					atomic.AddInt64(&overlaps, 1)
				}
				time.Sleep(200 * time.Microsecond) // the critical section
				if holders.Add(-1) > 0 {
					atomic.AddInt64(&overlaps, 1)
				}
				coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: "owner", Value: me}},
					bson.D{{Key: "$set", Value: bson.D{{Key: "owner", Value: ""}}}})
			}
		}()
	}
	wg.Wait()
	return wins, overlaps
}

// FerretDB v1 alone lets two compare-and-set writers win at once; the
// serializing proxy restores MongoDB's single-document atomicity. This is
// why dlock's tests run behind the proxy, and why the README supports
// FerretDB v1 only behind it.
func TestSerializerRestoresAtomicity(t *testing.T) {
	wins, overlaps := race(t, false, 8, 2*time.Second)
	t.Logf("serialized: %d wins, %d overlapping", wins, overlaps)
	if overlaps != 0 || wins == 0 {
		t.Fatalf("serialized server: %d of %d wins overlapped", overlaps, wins)
	}
	// Without the serializer, FerretDB v1 lets two compare-and-set winners
	// overlap: this is why the test server serializes. The race depends on
	// timing, so it gets up to five rounds to show itself (one is usual).
	for round := 1; ; round++ {
		wins, overlaps = race(t, true, 8, 2*time.Second)
		t.Logf("raw FerretDB, round %d: %d wins, %d overlapping", round, wins, overlaps)
		if overlaps > 0 {
			break
		}
		if round == 5 {
			t.Fatal("raw FerretDB v1 showed no overlapping winners: has it become atomic? Then the serializer may go")
		}
	}
}
