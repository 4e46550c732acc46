package dlock

import (
	"cmp"
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
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

// The real Client under simulation: real Clients, Mutexes, Leases, the
// extender, the local queue, handoff, release and Close, on the in-memory
// store, inside a testing/synctest bubble (time is fake, so a run of
// minutes of simulated time takes milliseconds). rapid draws each run up
// front: 2 to 6 Clients with wall clocks hours apart running at rates
// within MaxClockDrift, per-request delays, lost requests and lost replies
// (the write applied, the reply lost), the server's clock stepped by
// hours, network partitions of a Client for up to three TTLs, holders
// paused between their check and their write for longer than the TTL,
// crashes without release, contexts that end mid-call, Close at a random
// moment, and Prune calls (after an Unlock, at random times, and by a
// janitor Client with a fault-free link) that delete the key's document. A checker watches every acquisition and every
// check-then-write, and every write the store applies, for a new holder
// that overtook a waiter registered in the key's queue; the run ends with
// a liveness probe; synctest itself fails a run that leaves a goroutine
// behind.

const (
	simClientTTL = 10 * time.Second
	simHorizon   = 2 * time.Minute // faults and work stop then
)

// netFault is what becomes of one request.
type netFault struct {
	up, down  time.Duration // delays before and after it applies
	lostReq   bool          // it never reaches the store
	lostReply bool          // it applies, its reply never comes
	// nextLife: a write of a hold is held back until the key's document
	// has been created anew (deleted by Prune) by an acquire of the same
	// Client, and lands then: a write from an earlier life of the key,
	// beside the Client's hold of the new one. One that no such life
	// meets before the horizon is lost.
	nextLife bool
}

// simLink is one Client's network to the store: each request takes the
// next fault of its list, in turn. A crashed link loses everything.
type simLink struct {
	st *memStore

	t0 time.Time

	mu      sync.Mutex
	cuts    [][2]time.Duration // guarded by mu: partitions, from and to (since t0)
	faults  []netFault         // guarded by mu
	next    int                // guarded by mu
	crashed bool               // guarded by mu
	late    bool               // guarded by mu: the next write of a hold is a nextLife fault
	// stale: each read of a key, alone or in a round of the Client's
	// watcher, is answered with what one of its last reads found (views
	// older than the wait's own writes since: a lagging replica), and seen
	// keeps those (simLink.lag).
	stale bool
	seen  map[string][]record // guarded by mu

	// Flawed stores (the store's writes, as the real code sends them,
	// made unconditional where they must not be).
	releaseAnyToken bool // release frees the key if the owner matches, whatever the token
	// namesByToken: the writes of an exclusive hold that wrote its base
	// name it by its owner and token rather than by its owner and hold
	// id, and so match a hold of a later life of the key whose raw
	// counter shows that token.
	namesByToken   bool
	abandonAnyHold bool // abandon frees the key if the owner matches, whatever the hold
	sharedJoinsRaw bool // a shared acquire joins a raw record that has a shared hold already
	// floorBeforeCreate: floor answers the floor as it was when this
	// link's last acquire was sent, before the acquire could create the
	// record (a floor read made before the creation, however fresh).
	floorBeforeCreate bool
	earlyFloor        Token // guarded by st.mu: with floorBeforeCreate
	// floorNeverRaised: Prune's raise of the floor is answered but not
	// applied, so its deletes come without it.
	floorNeverRaised bool
	// baseNeverWritten: a raw hold's writes unset raw but leave the
	// counter where it was (the base is not written).
	baseNeverWritten bool
	// rawFoundSkipsFloor: an acquire that finds a raw record, rather than
	// creating it (a takeover of a creator that stopped), is answered as
	// if the record were not raw, so the Client counts no floor.
	rawFoundSkipsFloor bool
	// deletes, when set, replaces the condition under which Prune's delete
	// removes a record it read as d.
	deletes func(r record, d idleRecord) bool

	// Each of Prune's deletes reaches the store only once it has applied
	// lateDelete more writes and deletes (counted in writes), or after
	// 3 TTLs: a scan far older than its delete, with other Clients' writes
	// between.
	lateDelete int
	writes     *atomic.Int64

	net   *sync.WaitGroup // requests in flight, waited for at the end of a run
	k     *simChecker     // told of every extension, to check none extends a lease being released
	name  string
	owner string // its Client's owner, set before the Client sends anything
}

var errSimNetwork = fmt.Errorf("%w (simulated)", errUnreachable)

// simTrace logs every request of the simulation (go test -run ... -v with
// DLOCK_SIM_TRACE=1), to study a failing seed.
var simTrace = os.Getenv("DLOCK_SIM_TRACE") != ""

// send sends one request through l. Once sent, a request is the
// network's: it reaches the store after its delay and applies there
// whatever became of the caller meanwhile (a late write, as from a real
// network); the caller waits for the reply or for its ctx to end.
func send[T any](l *simLink, ctx context.Context, apply func(ctx context.Context) (T, error)) (T, error) {
	return sendAs(l, ctx, false, apply)
}

// sendAs is send; ofHold says that the request is a write of a hold
// (extend, release, requeue, handoff, setData), which a nextLife fault
// holds back until the key's next life.
func sendAs[T any](l *simLink, ctx context.Context, ofHold bool, apply func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	l.mu.Lock()
	f := netFault{}
	if len(l.faults) > 0 {
		f = l.faults[l.next%len(l.faults)]
		l.next++
	}
	var life <-chan struct{} // closed when the key's document is next created
	if (f.nextLife || l.late) && ofHold {
		life, l.late = l.k.nextLife(l.owner), false
	}
	lost := l.crashed || f.lostReq
	for _, c := range l.cuts {
		if now := time.Since(l.t0); now >= c[0] && now < c[1] {
			lost = true // cut off
		}
	}
	l.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return zero, err // not sent
	}
	type answer struct {
		v   T
		err error
	}
	reply := make(chan answer, 1)
	if !lost {
		l.net.Add(1)
		go func() {
			defer l.net.Done()
			time.Sleep(f.up)
			if life != nil {
				select {
				case <-life:
				case <-time.After(simHorizon - time.Since(l.t0)):
					return // lost
				}
			}
			v, err := apply(context.Background()) // the server does not see the caller's ctx
			if simTrace {
				fmt.Printf("%v %s: %T %+v %v\n", time.Since(time.Unix(946684800, 0)), l.name, apply, v, err)
			}
			if f.lostReply {
				return
			}
			time.Sleep(f.down)
			reply <- answer{v, err}
		}()
	}
	select {
	case a := <-reply:
		return a.v, a.err
	case <-ctx.Done():
		return zero, errors.Join(errSimNetwork, ctx.Err())
	}
}

// cut partitions the link from now for d.
func (l *simLink) cut(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Since(l.t0)
	l.cuts = append(l.cuts, [2]time.Duration{now, now + d})
}

// lateNext makes the next write of a hold a nextLife fault.
func (l *simLink) lateNext() {
	l.mu.Lock()
	l.late = true
	l.mu.Unlock()
}

func (l *simLink) isCrashed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.crashed
}

func (l *simLink) crash() {
	l.mu.Lock()
	l.crashed = true
	l.mu.Unlock()
}

