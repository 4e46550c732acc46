package dlock

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// externalServer: MONGODB_URI was set by the user, not by TestMain for the
// embedded server (package variables are set before TestMain runs).
var externalServer = os.Getenv("MONGODB_URI") != ""

// Run: go test -run '^$' -bench . -count 6 | tee new.txt ; benchstat new.txt
// Every figure is reported beside the floor measured in the same run.

func reportCommands(b *testing.B, mark int64, per int) {
	b.ReportMetric(float64(commands.since(mark))/float64(per), "cmds/op")
}

// BenchmarkFloor: the writes an acquire and a release must make, with the
// raw driver: a conditional upsert and a conditional update.
func BenchmarkFloor(b *testing.B) {
	for _, distinct := range []bool{false, true} {
		b.Run(map[bool]string{false: "key=one", true: "key=distinct"}[distinct], func(b *testing.B) {
			coll := newColl(b)
			coll = coll.Database().Collection(coll.Name(), options.Collection().SetWriteConcern(writeconcern.Majority()))
			ctx := context.Background()
			owner := randomOwner()
			b.ReportAllocs()
			mark := commands.total.Load()
			key, i := "k", 0
			for b.Loop() {
				if distinct {
					i++
					key = fmt.Sprint("k", i)
				}
				err := coll.FindOneAndUpdate(ctx,
					bson.D{{Key: "_id", Value: key}, {Key: "$or", Value: bson.A{bson.D{{Key: fOwner, Value: ""}}, bson.D{{Key: fOwner, Value: owner}}}}},
					newHold(owner, 1, time.Minute, 1), upsertAfter).Err()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: fOwner, Value: owner}}, free); err != nil {
					b.Fatal(err)
				}
			}
			reportCommands(b, mark, b.N)
		})
	}
}

// BenchmarkLockUnlock: uncontended Lock+Unlock, on one key and on a new
// key each time; with explicit no-op telemetry providers, to compare with
// the default (the global providers, no-op when nobody set them), and
// with a recording tracer (spans recorded, as under an SDK, but not
// exported; the hold then stores its trace context); and against the
// stub server, where the time is the Client's own.
func BenchmarkLockUnlock(b *testing.B) {
	for _, tc := range []struct {
		name     string
		distinct bool
		ack      bool
		opts     []Option
	}{
		{"key=one", false, false, nil},
		{"key=distinct", true, false, nil},
		{"key=one/telemetry=noop", false, false, []Option{WithTracerProvider(tracenoop.NewTracerProvider()), WithMeterProvider(metricnoop.NewMeterProvider())}},
		{"key=one/tracer=recording", false, false, []Option{WithTracerProvider(sdktrace.NewTracerProvider())}}, // spans recorded, none exported
		{"key=one/server=ack/tracer=recording", false, true, []Option{WithTracerProvider(sdktrace.NewTracerProvider())}},
		{"key=one/server=ack", false, true, nil},
	} {
		b.Run(tc.name, func(b *testing.B) {
			coll := newColl(b)
			if tc.ack {
				coll = newAckClient(b)
			}
			c := newClient(b, coll, tc.opts...)
			ctx := context.Background()
			m := c.NewMutex("k")
			b.ReportAllocs()
			mark := commands.total.Load()
			i := 0
			for b.Loop() {
				if tc.distinct {
					i++
					m = c.NewMutex(fmt.Sprint("k", i))
				}
				if err := m.Lock(ctx); err != nil {
					b.Fatal(err)
				}
				if err := m.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			reportCommands(b, mark, b.N)
		})
	}
}

// BenchmarkShared: an uncontended RLock+RUnlock of an RWMutex and
// Acquire+Release of a Semaphore's permit (two commands each, once the
// primitive knows the key's token counter), beside a Mutex's Lock+Unlock;
// and 8 goroutines of one Client that RLock at once, then RUnlock: they
// share one hold on the server, so the 8 cost what one does.
func BenchmarkShared(b *testing.B) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		op   func(c *Client) func() error
	}{
		{"mutex", func(c *Client) func() error {
			m := c.NewMutex("k")
			return func() error {
				if err := m.Lock(ctx); err != nil {
					return err
				}
				return m.Unlock(ctx)
			}
		}},
		{"rlock", func(c *Client) func() error {
			rw := c.NewRWMutex("k")
			return func() error {
				if err := rw.RLock(ctx); err != nil {
					return err
				}
				return rw.RUnlock(ctx)
			}
		}},
		{"semaphore", func(c *Client) func() error {
			s := c.NewSemaphore("k", 4)
			return func() error {
				l, err := s.Acquire(ctx)
				if err != nil {
					return err
				}
				return l.Release(ctx)
			}
		}},
		{"rlock/readers=8", func(c *Client) func() error {
			rw := c.NewRWMutex("k")
			return func() error {
				var all, done sync.WaitGroup
				errs := make(chan error, 16)
				all.Add(8)
				for range 8 {
					done.Add(1)
					go func() {
						defer done.Done()
						err := rw.RLock(ctx)
						all.Done()
						if err != nil {
							errs <- err
							return
						}
						all.Wait() // all 8 hold at once
						errs <- rw.RUnlock(ctx)
					}()
				}
				done.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						return err
					}
				}
				return nil
			}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := newClient(b, newColl(b))
			op := tc.op(c)
			if err := op(); err != nil { // creates the document; learns the key's counter
				b.Fatal(err)
			}
			b.ReportAllocs()
			mark := commands.total.Load()
			for b.Loop() {
				if err := op(); err != nil {
					b.Fatal(err)
				}
			}
			reportCommands(b, mark, b.N)
		})
	}
}

