package dlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// This file is the lease core's acquisition, shared by every primitive:
// the entry of an exclusive Lock (Mutex, RWMutex.Lock, Election), whose
// wait is in wait.go; the shared wait (RWMutex.RLock, Semaphore); and what
// both use: the grant of a lease, the sleep between polls, the token of a
// raw record, and the watches of holders and entries. docs/design.md has
// the lock document's design.

// A claim is what one locking call asks for, and for whom.
type claim struct {
	lk      locker
	cfg     *config
	pace    *pacing // what the primitive's waits and holds taught it (pacer.go)
	attempt attempt // key, ttl, kind, data; shared and limit for a shared hold
}

// lockExclusive takes an exclusive hold for cl: first this Client's slot
// for the key, queueing behind its other callers (or, with try, failing
// with errLockedHere), then the key, unless the previous holder of the
// slot handed its hold over. name is the span's.
func (c *Client) lockExclusive(ctx context.Context, cl claim, name string, try bool) (l *Lease, err error) {
	key := cl.attempt.key
	if err := c.begin(); err != nil {
		return nil, err
	}
	defer c.finish()
	start := time.Now()
	cl.pace.relocking(c.clock.Now(), requeueWindow(cl.cfg))
	parent := ctx
	ctx, span := c.tel.lockSpan(ctx, name, key, c.owner)
	cl.attempt.trace = traceOf(span, parent) // also for a handoff to this call (handOver)
	attempts := 0
	defer func() { c.tel.endLock(ctx, span, start, attempts, l, err) }()

	l, err = c.enter(ctx, cl, try)
	if err != nil {
		return nil, err
	}
	if l != nil {
		switch err := l.Err(); {
		case errors.Is(err, ErrReleased): // handed over as the Client closed
			c.leave(key)
			return nil, ErrClosed
		case err != nil: // a handoff answered too late to use: acquire afresh
			l = nil
		}
	}
	if l == nil {
		l, attempts, err = c.acquire(ctx, cl, try)
		if err != nil {
			c.leave(key)
			return nil, err
		}
	}
	return l, nil
}

// lockShared takes a shared hold for cl (a Semaphore's permit, an
// RWMutex's read hold), with no local queue.
func (c *Client) lockShared(ctx context.Context, cl claim, name string, try bool) (l *Lease, err error) {
	if err := c.begin(); err != nil {
		return nil, err
	}
	defer c.finish()
	start := time.Now()
	parent := ctx
	ctx, span := c.tel.lockSpan(ctx, name, cl.attempt.key, c.owner)
	cl.attempt.trace = traceOf(span, parent)
	attempts := 0
	defer func() { c.tel.endLock(ctx, span, start, attempts, l, err) }()
	l, attempts, err = c.acquireShared(ctx, cl, try)
	return l, err
}

// errLateReply is the cause of a hold lost before Lock could return it: the
// acquire was answered after the lease's local deadline. Lock retries, up
// to lateReplies times in a row; a TryLock returns it in a
// *LeaseLostError.
var errLateReply = errors.New("dlock: the acquire was answered after the lease's local deadline")

// lateReplies is how many of a wait's writes that won something (a hold,
// a place in the queue), in a row, answered after their local deadline,
// end the wait with ErrTTLTooShort: one is a slow reply (a pause, a
// failover), three in a row are a TTL under the round trip.
const lateReplies = 3

// A waitLog is what a wait saw, for the error it ends with.
type waitLog struct {
	lastErr error    // the last transient failure
	late    int      // writes answered after their local deadline since the last that won in time
	holders []Holder // the holds of the last record seen held, up to maxHeldEvents
	more    int      // the holds of that record beyond holders
}

// sawHeld records who holds r, a record the wait read or wrote, if anyone
// does.
func (w *waitLog) sawHeld(r record) {
	hs := holdersOf(r)
	if len(hs) == 0 {
		return
	}
	n := min(len(hs), maxHeldEvents)
	w.holders, w.more = hs[:n:n], len(hs)-n
}