func (l *simLink) acquire(ctx context.Context, a attempt, takeover stamp) (record, error) {
	sent := time.Now()
	if l.floorBeforeCreate {
		l.st.mu.Lock()
		l.earlyFloor = l.st.floorTok
		l.st.mu.Unlock()
	}
	return send(l, ctx, func(ctx context.Context) (record, error) {
		var r record
		var err error
		l.st.mu.Lock()
		before, found := l.st.records[a.key]
		l.st.mu.Unlock()
		if l.sharedJoinsRaw && a.shared {
			r, err = l.joinRaw(a)
		} else {
			r, err = l.st.acquire(ctx, a, takeover)
		}
		if err == nil {
			l.k.wrote(a.holdKey(), sent)
		}
		if l.rawFoundSkipsFloor && found && before.Raw {
			r.Raw = false
		}
		return r, err
	})
}

// unbased is ref as the flawed stores send it: with namesByToken, an
// exclusive ref that wrote its base names the hold that has its owner and
// token; with baseNeverWritten, a raw ref's base is the record's counter
// as it is, so the write unsets raw and leaves the counter below the
// hold's token.
func (l *simLink) unbased(ref leaseRef) leaseRef {
	if l.namesByToken && ref.role == roleExclusive && !ref.raw {
		if r := l.current(ref.key, ref.owner); r.Token == ref.token {
			ref.hold = r.Hold
		}
	}
	if l.baseNeverWritten && ref.raw {
		l.st.mu.Lock()
		ref.token = l.st.records[ref.key].Token
		l.st.mu.Unlock()
	}
	return ref
}

func (l *simLink) handoff(ctx context.Context, ref leaseRef, next attempt) (record, error) {
	sent := time.Now()
	return sendAs(l, ctx, true, func(ctx context.Context) (record, error) {
		r, err := l.st.handoff(ctx, l.unbased(ref), next)
		if err == nil {
			l.k.wrote(next.holdKey(), sent)
		}
		return r, err
	})
}

func (l *simLink) extend(ctx context.Context, refs []leaseRef) ([]bool, error) {
	l.k.extending(refs)
	sent := time.Now()
	return sendAs(l, ctx, true, func(ctx context.Context) ([]bool, error) {
		sentRefs := make([]leaseRef, len(refs))
		for i, ref := range refs {
			sentRefs[i] = l.unbased(ref)
		}
		ok, err := l.st.extend(ctx, sentRefs)
		for i, ref := range refs {
			if err == nil && ok[i] && ref.role != roleWaiter { // a registration's token is a queue number: not a hold's write
				l.k.wrote(holdKey(ref.owner, ref.hold), sent)
			}
		}
		return ok, err
	})
}

func (l *simLink) release(ctx context.Context, ref leaseRef) error {
	_, err := sendAs(l, ctx, true, func(ctx context.Context) (struct{}, error) {
		if l.releaseAnyToken {
			ref.token = l.current(ref.key, ref.owner).Token
		}
		return struct{}{}, l.st.release(ctx, l.unbased(ref))
	})
	return err
}

func (l *simLink) requeue(ctx context.Context, ref leaseRef, next attempt) (record, error) {
	return sendAs(l, ctx, true, func(ctx context.Context) (record, error) {
		if l.releaseAnyToken {
			ref.token = l.current(ref.key, ref.owner).Token
		}
		return l.st.requeue(ctx, l.unbased(ref), next)
	})
}

func (l *simLink) setData(ctx context.Context, ref leaseRef, data []byte) error {
	_, err := sendAs(l, ctx, true, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, l.st.setData(ctx, l.unbased(ref), data)
	})
	return err
}

func (l *simLink) releaseAll(ctx context.Context, refs []leaseRef) error {
	_, err := sendAs(l, ctx, true, func(ctx context.Context) (struct{}, error) {
		sentRefs := make([]leaseRef, len(refs))
		for i, ref := range refs {
			sentRefs[i] = l.unbased(ref)
		}
		return struct{}{}, l.st.releaseAll(ctx, sentRefs)
	})
	return err
}

func (l *simLink) abandon(ctx context.Context, a attempt) error {
	_, err := send(l, ctx, func(ctx context.Context) (struct{}, error) {
		if l.abandonAnyHold {
			a.hold = l.current(a.key, a.owner).Hold
		}
		return struct{}{}, l.st.abandon(ctx, a)
	})
	return err
}

func (l *simLink) mark(ctx context.Context, ref leaseRef, sleep bool) (record, error) {
	return send(l, ctx, func(ctx context.Context) (record, error) { return l.st.mark(ctx, ref, sleep) })
}

func (l *simLink) register(ctx context.Context, a attempt) (record, error) {
	return send(l, ctx, func(ctx context.Context) (record, error) { return l.st.register(ctx, a) })
}

func (l *simLink) reap(ctx context.Context, key string, at stamp, stale []staleEntry) (bool, error) {
	return send(l, ctx, func(ctx context.Context) (bool, error) { return l.st.reap(ctx, key, at, stale) })
}

func (l *simLink) floor(ctx context.Context) (Token, error) {
	return send(l, ctx, func(ctx context.Context) (Token, error) {
		if l.floorBeforeCreate {
			l.st.mu.Lock()
			defer l.st.mu.Unlock()
			return l.earlyFloor, nil
		}
		return l.st.floor(ctx)
	})
}

func (l *simLink) idle(ctx context.Context, cutoff time.Time, limit int) ([]idleRecord, error) {
	return send(l, ctx, func(ctx context.Context) ([]idleRecord, error) { return l.st.idle(ctx, cutoff, limit) })
}

func (l *simLink) raiseFloor(ctx context.Context, t Token) error {
	_, err := send(l, ctx, func(ctx context.Context) (struct{}, error) {
		if l.floorNeverRaised {
			return struct{}{}, nil
		}
		return struct{}{}, l.st.raiseFloor(ctx, t)
	})
	return err
}

func (l *simLink) remove(ctx context.Context, recs []idleRecord) (int, error) {
	return send(l, ctx, func(ctx context.Context) (int, error) {
		if l.lateDelete > 0 {
			until, give := l.writes.Load()+int64(l.lateDelete), time.Now().Add(3*simClientTTL)
			for l.writes.Load() < until && time.Now().Before(give) {
				time.Sleep(5 * time.Millisecond)
			}
		}
		n, err := 0, error(nil)
		if l.deletes == nil {
			n, err = l.st.remove(ctx, recs)
		} else {
			n = l.flawedRemove(recs)
		}
		if n > 0 {
			l.k.mu.Lock()
			l.k.pruned += n
			l.k.mu.Unlock()
		}
		return n, err
	})
}

// joinRaw is memStore.acquire of a shared attempt, but for the rule that
// only an empty raw record may be joined.
func (l *simLink) joinRaw(a attempt) (record, error) {
	l.st.mu.Lock()
	defer l.st.mu.Unlock()
	r, exists := l.st.get(a.key)
	switch {
	case !exists:
		r = record{Kind: a.kind, Raw: true, Token: a.token}
	case r.Kind != a.kind || r.Owner != "" || len(r.Shared) >= a.limit || len(r.Waiters) > 0 || r.Token != a.token:
		return record{}, errHeld
	}
	r.Token = a.token + 1
	if r.Shared == nil {
		r.Shared = map[string]entry{}
	}
	r.Shared[a.holdKey()] = entry{Owner: a.owner, Hold: a.hold, Token: r.Token, TTL: a.ttl, Data: a.data}
	return l.st.write(a.key, r), nil
}

