package dlock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// BenchmarkScale measures how the cost of waiting grows with the number of
// waiters: C separate Clients (as C processes would be, each with its own
// link to the server) on one in-memory store, inside a testing/synctest
// bubble, so that time is virtual and a row of many simulated minutes runs
// in seconds. Every command waits half of scaleRTT (1 ms) on its way to the
// store and half on its way back, and is counted at the link when sent: all
// commands, the registrations' upkeep included. A row is not driven by b.N:
// it runs once per call, whatever b.N is, so its ns/op is the row's real
// time and the intended use is -benchtime 1x:
//
//	go test -run '^$' -bench Scale -benchtime 1x -v .
//
// The loop rows (clients=C/hold=H) run C Clients, each looping Lock, a hold
// of H (a sleep in the bubble stands for the work), Unlock on the key "k",
// with the default options, for a simulated duration long enough for a few
// turns of every Client, but capped for 256 Clients and more (scaleMaxDur);
// a row whose cap leaves room for fewer than scaleMinHolds holds (1024
// Clients holding 5 s) is skipped, with the reason logged. The rows of
// 20 ms and 250 ms holds run again with each hold drawn at random
// (clients=C/hold=H-random: exponential, of mean H), which no pacing can
// foresee. The idle rows
// (idle/P/clients=C, for P mutex, election, semaphore and rwmutex) run one
// Client that holds the key (a Semaphore's one permit) for the whole row
// while the C−1 others wait in Mutex.Lock, Election.Campaign,
// Semaphore.Acquire or RWMutex.Lock (C = 2: a lone waiter, the commonest
// contention), with the default TTL and backoff: the cost of waiting
// while nothing changes hands, from 2 s to 12 s into the hold (before the
// key stood still a TTL), in the row's second half, and over all of it. Each row reports metrics
// (see runScaleLoop and runScaleIdle) and logs one line of a markdown table,
// whose header is logged before the first row of its kind; and it logs what
// its commands were. The environment variable DLOCK_SCALE_TIME (a positive
// number, default 1) multiplies every row's simulated duration: 0.1 makes a
// smoke run. DLOCK_SCALE_WITHOUT names a pacing rule to switch off (keep,
// requeue, turn-plan, head-plan, period, sleep or age), to price it at scale.
//
// It also logs the bytes one registration adds to a key's document in
// MongoDB's encoding (scaleRegistrationBytes).
func BenchmarkScale(b *testing.B) {
	stretch := 1.0
	if s := os.Getenv("DLOCK_SCALE_TIME"); s != "" {
		var err error
		if stretch, err = strconv.ParseFloat(s, 64); err != nil || !(stretch > 0) {
			b.Fatalf("DLOCK_SCALE_TIME=%q: want a positive number", s)
		}
	}
	for _, l := range scaleRegistrationBytes() {
		b.Log(l)
	}
	b.Logf("| clients | hold | simulated | turns/client | cmds/acq | 2nd half | cmds/s/waiter in holds | acq/s × (hold+RTT) | wait p50 / FIFO | wait p99 / FIFO | share min–max |")
	b.Logf("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, c := range []int{4, 16, 64, 256, 1024} {
		for _, hold := range []time.Duration{time.Millisecond, 20 * time.Millisecond, 250 * time.Millisecond, 5 * time.Second} {
			rows := []scaleRow{{clients: c, hold: hold}}
			if hold == 20*time.Millisecond || hold == 250*time.Millisecond {
				rows = append(rows, scaleRow{clients: c, hold: hold, random: true})
			}
			for _, r := range rows {
				r.dur, r.capped = r.duration(stretch)
				b.Run(r.name(), func(b *testing.B) {
					if r.dur < scaleMinHolds*hold {
						b.Logf("| %d | %s | skipped: %s fits fewer than %d holds |%s", c, r.holdLabel(), scaleDur(r.dur), scaleMinHolds, strings.Repeat(" |", 8))
						b.Skipf("%v of simulated time, the most for %d Clients, fits fewer than %d holds of %v; the idle rows measure waiting on a long hold", r.dur, c, scaleMinHolds, hold)
					}
					runScaleLoop(b, r)
				})
			}
		}
	}
	b.Logf("| primitive | waiting | simulated | cmds/s/waiter, 2–12 s | 2nd half | whole row | heap/waiter | stack/waiter |")
	b.Logf("|---|--:|--:|--:|--:|--:|--:|--:|")
	for _, prim := range []string{"mutex", "election", "semaphore", "rwmutex"} {
		for _, c := range []int{2, 48, 1024} {
			r := scaleRow{clients: c, dur: time.Duration(float64(min(scaleIdleDur, scaleMaxDur(c))) * stretch)}
			b.Run(fmt.Sprintf("idle/%s/clients=%d", prim, c), func(b *testing.B) {
				runScaleIdle(b, r, prim)
			})
		}
	}
}