// BenchmarkNewKey: Lock+Unlock of a key that has no document (its
// document deleted outside the timer, as Prune would), beside the same on
// a key that exists, in collections of other documents: a new key costs
// the acquire that creates it, a read of the floor and the release that
// writes its base (three commands against two), and must stay within 2x
// of an existing key's pair whatever the collection's size.
func BenchmarkNewKey(b *testing.B) {
	for _, size := range []int{10, 500, 2500} {
		for _, fresh := range []bool{false, true} {
			b.Run(fmt.Sprintf("docs=%d/key=%s", size, map[bool]string{false: "existing", true: "new"}[fresh]), func(b *testing.B) {
				coll := newColl(b)
				ctx := context.Background()
				docs := make([]any, size)
				for i := range docs {
					docs[i] = bson.D{{Key: "_id", Value: fmt.Sprint("other", i)}, {Key: fOwner, Value: ""}, {Key: fToken, Value: int64(1)}, {Key: fRev, Value: int64(2)}}
				}
				if _, err := coll.InsertMany(ctx, docs); err != nil {
					b.Fatal(err)
				}
				c := newClient(b, coll)
				m := c.NewMutex("k")
				if err := m.Lock(ctx); err != nil { // and the floor document, made once
					b.Fatal(err)
				}
				if err := m.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				var cmds int64
				for b.Loop() {
					if fresh {
						b.StopTimer()
						if _, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: "k"}}); err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
					}
					mark := commands.total.Load()
					if err := m.Lock(ctx); err != nil {
						b.Fatal(err)
					}
					if err := m.Unlock(ctx); err != nil {
						b.Fatal(err)
					}
					cmds += commands.since(mark)
				}
				b.ReportMetric(float64(cmds)/float64(b.N), "cmds/op")
			})
		}
	}
}

// BenchmarkPrune: one Prune of idle keys (free, last written two hours
// ago, pruned when idle for an hour), in a collection that also holds
// keys in use: half held, half free but written a moment ago. Prune
// deletes the idle ones and must pass over the rest, which its index
// (pruneIndex) keeps it from reading where the server has it. The idle
// keys' documents are inserted again, outside the timer, before each op.
// The row of 20,000 keys in use runs only on a server at MONGODB_URI: the
// embedded server scans the collection for every conditional write.
func BenchmarkPrune(b *testing.B) {
	for _, tc := range []struct{ idle, busy int }{{100, 0}, {400, 0}, {100, 1000}, {100, 20000}} {
		b.Run(fmt.Sprintf("idle=%d/busy=%d", tc.idle, tc.busy), func(b *testing.B) {
			if tc.busy > 1000 && os.Getenv("MONGODB_URI") == "" {
				b.Skip("on the embedded server every conditional write scans the collection: set MONGODB_URI")
			}
			coll := newColl(b)
			ctx := context.Background()
			now := time.Now()
			var busy, idle []any
			for i := range tc.busy {
				d := bson.D{{Key: "_id", Value: fmt.Sprint("busy", i)}, {Key: fOwner, Value: ""}, {Key: fToken, Value: int64(1)}, {Key: fRev, Value: int64(2)}, {Key: fAt, Value: now}}
				if i%2 == 0 {
					d[1].Value = "someone"
					d = append(d, bson.E{Key: fHold, Value: int64(1)}, bson.E{Key: fTTL, Value: int64(time.Hour / time.Millisecond)})
				}
				busy = append(busy, d)
			}
			for i := range tc.idle {
				idle = append(idle, bson.D{{Key: "_id", Value: fmt.Sprint("idle", i)}, {Key: fOwner, Value: ""}, {Key: fToken, Value: int64(1)}, {Key: fRev, Value: int64(2)}, {Key: fAt, Value: now.Add(-2 * time.Hour)}})
			}
			if len(busy) > 0 {
				if _, err := coll.InsertMany(ctx, busy); err != nil {
					b.Fatal(err)
				}
			}
			c := newClient(b, coll)
			if _, err := c.Prune(ctx, time.Hour); err != nil { // the Client's first: its index, and the floor
				b.Fatal(err)
			}
			var cmds int64
			for b.Loop() {
				b.StopTimer()
				if _, err := coll.InsertMany(ctx, idle); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				mark := commands.total.Load()
				n, err := c.Prune(ctx, time.Hour)
				if err != nil || n != tc.idle {
					b.Fatalf("pruned %d of %d: %v", n, tc.idle, err)
				}
				cmds += commands.since(mark)
			}
			b.ReportMetric(float64(cmds)/float64(b.N), "cmds/op")
		})
	}
}