// flawedRemove deletes each of recs whose record l.deletes matches.
func (l *simLink) flawedRemove(recs []idleRecord) int {
	l.st.mu.Lock()
	defer l.st.mu.Unlock()
	n := 0
	for _, d := range recs {
		if r, ok := l.st.records[d.key]; ok && l.deletes(r, d) {
			l.st.delete(d.key)
			n++
		}
	}
	return n
}

// current is the record of key when owner holds it.
func (l *simLink) current(key, owner string) record {
	l.st.mu.Lock()
	defer l.st.mu.Unlock()
	if r := l.st.records[key]; r.Owner == owner {
		return r
	}
	return record{}
}

func (l *simLink) readMany(ctx context.Context, keys []string) ([]record, error) {
	l.k.mu.Lock()
	l.k.rounds++
	if len(keys) > 1 {
		l.k.shared++
	}
	l.k.mu.Unlock()
	return send(l, ctx, func(ctx context.Context) ([]record, error) {
		rs, err := l.st.readMany(ctx, keys)
		if err != nil || !l.stale {
			return rs, err
		}
		for i, k := range keys {
			rs[i] = l.lag(k, rs[i])
		}
		return rs, nil
	})
}

// lag answers a stale link's read of key, which found r, with what one of
// its last staleReads reads of key found, r among them, drawn at random:
// a replica that lags, and answers out of order.
func (l *simLink) lag(key string, r record) record {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string][]record{}
	}
	h := append(l.seen[key], r.clone())
	if len(h) > staleReads {
		h = h[1:]
	}
	l.seen[key] = h
	return h[rand.IntN(len(h))].clone()
}

// staleReads is how many reads back a stale link's answer may be.
const staleReads = 4

func (l *simLink) read(ctx context.Context, key string) (record, error) {
	return send(l, ctx, func(ctx context.Context) (record, error) {
		r, err := l.st.read(ctx, key)
		if err != nil || !l.stale {
			return r, err
		}
		return l.lag(key, r), nil
	})
}

func (l *simLink) serverTime(ctx context.Context) (time.Time, bool, error) {
	type reading struct {
		t  time.Time
		ok bool
	}
	r, err := send(l, ctx, func(ctx context.Context) (reading, error) {
		t, ok, err := l.st.serverTime(ctx)
		return reading{t, ok}, err
	})
	return r.t, r.ok, err
}

// A simOp is one step of a Client's script.
type simOp struct {
	gap     time.Duration // before it
	try     bool          // TryLock instead of Lock
	timeout time.Duration // the Lock's ctx
	hold    time.Duration // how long it holds
	pause   time.Duration // between its check of the lease and its write: a stop-the-world pause
	crash   bool          // the process dies here, holding whatever it holds
	cut     time.Duration // a partition that starts as soon as it holds
	unlock  time.Duration // the Unlock's ctx: a short one leaves the release in flight
	prune   bool          // the Client prunes (idle 0) after its Unlock
	late    bool          // the Unlock's first write lands in the key's next life (netFault.nextLife)
	read    bool          // simRW: RLock rather than Lock
}

type simClientPlan struct {
	offset  time.Duration
	rate    float64
	faults  []netFault
	ops     []simOp
	closeAt time.Duration // Close is called then (0: at the end)
	cuts    [][2]time.Duration
	mutexes int  // Mutex (RWMutex, Semaphore) values it locks through (local queue, handoff, shared reads)
	stale   bool // its reads and its watcher's rounds are answered with the records the read before found (simLink.lag)
}

// A simMode is the primitive a run locks its key with.
type simMode int

const (
	simMutex simMode = iota
	simRW            // an RWMutex: each op reads or writes
	simSem           // a Semaphore of simPermits
	simAny           // drawn (not a mode of a plan)
)

const simPermits = 2

// simPlan is one run, drawn before it starts.
type simPlan struct {
	mode    simMode
	clients []simClientPlan
	steps   []time.Duration // when the server's wall clock steps
	stepBy  []time.Duration
	prunes  []simPrune
	late    int // how late each of the janitor's deletes arrives (simLink.lateDelete)
	pacer   pacer
}

// simPrune is a Prune call by one of the Clients.
type simPrune struct {
	at     time.Duration
	client int
	idle   time.Duration
}

