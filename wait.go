package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// acquire takes the key exclusively for cl, holding this Client's slot for
// it. It returns the lease, the number of acquire attempts, and an error
// when ctx ended, the Client closed, the key is held (with try) or the
// server failed in a way that waiting will not mend.
//
// A call that must wait queues in the key's document (docs/fairness.md):
// it registers with the next queue number, and only the head of the queue
// may take the key; an unregistered attempt takes a free key only while no
// one is registered. Registrations are extended like leases, and those
// whose Clients stopped extending them are reaped (entryWatch), so a
// crashed waiter holds up the queue for at most its registration's TTL
// (registrationTTLs of the wait's) and a read. A TryLock never
// queues. All the attempts of one call carry one hold id, so a retry after
// an unanswered attempt finds that attempt's hold its own.
//
// The steps:
//  1. Take over what the last Unlock left: a kept hold, with no command,
//     or a requeued registration (resumeKept).
//  2. A round at a time: register (join); or send what the schedule says
//     (pacer.go), an acquire attempt (attemptOnce) or a read (read). The
//     head attempts, the waiters behind it read to learn when they are at
//     the head, and a planned wait attempts once its turn is due.
//  3. Act on what the round saw (settle). A read that shows the key
//     takeable is followed by an attempt at once, but only once.
//  4. Sleep as long as the schedule says, capped by the watches (pause);
//     a long sleep in the Client's watcher (watcher.go), whose rounds may
//     bring the key's record, which the next round takes as its read.
//
// Besides the schedule's reads, the wait reads to start a watch on the
// holder's revision once it outlasts its first poll (a TryLock at once),
// when that watch says the holder may be taken over, and, while its Lock
// span is recorded, after the failed polls numbered 1, 2, 4, 8 and so on,
// to name each new holder: at most log2(n) reads more for n polls.
func (c *Client) acquire(ctx context.Context, cl claim, try bool) (*Lease, int, error) {
	x := c.newExclusiveWait(ctx, cl, try)
	if l, err, done := x.resumeKept(); done {
		return l, x.attempts, err
	}
	for {
		var s step
		var err error
		read := false
		switch {
		case x.enqueue || x.pr != nil:
			s, err = x.join()
		case x.view != nil: // a round of the watcher read the key for this one
			read = true
		case x.sched.attempts(c.clock.Now(), x.q.head()):
			s, read, err = x.attemptOnce()
		default: // behind others in the queue: read to learn when at its head
			read = true
		}
		switch s {
		case stepAgain:
			continue
		case stepDone:
			return x.lease, x.attempts, err
		}
		// Every round that did not just read passes the watches' check,
		// whatever the schedule planned: the liveness bounds rest on it.
		read = read || err == nil && !x.afterRead && x.watchesDue(c.clock.Now())
		x.afterRead = false
		if read {
			if s, err = x.read(); s == stepAgain {
				continue
			}
		}
		switch s, err = x.settle(err); s {
		case stepAgain:
			continue
		case stepDone:
			return nil, x.attempts, err
		}
		if err := x.pause(); err != nil {
			return nil, x.attempts, x.giveUp(err)
		}
	}
}

// A step says how a round of an exclusive wait goes on.
type step int

const (
	stepOn    step = iota // to the round's next step
	stepAgain             // to a new round at once, with no wait
	stepDone              // the wait ended
)

// An exclusiveWait is one exclusive acquisition in progress: what the
// steps of Client.acquire share.
type exclusiveWait struct {
	c     *Client
	ctx   context.Context
	cl    claim
	try   bool
	a     attempt
	lease *Lease // with stepDone from attemptOnce: the hold taken

	w         watch
	ew        entryWatch
	q         queueing
	sched     schedule  // when the next command goes, and which (pacer.go)
	pr        *leftover // what the last Unlock left for this call, until the wait adopts it
	attempts  int
	unsure    bool   // an attempt may have applied without our seeing the reply
	afterRead bool   // this attempt follows a read (or a registration) at once: if it fails too, the read lagged
	waitLog          // what the wait saw, for its error (acquire.go)
	holder    record // the last record whose holders were reported to the trace
	events    int    // holders reported
	tracing   bool   // the Lock span is recorded
	queues    bool   // the wait registers in the key's queue
	spares    bool   // its attempts reserve a spare token (keep.go)
	kept      bool   // this call sent a kept hold's handoff (another Mutex's hold, or flawKeepAlways)
	enqueue   bool   // register in the next round
	view      *view  // a view of the key that the watcher gave the wait as it slept: the next round's read
	joined    bool   // tried to register since the last wait: at most once a poll
}

