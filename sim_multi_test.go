package dlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

// The simulation of MultiMutex: real Clients on the in-memory store inside
// a synctest bubble, with the faults of the single-key simulation
// (sim_test.go: simLink, and its plans for each Client), locking random,
// overlapping sets of simMultiKeys, given in random orders with duplicates;
// a set of one key is locked by a Mutex half the time. Half the Clients
// are steady (their requests may be late, never lost), and half of their
// Locks are patient: their deadline is far past anything a run without
// deadlock needs (simPatient), so one that ends with its ctx is a deadlock. It
// checks, per key: that no two leases are valid at once (at each
// acquisition, each check before a write, and by a watcher); that each
// valid lease is within its reliance of its last write; that a token
// exceeds that of every hold of the key returned before its Lock was
// called, and is never handed out twice; that no lease is extended after
// its Unlock began; that every Lock returns by its deadline, and one that
// fails leaves nothing of its own in the Client; and that, once everyone
// has gone, a new Client takes every key within its bound.

// simMultiKeys are the keys the Clients lock sets of.
var simMultiKeys = []string{"a", "b", "c", "d", "e"}

// simPatient is a patient Lock's deadline: far beyond the horizon plus
// everything a run can leave for after it (each goroutine's one op in
// progress, crashed holders' TTLs, partitions).
const simPatient = 20 * time.Minute

// A multiSimPlan is one run: the Clients, faults and timings of a
// single-key plan, and for each op of each Client its keys and patience.
type multiSimPlan struct {
	simPlan
	sets    [][][]string // by Client, by op: the keys, in the caller's order
	patient [][]bool
	mutex   [][]bool // a one-key set locked by a Mutex
}

func drawMultiSimPlan(t *rapid.T) multiSimPlan {
	p := multiSimPlan{simPlan: drawSimPlan(t, MaxClockDrift, simMutex)}
	p.pacer = drawPacer(t)
	for i := range p.clients {
		cp := &p.clients[i]
		// A steady Client's requests are all answered, within a second
		// each way, so that its extensions keep its holds while it waits
		// for more: it may be patient.
		if rapid.Bool().Draw(t, "steady") {
			for j := range cp.faults {
				f := &cp.faults[j]
				f.lostReq, f.lostReply, f.nextLife = false, false, false
				f.up, f.down = min(f.up, time.Second), min(f.down, time.Second)
			}
			cp.cuts = nil
			for j := range cp.ops {
				cp.ops[j].cut = 0
			}
		}
		var sets [][]string
		var patient, mutex []bool
		// Only a Client whose requests are all answered, within a second
		// each way, is patient: a request that is lost (a fault, a
		// partition) is waited for until the ctx of its call ends; the
		// faults of a Client come round in turn, so that one whose
		// acquires are all lost while its extensions land could hold its
		// place in a queue for ever; and one whose extensions take longer
		// than their timeout (half the time left of the lease) loses the
		// keys it holds while it waits for the next, and starts again, for
		// ever: a livelock, not a deadlock. (A Client that is not patient
		// holds up the others for at most its Lock's deadline.)
		answered := len(cp.cuts) == 0 &&
			!slices.ContainsFunc(cp.faults, func(f netFault) bool {
				return f.lostReq || f.lostReply || f.nextLife || f.up > time.Second || f.down > time.Second
			}) &&
			!slices.ContainsFunc(cp.ops, func(op simOp) bool { return op.cut > 0 })
		for _, op := range cp.ops {
			sets = append(sets, rapid.SliceOfN(rapid.SampledFrom(simMultiKeys), 1, 4).Draw(t, "keys"))
			patient = append(patient, answered && !op.try && rapid.Bool().Draw(t, "patient"))
			mutex = append(mutex, rapid.Bool().Draw(t, "mutex"))
		}
		p.sets, p.patient, p.mutex = append(p.sets, sets), append(p.patient, patient), append(p.mutex, mutex)
	}
	return p
}

// multiChecker checks the holds of every key (see the top of the file).
type multiChecker struct {
	*simChecker // its lastWrite (overdue), queueOrder and nextLife serve all keys

	holds     map[string][]*simHold          // by key
	unlocking map[string]map[Token]time.Time // by key and token counter: when its holder called Unlock
}

// acquired records that client's Lock, called at called, returned the
// leases ls, and checks their tokens and exclusion.
func (k *multiChecker) acquired(client int, ls []*Lease, called time.Time) {
	k.mu.Lock()
	for _, l := range ls {
		for _, h := range k.holds[l.key] {
			if h.returned.Before(called) && l.Token() <= h.l.Token() {
				k.fail("%q: token %d acquired after token %d", l.key, l.Token(), h.l.Token())
			}
			if h.l.Token() == l.Token() {
				k.fail("%q: token %d handed out twice", l.key, l.Token())
			}
		}
		k.holds[l.key] = append(k.holds[l.key], &simHold{client, l, time.Now()})
		k.simChecker.acquired++
	}
	k.mu.Unlock()
	k.valid(client, ls)
}

