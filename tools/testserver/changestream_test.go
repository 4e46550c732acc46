package testserver

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	drvevent "go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// csServer starts a server with change streams and a history of size
// events, and a client whose commands are counted by name.
func csServer(t *testing.T, size int) (*Server, *mongo.Client, func(name string) int) {
	t.Helper()
	srv, err := Start(Config{Dir: t.TempDir(), ChangeStreams: true, HistorySize: size})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	var mu sync.Mutex
	counts := map[string]int{}
	mon := &drvevent.CommandMonitor{Started: func(_ context.Context, e *drvevent.CommandStartedEvent) {
		mu.Lock()
		counts[e.CommandName]++
		mu.Unlock()
	}}
	c, err := mongo.Connect(options.Client().ApplyURI(srv.URI()).SetMonitor(mon))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect(context.Background()) })
	return srv, c, func(name string) int { mu.Lock(); defer mu.Unlock(); return counts[name] }
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// next returns the stream's next event, failing the test on an error.
func next(t *testing.T, ctx context.Context, cs *mongo.ChangeStream) bson.Raw {
	t.Helper()
	if !cs.Next(ctx) {
		t.Fatalf("no event: %v", cs.Err())
	}
	return append(bson.Raw(nil), cs.Current...)
}

func str(v bson.RawValue) string {
	if s, ok := v.StringValueOK(); ok {
		return s
	}
	return v.String()
}

// Both a client that names the replica set and one that does not see a
// replica set with a primary.
func TestChangeStreamsTopology(t *testing.T) {
	srv, _, _ := csServer(t, 0)
	if !strings.Contains(srv.URI(), "replicaSet="+DefaultReplicaSet) {
		t.Fatalf("URI %s does not name the replica set", srv.URI())
	}
	for _, uri := range []string{srv.URI(), strings.Split(srv.URI(), "?")[0]} {
		var mu sync.Mutex
		var kind string
		mon := &drvevent.ServerMonitor{TopologyDescriptionChanged: func(e *drvevent.TopologyDescriptionChangedEvent) {
			mu.Lock()
			kind = e.NewDescription.Kind
			mu.Unlock()
		}}
		c, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerMonitor(mon))
		if err != nil {
			t.Fatal(err)
		}
		err = c.Ping(testCtx(t), nil)
		mu.Lock()
		got := kind
		mu.Unlock()
		c.Disconnect(context.Background())
		if err != nil || got != "ReplicaSetWithPrimary" {
			t.Fatalf("%s: ping %v, topology %q, want ReplicaSetWithPrimary", uri, err, got)
		}
	}
}

// Watch with updateLookup sees an insert, an update (with its fields, and
// the document as it then is) and a delete; the collection's drop, then
// invalidate, which ends the stream.
func TestChangeStreamEvents(t *testing.T) {
	_, c, _ := csServer(t, 0)
	ctx := testCtx(t)
	coll := c.Database("cs").Collection("docs")
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetFullDocument(options.UpdateLookup))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "a"}, {Key: "n", Value: 1}, {Key: "sub", Value: bson.D{{Key: "x", Value: 1}}}, {Key: "gone", Value: true}}); err != nil {
		t.Fatal(err)
	}
	ev := next(t, ctx, cs)
	if str(ev.Lookup("operationType")) != "insert" || str(ev.Lookup("fullDocument", "_id")) != "a" ||
		str(ev.Lookup("ns", "coll")) != "docs" || str(ev.Lookup("documentKey", "_id")) != "a" {
		t.Fatalf("insert event: %v", ev)
	}
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: "a"}}, bson.D{
		{Key: "$set", Value: bson.D{{Key: "n", Value: 2}, {Key: "sub.y", Value: 3}}},
		{Key: "$unset", Value: bson.D{{Key: "gone", Value: ""}}}}); err != nil {
		t.Fatal(err)
	}
	ev = next(t, ctx, cs)
	desc := ev.Lookup("updateDescription").Document()
	if str(ev.Lookup("operationType")) != "update" || ev.Lookup("fullDocument", "n").AsInt64() != 2 ||
		desc.Lookup("updatedFields", "n").AsInt64() != 2 || desc.Lookup("updatedFields", "sub.y").AsInt64() != 3 ||
		str(desc.Lookup("removedFields", "0")) != "gone" {
		t.Fatalf("update event: %v", ev)
	}
	if _, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: "a"}}); err != nil {
		t.Fatal(err)
	}
	ev = next(t, ctx, cs)
	if str(ev.Lookup("operationType")) != "delete" || str(ev.Lookup("documentKey", "_id")) != "a" {
		t.Fatalf("delete event: %v", ev)
	}
	if _, err := ev.LookupErr("fullDocument"); err == nil {
		t.Fatalf("delete event with a fullDocument: %v", ev)
	}
	if err := coll.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"drop", "invalidate"} {
		if ev := next(t, ctx, cs); str(ev.Lookup("operationType")) != op {
			t.Fatalf("want %s, got %v", op, ev)
		}
	}
	if cs.Next(ctx) || cs.Err() != nil || cs.ID() != 0 {
		t.Fatalf("stream after invalidate: %v, cursor %d, %v", cs.Current, cs.ID(), cs.Err())
	}
}