// waitError is the error of a wait for key that ctx ended, whose last
// round failed with err: a *WaitError with what the wait saw. err is its
// last error when it is the server's (not an account of the command ctx
// cut short), or the driver's failure to select a server, which names
// why none could be reached.
func (w *waitLog) waitError(ctx context.Context, key string, err error) error {
	last := w.lastErr
	if err != nil && (unanswered(err) || !errors.Is(err, ctx.Err())) {
		last = err
	}
	return &WaitError{Key: key, Err: ctx.Err(), LastErr: last, Holders: w.holders, more: w.more}
}

// tooLate counts err, a round's error (nil for none), if it is
// errLateReply, and returns the error to end the wait with once the late
// writes in a row number lateReplies: the TTL is shorter than the round
// trip. A write that won in time resets the count (registeredInTime); an
// acquire that won in time ends the wait. The late replies are the
// error: no last error is named beside it.
func (w *waitLog) tooLate(err error, ttl time.Duration) error {
	if !errors.Is(err, errLateReply) {
		return nil
	}
	if w.late++; w.late < lateReplies {
		return nil
	}
	w.lastErr = nil
	return fmt.Errorf("%w: %d writes in a row were answered after their local deadline (TTL %v)",
		ErrTTLTooShort, w.late, ttl)
}

// registeredInTime checks the registration in q that a wait's join just
// made or adopted, if any. One whose reply came after its local deadline
// has ended already, and, unregistered, the wait's own entry would keep
// its attempts out of the queue: it is removed in the background and
// errLateReply returned, for the wait to count (tooLate). One answered in
// time resets the late count.
func (c *Client) registeredInTime(q *queueing, w *waitLog) error {
	switch {
	case q.reg == nil:
		return nil
	case q.registered():
		w.late = 0
		return nil
	}
	ref := q.reg.ref()
	c.tidy(cleanupTimeout, func(ctx context.Context) { c.store.release(ctx, ref) }) // not the TTL: too short for an answer
	*q = queueing{}
	return errLateReply
}

// grant makes the lease of a hold that a made with token t, by a write
// sent at sent, and has the extender keep it. When Close has begun it
// gives the hold back in the background and returns ErrClosed; when the
// lease has already expired (the reply came too late) it returns a
// *LeaseLostError whose cause is errLateReply: the hold is still a's on
// the server, which the caller's next attempt finds.
func (c *Client) grant(cl claim, a attempt, t Token, ro role, sent time.Time) (*Lease, error) {
	l := c.newLease(cl.lk, cl.cfg, a, t, ro, sent)
	if c.isClosing() || !c.ext.add(l) {
		// Won as Close began: give it back, in the background so that the
		// call returns at once; Close waits for it.
		l.end(ErrReleased, "")
		ref := l.ref()
		c.tidy(a.ttl, func(ctx context.Context) { c.store.release(ctx, ref) })
		return nil, ErrClosed
	}
	if l.Err() != nil {
		l.end(ErrReleased, "")
		return nil, &LeaseLostError{Key: a.key, Token: t, Cause: errLateReply}
	}
	return l, nil
}

// waitPoll waits d, what the wait's pacing asked for, before the next
// poll of a held key; or less when the watch of the record (w) or of an
// entry (ew) is due sooner; and never longer than limit (maxSleep, or
// schedule.limit). These caps, not the pacing, keep the liveness bounds
// (pacer.go). It returns ctx's error or ErrClosed when those come first.
func (c *Client) waitPoll(ctx context.Context, d, limit time.Duration, w *watch, ew *entryWatch) error {
	t := c.clock.NewTimer(pollFor(c.clock.Now(), d, limit, w, ew))
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	case <-c.closing:
		t.Stop()
		return ErrClosed
	}
}

// pollFor is how long a wait sleeps at now before its next poll (waitPoll,
// waitView): d, or less when a watch is due sooner, never longer than
// limit. It wakes when a watch comes due, not again and again once it is:
// an attempt that could not act on it (the server out of reach) waits for
// the poll, rather than spinning.
func pollFor(now time.Time, d, limit time.Duration, w *watch, ew *entryWatch) time.Duration {
	if due := w.wait(now); w.rev != 0 && due > 0 {
		d = min(d, due)
	}
	if due := ew.wait(now); due > 0 {
		d = min(d, due)
	}
	return min(d, limit)
}

