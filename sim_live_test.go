package dlock

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

// The liveness simulation: the bounds of docs/fairness.md as a property.
// One Client holds key "k" while a queue of waiters of other Clients forms
// behind it; some of the waiters leave (their ctx ends), some crash (their
// Client stops: nothing it sends arrives), each at a drawn moment and in
// whichever mark it then has, some of the dead marked asleep on purpose;
// the holder then unlocks, or crashes. Whatever died where, a live waiter
// must take the key within the bound the docs state for that scene:
//
//   - from when the key is free: the Unlock, or two TTLs after the
//     holder's crash (its takeover);
//   - and a waiter that died awake is reaped at most its registration's
//     TTL (registrationTTLs TTLs), half a TTL and a poll after it died
//     (its last extension was before);
//   - then a live waiter's attempt comes within a poll interval, or half
//     a TTL when the waiters left are asleep (a quarter when the key stood
//     still).
//
// A waiter that died asleep holds up nothing. The live waiters are paced by
// the run's pacer (every one of pacers(), plans aimed a day late included):
// the bounds must hold whatever it answers.

// A liveScene is one run of the liveness simulation.
type liveScene struct {
	pacer   int           // index in pacers(), or -1: wakeCountsSleepers
	waiters []liveWaiter  // in the order they register
	release time.Duration // when the holder unlocks, or crashes
	crash   bool          // the holder crashes rather than unlocks
}

// A liveWaiter is one waiter of a liveScene, of a Client of its own.
type liveWaiter struct {
	fate   liveFate
	at     time.Duration // when it leaves or crashes
	asleep bool          // a dead one marks its registration asleep whatever its place
}

type liveFate int

const (
	liveStays liveFate = iota // waits until it has the key
	liveLeaves
	liveCrashes
)

func (f liveFate) String() string { return [...]string{"stays", "leaves", "crashes"}[f] }

// drawLiveScene draws a scene (with its pacer, unless pacer is one of
// pacers() or -1): up to four groups of up to twelve waiters, each of one fate
// and mark, so that a waiter often has many of one kind ahead of it, at
// least one of which stays; the leaves, crashes and the release come in
// the first two TTLs.
func drawLiveScene(t *rapid.T, pacer int) liveScene {
	ttl := DefaultTTL
	sc := liveScene{pacer: pacer, release: drawDuration(t, "release", 2*ttl), crash: rapid.IntRange(0, 3).Draw(t, "holderCrashes") == 0}
	if pacer == drawPacerIndex {
		sc.pacer = rapid.IntRange(0, len(pacers())-1).Draw(t, "pacer")
	}
	for g := range rapid.IntRange(1, 4).Draw(t, "groups") {
		fate := liveFate(rapid.IntRange(0, 2).Draw(t, fmt.Sprint("fate", g)))
		asleep := fate != liveStays && rapid.Bool().Draw(t, fmt.Sprint("asleep", g))
		for i := range rapid.IntRange(1, 12).Draw(t, fmt.Sprint("size", g)) {
			w := liveWaiter{fate: fate, asleep: asleep}
			if fate != liveStays {
				w.at = drawDuration(t, fmt.Sprint("at", g, ".", i), 2*ttl)
			}
			sc.waiters = append(sc.waiters, w)
		}
	}
	if !slices.ContainsFunc(sc.waiters, func(w liveWaiter) bool { return w.fate == liveStays }) {
		sc.waiters = append(sc.waiters, liveWaiter{})
	}
	return sc
}

// drawPacerIndex asks drawLiveScene to draw the scene's pacer.
const drawPacerIndex = -2

// drawDuration draws a duration up to most, in milliseconds.
func drawDuration(t *rapid.T, label string, most time.Duration) time.Duration {
	return time.Duration(rapid.Int64Range(0, most.Milliseconds()).Draw(t, label)) * time.Millisecond
}

// liveDeadline is when, at the latest, a live waiter of sc must hold the
// key, when what died held it up until each of upTo, counted from the
// start (liveWorld.dies).
func liveDeadline(sc liveScene, upTo []time.Duration) time.Duration {
	ttl := DefaultTTL
	free := sc.release
	if sc.crash {
		free += 2*ttl + fairPoll
	}
	for _, at := range upTo {
		free = max(free, at)
	}
	return free + max(fairPoll, ttl/2) + 10*time.Millisecond
}

// runLiveScene runs sc and returns the violation, or "".
func runLiveScene(t *testing.T, sc liveScene) (failure string) {
	synctest.Test(t, func(t *testing.T) {
		failure = liveRun(t, sc)
	})
	return failure
}

// A liveWorld is a liveScene running in its bubble: what its waiters
// share.
type liveWorld struct {
	st      *memStore
	start   time.Time
	took    chan string // the live waiters that took the key
	wg      sync.WaitGroup
	cancels []context.CancelFunc // of the waiters' Locks
	mu      sync.Mutex
	upTo    []time.Duration // guarded by mu: until when each of the dead may hold the key up (dies)
}

