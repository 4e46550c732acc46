package dlock

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"time"
)

// This file is the shared wait: a Semaphore's permit or an RWMutex's
// read hold. The exclusive wait is in wait.go; what both share, in
// acquire.go, queue.go and liveness.go.

// acquireShared takes a shared hold for cl: a Semaphore's permit or an
// RWMutex's read hold. A shared acquire is a compare-and-set on the key's
// token counter (docs/design.md has why), so it is sent only when the counter is
// known and the key looks takeable: a wait polls by reading the document,
// one command a poll, and sends an acquire when a read shows room for it.
// An uncontended shared acquire whose counter the primitive knows is one
// command; the first of a primitive, two (a read, then the acquire).
//
// A Semaphore's Acquire that must wait registers in the key's queue
// (join), at once when its primitive waited lately, and takes a permit
// only while one is left for each waiter ahead of it (takeable); a
// registered waiter is paced as an exclusive one, by its place. An
// RLock does not register: a registered writer keeps it out.
//
// A read that shows a hold of this very call (an attempt whose reply was
// lost) takes it. Holds and registrations that block the call and
// whose owners stopped extending them are cleared by their epochs, and a
// document whose revision stood still for a TTL is cleared whole (every
// hold in it has ended), both by writes conditional on what was read.
func (c *Client) acquireShared(ctx context.Context, cl claim, try bool) (*Lease, int, error) {
	x := c.newSharedWait(ctx, cl, try)
	var ready bool
	x.a.token, ready = cl.pace.token()
	fresh := false // the registration's reply is as good as a read: wait for the poll
	if x.queues && x.sched.contended(c.clock.Now()) {
		var err error
		ready, err = x.join()   // its last wait was lately: register at once, as a Lock does
		x.tooLate(err, x.a.ttl) // counts a late registration: the first can't be the last
		fresh = x.q.registered()
	}
	afterRead := false
	for {
		var err error
		read := !ready && !fresh
		fresh = false
		if ready {
			var done bool
			if done, read, err = x.attemptOnce(afterRead); done {
				return x.lease, x.attempts, err
			}
		}
		ready, afterRead = false, false
		if read {
			var s step
			switch s, err = x.read(); s {
			case stepDone:
				return x.lease, x.attempts, err
			case stepAgain:
				ready, afterRead = x.ready, x.ready
				continue
			}
		}
		if tooLate := x.tooLate(err, x.a.ttl); tooLate != nil {
			return nil, x.attempts, x.giveUp(tooLate)
		}
		switch {
		case err != nil && (try || ctx.Err() != nil || !(transient(err) || errors.Is(err, errLateReply))):
			return nil, x.attempts, x.giveUp(err)
		case err != nil:
			x.lastErr = err
		case try:
			return nil, x.attempts, x.giveUp(errLockedElsewhere)
		case x.queues && !x.q.registered():
			if ready, err = x.join(); ready {
				continue
			}
			if tooLate := x.tooLate(err, x.a.ttl); tooLate != nil {
				return nil, x.attempts, x.giveUp(tooLate)
			}
			x.lastErr = cmp.Or(err, x.lastErr)
		}
		now := c.clock.Now()
		// A registered waiter is paced as an exclusive one (rulePeriod): one
		// of the first n (a permit would be its) as the head is.
		registered, asleep := x.q.registered(), x.q.asleep()
		head := registered && !asleep && x.place() == 0
		d, limit := x.sched.next(now, registered, head, asleep), x.sched.limit(now, asleep)
		if x.view, err = c.waitRound(ctx, cl.cfg, x.a.key, d, limit, &x.w, &x.ew); err != nil {
			return nil, x.attempts, x.giveUp(err)
		}
	}
}

// A sharedWait is one shared acquisition in progress: what the steps of
// Client.acquireShared share.
type sharedWait struct {
	c     *Client
	ctx   context.Context
	cl    claim
	try   bool
	a     attempt
	lease *Lease // the hold taken, when the wait ends with it

	w         watch
	ew        entryWatch
	q         queueing         // a Semaphore's waiter's place in the queue
	view      *view            // a view of the key that the watcher gave the wait as it slept: the next round's read
	asleep    map[string]int64 // the waiters ahead of it seen asleep, by hold key: their queue numbers (takeable)
	queues    bool             // a Semaphore's Acquire: it registers once it must wait
	sched     schedule         // plain backoff and the age rule; a Semaphore's registered waiter is paced by its place too
	attempts  int
	unsure    bool      // an attempt may have applied without our seeing the reply
	firstSent time.Time // when the first attempt whose outcome is unknown was sent
	waitLog             // what the wait saw, for its error
	ready     bool      // with stepAgain from read: the record looks takeable, attempt at once
	holder    record    // the last record whose holders were reported to the trace
	events    int       // holders reported
}