// valid checks, as client relies on ls (those whose Err is nil), that no
// other lease of their keys is valid, and that each is within its
// reliance of its last write.
func (k *multiChecker) valid(client int, ls []*Lease) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, l := range ls {
		if l.Err() != nil {
			continue
		}
		for _, h := range k.holds[l.key] {
			if h.l != l && h.l.Err() == nil {
				k.fail("%q: client %d holds token %d while client %d holds token %d", l.key, client, l.Token(), h.client, h.l.Token())
			}
		}
		k.overdue(client, l)
	}
}

// unlock notes that the holds ls are being released now.
func (k *multiChecker) unlock(ls []*Lease) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, l := range ls {
		if k.unlocking[l.key] == nil {
			k.unlocking[l.key] = map[Token]time.Time{}
		}
		k.unlocking[l.key][l.ref().token] = time.Now()
	}
}

// A multiSimLink is a simLink whose extensions are checked by key: none
// of a lease whose Unlock began.
type multiSimLink struct {
	*simLink
	mk *multiChecker
}

func (l *multiSimLink) extend(ctx context.Context, refs []leaseRef) ([]bool, error) {
	l.mk.mu.Lock()
	for _, ref := range refs {
		if at, ok := l.mk.unlocking[ref.key][ref.token]; ok && ref.role != roleWaiter && time.Now().After(at) {
			l.mk.fail("%q: token %d extended %v after its Unlock began", ref.key, ref.token, time.Since(at))
		}
	}
	l.mk.mu.Unlock()
	return l.simLink.extend(ctx, refs)
}

// simMultiLock locks keys as op says: a MultiMutex, or a Mutex for one key
// when mutex is set. It returns the leases held, and what to unlock with.
func simMultiLock(ctx context.Context, c *Client, keys []string, try, mutex bool) ([]*Lease, func(context.Context) error, locker, error) {
	if mutex && len(slices.Compact(slices.Sorted(slices.Values(keys)))) == 1 {
		m := c.NewMutex(keys[0])
		lock := m.Lock
		if try {
			lock = m.TryLock
		}
		err := lock(ctx)
		m.mu.Lock()
		l := m.lease // even if lost already: the checks skip lost leases themselves
		m.mu.Unlock()
		return []*Lease{l}, m.Unlock, m, err
	}
	m := c.NewMultiMutex(keys)
	lock := m.Lock
	if try {
		lock = m.TryLock
	}
	err := lock(ctx)
	var ls []*Lease
	if err == nil {
		ls = slices.Clone(m.lease.leases)
	}
	return ls, m.Unlock, m, err
}

// leftBehind reports whether c keeps a lease of lk's (Lock failed, so
// none may be left).
func leftBehind(c *Client, lk locker) bool {
	c.ext.mu.Lock()
	defer c.ext.mu.Unlock()
	for l := range c.ext.leases {
		if l.lk == lk {
			return true
		}
	}
	return false
}

// simMultiScript runs one goroutine's ops for Client id.
func simMultiScript(k *multiChecker, c *Client, link *simLink, id int, plan multiSimPlan, start time.Time, crashed *sync.Once) {
	cp := plan.clients[id]
	for j, op := range cp.ops {
		time.Sleep(op.gap)
		if time.Since(start) > simHorizon || link.isCrashed() {
			return
		}
		timeout := op.timeout
		if plan.patient[id][j] {
			timeout = simPatient
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		called := time.Now()
		ls, unlock, lk, err := simMultiLock(ctx, c, plan.sets[id][j], op.try, plan.mutex[id][j])
		cancel()
		patient := plan.patient[id][j] && !link.isCrashed() // a crashed Client's calls wait for nothing
		if !simMultiLocked(k, c, id, lk, plan.sets[id][j], timeout, time.Since(called), patient, err) {
			continue
		}
		for _, l := range ls {
			if err := l.Err(); err != nil && !plan.mutex[id][j] { // (a Mutex's TryLock may return a hold answered late: sim_test.go)
				k.mu.Lock()
				k.fail("client %d: Lock of %q returned a hold already ended: %v", id, plan.sets[id][j], err)
				k.mu.Unlock()
			}
		}
		k.acquired(id, ls, called)
		if op.cut > 0 {
			link.cut(op.cut)
		}
		time.Sleep(op.hold / 2)
		k.valid(id, ls)
		time.Sleep(op.pause) // the world stops after the check
		if op.crash {
			crashed.Do(link.crash)
			return
		}
		time.Sleep(op.hold / 2)
		uctx, ucancel := context.WithTimeout(context.Background(), op.unlock)
		k.unlock(ls)
		if op.late {
			link.lateNext()
		}
		unlock(uctx)
		ucancel()
		if op.prune {
			pctx, pcancel := context.WithTimeout(context.Background(), simClientTTL)
			c.Prune(pctx, 0)
			pcancel()
		}
	}
}

// simMultiLocked checks how a Lock of keys, with a deadline of timeout,
// that took took, ended: it reports whether it holds them.
func simMultiLocked(k *multiChecker, c *Client, id int, lk locker, keys []string, timeout, took time.Duration, patient bool, err error) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if took > timeout {
		k.fail("client %d: Lock of %q with a %v ctx returned after %v", id, keys, timeout, took)
	}
	if err != nil && leftBehind(c, lk) {
		k.fail("client %d: Lock of %q failed (%v) and left a lease behind", id, keys, err)
	}
	switch {
	case err == nil:
		return true
	case patient && errors.Is(err, context.DeadlineExceeded):
		k.fail("client %d: a Lock of %q waited %v in vain: deadlock (%v)", id, keys, timeout, err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, ErrLocked), errors.Is(err, ErrClosed),
		errors.Is(err, ErrLeaseLost), errors.Is(err, ErrTTLTooShort):
	default:
		k.fail("client %d: Lock of %q: unexpected error %v", id, keys, err)
	}
	return false
}