// liveRun is runLiveScene inside its bubble.
func liveRun(t *testing.T, sc liveScene) string {
	ctx := context.Background()
	var pace pacer = wakeCountsSleepers{}
	if sc.pacer >= 0 {
		pace = pacers()[sc.pacer].pacer
	}
	lw := &liveWorld{st: newMemStore(), start: time.Now(), took: make(chan string, len(sc.waiters))}
	defer lw.wg.Wait()
	defer func() {
		for _, cancel := range lw.cancels {
			cancel()
		}
	}()
	holder, hh := memClient(t, lw.st)
	mh := holder.NewMutex("k")
	if err := mh.Lock(ctx); err != nil {
		return fmt.Sprintf("the holder's Lock: %v", err)
	}
	for i, w := range sc.waiters {
		if failure := lw.queue(t, i, w, pace); failure != "" {
			return failure
		}
	}
	if sc.crash {
		time.AfterFunc(sc.release, func() { hh.stop(t) })
	} else {
		time.AfterFunc(sc.release, func() { mh.Unlock(ctx) })
	}
	last := sc.release
	for _, w := range sc.waiters {
		last = max(last, w.at)
	}
	time.Sleep(last + time.Millisecond - time.Since(lw.start)) // every event has happened
	lw.mu.Lock()
	deadline := liveDeadline(sc, lw.upTo)
	lw.mu.Unlock()
	if late := deadline - time.Since(lw.start); late > 0 {
		select {
		case <-lw.took:
			return ""
		case <-time.After(late):
		}
	}
	select {
	case <-lw.took: // by the deadline: the clock stands still while the bubble's goroutines run
		return ""
	default:
		return fmt.Sprintf("no live waiter took the key by %v (queue %s, holder %q)",
			deadline, liveQueue(lw.st), holderOf(lw.st, "k"))
	}
}

// queue starts waiter i, w, paced by pace (or asleep on purpose), and
// waits until it registered; it schedules its end.
func (lw *liveWorld) queue(t *testing.T, i int, w liveWaiter, pace pacer) string {
	ctx := context.Background()
	if w.asleep {
		asleep := new(atomic.Bool)
		asleep.Store(true)
		pace = dozer{asleep: asleep}
	}
	c, h := memClient(t, lw.st, withPacer(pace))
	wctx, cancel := context.WithCancel(ctx)
	lw.cancels = append(lw.cancels, cancel)
	lw.wg.Go(func() {
		m := c.NewMutex("k")
		if m.Lock(wctx) != nil {
			return
		}
		switch w.fate { // one that took the key before its end holds it until then
		case liveStays:
			lw.took <- c.owner
		case liveLeaves:
			<-wctx.Done()
			m.Unlock(ctx)
		}
	})
	synctest.Wait()
	if !slices.Contains(waiters(lw.st, "k"), c.owner) {
		return fmt.Sprintf("waiter %d did not register", i)
	}
	switch w.fate {
	case liveLeaves:
		time.AfterFunc(w.at, func() { lw.dies(c, w.fate, cancel) })
	case liveCrashes:
		time.AfterFunc(w.at, func() { lw.dies(c, w.fate, func() { h.stop(t); h.settle() }) })
	}
	return ""
}

// dies ends waiter c, of fate, by die, after noting until when it may
// hold the key up, by the bounds of docs/fairness.md: a waiter marked
// awake, until it is reaped, its registration's TTL, half a TTL (the
// longest read interval behind it, a sleeper's) and a poll after it died;
// one that took the key, until it frees it as it leaves, or two TTLs and
// a poll after it crashed; one marked asleep, not at all. A waiter that
// leaves is judged as it was when it began to leave (its last writes
// free what it had); one that crashes, as its last writes left it: die
// returns once every write it sent before it crashed has landed (a
// sleeper whose mark awake was on its way holds the queue up as an awake
// one).
func (lw *liveWorld) dies(c *Client, fate liveFate, die func()) {
	if fate == liveCrashes {
		die()
	}
	ttl, r, now := DefaultTTL, holder(lw.st, "k"), time.Since(lw.start)
	until := time.Duration(0)
	switch {
	case r.Owner == c.owner && fate == liveCrashes:
		until = now + 2*ttl + fairPoll
	case r.Owner == c.owner:
		until = now
	}
	for _, e := range r.Waiters {
		if e.Owner == c.owner && !e.Sleep {
			until = now + registrationTTLs*ttl + ttl/2 + fairPoll
		}
	}
	lw.mu.Lock()
	lw.upTo = append(lw.upTo, until)
	lw.mu.Unlock()
	if fate != liveCrashes {
		die()
	}
}

// liveQueue describes the queue of "k" in st: each waiter, asleep or not.
func liveQueue(st *memStore) string {
	r := holder(st, "k")
	var q []string
	for _, owner := range waiters(st, "k") {
		for _, e := range r.Waiters {
			if e.Owner == owner {
				q = append(q, fmt.Sprintf("%s(asleep=%v)", owner, e.Sleep))
			}
		}
	}
	return "[" + strings.Join(q, " ") + "]"
}

// holderOf returns the owner of key's hold in st, "" when free.
func holderOf(st *memStore, key string) string { return holder(st, key).Owner }

// TestSimulationLiveness: a free key with a live waiter is taken within
// the bound of docs/fairness.md, whatever died where and in which mark,
// with each pacer. More runs: -rapid.checks=2000.
func TestSimulationLiveness(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		if failure := runLiveScene(t, drawLiveScene(rt, drawPacerIndex)); failure != "" {
			rt.Fatal(failure)
		}
	})
}

// The liveness simulation catches a sleeper that wakes by how many
// waiters are ahead of it, asleep or not (wakeCountsSleepers): behind
// waiters that died asleep, it sleeps on while the key stands free.
func TestSimulationLivenessCatchesFlaw(t *testing.T) {
	runs, found := catchWithin(t, 2000, func(rt *rapid.T) string { return runLiveScene(t, drawLiveScene(rt, -1)) })
	if found == "" {
		t.Fatalf("not caught in %d runs", runs)
	}
	t.Logf("caught after %d runs: %s", runs, found)
}