// giveUp is how an acquisition that gives up with err ends: the attempt a
// whose outcome is unknown (unsure) is given back in the background; a
// wait that ctx ended reports ctx's error, in a *WaitError with what the
// wait saw (log), not the driver's account of the cancelled command; and
// otherwise the last transient failure is named.
func (c *Client) giveUp(ctx context.Context, a attempt, unsure bool, log *waitLog, err error) error {
	if unsure {
		bound := a.ttl
		if errors.Is(err, ErrTTLTooShort) {
			bound = cleanupTimeout // a TTL is too short for an answer
		}
		c.tidy(bound, func(ctx context.Context) { c.store.abandon(ctx, a) })
	}
	switch {
	case ctx.Err() != nil && !errors.Is(err, ErrClosed):
		return log.waitError(ctx, a.key, err)
	case log.lastErr != nil && err != log.lastErr:
		return errorf("dlock: %w (last error: %w)", err, log.lastErr)
	}
	return err
}

// kindError reports a key used by another kind of primitive than cl's.
func kindError(key, want, got string) error {
	name := func(k string) string {
		switch {
		case k == "":
			return "a Mutex"
		case k == kindRW:
			return "an RWMutex"
		case k == kindElection:
			return "an Election"
		case strings.HasPrefix(k, "sem/"):
			return "a Semaphore of " + k[len("sem/"):] + " permits"
		default:
			return "a " + k
		}
	}
	return fmt.Errorf("%w: %q is used as %s, not as %s", ErrKindMismatch, key, name(got), name(want))
}

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

// clearDeadQueue clears the registrations of r, key's record as a try
// just read it, when the server's clock shows that none of them was
// extended for longer than the longest of their TTLs: every write of the
// record, an extension of a registration included, stamps it (record.At),
// so no registration was extended since. It reports whether it cleared
// them. A try waits for nothing, so it cannot watch their epochs for a
// TTL as a waiting Lock does (entryWatch); without this, a waiter that
// died with no waiting Lock behind it would block every try, and Prune,
// which skips records with registrations, for good. A registration is not
// a hold: the server's clock, which no exclusion rests on, may judge it,
// and a step of that clock costs a live waiter at most its place (its
// Client registers again). It costs a try two commands, only when
// registrations block it: the server's clock and the clearing write.
func (c *Client) clearDeadQueue(ctx context.Context, key string, r record) bool {
	if r.Owner != "" || len(r.Waiters) == 0 {
		return false
	}
	var longest time.Duration
	stale := make([]staleEntry, 0, len(r.Waiters))
	for hk, e := range r.Waiters {
		longest = max(longest, e.TTL)
		stale = append(stale, staleEntry{role: roleWaiter, key: hk, epoch: e.Epoch, token: e.Token, stored: e.Stored})
	}
	now, ok, err := c.store.serverTime(ctx)
	if err != nil || !ok || now.Sub(r.At) <= longest+serverClockResolution {
		return false
	}
	cleared, err := c.store.reap(ctx, key, stamp{}, stale)
	return err == nil && cleared
}

// sharable reports whether r takes a shared hold of attempt a now: no
// exclusive holder, room under the limit, no writer registered, and not a
// raw document that someone else has joined already.
func (r record) sharable(a attempt) bool {
	return r.Owner == "" && len(r.Shared) < a.limit && len(r.Waiters) == 0 && !(r.Raw && len(r.Shared) > 0)
}

// token returns the token of the hold whose counter r, the reply to its
// acquire, shows as t. A raw record's counter counts from 0, not from the
// floor: the token is then the floor, read now, after the reply, so after
// the record was created, plus that count; and a record this very acquire
// created (its first revision) counts 1, whatever counter the acquire set
// (a shared acquire sets its Client's guess plus one, which may have been
// a deleted record's: counted, it would add the old counter to every new
// life of the key). The hold writes its token into the record, as its
// base, with its first write (leaseRef.raw). docs/design.md has the
// argument.
func (c *Client) token(ctx context.Context, r record, t Token) (Token, error) {
	if !r.Raw {
		return t, nil
	}
	f, err := c.store.floor(ctx)
	if r.Rev == 1 {
		t = 1
	}
	return f + t, err
}