// runMultiSim runs plan with flaw f; it returns the first violation, or "".
func runMultiSim(t *testing.T, plan multiSimPlan, f flaw) (failure string, holds int) {
	failure, stats := runMultiSimStats(t, plan, f)
	return failure, stats.holds
}

// multiSimStats is what a run of the multi-key simulation did.
type multiSimStats struct {
	holds          int // holds of a key
	rounds, shared int // the watchers' rounds, and those that read more than one key
}

// runMultiSimStats is runMultiSim, with what the run did.
func runMultiSimStats(t *testing.T, plan multiSimPlan, f flaw) (failure string, stats multiSimStats) {
	synctest.Test(t, func(t *testing.T) {
		k := &multiChecker{
			simChecker: &simChecker{life: map[string]chan struct{}{}, mode: simMutex, releasing: map[Token]time.Time{}, lastWrite: map[string]time.Time{}, queue: map[string]map[string]map[string]bool{}},
			holds:      map[string][]*simHold{}, unlocking: map[string]map[Token]time.Time{},
		}
		st := newMemStore()
		st.observe = func(key string, before, after record) { k.queueOrder(key, before, after) }
		start := time.Now()
		var wg, network sync.WaitGroup
		defer network.Wait()
		var clients []*Client
		var closers []func()
		for id, cp := range plan.clients {
			link := &simLink{st: st, faults: cp.faults, k: k.simChecker, net: &network, name: fmt.Sprint("client-", id), cuts: cp.cuts, t0: start, stale: cp.stale}
			c, err := newClientOn(func(*telemetry) store { return &multiSimLink{link, k} },
				WithTTL(simClientTTL), withClock(newSkewedClock(cp.offset, cp.rate)), withFlaw(f), WithOwner(fmt.Sprint("client-", id)), withPacer(cmp.Or[pacer](plan.pacer, rulesPacer{})))
			if err != nil {
				k.fail("%v", err)
				return
			}
			link.owner = c.owner
			clients = append(clients, c)
			closeOnce := simCloser(c)
			closers = append(closers, closeOnce)
			if cp.closeAt > 0 {
				time.AfterFunc(cp.closeAt, closeOnce)
			}
			var crashed sync.Once
			for range cp.mutexes {
				wg.Go(func() { simMultiScript(k, c, link, id, plan, start, &crashed) })
			}
		}
		wg.Go(func() { simMultiPrunes(st, k, plan, clients, &network, start) })
		stop := simMultiWatch(k)
		wg.Wait()
		for _, closeOnce := range closers {
			closeOnce()
		}
		stop()
		simMultiProbe(k, st)
		k.mu.Lock()
		failure, stats = k.failure, multiSimStats{k.simChecker.acquired, k.rounds, k.shared}
		k.mu.Unlock()
	})
	return failure, stats
}

// simClose closes c, waiting at most a TTL for its writes (its link may
// lose them).
func simClose(c *Client) {
	ctx, cancel := context.WithTimeout(context.Background(), simClientTTL)
	defer cancel()
	c.Close(ctx)
}

// simCloser returns a function that closes c once; every call returns
// once c is closed. (It waits on a channel, which, unlike a sync.Once's
// mutex, lets the bubble's clock run meanwhile.)
func simCloser(c *Client) func() {
	var closing atomic.Bool
	closed := make(chan struct{})
	return func() {
		if closing.CompareAndSwap(false, true) {
			simClose(c)
			close(closed)
		}
		<-closed
	}
}

