package dlock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The bulk acquire and the read of many records, on both stores, against
// every document state of the table of TestStoresAgreeOnEveryWrite: each
// state's key is locked beside a key that has no document, in one bulk
// write, and both are read back with the floor.
func TestStoresAgreeOnAcquireAll(t *testing.T) {
	ctx := context.Background()
	coll := newColl(t)
	ms := newMongoStore(coll, func(context.Context, int) {})
	i := 0
	for sname, state := range tableStates() {
		for _, traced := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/traced=%v", sname, traced), func(t *testing.T) {
				i++
				key, fresh := fmt.Sprint("m", i), fmt.Sprint("n", i)
				mem := newMemStore()
				if state != nil {
					mem.records[key] = state.clone()
					if _, err := coll.InsertOne(ctx, seedDoc(key, *state)); err != nil {
						t.Fatal(err)
					}
				}
				as := []attempt{
					{key: key, owner: "o9", hold: 1, ttl: time.Second, data: []byte("d")},
					{key: fresh, owner: "o9", hold: 2, ttl: time.Second},
				}
				if traced {
					as[0].trace, as[1].trace = tableTraces[1], tableTraces[1]
				}
				var took [2][]bool
				run := func(i int, s store) string {
					var err error
					took[i], err = s.acquireAll(ctx, as)
					recs, floor, rerr := s.readAll(ctx, []string{key, fresh, "absent"})
					after, _ := s.read(ctx, key)
					return fmt.Sprintf("%v; read %v floor %d %v; after %s", err, describeAll(recs), floor, rerr, describe(after))
				}
				if m, s := run(0, mem), run(1, ms); m != s {
					t.Errorf("the stores disagree\nmemory: %s\nserver: %s", m, s)
				}
				// What applied may have applied; the server may report more
				// (FerretDB v1 does), never less.
				for j := range as {
					if took[0][j] && !took[1][j] {
						t.Errorf("acquire %d applied but is not reported: memory %v, server %v", j, took[0], took[1])
					}
				}
			})
		}
	}
}

func describeAll(recs []record) string {
	s := ""
	for _, r := range recs {
		s += describe(r)
	}
	return s
}

// TestStoresAgreeOnReadMany: the watcher's read of several keys returns,
// in order, what a read of each returns, on both stores, in every state of
// the table (a key twice, and one with no document, included).
func TestStoresAgreeOnReadMany(t *testing.T) {
	ctx := context.Background()
	coll := newColl(t)
	ms := newMongoStore(coll, func(context.Context, int) {})
	mem := newMemStore()
	var keys []string
	for sname, state := range tableStates() {
		if state == nil {
			continue
		}
		key := "r-" + sname
		mem.records[key] = state.clone()
		if _, err := coll.InsertOne(ctx, seedDoc(key, *state)); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key, "absent")
	}
	keys = append(keys, keys[0])
	for _, s := range []store{mem, ms} {
		recs, err := s.readMany(ctx, keys)
		require.NoError(t, err)
		require.Len(t, recs, len(keys))
		for i, k := range keys {
			one, err := s.read(ctx, k)
			require.NoError(t, err)
			assert.Equal(t, describe(one), describe(recs[i]), "%T: %s", s, k)
		}
	}
	m, _ := mem.readMany(ctx, keys)
	s, _ := ms.readMany(ctx, keys)
	assert.Equal(t, describeAll(m), describeAll(s), "the stores disagree")
}
