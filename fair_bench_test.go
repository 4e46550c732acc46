package dlock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// BenchmarkFairness measures how fairly separate Clients (as separate
// processes would be) share one key. Each Client loops Lock, a
// hold (a sleep stands for the work), Unlock, on the key "k", for a fixed
// wall time. A row is not driven by b.N: it runs its scenario once per
// call, whatever b.N is, so its ns/op is the row's wall time and the
// intended use is -benchtime 1x:
//
//	go test -run '^$' -bench Fairness -benchtime 1x -v
//
// The rows named hold=H-random draw each hold at random (exponential, of the
// mean the row names), which no pacing can foresee.
//
// The environment variable DLOCK_FAIR_SCALE (a positive number, default 1)
// multiplies every row's duration, not its hold: 0.1 makes a smoke run.
// DLOCK_FAIR_TRACE=1 prints every store operation of the rows' Clients to
// standard error as it returns: when it was sent and answered (ms since
// the row began building its Clients), the Client, the operation, and the token
// counter, holder, waiters and queue counter of the record it returned, or
// its error (a trace slows each command by a write to standard error).
//
// Each row runs on two servers: server=embedded, the test server, and
// server=memory, the in-memory store (which applies commands
// concurrently) a simulated round trip away (fairRTT); and with each of
// fairVariants: variant=before, dlock before fair queueing
// (withFlaw(flawUnfair)), where every poll races; variant=backoff, fair
// queueing on plain backoff, every pacing rule off; variant=after, as
// shipped; and variant=no-<rule>, as shipped with that rule off, which
// is how docs/fairness.md prices each rule. Pick with -bench, for example
// -bench 'Fairness/server=memory/.*/variant=(after|backoff)$'. Besides
// the metrics (see runFairness), each row logs one line of a markdown
// table; the header is logged first.
func BenchmarkFairness(b *testing.B) {
	scale := 1.0
	if s := os.Getenv("DLOCK_FAIR_SCALE"); s != "" {
		var err error
		if scale, err = strconv.ParseFloat(s, 64); err != nil || !(scale > 0) {
			b.Fatalf("DLOCK_FAIR_SCALE=%q: want a positive number", s)
		}
	}
	b.Logf("| server | clients, hold | variant | acq/s | same %% | per client min–max | wait p50 / p99 / max | cmds/acq | after first round |")
	b.Logf("|---|---|---|--:|--:|--:|--:|--:|--:|")
	for _, server := range []string{"embedded", "memory"} {
		for _, r := range []fairRow{
			{clients: 2, hold: time.Millisecond, dur: 10 * time.Second},
			{clients: 8, hold: time.Millisecond, dur: 10 * time.Second},
			{clients: 8, hold: 20 * time.Millisecond, dur: 10 * time.Second},
			{clients: 2, hold: 300 * time.Millisecond, dur: 10 * time.Second},
			{clients: 2, hold: 3 * time.Second, ttl: 2 * time.Second, dur: 12 * time.Second},
			// How cost and latency grow with the number of waiters.
			{clients: 4, hold: 20 * time.Millisecond, dur: 16 * time.Second},
			{clients: 16, hold: 20 * time.Millisecond, dur: 16 * time.Second},
			{clients: 48, hold: 20 * time.Millisecond, dur: 16 * time.Second},
			{clients: 4, hold: 20 * time.Millisecond, random: true, dur: 16 * time.Second},
			{clients: 16, hold: 20 * time.Millisecond, random: true, dur: 16 * time.Second},
			{clients: 48, hold: 20 * time.Millisecond, random: true, dur: 16 * time.Second},
			{clients: 4, hold: 250 * time.Millisecond, dur: 16 * time.Second},
			{clients: 16, hold: 250 * time.Millisecond, dur: 16 * time.Second},
			{clients: 48, hold: 250 * time.Millisecond, dur: 16 * time.Second},
		} {
			r.dur, r.server = time.Duration(float64(r.dur)*scale), server
			for _, v := range fairVariants() {
				opts := slices.Clone(v.opts)
				if r.ttl != 0 {
					opts = append(opts, WithTTL(r.ttl))
				}
				b.Run("server="+server+"/"+r.name()+"/variant="+v.name, func(b *testing.B) {
					runFairness(b, r, v.name, opts...)
				})
			}
		}
	}
}