func (c *Client) newExclusiveWait(ctx context.Context, cl claim, try bool) *exclusiveWait {
	x := &exclusiveWait{c: c, ctx: ctx, cl: cl, try: try, a: cl.attempt, sched: cl.pace.exclusive(cl.cfg, c.pacer)}
	x.a.owner, x.a.hold = c.owner, c.holdIDs.Add(1)
	x.a.pastQueue = c.cfg.hooks.flawed(flawUnfair) || c.cfg.hooks.flawed(flawQueueJump)
	x.tracing = trace.SpanFromContext(ctx).IsRecording()
	x.ew.reapLive = c.cfg.hooks.flawed(flawReapLive)
	x.queues = !try && c.queues(x.a.kind)
	_, spares := cl.lk.(requeuer) // its Unlock may keep a hold (keep.go): reserve a spare token
	x.spares = spares && !c.cfg.hooks.flawed(flawUnfair) && x.sched.spares()
	x.pr = c.pickUp(x.a) // what the last Unlock left for this call: a kept hold, or a registration
	return x
}

// giveUp ends the wait with err: see Client.giveUp.
func (x *exclusiveWait) giveUp(err error) error {
	x.c.unregister(x.q.reg)
	return x.c.giveUp(x.ctx, x.a, x.unsure, &x.waitLog, err)
}

// resumeKept takes over the hold that the last Unlock kept for this call,
// if it did (done), or else adopts the registration it left, if any; the
// wait then registers at once if its primitive waited less than a TTL ago.
func (x *exclusiveWait) resumeKept() (l *Lease, err error, done bool) {
	c, pr := x.c, x.pr
	if pr != nil && pr.kept() {
		x.kept = pr.byHandoff(x.cl)
		l, sent, err := c.resume(x.ctx, x.cl, x.a, pr)
		x.attempts = sent
		switch {
		case err == nil:
			return l, nil, true
		case errors.Is(err, ErrClosed):
			return nil, ErrClosed, true
		case !errors.Is(err, errNotOwner):
			x.unsure, x.lastErr = true, err // the hold may be a's: the next attempt renews it
		}
		x.pr = nil
	}
	if x.pr != nil {
		x.a.hold = x.pr.a.hold
	}
	x.enqueue = x.queues && x.pr == nil && x.sched.contended(c.clock.Now())
	x.joined = x.enqueue || x.pr != nil
	return nil, nil, false
}

// pickUp returns what the last Unlock left for an exclusive acquire of
// a's key, kind and TTL (a kept hold is ended: the caller hands it over),
// or nil when there is none. One of another kind or TTL, or whose lease
// has ended, is disposed of. It may have been left for another primitive
// of the key: a registration is adopted all the same (it is only a place
// in the queue), a kept hold is taken over by a write (byHandoff).
func (c *Client) pickUp(a attempt) *leftover {
	c.mu.Lock()
	lo := c.leftovers[a.key]
	delete(c.leftovers, a.key)
	c.mu.Unlock()
	if lo == nil {
		return nil
	}
	close(lo.taken)
	if lo.a.kind != a.kind || lo.a.ttl != a.ttl || lo.lease.Err() != nil {
		c.tidy(lo.a.ttl, func(context.Context) { c.dispose(lo) })
		return nil
	}
	if lo.kept() {
		lo.lease.end(ErrReleased, "")
	}
	return lo
}