// BenchmarkTelemetry: the telemetry calls that one Lock+Unlock makes, with
// the default providers, alone: what a dlock without telemetry would save.
// Compare with BenchmarkLockUnlock/key=one/server=ack, the Client's own
// cost of a Lock+Unlock (mutex.go, lease.go and extender.go make these
// calls; keep the two in step).
func BenchmarkTelemetry(b *testing.B) {
	c := newClient(b, newAckClient(b))
	tel, ctx := c.tel, context.Background()
	l := &Lease{c: c, key: "k", token: 1}
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		lctx, span := tel.lockSpan(ctx, "dlock.Lock", l.key, c.owner)
		tel.countCommands(lctx, 1)
		tel.endLock(lctx, span, start, 1, l, nil)
		tel.held.Add(ctx, 1)
		rctx, rspan := tel.releaseSpan(ctx, l)
		tel.countCommands(rctx, 1)
		tel.endLease(l, time.Since(start), "", nil)
		endSpan(rspan, nil)
	}
}

// BenchmarkContentionLocal: G goroutines share one Client and one key.
// They queue in the Client; each Unlock hands the hold to the next in one
// command. One op is one acquisition.
func BenchmarkContentionLocal(b *testing.B) {
	for _, g := range []int{8, 64} {
		b.Run(fmt.Sprintf("G=%d", g), func(b *testing.B) {
			c := newClient(b, newColl(b))
			mark := commands.total.Load()
			b.ResetTimer()
			contend(b, slices.Repeat([]*Client{c}, g), func(time.Duration) {})
			b.StopTimer()
			reportCommands(b, mark, b.N)
		})
	}
}

// contend runs one goroutine per entry of clients, each with its own Mutex
// for the key "k", until b.N acquisitions in all; held runs inside each
// hold, told how long its Lock took.
func contend(b *testing.B, clients []*Client, held func(waited time.Duration)) {
	ctx := context.Background()
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			m := c.NewMutex("k")
			for left.Add(-1) >= 0 {
				start := time.Now()
				if err := m.Lock(ctx); err != nil {
					b.Error(err)
					return
				}
				held(time.Since(start))
				if err := m.Unlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkContentionClients: C separate Clients (as separate processes
// would be) on one key, at the default backoff bounds and at a shorter and
// a longer pair, the curves the defaults were chosen from. Reports
// acquisitions per second, commands per acquisition, the handoff latency
// (from a call to Unlock to the return of the next Lock, in any Client) and
// how long a Lock waits (p99: how fair the polling is).
func BenchmarkContentionClients(b *testing.B) {
	bounds := []struct{ min, max time.Duration }{
		{time.Millisecond, 25 * time.Millisecond},
		{DefaultMinBackoff, DefaultMaxBackoff},
		{20 * time.Millisecond, time.Second},
	}
	for _, n := range []int{2, 8} {
		for _, bo := range bounds {
			b.Run(fmt.Sprintf("C=%d/backoff=%v-%v", n, bo.min, bo.max), func(b *testing.B) {
				benchContentionClients(b, n, WithBackoff(bo.min, bo.max))
			})
		}
	}
}

func benchContentionClients(b *testing.B, n int, opts ...Option) {
	coll := newColl(b)
	clients := make([]*Client, n)
	for i := range clients {
		clients[i] = newClient(b, coll, opts...)
	}
	var unlocking time.Time // when the last holder called Unlock
	var handoffs, waits []time.Duration
	mark := commands.total.Load()
	start := time.Now()
	b.ResetTimer()
	var mu sync.Mutex // dlock excludes, but the race detector cannot see it through the server
	contend(b, clients, func(waited time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if !unlocking.IsZero() {
			handoffs = append(handoffs, time.Since(unlocking))
		}
		waits = append(waits, waited)
		unlocking = time.Now()
	})
	b.StopTimer()
	reportCommands(b, mark, b.N)
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "acq/s")
	reportQuantile(b, handoffs, 50, "handoff-p50-ms")
	reportQuantile(b, handoffs, 99, "handoff-p99-ms")
	reportQuantile(b, waits, 99, "wait-p99-ms")
}

// reportQuantile reports the q-th percentile of ds, in milliseconds.
func reportQuantile(b *testing.B, ds []time.Duration, q int, unit string) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)*q/100].Microseconds())/1000, unit)
}

