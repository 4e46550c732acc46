package dlock

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

func TestFenceCheck(t *testing.T) {
	var f Fence
	for _, tc := range []struct {
		name  string
		token Token
		stale bool
	}{
		{"first", 5, false},
		{"same holder again", 5, false},
		{"newer", 7, false},
		{"older", 6, true},
		{"much older", 1, true},
		{"newest", 8, false},
	} {
		err := f.Check(tc.token)
		if tc.stale {
			require.ErrorIs(t, err, ErrStaleToken, tc.name)
			var se *StaleTokenError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, Token(tc.token), se.Token)
		} else {
			require.NoError(t, err, tc.name)
		}
	}
}

func TestFenceConcurrent(t *testing.T) {
	var f Fence
	var mu sync.Mutex
	var admitted []Token
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock() // admission and recording in one step, to compare orders
			defer mu.Unlock()
			if f.Check(Token(i%10)) == nil {
				admitted = append(admitted, Token(i%10))
			}
		}()
	}
	wg.Wait()
	for i := 1; i < len(admitted); i++ {
		assert.GreaterOrEqual(t, admitted[i], admitted[i-1])
	}
}

func TestUpdateFenced(t *testing.T) {
	coll := newColl(t)
	ctx := context.Background()
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "reg"}, {Key: "n", Value: 0}})
	require.NoError(t, err)
	id := bson.D{{Key: "_id", Value: "reg"}}
	inc := bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}
	read := func() bson.M {
		var d bson.M
		require.NoError(t, coll.FindOne(ctx, id).Decode(&d))
		return d
	}
	for _, tc := range []struct {
		name  string
		token Token
		stale bool
	}{
		{"first token on the document", 3, false},
		{"same token again", 3, false},
		{"newer", 4, false},
		{"stale", 3, true},
	} {
		_, err := UpdateFenced(ctx, coll, id, inc, tc.token)
		if tc.stale {
			require.ErrorIs(t, err, ErrStaleToken, tc.name)
			var se *StaleTokenError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, Token(4), se.Highest)
		} else {
			require.NoError(t, err, tc.name)
		}
	}
	d := read()
	assert.EqualValues(t, 3, d["n"], "the stale write changed nothing")
	assert.EqualValues(t, 4, d[FenceField])

	// The user's own $max is kept beside the fence's.
	_, err = UpdateFenced(ctx, coll, id, bson.D{{Key: "$max", Value: bson.D{{Key: "hi", Value: 9}}}}, 5)
	require.NoError(t, err)
	assert.EqualValues(t, 9, read()["hi"])

	_, err = UpdateFenced(ctx, coll, bson.D{{Key: "_id", Value: "missing"}}, inc, 9)
	require.ErrorIs(t, err, mongo.ErrNoDocuments)
	for _, bad := range []any{
		bson.D{{Key: "n", Value: 1}},
		bson.D{{Key: "$set", Value: bson.D{{Key: FenceField, Value: 1}}}},
	} {
		_, err = UpdateFenced(ctx, coll, id, bad, 9)
		require.ErrorIs(t, err, ErrInvalidOption)
	}
	_, err = UpdateFenced(ctx, nil, id, inc, 1)
	require.ErrorIs(t, err, ErrInvalidOption)
}

// The story fencing exists for: a holder paused past its lease wakes up and
// writes with its old token after the next holder wrote; the store refuses.
func TestFencedWriteAfterPause(t *testing.T) {
	coll := newColl(t)
	data := newColl(t)
	ctx := context.Background()
	_, err := data.InsertOne(ctx, bson.D{{Key: "_id", Value: "reg"}, {Key: "v", Value: ""}})
	require.NoError(t, err)
	f := &faultyStore{}
	a := newClient(t, coll, WithTTL(200_000_000), withFaults(f)) // 200ms
	b := newClient(t, coll)
	ma, mb := a.NewMutex("k"), b.NewMutex("k")
	require.NoError(t, ma.Lock(ctx))
	old := ma.Lease().Token()
	f.crash() // "paused": no extension gets through
	require.NoError(t, mb.Lock(ctx))
	set := func(v string) bson.D { return bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: v}}}} }
	id := bson.D{{Key: "_id", Value: "reg"}}
	_, err = UpdateFenced(ctx, data, id, set("b"), mb.Lease().Token())
	require.NoError(t, err)
	_, err = UpdateFenced(ctx, data, id, set("a, late"), old)
	require.ErrorIs(t, err, ErrStaleToken)
	var d bson.M
	require.NoError(t, data.FindOne(ctx, id).Decode(&d))
	assert.Equal(t, "b", d["v"])
}