func drawSimPlan(t *rapid.T, drift float64, mode simMode) simPlan {
	dur := func(label string, lo, hi time.Duration) time.Duration {
		return time.Duration(rapid.Int64Range(int64(lo), int64(hi)).Draw(t, label))
	}
	// Durations that matter by their order of magnitude are drawn from a
	// scale, so that every magnitude is as likely as the smallest.
	scale := func(label string, ds ...time.Duration) time.Duration {
		return rapid.SampledFrom(ds).Draw(t, label)
	}
	var p simPlan
	p.mode = mode
	if mode == simAny {
		p.mode = simMode(rapid.IntRange(0, 2).Draw(t, "mode"))
	}
	n := rapid.IntRange(2, 6).Draw(t, "clients")
	eager := rapid.IntRange(0, 3).Draw(t, "pruneEveryUnlock") == 0
	// A run with a late janitor: short holds, so that many lives of the
	// key's document come and go while a delete is on its way.
	if rapid.Bool().Draw(t, "late") {
		p.late = rapid.IntRange(1, 6).Draw(t, "lateDelete")
		eager = true
	}
	for range n {
		c := simClientPlan{
			offset:  dur("offset", -6*time.Hour, 6*time.Hour),
			rate:    1 + rapid.OneOf(rapid.SampledFrom([]float64{-drift, drift}), rapid.Float64Range(-drift, drift)).Draw(t, "rate"),
			mutexes: rapid.IntRange(1, 3).Draw(t, "mutexes"),
			stale:   rapid.Bool().Draw(t, "staleViews"),
		}
		if drift > MaxClockDrift {
			c.rate = 1 + rapid.SampledFrom([]float64{-drift, drift}).Draw(t, "rate")
		}
		loss := rapid.IntRange(0, 20).Draw(t, "lossPercent")
		for range rapid.IntRange(1, 12).Draw(t, "faults") {
			f := netFault{}
			switch x := rapid.IntRange(0, 99).Draw(t, "fault"); {
			case x < loss/2:
				f.lostReq = true
			case x < loss:
				f.lostReply = true
			case x < loss+3:
				f.nextLife = true
			case x < loss+40:
				f.up = scale("up", 0, time.Millisecond, 100*time.Millisecond, time.Second, simMaxDelay)
				f.down = scale("down", 0, time.Millisecond, 100*time.Millisecond, time.Second, simMaxDelay)
			default:
				f.up, f.down = dur("up", 0, 5*time.Millisecond), dur("down", 0, 5*time.Millisecond)
			}
			c.faults = append(c.faults, f)
		}
		// A looper locks again as soon as it unlocks, with short holds,
		// as a Client under steady contention does: its Unlocks requeue
		// it and keep the key (keep.go).
		looper := rapid.IntRange(0, 2).Draw(t, "looper") == 0
		nops := rapid.IntRange(3, 10).Draw(t, "ops")
		if looper {
			nops *= 2
			c.mutexes = 1
		}
		for range nops {
			op := simOp{
				gap:     scale("gap", 0, time.Millisecond, 100*time.Millisecond, time.Second, simClientTTL),
				try:     rapid.IntRange(0, 4).Draw(t, "try") == 0,
				timeout: scale("timeout", 10*time.Millisecond, time.Second, simClientTTL, 3*simClientTTL),
				hold:    scale("hold", 0, time.Millisecond, time.Second, simClientTTL/2, simClientTTL, 2*simClientTTL),
			}
			if rapid.IntRange(0, 3).Draw(t, "pauses") == 0 {
				op.pause = dur("pause", simClientTTL, 3*simClientTTL)
			}
			op.crash = rapid.IntRange(0, 15).Draw(t, "crash") == 0
			op.unlock = scale("unlockTimeout", 10*time.Millisecond, time.Second, simClientTTL)
			op.prune = eager || rapid.IntRange(0, 3).Draw(t, "pruneAfterUnlock") == 0
			op.late = rapid.IntRange(0, 7).Draw(t, "lateUnlock") == 0
			op.read = p.mode == simRW && rapid.IntRange(0, 2).Draw(t, "read") > 0
			if rapid.IntRange(0, 3).Draw(t, "cutWhileHolding") == 0 {
				op.cut = scale("cutFor", simClientTTL/2, simClientTTL, 3*simClientTTL)
			}
			if p.late > 0 {
				op.gap = scale("lateGap", 0, time.Millisecond, 100*time.Millisecond)
				op.hold = scale("lateHold", 0, time.Millisecond)
			}
			if looper {
				op.gap, op.try, op.prune = 0, false, eager
				op.hold = scale("loopHold", 0, time.Millisecond, 10*time.Millisecond)
			}
			c.ops = append(c.ops, op)
		}
		for range rapid.IntRange(0, 3).Draw(t, "partitions") {
			from := dur("cutFrom", 0, simHorizon)
			c.cuts = append(c.cuts, [2]time.Duration{from, from + dur("cutFor", simClientTTL/2, 3*simClientTTL)})
		}
		if rapid.IntRange(0, 3).Draw(t, "closeEarly") == 0 {
			c.closeAt = dur("closeAt", 0, simHorizon)
		}
		p.clients = append(p.clients, c)
	}
	for range rapid.IntRange(0, 12).Draw(t, "prunes") {
		p.prunes = append(p.prunes, simPrune{
			at:     dur("pruneAt", 0, simHorizon),
			client: rapid.IntRange(-1, n-1).Draw(t, "pruner"), // -1: a janitor Client with a fault-free link
			idle:   scale("pruneIdle", 0, time.Second, simClientTTL),
		})
	}
	if p.late > 0 {
		// The janitor prunes often: its scans see states that are gone
		// when its deletes land.
		for at := time.Duration(0); at < simHorizon; at += simClientTTL / 5 {
			p.prunes = append(p.prunes, simPrune{at: at, client: -1})
		}
	}
	for range rapid.IntRange(0, 3).Draw(t, "serverSteps") {
		p.steps = append(p.steps, dur("stepAt", 0, simHorizon))
		p.stepBy = append(p.stepBy, dur("stepBy", -time.Hour, 6*time.Hour))
	}
	return p
}

// simChecker records what the Clients see and reports the first violation.
type simChecker struct {
	mode      simMode
	mu        sync.Mutex
	leases    []*simHold           // every hold handed out
	releasing map[Token]time.Time  // when its holder called Unlock
	lastWrite map[string]time.Time // by hold key: when the last write that applied for the hold was sent
	lastToken Token
	failure   string
	acquired  int
	writes    int
	pruned    int
	queued    int // new exclusive holds made while another waiter was registered (queueOrder)
	rounds    int // the watchers' rounds (watcher.go)
	shared    int // those that read more than one key

	lifeMu sync.Mutex
	life   map[string]chan struct{} // guarded by lifeMu: by owner, closed when that owner's acquire next creates the key's document

	// queue is, per key, each registered waiter (by hold key) and the set
	// of waiters registered before it that are still registered: see
	// queueOrder. Guarded by the store's mu (the store's observe hook
	// alone touches it), not by mu.
	queue map[string]map[string]map[string]bool
}

// queueOrder checks one write to key, from the store's observe hook (with
// the store's mu held), for overtaking: once a waiter W is registered,
// until its entry leaves the record, every new exclusive hold (a write
// that gives the record a new (Owner, Hold)) must be W's own, or that of a
// waiter registered before W and registered ever since, or made while W
// was marked asleep (the store lets an unregistered attempt take the key
// only when nobody is registered, and a registered one only when everyone
// registered before it has gone or is asleep). A
// waiter whose entry is written again with a new queue number (its
// registration was lost, and it registered again) counts as registered
// anew, behind everyone there; one pending (numbered 0: store.register)
// is registered from that first write, whose order its number keeps. A
// kept hold (keep.go) is no new hold of the
// record: it writes nothing (acquire checks that each hold of the record
// serves at most two Locks).
func (k *simChecker) queueOrder(key string, before, after record) {
	if before.Rev == 0 && after.Rev != 0 { // created: a new life of the key
		k.lifeMu.Lock()
		for owner, ch := range k.life {
			if after.Owner == owner || slices.ContainsFunc(slices.Collect(maps.Values(after.Shared)), func(e entry) bool { return e.Owner == owner }) {
				close(ch)
				delete(k.life, owner)
			}
		}
		k.lifeMu.Unlock()
	}
	if after.Rev == 0 { // deleted (by Prune)
		if !before.prunable() {
			k.mu.Lock()
			k.fail("Prune deleted %q with %d waiters, %d shared holds, owner %q, raw %v", key, len(before.Waiters), len(before.Shared), before.Owner, before.Raw)
			k.mu.Unlock()
		}
		delete(k.queue, key)
		return
	}
	q := k.queue[key]
	if q == nil {
		q = map[string]map[string]bool{}
		k.queue[key] = q
	}
	if after.Owner != "" && (after.Owner != before.Owner || after.Hold != before.Hold) {
		holder := holdKey(after.Owner, after.Hold)
		k.mu.Lock()
		checked := false
		for w, ahead := range q {
			e, still := after.Waiters[w]
			if !still || w == holder {
				continue
			}
			checked = true
			if !ahead[holder] && !before.Waiters[w].Sleep {
				k.fail("%s (hold %d, token %d) overtook waiter %s (hold %d, queue number %d) on %q, which had %d still registered ahead of it",
					after.Owner, after.Hold, after.Token, e.Owner, e.Hold, e.Q, key, len(ahead))
			}
		}
		if checked {
			k.queued++
		}
		k.mu.Unlock()
	}
	k.permitOrder(key, q, before, after)
	for w := range q { // those that left, or registered again (not a pending registration numbered: store.register)
		if e, ok := after.Waiters[w]; !ok || e.Q != before.Waiters[w].Q && before.Waiters[w].Q != 0 {
			delete(q, w)
			for _, ahead := range q {
				delete(ahead, w)
			}
		}
	}
	for w := range after.Waiters { // those that registered: behind everyone there
		if _, known := q[w]; !known {
			ahead := map[string]bool{}
			for o := range q {
				ahead[o] = true
			}
			q[w] = ahead
		}
	}
}