// newSharedWait returns the shared wait of claim cl, with a hold id of its
// own; try makes it a single attempt (no registration).
func (c *Client) newSharedWait(ctx context.Context, cl claim, try bool) *sharedWait {
	x := &sharedWait{c: c, ctx: ctx, cl: cl, try: try, a: cl.attempt, sched: cl.pace.shared(cl.cfg, c.pacer)}
	x.a.owner, x.a.hold = c.owner, c.holdIDs.Add(1)
	x.queues = !try && strings.HasPrefix(x.a.kind, "sem/") && c.queues(x.a.kind)
	if c.cfg.hooks.flawed(flawSharedOverLimit) {
		x.a.limit++
	}
	x.ew.reapLive = c.cfg.hooks.flawed(flawReapLive)
	return x
}

func (x *sharedWait) giveUp(err error) error {
	x.c.unregister(x.q.reg)
	return x.c.giveUp(x.ctx, x.a, x.unsure, &x.waitLog, err)
}

// join registers the wait in the key's queue (a Semaphore's waiters are
// served in order, across permits: see takeable) and reports whether the
// record its registration returned has room for it now.
func (x *sharedWait) join() (ready bool, err error) {
	c := x.c
	r, err := c.enqueue(x.ctx, x.cl, x.a, &x.q)
	if err == nil {
		err = c.registeredInTime(&x.q, &x.waitLog)
	}
	if err != nil || !x.q.registered() {
		return false, err
	}
	if err := c.view(x.cl, x.a, r, &x.ew, &x.q); err != nil {
		return false, err
	}
	if err := x.remark(&r); err != nil || !x.q.registered() {
		return false, err
	}
	x.sched.saw(r, c.clock.Now(), c.clock.Now(), true, x.turns(), true)
	x.a.token = r.Token
	return x.takeable(r), nil
}

// takeable reports whether r has room for the wait's shared hold now: as
// record.sharable, or, registered and awake, with a permit left for each
// waiter ahead of it that is awake, or pending (its number may be below
// its own), each owed one first. It notes the waiters ahead it saw
// asleep, which its attempt passes only while they still are (x.asleep).
func (x *sharedWait) takeable(r record) bool {
	if !x.q.registered() {
		return r.sharable(x.a)
	}
	x.asleep = map[string]int64{}
	for hk, q := range x.q.ahead {
		if e := r.Waiters[hk]; e.Sleep && q != 0 && !x.c.cfg.hooks.flawed(flawSemaphoreOutOfOrder) {
			x.asleep[hk] = q
		}
	}
	return !x.q.sleep && r.Owner == "" && len(r.Shared)+x.passing() < x.a.limit && !(r.Raw && len(r.Shared) > 0)
}

// place is how many permits must change hands before one is the wait's,
// as a registered exclusive waiter's place counts the awake waiters ahead
// of it (schedule.saw): 0 among the first n.
func (x *sharedWait) place() int { return max(x.q.awake-x.a.limit+1, 0) }

// passing is how many waiters ahead of the wait's registration it passes
// awake, each owed a permit before it (attempt.passing).
func (x *sharedWait) passing() int {
	if x.c.cfg.hooks.flawed(flawSemaphoreOutOfOrder) {
		return 0
	}
	return x.q.awake
}

// remark marks the wait's registration asleep or awake by its place, as
// an exclusive waiter's (byPlace), counting its places past the first n.
func (x *sharedWait) remark(r *record) error {
	return x.c.remark(x.ctx, x.cl, x.a, r, &x.q, &x.ew, x.turns(), x.place())
}

// turns is how many waiters ahead of the wait, asleep or awake, are past
// the first n: each holds a permit before it, once awake.
func (x *sharedWait) turns() int { return max(len(x.q.ahead)-x.a.limit+1, 0) }

// take makes the lease of the hold a has in r, its token counted from the
// floor if r is raw.
func (x *sharedWait) take(r record, sent time.Time) (*Lease, error) {
	c := x.c
	x.a.raw = r.Raw
	t, err := c.token(x.ctx, r, r.Shared[x.a.holdKey()].Token)
	if err != nil {
		return nil, err
	}
	x.cl.pace.sawToken(r.Token, c.clock.Now())
	if c.cfg.hooks.flawed(flawDeadlineFromReply) {
		sent = c.clock.Now()
	}
	if x.q.reg != nil { // the acquire ended the registration
		x.q.reg.end(ErrReleased, "")
	}
	l, err := c.grant(x.cl, x.a, t, roleShared, sent)
	if err == nil {
		l.settle(x.ctx) // others join a raw record only once it is empty (record.sharable)
	}
	return l, err
}