// idleEarly are the times into an idle row's hold between which it counts
// the waiters' commands before the key has stood still for a TTL.
var idleEarly = [2]time.Duration{2 * time.Second, 12 * time.Second}

// scaleRTT is the simulated round trip of every command in BenchmarkScale.
const scaleRTT = time.Millisecond

// A loop row's simulated duration is enough for scaleTurns turns of every
// Client, each turn counted as its hold and three round trips, but at
// least scaleMinDur and at most scaleMaxDur; an idle row's is scaleIdleDur
// (six TTLs, so the registrations' upkeep runs in its second half), at
// most scaleMaxDur too. A loop row whose duration fits fewer than
// scaleMinHolds holds is skipped: its figures would be those of its first
// hand-overs.
const (
	scaleTurns    = 3
	scaleMinDur   = 10 * time.Second
	scaleIdleDur  = 6 * DefaultTTL
	scaleMinHolds = 10
)

// scaleMaxDur returns the longest simulated duration of a row of c
// Clients: 10 s × (1024/c)², at most 10 minutes, which keeps the whole
// benchmark to about four minutes of real time on a 2-core machine. A
// row's real time grows about as c² times its simulated duration: every
// waiter sends commands all along its wait, and every command carries the
// whole queue (the store copies the document, the Client scans its
// registrations). Measured: 10 s at 1024 Clients and 160 s at 256 take
// 25 to 35 s each.
func scaleMaxDur(c int) time.Duration {
	return min(10*time.Minute, 10*time.Second*time.Duration(1024*1024/(c*c)))
}

// A scaleRow is one row of BenchmarkScale.
type scaleRow struct {
	clients int
	hold    time.Duration // a loop row's hold; 0 in an idle row
	dur     time.Duration // simulated
	capped  bool          // dur is scaleMaxDur, short of scaleTurns turns for every Client
	random  bool          // each hold is drawn at random (exponential, of mean hold), which no pacing can foresee
}

// name returns the row's sub-benchmark name.
func (r scaleRow) name() string {
	s := fmt.Sprintf("clients=%d/hold=%v", r.clients, r.hold)
	if r.random {
		s += "-random"
	}
	return s
}

// holdLabel returns the row's hold for its line of the table.
func (r scaleRow) holdLabel() string {
	if r.random {
		return fmt.Sprintf("%v random", r.hold)
	}
	return r.hold.String()
}

// holdTime returns how long one hold lasts: r.hold, or in a random row an
// exponential draw of mean r.hold.
func holdTime(rng *rand.Rand, mean time.Duration, random bool) time.Duration {
	if !random {
		return mean
	}
	return time.Duration(rng.ExpFloat64() * float64(mean))
}

// duration returns the simulated duration of a loop row, multiplied by
// stretch, and whether it was capped at scaleMaxDur.
func (r scaleRow) duration(stretch float64) (time.Duration, bool) {
	d := max((time.Duration(scaleTurns*r.clients) * (r.hold + 3*scaleRTT)).Round(time.Second), scaleMinDur)
	d, capped := min(d, scaleMaxDur(r.clients)), d > scaleMaxDur(r.clients)
	return time.Duration(float64(d) * stretch), capped
}