// permitOrder checks one write to a Semaphore's key (see queueOrder, whose
// queue q is), for permits out of order: every new permit goes to a Client
// that waited unregistered while nobody was registered, or to a
// registered waiter with a permit left, beside the ones held, for each
// waiter registered before it and still registered, awake (a pending
// registration, which may not be numbered yet, aside).
func (k *simChecker) permitOrder(key string, q map[string]map[string]bool, before, after record) {
	n, err := strconv.Atoi(strings.TrimPrefix(after.Kind, "sem/"))
	if err != nil || !strings.HasPrefix(after.Kind, "sem/") {
		return
	}
	for hk := range after.Shared {
		if _, old := before.Shared[hk]; old {
			continue
		}
		ahead, registered := q[hk]
		owed := 0
		for w := range ahead {
			if e, ok := before.Waiters[w]; ok && !e.Sleep {
				owed++
			}
		}
		if !registered && len(before.Waiters) > 0 || registered && len(before.Shared)+owed >= n {
			k.mu.Lock()
			k.fail("a permit of %q went to %s out of order: %d held of %d, %d waiters owed one first, registered %v",
				key, hk, len(before.Shared), n, owed, registered)
			k.mu.Unlock()
		}
	}
}

// nextLife returns a channel closed when owner's acquire next creates
// the key's document (the simulation locks one key).
func (k *simChecker) nextLife(owner string) <-chan struct{} {
	k.lifeMu.Lock()
	defer k.lifeMu.Unlock()
	if k.life[owner] == nil {
		k.life[owner] = make(chan struct{})
	}
	return k.life[owner]
}

type simHold struct {
	client   int
	l        *Lease
	returned time.Time // when its Lock returned
}

func (k *simChecker) fail(format string, args ...any) {
	if k.failure == "" {
		k.failure = fmt.Sprintf("at %v: ", time.Now().UTC().Format("15:04:05.000000")) + fmt.Sprintf(format, args...)
	}
}

// valid checks, when client believes it holds l (its Err is nil), that
// no lease it excludes is valid: the check users make before they act. An
// exclusive hold excludes every other; a shared hold of an RWMutex every
// exclusive one; the permits of a Semaphore number at most simPermits.
func (k *simChecker) valid(client int, l *Lease) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var valid []*simHold
	for _, o := range k.leases {
		if o.l != l && o.l.Err() == nil {
			valid = append(valid, o)
		}
	}
	k.exclusion(client, l, valid)
	k.overdue(client, l)
}

// exclusion checks, with k.mu held, that l may be valid beside others.
func (k *simChecker) exclusion(client int, l *Lease, others []*simHold) {
	if k.mode == simSem {
		if len(others)+1 > simPermits {
			k.fail("client %d holds permit %d while %d others are held (of %d)", client, l.Token(), len(others), simPermits)
		}
		return
	}
	for _, o := range others {
		if l.role == roleExclusive || o.l.role == roleExclusive {
			k.fail("client %d holds token %d (%v) while client %d holds token %d (%v)", client, l.Token(), l.role, o.client, o.l.Token(), o.l.role)
		}
	}
}

// wrote notes that a write for the hold with key hk, sent at sent, applied.
func (k *simChecker) wrote(hk string, sent time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if sent.After(k.lastWrite[hk]) {
		k.lastWrite[hk] = sent
	}
}

// reliance is the longest a holder may rely on a write after it sent it,
// in true time: holdFor on a clock running as slow as MaxClockDrift allows.
// It is the premise of the safety argument (docs/design.md): a lease valid past it
// can overlap a takeover, whether or not one happens in this run.
var reliance = time.Duration(float64(holdFor(simClientTTL)) / (1 - MaxClockDrift))

// overdue checks, with k.mu held, that a valid lease l is within the
// reliance of its last write. Writes are noted by the hold they name (its
// owner and hold id), which a kept hold (keep.go) shares with the hold
// that kept it.
func (k *simChecker) overdue(client int, l *Lease) {
	if sent, ok := k.lastWrite[holdKey(l.c.owner, l.hold)]; ok && time.Since(sent) > reliance+time.Millisecond {
		k.fail("client %d's lease (token %d) valid %v after its last write was sent, more than %v", client, l.Token(), time.Since(sent), reliance)
	}
}

// unlocking notes that the holder of the hold whose writes name token
// counter t calls Unlock now.
func (k *simChecker) unlocking(t Token) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.releasing[t] = time.Now()
}

// extending checks that no lease whose Release began earlier is extended.
// (The extender decides on a batch and sends it at one instant of the
// bubble's clock: a release that begins at that instant may race it.)
func (k *simChecker) extending(refs []leaseRef) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, ref := range refs {
		if ref.role == roleWaiter {
			// A registration's token is its queue number, not a hold's:
			// number 1 (a registration after the document was created
			// anew) is not the hold with token 1 whose Unlock began.
			continue
		}
		if at, ok := k.releasing[ref.token]; ok && time.Now().After(at) {
			k.fail("token %d extended %v after its Unlock began", ref.token, time.Since(at))
		}
	}
}

// acquire records that client's Lock, called at called, returned l. Its
// token must exceed the token of every hold returned before it was called
// (tokens strictly increase in the order holds are handed out), and differ
// from every other hold's. An RLock may join a shared hold acquired before
// it was called: its called is zero, and only the uniqueness is checked
// (a hold that RLocks share is recorded once). A hold of the record serves
// at most two Locks: its acquire's, and the Lock that took it over when
// its Unlock kept it (keep.go), a lease with the spare token that writes
// as the first; that one's writes are its own from then on, so the
// Unlock that began before them is forgotten.
func (k *simChecker) acquire(client int, l *Lease, called time.Time) {
	k.mu.Lock()
	same := 0 // earlier leases of the record's hold
	for _, h := range k.leases {
		if h.l == l {
			k.mu.Unlock()
			return
		}
		if h.l.key == l.key && h.l.ref().token == l.ref().token && h.l.role == roleExclusive && l.role == roleExclusive {
			if same++; same > 1 || h.l.hold != l.hold || h.l.token+1 != l.token {
				k.fail("token %d (hold %d) served Lock again, as token %d (hold %d)", h.l.token, h.l.hold, l.token, l.hold)
			}
			delete(k.releasing, l.ref().token)
		}
		if !called.IsZero() && h.returned.Before(called) && l.Token() <= h.l.Token() {
			k.fail("token %d acquired after token %d", l.Token(), h.l.Token())
		}
		if h.l.Token() == l.Token() {
			k.fail("token %d handed out twice", l.Token())
		}
	}
	k.lastToken = max(k.lastToken, l.Token())
	k.leases = append(k.leases, &simHold{client, l, time.Now()})
	k.acquired++
	k.mu.Unlock()
	if l.Err() == nil {
		k.valid(client, l)
	}
}

// runSim runs plan against Clients with flaw f and store flaws; it returns
// the first violation, or "".
// simStats is what a run did.
type simStats struct {
	holds, writes, pruned int
	queued                int // new exclusive holds made while another waiter was registered
	rounds                int // the watchers' rounds
	simulated             time.Duration
}