// fairVariants are the Clients each row of BenchmarkFairness runs: before
// fair queueing (every poll races), fair queueing on plain backoff, as
// shipped (after), and as shipped with one pacing rule switched off.
func fairVariants() []struct {
	name string
	opts []Option
} {
	vs := []struct {
		name string
		opts []Option
	}{
		{"before", []Option{withFlaw(flawUnfair)}},
		{"backoff", []Option{withPacer(backoffPacer{})}},
		{"after", nil},
	}
	for _, r := range namedRules {
		vs = append(vs, struct {
			name string
			opts []Option
		}{"no-" + r.name, []Option{withPacer(withoutRule{r.r})}})
	}
	return vs
}

// A fairRow is one row of BenchmarkFairness.
type fairRow struct {
	server  string        // "embedded": the test server; "memory": the in-memory store, a simulated round trip away (fairRTT)
	clients int           // separate Clients contending for the key
	hold    time.Duration // how long each acquisition holds the key
	ttl     time.Duration // WithTTL, when not 0
	random  bool          // each hold is drawn at random (holdTime), which no pacing can foresee
	dur     time.Duration // the row's wall time, scaled by DLOCK_FAIR_SCALE
}

// name returns the row's part of the sub-benchmark's name.
func (r fairRow) name() string {
	s := fmt.Sprintf("clients=%d/hold=%v", r.clients, r.hold)
	if r.ttl != 0 {
		s += fmt.Sprintf("/ttl=%v", r.ttl)
	}
	if r.random {
		s += "-random"
	}
	return s
}

// label returns the row's first cell in the markdown table.
func (r fairRow) label() string {
	s := fmt.Sprintf("%d, %v", r.clients, r.hold)
	if r.random {
		s += " random"
	}
	if r.ttl != 0 {
		s += fmt.Sprintf(" (ttl %v)", r.ttl)
	}
	return s
}

// A fairAcq is one acquisition: the index of the Client that made it, how
// long its Lock call took, from the call to its return, and the commands
// sent to the server (by any Client) from the row's start to that return.
type fairAcq struct {
	client int
	waited time.Duration
	cmds   int64
}