// Each form of write gives the events MongoDB gives, in order; a write
// that changes nothing gives none.
func TestChangeStreamWriteForms(t *testing.T) {
	_, c, _ := csServer(t, 0)
	ctx := testCtx(t)
	coll := c.Database("cs").Collection("forms")
	cs, err := coll.Watch(ctx, mongo.Pipeline{{{Key: "$project", Value: bson.D{{Key: "operationType", Value: 1}, {Key: "documentKey", Value: 1}}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	id := func(s string) bson.D { return bson.D{{Key: "_id", Value: s}} }
	set := func(v int) bson.D { return bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: v}}}} }
	upsert := options.FindOneAndUpdate().SetUpsert(true)
	steps := []func() error{
		func() error {
			_, err := coll.InsertMany(ctx, []any{id("a"), id("b")})
			return err
		},
		func() error { _, err := coll.UpdateMany(ctx, bson.D{}, set(1)); return err },
		func() error { _, err := coll.UpdateOne(ctx, id("a"), set(1)); return err }, // no change: no event
		func() error {
			_, err := coll.BulkWrite(ctx, []mongo.WriteModel{
				mongo.NewUpdateOneModel().SetFilter(id("b")).SetUpdate(set(2)),
				mongo.NewReplaceOneModel().SetFilter(id("a")).SetReplacement(bson.D{{Key: "w", Value: 1}}),
				mongo.NewUpdateOneModel().SetFilter(id("c")).SetUpdate(set(3)).SetUpsert(true),
			})
			return err
		},
		func() error { return coll.FindOneAndUpdate(ctx, id("d"), set(4), upsert).Err() },
		func() error { return coll.FindOneAndDelete(ctx, id("b")).Err() },
		func() error { _, err := coll.DeleteMany(ctx, bson.D{}); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
			t.Fatal(err)
		}
	}
	want := []string{"insert a", "insert b", "update a", "update b", "update b", "replace a", "insert c",
		"insert d", "delete b", "delete a", "delete c", "delete d"}
	for i, w := range want {
		ev := next(t, ctx, cs)
		if got := str(ev.Lookup("operationType")) + " " + str(ev.Lookup("documentKey", "_id")); got != w {
			t.Fatalf("event %d: %s, want %s (%v)", i, got, w, ev)
		}
		if _, err := ev.LookupErr("clusterTime"); err == nil {
			t.Fatalf("event %d: $project kept clusterTime: %v", i, ev)
		}
	}
}