func runSim(t *testing.T, plan simPlan, f flaw, storeFlaw func(*simLink)) (failure string, stats simStats) {
	if simTrace {
		fmt.Printf("=== sim run (mode %d)\n", plan.mode)
	}
	synctest.Test(t, func(t *testing.T) {
		k := &simChecker{life: map[string]chan struct{}{}, mode: plan.mode, releasing: map[Token]time.Time{}, lastWrite: map[string]time.Time{}, queue: map[string]map[string]map[string]bool{}}
		st := newMemStore()
		var writes atomic.Int64
		st.observe = func(key string, before, after record) {
			writes.Add(1)
			k.queueOrder(key, before, after)
		}
		start := time.Now()
		var stepMu sync.Mutex
		var step time.Duration
		st.now = func() time.Time {
			stepMu.Lock()
			defer stepMu.Unlock()
			return time.Now().Add(step)
		}
		for i, at := range plan.steps {
			time.AfterFunc(at, func() {
				stepMu.Lock()
				step += plan.stepBy[i]
				stepMu.Unlock()
			})
		}
		var wg, network sync.WaitGroup
		defer network.Wait() // the requests still in flight land, or are lost
		var closers []func()
		var clients []*Client
		for id, cp := range plan.clients {
			link := &simLink{st: st, faults: cp.faults, k: k, net: &network, name: fmt.Sprint("client-", id), cuts: cp.cuts, t0: start, stale: cp.stale}
			if storeFlaw != nil {
				storeFlaw(link)
			}
			c, err := newClientOn(func(*telemetry) store { return link },
				WithTTL(simClientTTL), withClock(newSkewedClock(cp.offset, cp.rate)), withFlaw(f), WithOwner(fmt.Sprint("client-", id)), withPacer(cmp.Or[pacer](plan.pacer, rulesPacer{})))
			if err != nil {
				k.fail("%v", err)
				return
			}
			link.owner = c.owner
			clients = append(clients, c)
			mutexes := make([]simLocker, cp.mutexes)
			for i := range mutexes {
				mutexes[i] = newSimLocker(c, plan.mode)
			}
			// Close once; every caller waits on a channel, which (unlike a
			// sync.Once's mutex) lets the bubble's clock run meanwhile.
			var closing atomic.Bool
			closed := make(chan struct{})
			closeClient := func() {
				if closing.CompareAndSwap(false, true) {
					ctx, cancel := context.WithTimeout(context.Background(), simClientTTL)
					c.Close(ctx)
					cancel()
					close(closed)
				}
				<-closed
			}
			if cp.closeAt > 0 {
				time.AfterFunc(cp.closeAt, closeClient)
			}
			closers = append(closers, closeClient)
			// One goroutine per Mutex runs the script, so that Mutexes of
			// one Client queue and hand over to each other.
			var crashed sync.Once
			for mi, m := range mutexes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for _, op := range cp.ops {
						time.Sleep(op.gap)
						if time.Since(start) > simHorizon || link.isCrashed() {
							return
						}
						ctx, cancel := context.WithTimeout(context.Background(), op.timeout)
						called := time.Now()
						l, err := m.lock(ctx, op)
						if took := time.Since(called); took > op.timeout {
							k.mu.Lock()
							k.fail("client %d: Lock with a %v ctx returned after %v", id, op.timeout, took)
							k.mu.Unlock()
						}
						cancel()
						switch {
						case err == nil:
						case errors.Is(err, context.DeadlineExceeded), errors.Is(err, ErrLocked), errors.Is(err, ErrClosed):
							continue
						case op.try && errors.Is(err, ErrLeaseLost): // answered (acquire, floor, raise) past the lease's deadline
							continue
						case errors.Is(err, ErrTTLTooShort): // writes held back past their TTL (nextLife, long delays), three in a row
							continue
						default:
							k.mu.Lock()
							k.fail("client %d: Lock: unexpected error %v", id, err)
							k.mu.Unlock()
							continue
						}
						if l == nil {
							k.mu.Lock()
							k.fail("client %d: Lock returned no error and no lease (read %v try %v)", id, op.read, op.try)
							k.mu.Unlock()
							continue
						}
						if op.read {
							called = time.Time{} // it may have joined an older hold
						}
						k.acquire(id, l, called)
						if op.cut > 0 {
							link.cut(op.cut)
						}
						time.Sleep(op.hold / 2)
						if l.Err() == nil {
							k.valid(id, l)
							time.Sleep(op.pause) // the world stops after the check
							k.mu.Lock()
							k.writes++
							k.mu.Unlock()
						}
						if op.crash && mi == 0 {
							crashed.Do(link.crash)
							return
						}
						time.Sleep(op.hold / 2)
						uctx, ucancel := context.WithTimeout(context.Background(), op.unlock)
						if !op.read {
							k.unlocking(l.ref().token) // (an RUnlock need not release)
						}
						if op.late {
							link.lateNext()
						}
						m.unlock(uctx, op, l)
						ucancel()
						if op.prune {
							pctx, pcancel := context.WithTimeout(context.Background(), simClientTTL)
							if _, err := c.Prune(pctx, 0); err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, errUnreachable) && !errors.Is(err, context.DeadlineExceeded) {
								k.mu.Lock()
								k.fail("client %d: Prune: unexpected error %v", id, err)
								k.mu.Unlock()
							}
							pcancel()
						}
					}
				}()
			}
		}
		// Prunes, each by a Client (through its link, with its faults) or
		// by a janitor Client that only prunes: one goroutine calls them in
		// turn.
		janitor, err := newClientOn(func(*telemetry) store {
			link := &simLink{st: st, k: k, net: &network, name: "janitor", t0: start, lateDelete: plan.late, writes: &writes}
			if storeFlaw != nil {
				storeFlaw(link)
			}
			return link
		}, WithTTL(simClientTTL))
		if err != nil {
			k.fail("%v", err)
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var prunes sync.WaitGroup
			defer janitor.Close(context.Background())
			defer prunes.Wait()
			var done time.Duration
			for _, p := range slices.SortedFunc(slices.Values(plan.prunes), func(a, b simPrune) int { return cmp.Compare(a.at, b.at) }) {
				time.Sleep(p.at - done)
				done = p.at
				c := janitor
				if p.client >= 0 {
					c = clients[p.client]
				}
				prunes.Go(func() { // late deletes overlap the next prunes
					ctx, cancel := context.WithTimeout(context.Background(), simClientTTL)
					_, err := c.Prune(ctx, p.idle)
					cancel()
					if err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, errUnreachable) && !errors.Is(err, context.DeadlineExceeded) {
						k.mu.Lock()
						k.fail("client %d: Prune: unexpected error %v", p.client, err)
						k.mu.Unlock()
					}
				})
				if plan.late == 0 {
					prunes.Wait()
				}
			}
		}()
		// A watcher: at most one valid lease at any moment it looks.
		watchDone := make(chan struct{})
		go func() {
			tick := time.NewTicker(250 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-tick.C:
					k.mu.Lock()
					var valid []*simHold
					for _, h := range k.leases {
						if h.l.Err() == nil {
							valid = append(valid, h)
							k.overdue(h.client, h.l)
						}
					}
					for i, h := range valid {
						k.exclusion(h.client, h.l, valid[i+1:])
					}
					k.mu.Unlock()
				case <-watchDone:
					return
				}
			}
		}()
		wg.Wait()
		for _, c := range closers {
			c()
		}
		close(watchDone)

		// Liveness: with the network healthy and everyone else gone, a new
		// Client gets the key within the bound on a dead waiter (its
		// registration's TTL, a read, and a poll) of its last extension,
		// which may land up to simMaxDelay after everyone left; a crashed
		// holder's bound (two TTLs and a poll) is shorter.
		probe, err := newClientOn(func(*telemetry) store { return st }, WithTTL(simClientTTL))
		if err != nil {
			k.fail("%v", err)
			return
		}
		defer probe.Close(context.Background())
		bound := simMaxDelay + registrationTTLs*simClientTTL + simClientTTL/2 + DefaultMaxBackoff*2
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		called := time.Now()
		if l, err := newSimLocker(probe, plan.mode).lock(ctx, simOp{}); err != nil {
			r := holder(st, "k") // before k.mu: the store's observe hook takes k.mu with the store's mu held
			k.mu.Lock()
			k.fail("the key was not free within %v of everyone leaving: %v (record %+v)", bound, err, r)
			k.mu.Unlock()
		} else {
			k.acquire(-1, l, called)
		}
		k.mu.Lock()
		failure = k.failure
		stats = simStats{k.acquired, k.writes, k.pruned, k.queued, k.rounds, time.Since(start)}
		k.mu.Unlock()
	})
	return failure, stats
}