// runFairness runs one row: r.clients Clients, built with opts on one
// collection, each in a goroutine of its own, take turns at the key until
// r.dur has passed. Then a Lock still waiting is cancelled (not an error,
// not counted) and a hold in progress ends early; it returns once every
// goroutine has unlocked and returned. It reports acquisitions per second
// and the commands each cost; the acquisitions of the least and the most
// served Client (acq-min, acq-max), and as a multiple of the mean
// (share-min-x, share-max-x); how often the key went to the Client that
// had it last (same-pct: of the acquisitions after the first, the percent
// made by the previous acquisition's Client); and how long Lock waited.
func runFairness(b *testing.B, r fairRow, variant string, opts ...Option) {
	var ops opCounts
	tr := newFairTrace()
	clients := make([]*Client, r.clients)
	floor := fairRTT
	var since func(mark int64) int64 // commands since mark
	if r.server == "memory" {
		st := newMemStore()
		for i := range clients {
			c, err := newClientOn(func(*telemetry) store {
				return &countingStore{store: slowStore{st, fairRTT}, n: &ops, client: i, trace: tr}
			}, opts...)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close(context.Background()) })
			clients[i] = c
		}
		since = func(mark int64) int64 { return ops.total() - mark }
	} else {
		coll := newColl(b)
		floor = floorRTT(b, coll)
		for i := range clients {
			wrap := withStoreWrapper(func(s store) store { return &countingStore{store: s, n: &ops, client: i, trace: tr} })
			clients[i] = newClient(b, coll, append(slices.Clip(opts), wrap)...)
		}
		since = commands.since
	}
	var (
		mu   sync.Mutex
		acqs []fairAcq // guarded by mu; appended while the key is held, so in the order Lock returned
	)
	mark := since(0)
	b.ResetTimer()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), r.dur)
	defer cancel()
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			m := c.NewMutex("k")
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			for ctx.Err() == nil {
				called := time.Now()
				if err := m.Lock(ctx); err != nil {
					if ctx.Err() == nil || !errors.Is(err, ctx.Err()) {
						b.Error(err)
					}
					return
				}
				waited := time.Since(called)
				mu.Lock()
				acqs = append(acqs, fairAcq{client: i, waited: waited, cmds: since(mark)})
				mu.Unlock()
				select {
				case <-time.After(holdTime(rng, r.hold, r.random)):
				case <-ctx.Done(): // the row's time is up: end the hold now
				}
				if err := m.Unlock(context.WithoutCancel(ctx)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	wall := time.Since(start)
	b.StopTimer()
	cmds := since(mark)

	n := len(acqs)
	if n == 0 {
		b.Fatal("no acquisitions")
	}
	counts := make([]int, r.clients)
	waits := make([]time.Duration, n)
	same := 0
	for j, a := range acqs {
		counts[a.client]++
		waits[j] = a.waited
		if j > 0 && a.client == acqs[j-1].client {
			same++
		}
	}
	samePct := 0.0
	if n > 1 {
		samePct = 100 * float64(same) / float64(n-1)
	}
	slices.Sort(waits)
	mean := float64(n) / float64(r.clients)
	lo, hi := slices.Min(counts), slices.Max(counts)
	p50, p99, longest := fairMs(fairPercentile(waits, 50)), fairMs(fairPercentile(waits, 99)), fairMs(waits[n-1])
	acqPerSec, cmdsPerAcq := float64(n)/wall.Seconds(), float64(cmds)/float64(n)
	for _, m := range []struct {
		v    float64
		unit string
	}{
		{acqPerSec, "acq/s"}, {cmdsPerAcq, "cmds/acq"},
		{float64(lo), "acq-min"}, {float64(hi), "acq-max"},
		{float64(lo) / mean, "share-min-x"}, {float64(hi) / mean, "share-max-x"},
		{samePct, "same-pct"},
		{p50, "wait-p50-ms"}, {p99, "wait-p99-ms"}, {longest, "wait-max-ms"},
	} {
		b.ReportMetric(m.v, m.unit)
	}
	settled := afterFirstRound(acqs, r.clients, cmds)
	if settled >= 0 {
		b.ReportMetric(settled, "cmds/acq-settled")
	}
	b.Logf("| %s | %s | %s | %.1f | %.0f %% | %d–%d | %.1f / %.1f / %.1f ms | %.2f | %.2f |",
		r.server, r.label(), variant, acqPerSec, samePct, lo, hi, p50, p99, longest, cmdsPerAcq, settled)
	b.Logf("per acquisition: %s", strings.TrimSpace(ops.per(n)))
	b.Logf("commands by acquisition: %s", byAcquisition(acqs, cmds, 6))
	bound := 2 * time.Duration(r.clients) * (r.hold + 2*floor)
	b.Logf("wait bound 2 × %d × (%v + 2 × %v floor round trip) = %.1f ms (the target at 8 Clients / 20 ms): p99 %s, max %s (twice the bound: %.1f ms); %s",
		r.clients, r.hold, floor.Round(10*time.Microsecond), fairMs(bound), within(p99, bound), within(longest, 2*bound), fairMs(2*bound), overBound(acqs, bound))
}

// overBound says how many of acqs waited longer than bound, and where in
// the run they are: the p99 allows one in a hundred, and a late hand-over
// puts the waits of a round of Clients over together, so the indexes tell
// the start (the first rounds) from a slow stretch later.
func overBound(acqs []fairAcq, bound time.Duration) string {
	var over []int
	for j, a := range acqs {
		if a.waited > bound {
			over = append(over, j)
		}
	}
	if len(over) == 0 {
		return fmt.Sprintf("no wait of %d over it", len(acqs))
	}
	return fmt.Sprintf("%d waits of %d over it, the acquisitions numbered %d to %d", len(over), len(acqs), over[0], over[len(over)-1])
}

// afterFirstRound returns the commands per acquisition once every one of
// the row's clients has acquired the key at least once: the commands sent
// after that acquisition, the Unlocks at the row's end included, over the
// acquisitions after it (-1 when there are none). It leaves out the key's
// creation and each Client's first wait, whose polls know nothing yet of
// how long others hold the key.
func afterFirstRound(acqs []fairAcq, clients int, cmds int64) float64 {
	seen := make(map[int]bool, clients)
	for j, a := range acqs {
		seen[a.client] = true
		if len(seen) == clients {
			if rest := len(acqs) - j - 1; rest > 0 {
				return float64(cmds-a.cmds) / float64(rest)
			}
			break
		}
	}
	return -1
}

// byAcquisition says how many commands each of the first acquisitions of
// acqs cost (the commands of every Client sent after the acquisition
// before it returned, up to its own return), their sum, and the commands
// an acquisition after them, to cmds, the row's end included: where the
// start's cost lies, which a row of a few dozen acquisitions (2 Clients
// holding 300 ms) weighs heavily.
func byAcquisition(acqs []fairAcq, cmds int64, first int) string {
	first = min(first, len(acqs))
	var sb strings.Builder
	prev := int64(0)
	for j := range first {
		if j > 0 {
			sb.WriteString(" + ")
		}
		fmt.Fprintf(&sb, "%d", acqs[j].cmds-prev)
		prev = acqs[j].cmds
	}
	fmt.Fprintf(&sb, " = %d for the first %d", prev, first)
	if rest := len(acqs) - first; rest > 0 {
		fmt.Fprintf(&sb, "; %.2f an acquisition after them (%d acquisitions)", float64(cmds-prev)/float64(rest), rest)
	}
	return sb.String()
}

// within says whether ms milliseconds is at most bound.
func within(ms float64, bound time.Duration) string {
	if ms <= fairMs(bound) {
		return "within"
	}
	return "OVER"
}

// fairRTT is the memory server's round trip (slowStore).
const fairRTT = time.Millisecond

// floorRTT is the floor of a round trip to the server for a lock write: the
// median of 50 findOneAndUpdate upserts of one document by the raw driver,
// one at a time, before the row's Clients start, after 50 more that warm
// the server up. (Measured: on a server started for the row, the first 50
// took 1.8 and 2.0 ms, the next 50 1.3 and 1.4; the bound, 32 floors of
// slack at 8 Clients, came out 15 to 20 ms looser for a row run alone than
// for the same row later in a run.)
func floorRTT(b *testing.B, coll *mongo.Collection) time.Duration {
	ctx := context.Background()
	rtts := make([]time.Duration, 100)
	for i := range rtts {
		sent := time.Now()
		err := coll.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: "floor-rtt"}},
			bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}, options.FindOneAndUpdate().SetUpsert(true)).Err()
		if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
			b.Fatal(err)
		}
		rtts[i] = time.Since(sent)
	}
	rtts = rtts[len(rtts)/2:] // the warm half
	slices.Sort(rtts)
	return rtts[len(rtts)/2]
}