// attemptOnce sends one shared acquire at the counter last seen: done
// with x.lease when it took a hold (or with ErrClosed); otherwise the
// error to act on and whether to read at once (afterRead: the attempt
// followed a read, which lagged if it failed: wait for the poll).
func (x *sharedWait) attemptOnce(afterRead bool) (done, read bool, err error) {
	c := x.c
	x.attempts++
	x.a.registered, x.a.number, x.a.passing, x.a.ahead = x.q.registered(), x.q.number(), x.passing(), x.asleep
	sent := c.clock.Now()
	r, err := c.store.acquire(x.ctx, x.a, stamp{})
	if err == nil {
		if x.lease, err = x.take(r, sent); err == nil {
			x.sched.ended(c.clock.Now())
			return true, false, nil
		}
		if errors.Is(err, ErrClosed) {
			return true, false, ErrClosed
		}
		if errors.Is(err, errLateReply) {
			x.forget() // counted once, here: a read must not find it and count it again
			return false, false, err
		}
	}
	switch {
	case errors.Is(err, errHeld) && !afterRead:
		return false, true, nil // a stale counter, or taken meanwhile: read at once
	case errors.Is(err, errHeld):
		return false, false, nil // the read that sent it lagged: wait for the poll
	case !x.unsure:
		x.unsure, x.firstSent = true, sent
	}
	return false, false, err
}

// forget gives back, in the background, the hold that this call's attempts
// made and cannot use, and goes on with a new hold id.
func (x *sharedWait) forget() {
	c, old := x.c, x.a
	c.tidy(old.ttl, func(ctx context.Context) { c.store.abandon(ctx, old) })
	x.a.hold, x.unsure = c.holdIDs.Add(1), false
}

// read reads the record: it takes a hold that an earlier attempt of this
// call made, or starts a new round at once when the record has room
// (x.ready) or when it cleared what blocked the wait.
func (x *sharedWait) read() (step, error) {
	c, a := x.c, &x.a
	var r record
	var err error
	if v := x.view; v != nil { // read by a round of the watcher
		x.view, r = nil, v.r
	} else {
		r, err = c.store.read(x.ctx, a.key)
	}
	now := c.clock.Now()
	switch {
	case err != nil:
		return stepOn, err
	case r.Rev != 0 && r.Kind != a.kind:
		return stepDone, x.giveUp(kindError(a.key, a.kind, r.Kind))
	case r.Shared[a.holdKey()].Owner != "":
		// An earlier attempt of this call applied: the hold counts from
		// when the first attempt that may have made it was sent.
		l, err := x.take(r, x.firstSent)
		switch {
		case err == nil:
			x.lease = l
			return stepDone, nil
		case errors.Is(err, ErrClosed):
			return stepDone, ErrClosed
		}
		x.forget() // too late to rely on, or its floor read failed
		return stepOn, err
	}
	if x.q.stale(r, a.holdKey()) && !c.cfg.hooks.flawed(flawActOnStaleRead) {
		// Its marks may be older than the view the wait last acted on: a
		// waiter ahead seen asleep since may show awake here, and, taken
		// as news, no attempt would check it (takeable). Wait for the next.
		return stepOn, nil
	}
	a.token = r.Token
	x.cl.pace.sawToken(r.Token, c.clock.Now())
	x.sawHeld(r)
	if x.q.reg != nil {
		if err := c.view(x.cl, *a, r, &x.ew, &x.q); err != nil {
			return stepOn, err
		}
		if err := x.remark(&r); err != nil {
			return stepOn, err
		}
		x.sched.saw(r, now, now, x.q.registered(), x.turns(), true)
	}
	if x.ready = x.takeable(r); x.ready {
		return stepAgain, nil
	}
	x.events += c.tel.heldBy(x.ctx, a.key, r, &x.holder, maxHeldEvents-x.events)
	if r.free() {
		x.w = watch{} // no hold to take over: registered writers block it (ew)
	} else {
		x.w.observe(r, now, -1)
	}
	if !x.q.registered() { // registered, view watches those ahead and the holds
		blockers := []role{roleWaiter} // a registered waiter blocks new shared holds
		if len(r.Shared) >= a.limit {
			blockers = append(blockers, roleShared) // and so does a full Semaphore
		}
		x.ew.observe(r, now, blockers...)
	}
	if at := x.w.takeover(now); at.rev != 0 {
		if ok, rerr := c.store.reap(x.ctx, a.key, at, nil); rerr == nil && ok {
			return stepAgain, nil // cleared: read again at once
		}
	} else if stale := x.ew.due(now); len(stale) > 0 {
		if ok, rerr := c.store.reap(x.ctx, a.key, stamp{}, stale); rerr == nil && ok {
			return stepAgain, nil
		}
	}
	if x.try && c.clearDeadQueue(x.ctx, a.key, r) {
		return stepAgain, nil
	}
	return stepOn, nil
}

// sharable reports whether r takes a shared hold of attempt a now: no
// exclusive holder, room under the limit, no writer registered, and not a
// raw document that someone else has joined already.
func (r record) sharable(a attempt) bool {
	return r.Owner == "" && len(r.Shared) < a.limit && len(r.Waiters) == 0 && !(r.Raw && len(r.Shared) > 0)
}