// resume gives the hold kept in lo (which pickUp ended) to attempt a of
// claim cl, and returns the lease and how many commands that took: none,
// the lease being the kept hold's under its spare token (the hold's
// writes still name the counter, which is that token now). The deadline
// is the kept hold's: counted from its last write's send. It returns
// ErrClosed when Close had begun (the hold is then given back), and
// errNotOwner, with the hold released in the background, when it was
// past its deadline.
//
// A hold kept for another primitive than cl's, or, for flawKeepAlways,
// kept without a spare, is handed over by a write instead: a new hold
// with a's hold id, data and a new token. The keep's own handoff is taken
// past the queue (the queue was passed by the hold's own acquire);
// another primitive's is not, as a local handoff is not: if waiters of
// other Clients are queued it is refused, the hold is released (a second
// command), and errNotOwner returned, the caller queueing behind them.
// Any other error leaves the hold perhaps a's, and the caller's next
// attempt, with a's hold id, finds and renews it.
func (c *Client) resume(ctx context.Context, cl claim, a attempt, lo *leftover) (*Lease, int, error) {
	h := lo.lease
	if !lo.byHandoff(cl) {
		next := a
		next.hold = h.hold
		l, err := c.grant(cl, next, h.token, roleExclusive, h.lastSent())
		if err == nil {
			cl.pace.took(h.lastSent(), c.clock.Now(), 0, true)
		} else if !errors.Is(err, ErrClosed) {
			ref := h.ref()
			c.tidy(a.ttl, func(ctx context.Context) { c.store.release(ctx, ref) })
			err = errNotOwner
		}
		return l, 0, err
	}
	next := a
	next.pastQueue = lo.pace == cl.pace // the keep's own handoff: the hold's acquire passed the queue
	sent := c.clock.Now()
	r, err := c.store.handoff(ctx, h.ref(), next)
	if errors.Is(err, errNotOwner) && !next.pastQueue {
		ref := h.ref()
		if c.store.release(ctx, ref) != nil {
			c.tidy(a.ttl, func(ctx context.Context) { c.store.release(ctx, ref) })
		}
		return nil, 2, errNotOwner
	}
	if err != nil {
		return nil, 1, err
	}
	l, err := c.grant(cl, a, r.Token, roleExclusive, sent)
	if err == nil {
		cl.pace.took(sent, c.clock.Now(), 0, true)
	}
	return l, 1, err
}

// join registers the wait in the key's queue, or adopts the registration
// that the last Unlock made for it (requeue.go), and brings the wait up
// to date with the record its write returned.
func (x *exclusiveWait) join() (step, error) {
	c, cl := x.c, x.cl
	var r record
	var err error
	var joined time.Time   // when an adopted registration was made
	var busy time.Duration // how long the hold before it lasted
	sent := c.clock.Now()
	if x.pr != nil {
		r, x.q.reg, joined, busy, x.pr = x.pr.r, x.pr.lease, x.pr.at, x.pr.busy, nil
	} else {
		x.enqueue = false
		r, err = c.enqueue(x.ctx, cl, x.a, &x.q)
		if err == nil && x.q.reg != nil && len(r.Waiters) > MaxQueue {
			c.unregister(x.q.reg)
			x.q = queueing{}
			err = fmt.Errorf("%w (%d, at most %d)", ErrQueueFull, len(r.Waiters)-1, MaxQueue)
		}
	}
	if err == nil {
		err = c.registeredInTime(&x.q, &x.waitLog)
	}
	if err != nil {
		return stepOn, err
	}
	if x.q.registered() { // r is the reply to the wait's own write: its registration, or the requeue that made it
		answered := joined
		if answered.IsZero() {
			answered = c.clock.Now()
		}
		sent = x.q.reg.acquired
		x.sched.registered(r, sent, answered)
	}
	if r.Rev == 0 { // no record: the key is free
		x.afterRead = true
		return stepAgain, nil
	}
	c.watchHolder(x.ctx, r, &x.w)
	if err := c.view(cl, x.a, r, &x.ew, &x.q); err != nil {
		return stepOn, err
	}
	if !joined.IsZero() && x.q.registered() {
		x.sched.requeued(joined, len(x.q.ahead), busy)
	}
	if err := x.remark(&r); err != nil {
		return stepOn, err
	}
	x.saw(r, sent)
	if x.q.head() && (r.free() || x.w.takeover(c.clock.Now()).rev != 0) {
		x.afterRead = true
		return stepAgain, nil
	}
	return stepOn, nil
}