// inBubble runs f in a synctest bubble (synctest.Test) on behalf of b, and
// fails b if f failed. synctest.Test wants a *testing.T, which a benchmark
// has not, so f runs as the one test of a testing.RunTests, which with -v
// prints its own "=== RUN bubble" and "--- PASS: bubble" lines. f runs once
// whatever -count or -cpu says (those repeat the benchmark instead).
func inBubble(b *testing.B, f func(t *testing.T)) {
	b.Helper()
	var ran bool
	ok := testing.RunTests(func(string, string) (bool, error) { return true, nil }, []testing.InternalTest{{
		Name: "bubble",
		F: func(t *testing.T) {
			if ran {
				t.SkipNow()
			}
			ran = true
			synctest.Test(t, f)
		},
	}})
	if !ok || !ran {
		b.Fatalf("the bubble failed (ran: %v): see its output above", ran)
	}
}

// The commands a scaleLink counts, by kind.
const (
	opAcquire = iota
	opHandoff
	opExtend
	opRelease
	opRequeue
	opSetData
	opReleaseAll
	opAbandon
	opFloor
	opIdle
	opRaiseFloor
	opRemove
	opRegister
	opMark
	opReap
	opRead
	opServerTime
	scaleOps
)

var scaleOpNames = [scaleOps]string{"acquire", "handoff", "extend", "release", "requeue", "setData", "releaseAll", "abandon", "floor", "idle", "raiseFloor", "remove", "register", "mark", "reap", "read", "serverTime"}

// scaleCounts counts the commands of a row's Clients: all of them, and by
// kind.
type scaleCounts struct {
	all  atomic.Int64           // every command sent
	kind [scaleOps]atomic.Int64 // the same by kind: opAcquire and the rest
}

// A scaleMark is a row's count of commands, all and by kind, and of
// acquisitions, at one time.
type scaleMark struct {
	cmds int64
	kind [scaleOps]int64
	acqs int
}

// mark returns the counts of commands now, with acqs acquisitions.
func (n *scaleCounts) mark(acqs int) scaleMark {
	m := scaleMark{cmds: n.all.Load(), acqs: acqs}
	for k := range n.kind {
		m.kind[k] = n.kind[k].Load()
	}
	return m
}

// sub returns the commands counted between o and m.
func (m scaleMark) sub(o scaleMark) scaleMark {
	m.cmds -= o.cmds
	for k := range m.kind {
		m.kind[k] -= o.kind[k]
	}
	m.acqs -= o.acqs
	return m
}

// byKind returns the commands of m by kind divided by per, in a line.
func (m scaleMark) byKind(per float64, unit string) string {
	var sb strings.Builder
	for k, v := range m.kind {
		if v != 0 {
			if sb.Len() > 0 {
				sb.WriteString(", ")
			}
			fmt.Fprintf(&sb, "%s %.3g", scaleOpNames[k], float64(v)/per)
		}
	}
	return sb.String() + unit
}

// A scaleLink is one Client's link to the memStore of a BenchmarkScale row:
// every command is counted when sent (in own and in the row's n), reaches
// the store half a round trip later and is answered half a round trip
// after that. It implements every method of store itself, so that no
// command goes uncounted.
type scaleLink struct {
	st  *memStore
	rtt time.Duration
	own atomic.Int64 // the commands this Client sent
	n   *scaleCounts // the row's
}

var _ store = (*scaleLink)(nil)

// send counts a command of kind op and waits for it to reach the store.
func (l *scaleLink) send(op int) {
	l.own.Add(1)
	l.n.all.Add(1)
	l.n.kind[op].Add(1)
	time.Sleep(l.rtt / 2)
}

// back waits for an answer to come back.
func (l *scaleLink) back() { time.Sleep(l.rtt - l.rtt/2) }

func (l *scaleLink) acquire(ctx context.Context, a attempt, takeover stamp) (record, error) {
	l.send(opAcquire)
	defer l.back()
	return l.st.acquire(ctx, a, takeover)
}

func (l *scaleLink) handoff(ctx context.Context, ref leaseRef, next attempt) (record, error) {
	l.send(opHandoff)
	defer l.back()
	return l.st.handoff(ctx, ref, next)
}