// opCounts counts a row's store operations by kind, to show where its
// commands go: an acquire that took the key (acq-ok) or found it held
// (acq-held), a registration, a read, a release or handoff, an extension,
// a reap, and the rest.
type opCounts struct {
	mu sync.Mutex
	n  map[string]int           // guarded by mu
	d  map[string]time.Duration // guarded by mu: the operations' round trips, summed
}

func (o *opCounts) add(op string) { o.took(op, 0) }

// total returns how many operations were counted.
func (o *opCounts) total() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, v := range o.n {
		n += v
	}
	return int64(n)
}

func (o *opCounts) took(op string, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n, o.d = map[string]int{}, map[string]time.Duration{}
	}
	o.n[op]++
	o.d[op] += d
}

// per returns the counts divided by acquisitions, in a line.
func (o *opCounts) per(acqs int) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	keys := slices.Sorted(maps.Keys(o.n))
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "%s %.2f (%.2f ms)  ", k, float64(o.n[k])/float64(acqs), fairMs(o.d[k]/time.Duration(o.n[k])))
	}
	return sb.String()
}

// A countingStore counts the operations of the store it wraps in n, and
// traces them when trace is not nil.
type countingStore struct {
	store
	n      *opCounts
	client int        // the Client's index in its row
	trace  *fairTrace // nil: no trace
}

// A fairTrace prints store operations to standard error: see
// BenchmarkFairness (DLOCK_FAIR_TRACE).
type fairTrace struct {
	mu    sync.Mutex // serialises the lines
	start time.Time
}

// newFairTrace returns a trace starting now if DLOCK_FAIR_TRACE is set,
// else nil.
func newFairTrace() *fairTrace {
	if os.Getenv("DLOCK_FAIR_TRACE") == "" {
		return nil
	}
	return &fairTrace{start: time.Now()}
}