// A simLocker is a Mutex, an RWMutex or a Semaphore, as a script uses it.
type simLocker interface {
	lock(ctx context.Context, op simOp) (*Lease, error)
	unlock(ctx context.Context, op simOp, l *Lease) error
}

func newSimLocker(c *Client, mode simMode) simLocker {
	switch mode {
	case simRW:
		return simRWLocker{c.NewRWMutex("k")}
	case simSem:
		return simSemLocker{c.NewSemaphore("k", simPermits)}
	}
	return simMutexLocker{c.NewMutex("k")}
}

type simMutexLocker struct{ m *Mutex }

func (s simMutexLocker) lock(ctx context.Context, op simOp) (*Lease, error) {
	var err error
	if op.try {
		err = s.m.TryLock(ctx)
	} else {
		err = s.m.Lock(ctx)
	}
	return s.m.Lease(), err
}

func (s simMutexLocker) unlock(ctx context.Context, _ simOp, _ *Lease) error { return s.m.Unlock(ctx) }

type simRWLocker struct{ rw *RWMutex }

func (s simRWLocker) lock(ctx context.Context, op simOp) (*Lease, error) {
	var err error
	switch {
	case op.read && op.try:
		err = s.rw.TryRLock(ctx)
	case op.read:
		err = s.rw.RLock(ctx)
	case op.try:
		err = s.rw.TryLock(ctx)
	default:
		err = s.rw.Lock(ctx)
	}
	if op.read && err == nil {
		return s.newestRead(), nil
	}
	return s.rw.Lease(), err
}

// newestRead returns the newest shared hold of the RWMutex's Client, the
// one an RLock that returned nil counted on, even if it was lost since
// (Lease skips lost holds; the checks skip lost leases themselves).
func (s simRWLocker) newestRead() *Lease {
	c := s.rw.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if rs := c.readers[s.rw.key]; rs != nil && len(rs.holds) > 0 {
		return rs.holds[len(rs.holds)-1].l
	}
	return nil
}

func (s simRWLocker) unlock(ctx context.Context, op simOp, _ *Lease) error {
	if op.read {
		return s.rw.RUnlock(ctx)
	}
	return s.rw.Unlock(ctx)
}

type simSemLocker struct{ s *Semaphore }

func (s simSemLocker) lock(ctx context.Context, op simOp) (*Lease, error) {
	if op.try {
		return s.s.TryAcquire(ctx)
	}
	return s.s.Acquire(ctx)
}

func (s simSemLocker) unlock(ctx context.Context, _ simOp, l *Lease) error { return l.Release(ctx) }

// TestSimulation: the properties hold for the real Client under every
// fault above, with clocks within MaxClockDrift. More runs:
// go test -run TestSimulation -rapid.checks=2000 .
func TestSimulation(t *testing.T) {
	start, runs, holds, writes, pruned, queued, rounds := time.Now(), 0, 0, 0, 0, 0, 0
	var simulated time.Duration
	rapid.Check(t, func(rt *rapid.T) {
		runs++
		plan := drawSimPlan(rt, MaxClockDrift, simAny)
		plan.pacer = drawPacer(rt)
		if rapid.IntRange(0, 3).Draw(rt, "lives") == 0 {
			lives(&plan)
		}
		failure, stats := runSim(t, plan, noFlaw, nil)
		holds, writes, pruned, queued, simulated = holds+stats.holds, writes+stats.writes, pruned+stats.pruned, queued+stats.queued, simulated+stats.simulated
		rounds += stats.rounds
		if failure != "" {
			rt.Fatal(failure)
		}
	})
	t.Logf("%d runs in %v: %d holds (%d taken with waiters registered), %d checked writes, %d documents pruned, %d rounds of the watchers, %v simulated",
		runs, time.Since(start).Round(time.Millisecond), holds, queued, writes, pruned, rounds, simulated.Round(time.Second))
}

// drawPacer draws how a run's waits are paced: by dlock's rules in half
// the runs; otherwise at random within the caps (with or without the
// rules' plans), or on plain backoff. Safety and every liveness check of
// the run must hold for each: the pacer's mistakes cost commands only.
func drawPacer(t *rapid.T) pacer {
	switch rapid.IntRange(0, 3).Draw(t, "pacer") {
	case 0:
		return randomPacer{max: 2 * maxSleep(&config{maxBackoff: DefaultMaxBackoff}), plan: rapid.Bool().Draw(t, "randomPlans"), marks: rapid.Bool().Draw(t, "randomMarks")}
	case 1:
		return backoffPacer{}
	}
	return rulesPacer{}
}

// churn makes a run re-create its key's document again and again: every
// Unlock prunes, and a janitor whose deletes arrive late prunes every
// fifth of a TTL. The flaws of pruning and of raw documents show there.
func churn(p *simPlan) {
	if p.late == 0 {
		p.late = 1
		for at := time.Duration(0); at < simHorizon; at += simClientTTL / 5 {
			p.prunes = append(p.prunes, simPrune{at: at, client: -1})
		}
	}
	for i := range p.clients {
		for j := range p.clients[i].ops {
			p.clients[i].ops[j].prune = true
		}
	}
}

// lives makes a run re-create its key's document often (churn), with
// two Clients whose holds last long enough to write their base and to be
// waited for, and whose first Unlock's first write lands in the key's
// next life (a raw record's counter starts again at 1 in each life: the
// first life's first holds are the ones whose tokens come back). The flaws that let a write of one
// life match a hold of the next show there.
func lives(p *simPlan) {
	churn(p)
	p.clients = p.clients[:2] // the Client of the late write creates the next life more often
	for i := range p.prunes {
		p.prunes[i].client = min(p.prunes[i].client, -1+len(p.clients))
	}
	for i := range p.clients {
		for j := range p.clients[i].ops {
			op := &p.clients[i].ops[j]
			op.try, op.timeout, op.hold = false, 3*simClientTTL, max(op.hold, simClientTTL/2) // the other Client waits while one holds
			op.crash = false
		}
		p.clients[i].closeAt = 0 // both Clients stay until the end
		p.clients[i].ops[0].late = true
	}
}

