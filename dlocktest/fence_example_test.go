package dlocktest_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Reports is where the worker under test writes: a small interface in
// front of its fenced write. Production implements it with
// dlock.UpsertFenced (mongoReports); a test, in memory (fakeReports).
type Reports interface {
	Save(ctx context.Context, id, text string, token dlock.Token) error
}

// writeReport is the worker under test: it takes the lock and writes the
// report under the lease, fenced by its token.
func writeReport(ctx context.Context, mu *dlock.Mutex, reports Reports, text string) error {
	if err := mu.Lock(ctx); err != nil {
		return err
	}
	defer mu.Unlock(ctx)
	lease := mu.Lease()
	return reports.Save(lease.Context(), "nightly", text, lease.Token())
}

// mongoReports is the production Reports: one document per report, its
// writes fenced in the database.
type mongoReports struct{ coll *mongo.Collection }

var (
	_ Reports = mongoReports{}
	_ Reports = (*fakeReports)(nil)
)

func (r mongoReports) Save(ctx context.Context, id, text string, token dlock.Token) error {
	_, err := dlock.UpsertFenced(ctx, r.coll, bson.D{{Key: "_id", Value: id}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "text", Value: text}}}}, token)
	return err
}

// fakeReports is the test's Reports: a dlock.Fence per report in front of
// a map, so that it turns stale tokens away (dlock.ErrStaleToken), and
// token 0 (dlock.ErrInvalidOption), as UpsertFenced does. A Save whose ctx
// has ended is not sent, as the driver's is not; one that was sent applies
// whatever happens to ctx afterwards, as on a server. Set delay to hold
// the next Save in flight until it is closed: inFlight closes once it is.
type fakeReports struct {
	mu       sync.Mutex
	fences   map[string]*dlock.Fence // guarded by mu
	texts    map[string]string       // guarded by mu
	delay    chan struct{}           // guarded by mu; taken by the next Save
	inFlight chan struct{}           // guarded by mu; closed by the Save that took delay
}

func newFakeReports() *fakeReports {
	return &fakeReports{fences: map[string]*dlock.Fence{}, texts: map[string]string{}}
}

func (r *fakeReports) Save(ctx context.Context, id, text string, token dlock.Token) error {
	if err := ctx.Err(); err != nil {
		return err // not sent
	}
	r.mu.Lock()
	delay, inFlight := r.delay, r.inFlight
	r.delay, r.inFlight = nil, nil
	r.mu.Unlock()
	if delay != nil { // the network holds the write up
		close(inFlight)
		<-delay
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.fence(id).Check(token); err != nil {
		return err
	}
	r.texts[id] = text
	return nil
}

// fence returns the report's fence, made on first use. r.mu is held.
func (r *fakeReports) fence(id string) *dlock.Fence {
	f := r.fences[id]
	if f == nil {
		f = &dlock.Fence{}
		r.fences[id] = f
	}
	return f
}

// Testing a worker that fences its writes, with no database: the worker
// writes through Reports, and the test gives it fakeReports, fenced by a
// dlock.Fence. A's write is held up in the network while A is cut off; its
// lease is lost, B takes the key over and writes; when A's write lands,
// the fence turns it away, and A's worker reports dlock.ErrStaleToken.
// Real time, with a TTL of 100ms, as in ExampleServer.
func Example_fencedWrites() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv := dlocktest.NewServer()
	a := srv.Client(dlock.WithTTL(100 * time.Millisecond))
	defer a.Close(ctx)
	b := srv.Client(dlock.WithTTL(100 * time.Millisecond))
	defer b.Close(ctx)
	reports := newFakeReports()

	reports.delay, reports.inFlight = make(chan struct{}), make(chan struct{})
	inFlight, delay := reports.inFlight, reports.delay
	ma := a.NewMutex("report")
	aDone := make(chan error)
	go func() { aDone <- writeReport(ctx, ma, reports, "from A") }()
	<-inFlight // A holds the key, and its write is on its way
	lease := ma.Lease()

	srv.Partition(a) // A is cut off: its lease is lost just under a TTL later
	<-lease.Lost()
	fmt.Println("B:", writeReport(ctx, b.NewMutex("report"), reports, "from B"))
	close(delay) // A's write lands, after B's
	fmt.Println("A:", <-aDone)
	fmt.Println("report:", reports.texts["nightly"])
	srv.Heal(a)
	// Output:
	// B: <nil>
	// A: dlock: stale fencing token 1 (highest admitted 2)
	// report: from B
}