func (l *scaleLink) extend(ctx context.Context, refs []leaseRef) ([]bool, error) {
	l.send(opExtend)
	defer l.back()
	return l.st.extend(ctx, refs)
}

func (l *scaleLink) release(ctx context.Context, ref leaseRef) error {
	l.send(opRelease)
	defer l.back()
	return l.st.release(ctx, ref)
}

func (l *scaleLink) requeue(ctx context.Context, ref leaseRef, next attempt) (record, error) {
	l.send(opRequeue)
	defer l.back()
	return l.st.requeue(ctx, ref, next)
}

func (l *scaleLink) setData(ctx context.Context, ref leaseRef, data []byte) error {
	l.send(opSetData)
	defer l.back()
	return l.st.setData(ctx, ref, data)
}

func (l *scaleLink) releaseAll(ctx context.Context, refs []leaseRef) error {
	l.send(opReleaseAll)
	defer l.back()
	return l.st.releaseAll(ctx, refs)
}

func (l *scaleLink) abandon(ctx context.Context, a attempt) error {
	l.send(opAbandon)
	defer l.back()
	return l.st.abandon(ctx, a)
}

func (l *scaleLink) floor(ctx context.Context) (Token, error) {
	l.send(opFloor)
	defer l.back()
	return l.st.floor(ctx)
}

func (l *scaleLink) idle(ctx context.Context, cutoff time.Time, limit int) ([]idleRecord, error) {
	l.send(opIdle)
	defer l.back()
	return l.st.idle(ctx, cutoff, limit)
}

func (l *scaleLink) raiseFloor(ctx context.Context, t Token) error {
	l.send(opRaiseFloor)
	defer l.back()
	return l.st.raiseFloor(ctx, t)
}

func (l *scaleLink) remove(ctx context.Context, recs []idleRecord) (int, error) {
	l.send(opRemove)
	defer l.back()
	return l.st.remove(ctx, recs)
}

func (l *scaleLink) mark(ctx context.Context, ref leaseRef, sleep bool) (record, error) {
	l.send(opMark)
	defer l.back()
	return l.st.mark(ctx, ref, sleep)
}

func (l *scaleLink) register(ctx context.Context, a attempt) (record, error) {
	l.send(opRegister) // two writes (store.register): two round trips, counted as two
	l.back()
	l.send(opRegister)
	defer l.back()
	return l.st.register(ctx, a)
}

func (l *scaleLink) reap(ctx context.Context, key string, at stamp, stale []staleEntry) (bool, error) {
	l.send(opReap)
	defer l.back()
	return l.st.reap(ctx, key, at, stale)
}

func (l *scaleLink) readMany(ctx context.Context, keys []string) ([]record, error) {
	l.send(opRead)
	defer l.back()
	return l.st.readMany(ctx, keys)
}

func (l *scaleLink) read(ctx context.Context, key string) (record, error) {
	l.send(opRead)
	defer l.back()
	return l.st.read(ctx, key)
}

func (l *scaleLink) serverTime(ctx context.Context) (time.Time, bool, error) {
	l.send(opServerTime)
	defer l.back()
	return l.st.serverTime(ctx)
}

// scaleClients returns n Clients with default options, each on a
// scaleLink of its own to st, counted in counts; t's cleanup closes them.
// Call it inside a bubble.
func scaleClients(t *testing.T, st *memStore, n int, counts *scaleCounts) ([]*Client, []*scaleLink) {
	var opts []Option
	if off := os.Getenv("DLOCK_SCALE_WITHOUT"); off != "" {
		i := slices.IndexFunc(namedRules, func(r namedRule) bool { return r.name == off })
		if i < 0 {
			t.Fatalf("DLOCK_SCALE_WITHOUT=%q: no such rule", off)
		}
		opts = append(opts, withPacer(withoutRule{namedRules[i].r}))
	}
	clients, links := make([]*Client, n), make([]*scaleLink, n)
	for i := range clients {
		links[i] = &scaleLink{st: st, rtt: scaleRTT, n: counts}
		c, err := newClientOn(func(*telemetry) store { return links[i] }, opts...)
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = c
	}
	t.Cleanup(func() {
		for _, c := range clients {
			c.Close(context.Background())
		}
	})
	return clients, links
}

