package dlock

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// BenchmarkManyKeys: one Client holds K keys, a Mutex each, and another
// Client's K goroutines wait, one for each key (a worker pool whose
// entities are busy elsewhere). It reports the waiting Client's commands a
// second from 2 s to 12 s into the holds (cmds/s); then the holder frees
// the keys one by one, 20 ms apart, and it reports how long each waiter
// took to return from Lock after its key's Unlock was called
// (freed-p50-ms, freed-p99-ms; the bound for a key that stood still a TTL
// is a quarter TTL).
//
// Rows: server=memory, real Clients on the in-memory store under
// testing/synctest, each command a round trip of scaleRTT away, in virtual
// time (K = 20, 200, 2000); server=embedded, the test server (or
// MONGODB_URI), commands counted by a driver command monitor, in real
// time (K = 20, 100: the test server applies one command at a time and
// slows as keys accumulate). Variants: after, as shipped (the watcher:
// watcher.go); before, without the watcher (each wait reads alone).
func BenchmarkManyKeys(b *testing.B) {
	variants := []struct {
		name string
		opts []Option
	}{{"after", nil}, {"before", []Option{withPacer(withoutRule{ruleWatch})}}}
	for _, k := range []int{20, 200, 2000} {
		for _, v := range variants {
			b.Run(fmt.Sprintf("server=memory/keys=%d/variant=%s", k, v.name), func(b *testing.B) {
				var m manyKeysResult
				inBubble(b, func(t *testing.T) {
					var held, waiting scaleCounts
					st := newMemStore()
					holder := manyKeysClient(t, st, &held, nil)
					waiter := manyKeysClient(t, st, &waiting, v.opts)
					m = runManyKeys(t, k, holder, waiter, func() int64 { return waiting.all.Load() }, &waiting)
				})
				m.report(b, k)
			})
		}
	}
	for _, k := range []int{20, 100} {
		for _, v := range variants {
			b.Run(fmt.Sprintf("server=embedded/keys=%d/variant=%s", k, v.name), func(b *testing.B) {
				coll := newColl(b)
				var n atomic.Int64
				var mu sync.Mutex
				byName := map[string]int{} // the waiting Client's commands by name
				mc, err := mongo.Connect(options.Client().ApplyURI(testURI).SetMonitor(&event.CommandMonitor{
					Started: func(_ context.Context, e *event.CommandStartedEvent) {
						n.Add(1)
						mu.Lock()
						byName[e.CommandName]++
						mu.Unlock()
					},
				}))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { mc.Disconnect(context.Background()) })
				holder := newClient(b, coll)
				waiter := newClient(b, mc.Database(testDB.Name()).Collection(coll.Name()), v.opts...)
				var marks []map[string]int // byName when sent is called: 2 s and 12 s into the holds
				sent := func() int64 {
					mu.Lock()
					marks = append(marks, maps.Clone(byName))
					mu.Unlock()
					return n.Load()
				}
				runManyKeys(b, k, holder, waiter, sent, nil).report(b, k)
				var sb strings.Builder
				for _, name := range slices.Sorted(maps.Keys(marks[1])) {
					if d := marks[1][name] - marks[0][name]; d > 0 {
						fmt.Fprintf(&sb, " %s %.2f", name, float64(d)/10)
					}
				}
				b.Logf("the waiting Client's commands a second, 2 s to 12 s into the holds:%s", sb.String())
			})
		}
	}
}

// manyKeysClient returns a Client on st whose commands counts counts.
func manyKeysClient(t *testing.T, st *memStore, counts *scaleCounts, opts []Option) *Client {
	link := &scaleLink{st: st, rtt: scaleRTT, n: counts}
	c, err := newClientOn(func(*telemetry) store { return link }, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// manyKeysResult is what a row of BenchmarkManyKeys measured.
type manyKeysResult struct {
	rate     float64 // the waiting Client's commands a second, 2 s to 12 s into the holds
	p50, p99 float64 // release to take, milliseconds
	kinds    string  // the commands by kind, when counted so
}

func (m manyKeysResult) report(b *testing.B, k int) {
	b.ReportMetric(m.rate, "cmds/s")
	b.ReportMetric(m.p50, "freed-p50-ms")
	b.ReportMetric(m.p99, "freed-p99-ms")
	b.Logf("| %d | %.2f | %.0f / %.0f ms | %s", k, m.rate, m.p50, m.p99, m.kinds)
}

// runManyKeys runs one row of BenchmarkManyKeys: holder takes k keys,
// waiter waits for each; sent returns how many commands waiter sent, and
// counts, when not nil, counts them by kind.
func runManyKeys(t testing.TB, k int, holder, waiter *Client, sent func() int64, counts *scaleCounts) manyKeysResult {
	ctx := context.Background()
	keys := make([]string, k)
	holds := make([]*Mutex, k)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%04d", i)
		holds[i] = holder.NewMutex(keys[i])
		if err := holds[i].Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	freed := make([]time.Time, k) // when each key's Unlock was called
	taken := make([]time.Time, k) // when its waiter's Lock returned
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() {
			m := waiter.NewMutex(key)
			if err := m.Lock(ctx); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			taken[i] = time.Now()
			mu.Unlock()
			if err := m.Unlock(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	time.Sleep(2*time.Second - time.Since(start))
	from := sent()
	var mark scaleMark
	if counts != nil {
		mark = counts.mark(0)
	}
	time.Sleep(12*time.Second - time.Since(start))
	rate := float64(sent()-from) / 10
	kinds := ""
	if counts != nil {
		kinds = counts.mark(0).sub(mark).byKind(10, "/s")
	}
	for i, m := range holds {
		mu.Lock()
		freed[i] = time.Now()
		mu.Unlock()
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	lat := make([]float64, k)
	for i := range keys {
		lat[i] = float64(taken[i].Sub(freed[i])) / float64(time.Millisecond)
	}
	slices.Sort(lat)
	return manyKeysResult{rate, lat[k/2], lat[min(k-1, k*99/100)], kinds}
}

// BenchmarkWatchedKey reports what a wait wanting a view costs the
// watcher while it sleeps (B/key: the Go heap live after a collection,
// per want, for 10,000 waits of distinct keys).
func BenchmarkWatchedKey(b *testing.B) {
	const n = 10000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%05d", i)
	}
	var w watcher
	rounds := make([]*round, n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i, k := range keys {
		rounds[i] = w.want(k)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/key")
	for i, k := range keys {
		w.drop(k, rounds[i])
	}
}