// A stream whose cursor the server kills resumes from its token, and
// neither loses nor repeats an event; so does one whose getMore fails
// with a resumable error. A non-resumable error ends the stream.
func TestChangeStreamResumes(t *testing.T) {
	srv, c, count := csServer(t, 0)
	ctx := testCtx(t)
	coll := c.Database("cs").Collection("resume")
	cs, err := coll.Watch(ctx, mongo.Pipeline{bson.D{{Key: "$match", Value: bson.D{{Key: "operationType", Value: "insert"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	insert := func(n int) {
		t.Helper()
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: n}}); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(n int) {
		t.Helper()
		if ev := next(t, ctx, cs); ev.Lookup("documentKey", "_id").AsInt64() != int64(n) {
			t.Fatalf("want the insert of %d, got %v", n, ev)
		}
	}
	insert(1)
	expect(1)
	if n, err := srv.KillChangeStreams("cs.resume"); n != 1 || err != nil {
		t.Fatalf("killed %d cursors: %v", n, err)
	}
	insert(2)
	insert(3)
	expect(2)
	expect(3)
	if err := srv.FailNextGetMore("", 91, "ShutdownInProgress", "ResumableChangeStreamError"); err != nil {
		t.Fatal(err)
	}
	insert(4)
	expect(4)
	if got := count("aggregate"); got != 3 {
		t.Fatalf("%d aggregates, want 3: the first, and one resume after each fault", got)
	}
	if err := srv.FailNextGetMore("", 2, "BadValue"); err != nil {
		t.Fatal(err)
	}
	insert(5)
	if cs.Next(ctx) {
		t.Fatalf("an event after a non-resumable error: %v", cs.Current)
	}
	var se mongo.ServerError
	if !errors.As(cs.Err(), &se) || !se.HasErrorCode(2) {
		t.Fatalf("stream ended with %v, want the injected BadValue", cs.Err())
	}
}

// Resuming from before the oldest event kept fails with
// ChangeStreamHistoryLost (286), on which the driver does not resume; so
// does a stream that falls behind by more than the history.
func TestChangeStreamHistoryLost(t *testing.T) {
	_, c, count := csServer(t, 4)
	ctx := testCtx(t)
	coll := c.Database("cs").Collection("lost")
	cs, err := coll.Watch(ctx, mongo.Pipeline{})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	next(t, ctx, cs)
	first := cs.ResumeToken()
	for i := 1; i <= 5; i++ {
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: i}}); err != nil {
			t.Fatal(err)
		}
	}
	if cs.Next(ctx) {
		t.Fatalf("a stream 5 events behind a history of 4 read %v", cs.Current)
	}
	if !isHistoryLost(cs.Err()) {
		t.Fatalf("stream fallen behind: %v, want ChangeStreamHistoryLost", cs.Err())
	}
	_, err = coll.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetResumeAfter(first))
	if !isHistoryLost(err) {
		t.Fatalf("resume from a lost token: %v, want ChangeStreamHistoryLost", err)
	}
	if got := count("aggregate"); got != 2 {
		t.Fatalf("%d aggregates, want 2: the driver must not resume on 286", got)
	}
}

func isHistoryLost(err error) bool {
	var ce mongo.CommandError
	return errors.As(err, &ce) && ce.Code == 286 && ce.Name == "ChangeStreamHistoryLost"
}

// A stream survives every connection being dropped (its cursor goes with
// its connection), and sees events held back by a delay only once it has
// passed.
func TestChangeStreamDropAndDelay(t *testing.T) {
	srv, c, count := csServer(t, 0)
	ctx := testCtx(t)
	coll := c.Database("cs").Collection("drop")
	cs, err := coll.Watch(ctx, mongo.Pipeline{})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	for i := 1; i <= 3; i++ {
		if i == 2 {
			if err := srv.DropConnections(); err != nil {
				t.Fatal(err)
			}
		}
		if i == 3 {
			if err := srv.DelayChangeEvents("cs.drop", 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: i}}); err != nil {
			t.Fatal(err)
		}
		if ev := next(t, ctx, cs); ev.Lookup("documentKey", "_id").AsInt64() != int64(i) {
			t.Fatalf("want the insert of %d, got %v", i, ev)
		}
		if i == 3 && time.Since(start) < 300*time.Millisecond {
			t.Fatalf("an event delayed by 300ms came after %v", time.Since(start))
		}
	}
	if got := count("aggregate"); got != 2 {
		t.Fatalf("%d aggregates, want 2: the first, and the resume after the drop", got)
	}
}

// A client that disconnects takes its streams' cursors with it, and no
// other client's.
func TestChangeStreamDisconnect(t *testing.T) {
	srv, c, count := csServer(t, 0)
	ctx := testCtx(t)
	coll := c.Database("cs").Collection("disconnect")
	cs, err := coll.Watch(ctx, mongo.Pipeline{})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(ctx)
	other, err := mongo.Connect(options.Client().ApplyURI(srv.URI()))
	if err != nil {
		t.Fatal(err)
	}
	otherCS, err := other.Database("cs").Collection("disconnect").Watch(ctx, mongo.Pipeline{})
	if err != nil {
		t.Fatal(err)
	}
	_ = otherCS // left open: the disconnect must free it
	if err := other.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	next(t, ctx, cs)
	if got := count("aggregate"); got != 1 {
		t.Fatalf("%d aggregates: another client's disconnect killed this stream's cursor", got)
	}
	if n, err := srv.KillChangeStreams(""); n != 1 || err != nil {
		t.Fatalf("%d cursors alive after the other client left, want 1 (%v)", n, err)
	}
}