// BenchmarkManyLeases: one Client holds N leases. One op is one extension
// cadence, a round that extends all N: it reports the commands the round
// cost, heap bytes per held lease, and the process's CPU time per round.
// Against server=ack (ackserver_test.go, in this process) the figures are
// the Client's own; against server=test they are end to end. The embedded
// FerretDB scans the collection for each conditional write (it uses its _id
// index only for a filter on _id alone: 28 ms a write at 1,000 documents),
// so there a round costs O(N²) and it runs N=100; with MONGODB_URI set,
// server=test runs N=1000 and N=10000 too.
func BenchmarkManyLeases(b *testing.B) {
	type run struct {
		n   int
		ack bool
	}
	runs := []run{{100, false}, {1000, true}, {10000, true}}
	if externalServer {
		runs = append(runs, run{1000, false}, run{10000, false})
	}
	for _, r := range runs {
		server := map[bool]string{false: "test", true: "ack"}[r.ack]
		b.Run(fmt.Sprintf("N=%d/server=%s", r.n, server), func(b *testing.B) {
			benchManyLeases(b, r.n, r.ack)
		})
	}
}

func benchManyLeases(b *testing.B, n int, ack bool) {
	ctx := context.Background()
	var coll *mongo.Collection
	if ack {
		coll = newAckClient(b)
	} else {
		coll = newColl(b)
		// Lock documents made beforehand: a first insert costs far more than
		// an update on this server, and is not what is measured here.
		docs := make([]any, n)
		for i := range docs {
			docs[i] = bson.D{{Key: "_id", Value: fmt.Sprint("lease-", i)}, {Key: fOwner, Value: ""}, {Key: fToken, Value: int64(0)}, {Key: fRev, Value: int64(0)}}
		}
		if _, err := coll.InsertMany(ctx, docs); err != nil {
			b.Fatal(err)
		}
	}
	rounds := make(chan extendRound, 1)
	f := &faultyStore{onExtend: func(r extendRound) {
		if r.leases == n {
			select {
			case rounds <- r:
			default:
			}
		}
	}}
	c := newClient(b, coll, WithTTL(5*time.Minute), WithExtendInterval(time.Second), withFaults(f))
	mutexes := make([]*Mutex, n)
	for i := range mutexes {
		mutexes[i] = c.NewMutex(fmt.Sprint("lease-", i))
		if err := mutexes[i].Lock(ctx); err != nil {
			b.Fatal(err)
		}
	}
	commands.forgetLast()
	holding := liveHeap()
	<-rounds // leases taken over a while have fallen into step
	var cmds int64
	cpu0 := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		r := <-rounds
		if r.err != nil {
			b.Fatal(r.err)
		}
		cmds += r.commands
	}
	b.StopTimer()
	b.ReportMetric(float64(cmds)/float64(b.N), "cmds/op")
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N)/1000, "cpu-ms/op")
	for _, m := range mutexes {
		if m.Lease() == nil {
			b.Fatal("a lease was lost")
		}
	}
	// The heap a held lease costs, with its Mutex: what closing the Client
	// and dropping the Mutexes frees. (A difference from before the Locks
	// would also count garbage that earlier runs left to this one.)
	c.Close(ctx)
	mutexes = nil
	commands.forgetLast()
	b.ReportMetric(float64(holding-liveHeap())/float64(n), "heap-B/lease")
}

// liveHeap returns the bytes of live heap objects. It collects twice: the
// first collection runs the finalizers of garbage left behind (connections,
// files), the second frees what they held.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