// attemptOnce sends one acquire: stepDone with x.lease when it took the
// key (or with ErrClosed); otherwise the error to act on and whether to
// read the record before the next round.
func (x *exclusiveWait) attemptOnce() (s step, read bool, err error) {
	c := x.c
	x.attempts++
	x.a.registered, x.a.number, x.a.ahead = x.q.registered(), x.q.number(), x.q.ahead
	x.a.spare = x.a.registered && x.spares
	sent := c.clock.Now()
	r, err := c.store.acquire(x.ctx, x.a, x.w.takeover(sent))
	rtt := c.clock.Now().Sub(sent) // the acquire's round trip, without the floor read's
	var t Token
	if err == nil {
		if x.a.raw = r.Raw; x.a.raw {
			x.a.spare = false // counted from the floor: no spare
		}
		t = r.Token
		if x.a.spare {
			t--
		}
		t, err = c.token(x.ctx, r, t)
	}
	if err == nil {
		l, gerr := x.take(r, t, sent, rtt)
		if gerr == nil || errors.Is(gerr, ErrClosed) {
			x.lease = l
			return stepDone, false, gerr
		}
		// Answered too late to rely on: the hold is ours on the server,
		// and the next attempt renews it (same hold id).
		x.q = queueing{}
		x.unsure, err = true, gerr
	}
	switch {
	case err == nil:
	case !errors.Is(err, errHeld):
		x.unsure = true
		x.sched.failed()
	case x.sched.planned(sent):
		// Not its turn yet: retry, reading to trace, when the plan ran out,
		// or asleep, to learn whether it is near enough to wake (and when
		// a watch is due: Client.acquire).
		err = nil
		read = x.sched.missed(sent, c.clock.Now()) || x.traceDue() || x.q.asleep()
	case x.afterRead:
		err = nil // wait for the poll: see Client.acquire
	default:
		err = nil
		read = x.traceDue()
	}
	return stepOn, read, err
}

// watchesDue reports whether the wait must read the record at now to keep
// the liveness bounds: to start watching the holder's revision once it
// outlasted the first poll (a TryLock at once), or because a watch says
// that the holder, a waiter ahead or a reader may be cleared.
func (x *exclusiveWait) watchesDue(now time.Time) bool {
	return x.w.rev == 0 && (x.try || x.attempts > 1) || x.w.takeover(now).rev != 0 || x.ew.wait(now) == 0
}

// traceDue reports whether a failed attempt reads to name the holder in
// the recorded Lock span: after failed attempts 1, 2, 4, 8 and so on.
func (x *exclusiveWait) traceDue() bool {
	return x.tracing && x.events < maxHeldEvents && x.attempts&(x.attempts-1) == 0
}

// take makes the lease of the hold with token t that the acquire sent at
// sent made in r, and tells the primitive's pacing.
func (x *exclusiveWait) take(r record, t Token, sent time.Time, rtt time.Duration) (*Lease, error) {
	c, cl := x.c, x.cl
	if c.cfg.hooks.flawed(flawDeadlineFromReply) {
		sent = c.clock.Now()
	}
	if x.q.reg != nil { // the acquire ended the registration
		x.q.reg.end(ErrReleased, "")
	}
	l, err := c.grant(cl, x.a, t, roleExclusive, sent)
	if err != nil {
		return nil, err
	}
	// A call that sent a keep's handoff may hold by it (the attempt renews
	// the same hold id): its Unlock keeps nothing.
	x.sched.took(r, sent, c.clock.Now(), rtt, x.kept, x.q.reg != nil)
	return l, nil
}