// runScaleLoop runs one loop row: r.clients Clients loop Lock, a hold of
// r.hold, Unlock on the key "k" for r.dur of simulated time, when the row
// is cut: Locks still waiting are cancelled and nothing after the cut is
// counted. It reports, of the commands the Clients sent (counted when
// sent): cmds/acq, over the whole row; cmds/acq-2nd-half, of the commands
// sent in the row's second half over the acquisitions made in it (the
// steady state); cmds/s/waiter-in-holds, the commands that Clients other
// than the holder sent while holds lasted, per second of hold and per
// waiting Client (r.clients−1); and of the acquisitions: acq-ratio, the
// acquisitions a second against 1/(hold + RTT), the most the key can
// change hands; wait-p50-x and wait-p99-x, the wait of a Lock, from its
// call to its return, against the FIFO limit (C−1)·(hold + 2·RTT);
// share-min-x and share-max-x, the acquisitions of the least and the most
// served Client against the mean; and turns/client, the acquisitions per
// Client. A wait still under way at the cut is not counted: in a row too
// short for every Client to take a turn, the waits are those of the
// Clients served first.
func runScaleLoop(b *testing.B, r scaleRow) {
	type acq struct {
		client int
		waited time.Duration
	}
	var (
		counts    scaleCounts
		mu        sync.Mutex
		acqs      []acq         // guarded by mu; in the order Lock returned
		held      time.Duration // guarded by mu: the holds that ended before the cut, summed
		inHolds   int64         // guarded by mu: the commands others sent during those holds
		mid, end  scaleMark     // written before the cut
		wallStart = time.Now()
	)
	inBubble(b, func(t *testing.T) {
		st := newMemStore()
		clients, links := scaleClients(t, st, r.clients, &counts)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		mark := func() scaleMark {
			mu.Lock()
			defer mu.Unlock()
			return counts.mark(len(acqs))
		}
		var wg sync.WaitGroup
		wg.Go(func() { // the row's clock: it cuts the row
			time.Sleep(r.dur / 2)
			mid = mark()
			time.Sleep(r.dur - r.dur/2)
			end = mark()
			cancel()
		})
		for i, c := range clients {
			wg.Go(func() {
				m := c.NewMutex("k")
				rng := rand.New(rand.NewPCG(uint64(i), 1))
				for {
					called := time.Now()
					if err := m.Lock(ctx); err != nil {
						if ctx.Err() == nil || !errors.Is(err, ctx.Err()) {
							t.Error(err)
						}
						return
					}
					got := time.Now()
					all0, own0 := counts.all.Load(), links[i].own.Load()
					mu.Lock()
					acqs = append(acqs, acq{client: i, waited: got.Sub(called)})
					mu.Unlock()
					time.Sleep(holdTime(rng, r.hold, r.random))
					if ctx.Err() == nil {
						others := counts.all.Load() - all0 - (links[i].own.Load() - own0)
						mu.Lock()
						held += time.Since(got)
						inHolds += others
						mu.Unlock()
					}
					if err := m.Unlock(context.WithoutCancel(ctx)); err != nil {
						t.Error(err)
						return
					}
					if ctx.Err() != nil {
						return
					}
				}
			})
		}
		wg.Wait()
	})
	wall := time.Since(wallStart)
	acqs = acqs[:end.acqs]
	if end.acqs == 0 {
		b.Fatal("no acquisitions")
	}
	n := end.acqs
	perClient := make([]int, r.clients)
	waits := make([]time.Duration, n)
	for j, a := range acqs {
		perClient[a.client]++
		waits[j] = a.waited
	}
	slices.Sort(waits)
	mean := float64(n) / float64(r.clients)
	fifo := time.Duration(r.clients-1) * (r.hold + 2*scaleRTT)
	turnRate := float64(n) / r.dur.Seconds() * (r.hold + scaleRTT).Seconds()
	waiterRate := 0.0
	if held > 0 {
		waiterRate = float64(inHolds) / held.Seconds() / float64(r.clients-1)
	}
	m := map[string]float64{
		"cmds/acq":               float64(end.cmds) / float64(n),
		"cmds/acq-2nd-half":      float64(end.cmds-mid.cmds) / float64(end.acqs-mid.acqs),
		"cmds/s/waiter-in-holds": waiterRate,
		"acq-ratio":              turnRate,
		"wait-p50-x":             float64(fairPercentile(waits, 50)) / float64(fifo),
		"wait-p99-x":             float64(fairPercentile(waits, 99)) / float64(fifo),
		"share-min-x":            float64(slices.Min(perClient)) / mean,
		"share-max-x":            float64(slices.Max(perClient)) / mean,
		"turns/client":           mean,
	}
	for unit, v := range m {
		b.ReportMetric(v, unit)
	}
	sim := scaleDur(r.dur)
	if r.capped {
		sim += " (capped)"
	}
	b.Logf("| %d | %s | %s | %.2f | %.2f | %.2f | %.2f | %.3f | %.2f | %.2f | %.2f–%.2f |",
		r.clients, r.holdLabel(), sim, mean, m["cmds/acq"], m["cmds/acq-2nd-half"], waiterRate, turnRate,
		m["wait-p50-x"], m["wait-p99-x"], m["share-min-x"], m["share-max-x"])
	b.Logf("%d acquisitions, %d commands to the cut; per acquisition: %s; FIFO limit %v; real time %v",
		n, end.cmds, end.byKind(float64(n), ""), fifo, wall.Round(time.Millisecond))
}

