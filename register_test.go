package dlock

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestRegisterBetweenItsWrites: on the server, what lands between a
// registration's two writes neither outruns it nor leaves it half made.
// a's first write is held until something else is done: another waiter
// registering (it queues behind a, whose number was taken first), or a's
// pending entry cleared (a's second write then finds nothing to number,
// and register reports errHeld, leaving no entry of a's).
func TestRegisterBetweenItsWrites(t *testing.T) {
	for _, tc := range []struct {
		name    string
		between func(t *testing.T, st *mongoStore)
		check   func(t *testing.T, r record, err error)
	}{
		{"another registers", func(t *testing.T, st *mongoStore) {
			r, err := st.read(context.Background(), "k")
			require.NoError(t, err)
			pending := r.Waiters[holdKey("a", 1)]
			assert.True(t, pending.Q == 0 && pending.Sleep, "a's entry is pending: numbered 0, asleep (%+v)", pending)
			_, err = st.register(context.Background(), attempt{key: "k", owner: "b", hold: 1, ttl: time.Minute})
			require.NoError(t, err)
		}, func(t *testing.T, r record, err error) {
			require.NoError(t, err)
			a, b := r.Waiters[holdKey("a", 1)], r.Waiters[holdKey("b", 1)]
			assert.NotZero(t, a.Q, "a is numbered")
			assert.Greater(t, b.Q, a.Q, "b queues behind a")
			assert.False(t, a.Sleep, "a is awake, as it asked")
		}},
		{"a's pending entry is cleared", func(t *testing.T, st *mongoStore) {
			_, err := st.coll.UpdateOne(context.Background(), bson.D{{Key: "_id", Value: "k"}},
				bson.D{{Key: "$unset", Value: bson.D{{Key: path(fW, holdKey("a", 1)), Value: ""}}}})
			require.NoError(t, err)
		}, func(t *testing.T, r record, err error) {
			require.ErrorIs(t, err, errHeld)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			coll := newColl(t)
			other := newMongoStore(coll, func(context.Context, int) {})
			_, err := other.acquire(ctx, attempt{key: "k", owner: "h", hold: 1, ttl: time.Minute}, stamp{})
			require.NoError(t, err)
			var writes atomic.Int32
			succeeded := func(_ context.Context, e *event.CommandSucceededEvent) {
				if e.CommandName == "findAndModify" && writes.Add(1) == 1 {
					tc.between(t, other)
				}
			}
			mc, err := mongo.Connect(options.Client().ApplyURI(testURI).SetMonitor(&event.CommandMonitor{Succeeded: succeeded}))
			require.NoError(t, err)
			t.Cleanup(func() { mc.Disconnect(context.Background()) })
			st := newMongoStore(mc.Database(testDB.Name()).Collection(coll.Name()), func(context.Context, int) {})
			_, err = st.register(ctx, attempt{key: "k", owner: "a", hold: 1, ttl: time.Minute})
			assert.EqualValues(t, 2, writes.Load(), "a's writes")
			r, rerr := other.read(ctx, "k")
			require.NoError(t, rerr)
			for hk, e := range r.Waiters {
				assert.NotZero(t, e.Q, "a pending entry is left: %s", hk)
			}
			tc.check(t, r, err)
		})
	}
}