// An entryWatch is a waiter's view of the entries (shared holds and
// writers' registrations) of a record: each entry's epoch and, on the
// waiter's clock, when it may be cleared if its epoch has not changed.
// That is the rule of watch, applied per entry: an owner's extension
// changes its entry's epoch, so an epoch unchanged for the entry's TTL
// since the waiter's read arrived means its owner relies on it no more.
type entryWatch struct {
	seen     map[string]watchedEntry
	reapLive bool // flawReapLive: entries are due at once
}

type watchedEntry struct {
	role     role
	key      string
	epoch    int64
	token    Token
	stored   string
	deadline time.Time
}

// observe records r's entries of the given roles (those that block the
// waiter), read at now; it forgets every other entry.
func (ew *entryWatch) observe(r record, now time.Time, roles ...role) {
	next := make(map[string]watchedEntry, len(r.Shared)+len(r.Waiters))
	for _, ro := range roles {
		for k, e := range r.entries(ro) {
			id := string(rune('0'+ro)) + k
			old, ok := ew.seen[id]
			if !ok || old.epoch != e.Epoch || old.token != e.Token || old.stored != e.Stored {
				old = watchedEntry{role: ro, key: k, epoch: e.Epoch, token: e.Token, stored: e.Stored, deadline: now.Add(e.TTL)}
				if ew.reapLive {
					old.deadline = now
				}
			}
			next[id] = old
		}
	}
	ew.seen = next
}

// dueAt makes the watched entry hk of role ro clearable from at.
func (ew *entryWatch) dueAt(ro role, hk string, at time.Time) {
	id := string(rune('0'+ro)) + hk
	if e, ok := ew.seen[id]; ok {
		e.deadline = at
		ew.seen[id] = e
	}
}

// due returns the watched entries that may be cleared at now.
func (ew *entryWatch) due(now time.Time) []staleEntry {
	var stale []staleEntry
	for _, e := range ew.seen {
		if !now.Before(e.deadline) {
			stale = append(stale, staleEntry{role: e.role, key: e.key, epoch: e.epoch, token: e.token, stored: e.stored})
		}
	}
	return stale
}

// wait is how long from now until the first watched entry may be cleared,
// or -1 when none is watched.
func (ew *entryWatch) wait(now time.Time) time.Duration {
	d := time.Duration(-1)
	for _, e := range ew.seen {
		if left := max(e.deadline.Sub(now), 0); d < 0 || left < d {
			d = left
		}
	}
	return d
}

// observe reads key's record into w. A hold of this Client's that no
// call of it uses (an earlier attempt's, whose Lock gave up before its
// reply came, or a lease that was lost) may be taken over at once: this
// call holds the Client's slot for the key, so no other call of it relies
// on that hold. With [WithServerClockTakeover], when the record's revision
// is new to w, it also estimates the server's clock (reading it when the
// last reading is over a TTL old), so that a record written long ago by the
// server's clock can be taken over without waiting a further TTL.
func (c *Client) observe(ctx context.Context, key string, w *watch) (record, error) {
	r, err := c.store.read(ctx, key)
	if err != nil {
		return r, err
	}
	c.watchHolder(ctx, r, w)
	return r, nil
}

// watchHolder brings w up to date with r, a record just read (or
// returned by a registration), as observe describes.
func (c *Client) watchHolder(ctx context.Context, r record, w *watch) {
	if r.free() {
		return
	}
	if r.Owner == c.owner {
		w.orphan(r, c.clock.Now())
		return
	}
	elapsed := time.Duration(-1)
	if c.cfg.hooks.flawed(flawWallClockExpiry) {
		elapsed = c.clock.Now().Sub(r.At) // our wall clock against the server's: unsound
	}
	if r.Rev != w.rev && c.serverClock.reported() {
		now, ok := c.serverClock.estimate(c.clock.Now(), r.TTL)
		if !ok {
			sent := c.clock.Now()
			switch t, reported, err := c.store.serverTime(ctx); {
			case err != nil:
				// Not fatal: wait a full TTL on our own clock instead.
			case !reported:
				c.serverClock.markUnsupported()
			default:
				now, ok = c.serverClock.record(t, sent, c.clock.Now())
			}
		}
		if ok {
			elapsed = now.Sub(r.At)
		}
	}
	w.observe(r, c.clock.Now(), elapsed)
}
