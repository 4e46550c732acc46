package dlock

import (
	"context"
	"testing"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// The behaviour tests run against each backend, as subtests: the test
// server (MONGODB_URI, or the embedded FerretDB) and the in-memory store
// that package dlocktest gives users. The same assertions on both keep the
// in-memory store from drifting away from the real one.

// A space is an empty keyspace on a backend: a new collection, or a new
// in-memory store.
type space interface {
	// client returns a Client on the space, closed when the test ends.
	client(t testing.TB, opts ...Option) *Client
	// read returns key's record as the server has it.
	read(t testing.TB, key string) record
	// commands counts the commands sent to the space's server so far.
	commands() int64
}

type mongoKeys struct{ coll *mongo.Collection }

func (s mongoKeys) client(t testing.TB, opts ...Option) *Client {
	return newClient(t, s.coll, opts...)
}

func (s mongoKeys) read(t testing.TB, key string) record {
	t.Helper()
	return readDoc(t, s.coll, key).record()
}

func (mongoKeys) commands() int64 { return commands.total.Load() }

type memKeys struct{ st *memStore }

func (s memKeys) client(t testing.TB, opts ...Option) *Client {
	t.Helper()
	c, err := newClientOn(func(*telemetry) store { return &memLink{memStore: s.st} }, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func (s memKeys) read(_ testing.TB, key string) record { return holder(s.st, key) }

func (s memKeys) commands() int64 { return s.st.commands.Load() }

// forEachBackend runs test once per backend, each with a fresh space.
func forEachBackend(t *testing.T, test func(t *testing.T, sp space)) {
	t.Run("server", func(t *testing.T) { test(t, mongoKeys{newColl(t)}) })
	t.Run("memory", func(t *testing.T) { test(t, memKeys{newMemStore()}) })
}