// note traces an operation of the Client numbered client, sent at sent,
// that returned r and err.
func (t *fairTrace) note(client int, op string, sent time.Time, r record, err error) {
	if t == nil {
		return
	}
	answered := time.Now()
	out := fmt.Sprintf("tok=%d owner=%.8s waiters=%d queue=%d", r.Token, r.Owner, len(r.Waiters), r.Queue)
	if err != nil {
		out = "error: " + err.Error()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	fmt.Fprintf(os.Stderr, "trace %9.1f %9.1f c%d %-9s %s\n", fairMs(sent.Sub(t.start)), fairMs(answered.Sub(t.start)), client, op, out)
}

func (s *countingStore) acquire(ctx context.Context, a attempt, takeover stamp) (record, error) {
	sent := time.Now()
	r, err := s.store.acquire(ctx, a, takeover)
	switch {
	case err == nil:
		s.n.took("acq-ok", time.Since(sent))
	case errors.Is(err, errHeld):
		s.n.took("acq-held", time.Since(sent))
	default:
		s.n.took("acq-err", time.Since(sent))
	}
	s.trace.note(s.client, "acquire", sent, r, err)
	return r, err
}

func (s *countingStore) mark(ctx context.Context, ref leaseRef, sleep bool) (record, error) {
	s.n.add("mark")
	sent := time.Now()
	r, err := s.store.mark(ctx, ref, sleep)
	s.trace.note(s.client, "mark", sent, r, err)
	return r, err
}

func (s *countingStore) register(ctx context.Context, a attempt) (record, error) {
	s.n.add("register")
	s.n.add("register") // two writes (store.register)
	sent := time.Now()
	r, err := s.store.register(ctx, a)
	s.trace.note(s.client, "register", sent, r, err)
	return r, err
}

func (s *countingStore) readMany(ctx context.Context, keys []string) ([]record, error) {
	sent := time.Now()
	rs, err := s.store.readMany(ctx, keys)
	s.n.took("read-many", time.Since(sent))
	return rs, err
}

func (s *countingStore) read(ctx context.Context, key string) (record, error) {
	sent := time.Now()
	r, err := s.store.read(ctx, key)
	s.n.took("read", time.Since(sent))
	s.trace.note(s.client, "read", sent, r, err)
	return r, err
}

func (s *countingStore) release(ctx context.Context, ref leaseRef) error {
	sent := time.Now()
	err := s.store.release(ctx, ref)
	s.n.took("release", time.Since(sent))
	s.trace.note(s.client, "release", sent, record{}, err)
	return err
}

func (s *countingStore) requeue(ctx context.Context, ref leaseRef, next attempt) (record, error) {
	sent := time.Now()
	r, err := s.store.requeue(ctx, ref, next)
	if err != nil {
		s.n.took("requeue-failed", time.Since(sent))
	} else {
		s.n.took("requeue", time.Since(sent))
	}
	s.trace.note(s.client, "requeue", sent, r, err)
	return r, err
}

func (s *countingStore) handoff(ctx context.Context, ref leaseRef, next attempt) (record, error) {
	sent := time.Now()
	r, err := s.store.handoff(ctx, ref, next)
	s.n.took("handoff", time.Since(sent))
	s.trace.note(s.client, "handoff", sent, r, err)
	return r, err
}

func (s *countingStore) extend(ctx context.Context, refs []leaseRef) ([]bool, error) {
	s.n.add("extend")
	sent := time.Now()
	ok, err := s.store.extend(ctx, refs)
	s.trace.note(s.client, "extend", sent, record{}, err)
	return ok, err
}

func (s *countingStore) reap(ctx context.Context, key string, at stamp, stale []staleEntry) (bool, error) {
	s.n.add("reap")
	sent := time.Now()
	ok, err := s.store.reap(ctx, key, at, stale)
	s.trace.note(s.client, "reap", sent, record{}, err)
	return ok, err
}

// fairPercentile returns the q-th percentile of sorted, by nearest rank as
// reportQuantile takes it.
func fairPercentile(sorted []time.Duration, q int) time.Duration {
	return sorted[min(len(sorted)*q/100, len(sorted)-1)]
}

// fairMs returns d in milliseconds, to the microsecond.
func fairMs(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