// simMultiPrunes runs the plan's prunes: by a Client, or by a janitor
// with a fault-free link.
func simMultiPrunes(st *memStore, k *multiChecker, plan multiSimPlan, clients []*Client, network *sync.WaitGroup, start time.Time) {
	janitor, err := newClientOn(func(*telemetry) store {
		return &simLink{st: st, k: k.simChecker, net: network, name: "janitor", t0: start, writes: &atomic.Int64{}}
	}, WithTTL(simClientTTL))
	if err != nil {
		return
	}
	defer simClose(janitor)
	var done time.Duration
	for _, p := range slices.SortedFunc(slices.Values(plan.prunes), func(a, b simPrune) int { return cmp.Compare(a.at, b.at) }) {
		time.Sleep(p.at - done)
		done = p.at
		c := janitor
		if p.client >= 0 {
			c = clients[p.client]
		}
		ctx, cancel := context.WithTimeout(context.Background(), simClientTTL)
		c.Prune(ctx, p.idle)
		cancel()
	}
}

// simMultiWatch starts a watcher: at most one valid lease of each key
// whenever it looks. Call the function it returns to stop it.
func simMultiWatch(k *multiChecker) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				k.mu.Lock()
				for key, hs := range k.holds {
					var valid []*simHold
					for _, h := range hs {
						if h.l.Err() == nil {
							valid = append(valid, h)
							k.overdue(h.client, h.l)
						}
					}
					if len(valid) > 1 {
						k.fail("%q: %d leases valid at once (tokens %d and %d)", key, len(valid), valid[0].l.Token(), valid[1].l.Token())
					}
				}
				k.mu.Unlock()
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// simMultiProbe checks liveness: with the network healthy and everyone
// gone, a new Client takes every key, each within a crashed waiter's
// registration TTL of reaching it (registrationTTLs TTLs, longer than a
// crashed holder's TTL), and a poll; and a TTL more.
func simMultiProbe(k *multiChecker, st *memStore) {
	probe, err := newClientOn(func(*telemetry) store { return st }, WithTTL(simClientTTL))
	if err != nil {
		k.fail("%v", err)
		return
	}
	defer probe.Close(context.Background())
	n := time.Duration(len(simMultiKeys))
	bound := (registrationTTLs*n+1)*simClientTTL + n*2*DefaultMaxBackoff
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	called := time.Now()
	m := probe.NewMultiMutex(simMultiKeys)
	if err := m.Lock(ctx); err != nil {
		k.mu.Lock()
		k.fail("the keys were not all free within %v of everyone leaving: %v", bound, err)
		k.mu.Unlock()
		return
	}
	k.acquired(-1, m.lease.leases, called)
}

// TestSimulationMulti: the properties hold for MultiMutexes (and Mutexes)
// locking overlapping sets of keys under every fault of the simulation.
func TestSimulationMulti(t *testing.T) {
	start, runs := time.Now(), 0
	var sum multiSimStats
	rapid.Check(t, func(rt *rapid.T) {
		runs++
		failure, n := runMultiSimStats(t, drawMultiSimPlan(rt), noFlaw)
		sum.holds, sum.rounds, sum.shared = sum.holds+n.holds, sum.rounds+n.rounds, sum.shared+n.shared
		if failure != "" {
			rt.Fatal(failure)
		}
	})
	t.Logf("%d runs in %v: %d holds of a key; %d rounds of the watchers, %d of them of several keys",
		runs, time.Since(start).Round(time.Millisecond), sum.holds, sum.rounds, sum.shared)
}

// TestSimulationMultiCatchesCallerOrder: MultiMutexes that lock their keys
// in the caller's order, not one canonical order, deadlock, and the
// simulation catches it within its budget of runs.
func TestSimulationMultiCatchesCallerOrder(t *testing.T) {
	runs, found := catchWithin(t, 300, func(rt *rapid.T) string {
		found, _ := runMultiSim(t, drawMultiSimPlan(rt), flawMultiCallerOrder)
		return found
	})
	if found == "" {
		t.Fatalf("not caught in %d runs", runs)
	}
	t.Logf("caught after %d runs: %s", runs, found)
}

// TestSimulationMultiCatchesWrongViews: a watcher that hands each wait of
// a round the view of another key of that round is caught within the
// budget of runs: its waits wait for a key they see held, while it is
// free, until a patient Lock's deadline. Caught after 7 to 249 runs in ten
// tries (90 on average): a budget of 2,000 misses it about once in 10^9.
func TestSimulationMultiCatchesWrongViews(t *testing.T) {
	runs, found := catchWithin(t, 2000, func(rt *rapid.T) string {
		found, _ := runMultiSim(t, drawMultiSimPlan(rt), flawViewOfOtherKey)
		return found
	})
	if found == "" {
		t.Fatalf("not caught in %d runs", runs)
	}
	t.Logf("caught after %d runs: %s", runs, found)
}