// read reads the record: it names a new holder in the trace, clears the
// waiters ahead (or readers) that stopped extending, and starts a new
// round at once when the key can be taken.
func (x *exclusiveWait) read() (step, error) {
	c := x.c
	sent := c.clock.Now()
	var r record
	var err error
	if v := x.view; v != nil { // read by a round of the watcher
		x.view, r, sent = nil, v.r, v.sent
		c.watchHolder(x.ctx, r, &x.w)
	} else {
		r, err = c.observe(x.ctx, x.a.key, &x.w)
	}
	if err == nil {
		err = c.view(x.cl, x.a, r, &x.ew, &x.q)
	}
	if err != nil {
		return stepOn, err
	}
	// Name the holder whatever the read leads to (a reap, an attempt at
	// once): the next read may come after the key changed hands.
	if x.tracing {
		x.events += c.tel.heldBy(x.ctx, x.a.key, r, &x.holder, maxHeldEvents-x.events)
	}
	if stale := x.ew.due(c.clock.Now()); len(stale) > 0 {
		// Waiters ahead, or readers, that stopped extending: clear them, then go on.
		if ok, rerr := c.store.reap(x.ctx, x.a.key, stamp{}, stale); rerr == nil && ok {
			x.afterRead = x.q.head()
			return stepAgain, nil
		}
	}
	if x.try && r.free() && c.clearDeadQueue(x.ctx, x.a.key, r) {
		x.afterRead = true // one more attempt, then the try ends
		return stepAgain, nil
	}
	if err := x.remark(&r); err != nil {
		return stepOn, err
	}
	if x.q.head() && (r.free() || x.w.takeover(c.clock.Now()).rev != 0) {
		x.afterRead = true
		return stepAgain, nil // freed meanwhile, a hold of ours no call uses, or due
	}
	x.saw(r, sent)
	return stepOn, nil
}

// remark marks the wait's registration asleep or awake, as the pacer says
// for its place now (byPlace), and brings the wait, and *r, up to date
// with the record the write returned. A registration found gone was
// cleared: the wait registers again.
func (x *exclusiveWait) remark(r *record) error {
	return x.c.remark(x.ctx, x.cl, x.a, r, &x.q, &x.ew, len(x.q.ahead), x.q.awake)
}

// saw tells the pacing what the record r, returned by a command sent at
// sent, shows of the wait's place, and the wait's log who holds it.
func (x *exclusiveWait) saw(r record, sent time.Time) {
	x.sawHeld(r)
	x.sched.saw(r, sent, x.c.clock.Now(), x.q.registered(), len(x.q.ahead), x.a.kind == kindRW)
}

// settle acts on the round's error: it ends the wait on one that waiting
// will not mend (or on any, with try; or on the lateReplies-th late reply
// in a row), and registers a wait that has not yet, at once.
func (x *exclusiveWait) settle(err error) (step, error) {
	if tooLate := x.tooLate(err, x.a.ttl); tooLate != nil {
		return stepDone, x.giveUp(tooLate)
	}
	switch {
	case errors.Is(err, ErrKindMismatch):
		return stepDone, x.giveUp(err)
	case err != nil && (x.try || x.ctx.Err() != nil || !(transient(err) || errors.Is(err, errLateReply))):
		return stepDone, x.giveUp(err)
	case err != nil:
		// Retry after the wait. A retried acquire that did apply the
		// first time finds the key ours.
		x.lastErr = err
	case x.try:
		return stepDone, x.giveUp(errLockedElsewhere)
	}
	if x.queues && !x.q.registered() && err == nil && !x.joined {
		x.enqueue, x.joined = true, true // join the queue now, then wait
		return stepAgain, nil
	}
	return stepOn, nil
}

// pause waits for the next round, as long as the pacing says (waitPoll).
func (x *exclusiveWait) pause() error {
	due := &x.w // when the holder's revision may be taken over: the head's concern alone
	if !x.q.head() {
		due = &watch{}
	}
	now := x.c.clock.Now()
	reg, asleep := x.q.registered(), x.q.asleep()
	d, limit := x.sched.next(now, reg, x.q.head(), asleep), x.sched.limit(now, asleep)
	var err error
	if x.view, err = x.c.waitRound(x.ctx, x.cl.cfg, x.a.key, d, limit, due, &x.ew); err != nil {
		return err
	}
	x.joined = false
	return nil
}