// calm makes a run keep its key's document: no Prune, so no hold is made
// on a raw document (which keeps nothing: keep.go). The flaws of the keep
// show there.
func calm(p *simPlan) {
	p.late, p.prunes = 0, nil
	for i := range p.clients {
		for j := range p.clients[i].ops {
			p.clients[i].ops[j].prune = false
		}
	}
}

// dozy paces the run's waits with randomPacer, which marks registrations
// asleep and awake at random whatever their place: many more passes, and
// wakes, than dlock's pacer makes with the simulation's few Clients.
func dozy(p *simPlan) {
	calm(p)
	p.pacer = randomPacer{max: 2 * maxSleep(&config{maxBackoff: DefaultMaxBackoff}), plan: true, marks: true}
}

// TestSimulationPacers runs the simulation with each pacer alone.
func TestSimulationPacers(t *testing.T) {
	marks := struct {
		name  string
		pacer pacer
	}{"random with random marks", randomPacer{max: 2 * maxSleep(&config{maxBackoff: DefaultMaxBackoff}), plan: true, marks: true}}
	for _, tc := range append(pacers(), marks) {
		t.Run(tc.name, func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				plan := drawSimPlan(rt, MaxClockDrift, simAny)
				plan.pacer = tc.pacer
				if failure, _ := runSim(t, plan, noFlaw, nil); failure != "" {
					rt.Fatal(failure)
				}
			})
		})
	}
}

// catchWithin runs scenes drawn by rapid, one at a time, until one
// returns a violation or budget of them ran; it returns how many ran, and
// the violation ("" if none): how a test shows that the simulation
// catches a flawed variant.
func catchWithin(t *testing.T, budget int, scene func(rt *rapid.T) string) (runs int, found string) {
	for found == "" && runs < budget {
		rapid.Check(t, func(rt *rapid.T) {
			if found != "" || runs >= budget {
				return
			}
			runs++
			found = scene(rt)
		})
	}
	return runs, found
}

// The simulation catches flawed variants of the real code, and clocks
// drifting beyond the bound, each within its budget of runs: a budget is
// several times the most runs any variant needed to be caught in repeated
// measurements without -race (docs/testing.md has the figures). The
// flawed stores are written in simLink, not in the package. Under -race a
// run takes about 10 ms.
func TestSimulationCatchesFlaws(t *testing.T) {
	for _, tc := range []struct {
		name      string
		flaw      flaw
		storeFlaw func(*simLink)
		drift     float64
		mode      simMode
		budget    int
		plan      func(*simPlan) // nil, churn or calm
	}{
		{"expiry by wall clock", flawWallClockExpiry, nil, MaxClockDrift, simMutex, 1000, nil},
		{"extender extends a lease being released", flawExtendReleasing, nil, MaxClockDrift, simMutex, 300, nil},
		{"clean-up not conditional on the hold (the late abandon)", noFlaw, func(l *simLink) { l.abandonAnyHold = true }, MaxClockDrift, simMutex, 3000, nil},
		{"deadline counted from the reply", flawDeadlineFromReply, nil, MaxClockDrift, simMutex, 3000, nil},
		{"release not conditional on the token", noFlaw, func(l *simLink) { l.releaseAnyToken = true }, MaxClockDrift, simMutex, 10000, nil},
		{"a hold named by its owner and token (a late write from an earlier life)", noFlaw, func(l *simLink) { l.namesByToken = true }, MaxClockDrift, simMutex, 10000, lives},
		{"clocks drifting at ten times the bound", noFlaw, nil, 10 * MaxClockDrift, simMutex, 3000, nil},
		{"prune deletes without raising the floor", noFlaw, func(l *simLink) { l.floorNeverRaised = true }, MaxClockDrift, simMutex, 3000, nil},
		{"lock reads the floor before creating the document", noFlaw, func(l *simLink) { l.floorBeforeCreate = true }, MaxClockDrift, simMutex, 3000, churn},
		{"a raw hold's writes unset raw without writing the base", noFlaw, func(l *simLink) { l.baseNeverWritten = true }, MaxClockDrift, simMutex, 3000, nil},
		{"a takeover of a raw record skips the floor", noFlaw, func(l *simLink) { l.rawFoundSkipsFloor = true }, MaxClockDrift, simMutex, 3000, nil},
		{"prune's delete matches the revision, not the token", noFlaw, func(l *simLink) {
			l.deletes = func(r record, d idleRecord) bool { return r.free() && len(r.Waiters) == 0 && r.Rev == d.rev }
		}, MaxClockDrift, simMutex, 10000, nil},
		{"prune's delete matches neither revision nor token", noFlaw, func(l *simLink) {
			l.deletes = func(r record, d idleRecord) bool { return r.prunable() }
		}, MaxClockDrift, simMutex, 3000, nil},
		{"prune's delete ignores waiters and shared holds (RWMutex)", noFlaw, func(l *simLink) {
			l.deletes = func(r record, d idleRecord) bool {
				return r.Owner == "" && !r.Raw && r.Rev == d.rev && r.Token == d.token
			}
		}, MaxClockDrift, simRW, 3000, churn},
		// Caught after about 2,200 runs on average (435 to 5,918 in eight
		// tries): a budget of 10,000 misses it about one time in a hundred.
		{"a shared acquire joins a raw record (Semaphore)", noFlaw, func(l *simLink) { l.sharedJoinsRaw = true }, MaxClockDrift, simSem, 50000, churn},
		{"a Semaphore allows a permit more than n", flawSharedOverLimit, nil, MaxClockDrift, simSem, 3000, nil},
		{"shared holds cleared without waiting out their TTL (RWMutex)", flawReapLive, nil, MaxClockDrift, simRW, 3000, nil},
		{"permits cleared without waiting out their TTL (Semaphore)", flawReapLive, nil, MaxClockDrift, simSem, 3000, nil},
		{"shared deadline counted from the reply (RWMutex)", flawDeadlineFromReply, nil, MaxClockDrift, simRW, 3000, nil},
		{"waiters jump the queue", flawQueueJump, nil, MaxClockDrift, simMutex, 100, nil},
		{"a Semaphore serves out of order", flawSemaphoreOutOfOrder, nil, MaxClockDrift, simSem, 3000, nil},
		{"an Unlock keeps the key turn after turn", flawKeepAlways, nil, MaxClockDrift, simMutex, 3000, calm},
		{"a claim passes waiters it saw asleep without the server checking", flawPassAsSeen, nil, MaxClockDrift, simMutex, 5000, dozy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			runs, found := catchWithin(t, tc.budget, func(rt *rapid.T) string {
				plan := drawSimPlan(rt, tc.drift, tc.mode)
				if tc.plan != nil {
					tc.plan(&plan)
				}
				found, _ := runSim(t, plan, tc.flaw, tc.storeFlaw)
				return found
			})
			if found == "" {
				t.Fatalf("not caught in %d runs", runs)
			}
			t.Logf("caught after %d runs (%v): %s", runs, time.Since(start).Round(time.Millisecond), found)
		})
	}
}