// runScaleIdle runs one idle row: one Client takes the key "k" (prim
// "mutex": Mutex.Lock; "election": Election.Campaign) and holds it for
// the whole row, r.dur of simulated time, while r.clients−1 others wait
// for it with the same call; then the waits are cancelled and the hold
// given back. It reports cmds/s/waiter, the commands the waiting Clients
// sent in the row's second half, per second and per waiting Client, and
// cmds/s/waiter-whole, the same over the whole row (their registrations
// included); and heap-B/waiter and stack-B/waiter, the Go heap live after
// a collection and the goroutine stacks in use at the row's middle, less
// what they were before the Clients were made, per waiting Client.
func runScaleIdle(b *testing.B, r scaleRow, prim string) {
	var (
		counts      scaleCounts // the waiting Clients' commands
		holding     scaleCounts // the holder's
		mid, end    scaleMark
		early       [2]scaleMark // at idleEarly's two times
		heap, stack float64
		goroutines  float64
		wallStart   = time.Now()
	)
	waiters := r.clients - 1
	inBubble(b, func(t *testing.T) {
		var before runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		goroutines0 := runtime.NumGoroutine()

		st := newMemStore()
		holder, _ := scaleClients(t, st, 1, &holding)
		clients, _ := scaleClients(t, st, waiters, &counts)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		take := func(c *Client, value string) (release func() error, err error) {
			var l *Lease
			switch prim {
			case "election":
				l, err = c.NewElection("k").Campaign(ctx, value)
			case "semaphore": // one permit: the others wait for it
				l, err = c.NewSemaphore("k", 1).Acquire(ctx)
			case "rwmutex":
				rw := c.NewRWMutex("k")
				if err := rw.Lock(ctx); err != nil {
					return nil, err
				}
				return func() error { return rw.Unlock(context.WithoutCancel(ctx)) }, nil
			default:
				m := c.NewMutex("k")
				if err := m.Lock(ctx); err != nil {
					return nil, err
				}
				return func() error { return m.Unlock(context.WithoutCancel(ctx)) }, nil
			}
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(context.WithoutCancel(ctx)) }, nil
		}
		release, err := take(holder[0], "holder")
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i, c := range clients {
			wg.Go(func() {
				release, err := take(c, fmt.Sprint("waiter ", i))
				switch {
				case err == nil:
					t.Errorf("waiter %d took the key", i)
					release()
				case ctx.Err() == nil || !errors.Is(err, ctx.Err()):
					t.Error(err)
				}
			})
		}
		time.Sleep(min(idleEarly[0], r.dur/2))
		early[0] = counts.mark(0)
		time.Sleep(min(idleEarly[1], r.dur/2) - min(idleEarly[0], r.dur/2))
		early[1] = counts.mark(0)
		time.Sleep(r.dur/2 - min(idleEarly[1], r.dur/2))
		mid = counts.mark(0)
		var at runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&at)
		heap = (float64(at.HeapAlloc) - float64(before.HeapAlloc)) / float64(waiters)
		stack = (float64(at.StackInuse) - float64(before.StackInuse)) / float64(waiters)
		goroutines = float64(runtime.NumGoroutine()-goroutines0) / float64(r.clients)
		time.Sleep(r.dur - r.dur/2)
		end = counts.mark(0)
		cancel()
		wg.Wait() // every wait has ended: the hold goes to no one
		if err := release(); err != nil {
			t.Error(err)
		}
	})
	wall := time.Since(wallStart)
	half := (r.dur - r.dur/2).Seconds() * float64(waiters)
	steady := float64(end.cmds-mid.cmds) / half
	whole := float64(end.cmds) / r.dur.Seconds() / float64(waiters)
	first := math.NaN() // from 2 s to 12 s into the hold: before the key stood still a TTL
	if r.dur/2 >= idleEarly[1] {
		first = float64(early[1].cmds-early[0].cmds) / (idleEarly[1] - idleEarly[0]).Seconds() / float64(waiters)
	}
	b.ReportMetric(steady, "cmds/s/waiter")
	b.ReportMetric(whole, "cmds/s/waiter-whole")
	b.ReportMetric(first, "cmds/s/waiter-2-12s")
	b.ReportMetric(heap, "heap-B/waiter")
	b.ReportMetric(stack, "stack-B/waiter")
	b.Logf("| %s | %d | %s | %.3f | %.3f | %.3f | %.1f KiB | %.1f KiB |", prim, waiters, scaleDur(r.dur), first, steady, whole, heap/1024, stack/1024)
	b.Logf("a waiting Client's commands a second in the second half: %s; over the whole row: %s; %.1f goroutines a Client at the middle; real time %v",
		end.sub(mid).byKind(half, "/s"), end.byKind(r.dur.Seconds()*float64(waiters), "/s"), goroutines, wall.Round(time.Millisecond))
}

// scaleDur formats a simulated duration for the table.
func scaleDur(d time.Duration) string {
	if d >= time.Minute && d%time.Minute == 0 {
		return fmt.Sprintf("%d min", d/time.Minute)
	}
	return d.Round(time.Millisecond).String()
}

// scaleRegistrationBytes returns lines that say how many bytes one
// registration adds to a key's document in MongoDB's encoding: the element
// w.<hold key> with its string value (waiterValue), for a Client of the
// default owner identity and for one with the longest label
// (MaxOwnerLen), measured as the difference of two encoded documents.
func scaleRegistrationBytes() []string {
	size := func(owner string, hold, q int64, epoch int64) int {
		without, err1 := bson.Marshal(bson.D{{Key: fW, Value: bson.D{}}})
		with, err2 := bson.Marshal(bson.D{{Key: fW, Value: bson.D{{Key: holdKey(owner, hold), Value: waiterValue(q, DefaultTTL, epoch)}}}})
		if err := errors.Join(err1, err2); err != nil {
			panic(err)
		}
		return len(with) - len(without)
	}
	const epoch = 1<<62 - 1 // 19 digits, as most epochs are (mongoStore.epoch)
	typical := size(identity(""), 99_999, 999_999_999, epoch)
	long := size(identity(strings.Repeat("x", MaxOwnerLen)), 1<<63-1, 1<<63-1, epoch)
	return []string{
		fmt.Sprintf("a registration adds %d bytes to its key's document with the default owner identity (a hold id of 5 digits, a queue number of 9, the default TTL, an epoch of 19); %d with an owner label of %d bytes and 19-digit hold id and queue number",
			typical, long, MaxOwnerLen),
	}
}
