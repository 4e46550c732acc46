package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// This file is the wait: the one loop by which every claim takes its key,
// exclusive (a Mutex, an RWMutex's writer, an Election's candidate, a
// MultiMutex's key) or shared (an RWMutex's reader, a Semaphore's
// permit), and the steps of its rounds. An exclusive claim is framed as a
// Semaphore of one permit (permits), so that a waiter's place in the
// queue is one formula for both (turns, place). What the two send differs,
// and only in the attempt (attemptExclusive, attemptShared): an exclusive acquire takes the key,
// or renews this call's hold, and may take over a dead holder in the same
// write; a shared acquire is a compare-and-set on the token counter that a
// read just showed, so it is sent only when a read shows room for it
// (ready). The queue is in queue.go, the liveness watches in liveness.go,
// the pacing in pacer.go and the watcher, through which a sleeping wait
// learns its key's state, in watcher.go.

// acquire takes cl's hold. It returns the lease, the number of acquire
// attempts, and an error when ctx ended, the Client closed, the key is
// held (with try) or the server failed in a way that waiting will not
// mend.
//
// A call that must wait queues in the key's document (docs/fairness.md):
// it registers with the next queue number (an RLock does not: a registered
// writer keeps it out), and takes the key only with a permit left for
// each awake waiter ahead of it; an unregistered attempt takes a free key
// only while no one is registered. Registrations are extended like
// leases, and those whose Clients stopped extending them are reaped
// (entryWatch), so a crashed waiter holds up the queue for at most its
// registration's TTL (registrationTTLs of the wait's) and a read. A try
// never queues. All the attempts of an exclusive call carry one hold id,
// so a retry after an unanswered attempt finds that attempt's hold its
// own; a shared call finds its own by reading.
//
// The steps:
//  1. Take over what the last Unlock of the primitive left: a kept hold,
//     with no command, or a requeued registration (start).
//  2. A round at a time (round): register (join); or send an acquire
//     (attempt), when the schedule says for an exclusive claim (pacer.go)
//     and when a read just showed room for a shared one; or read (read).
//     A read or a registration that shows the key takeable, or that
//     cleared what blocked it, starts a new round at once.
//  3. Act on the round's error (settle): end the wait, or register.
//  4. Sleep as long as the schedule says, capped by the watches (pause);
//     a long sleep in the Client's watcher (watcher.go), whose rounds may
//     bring the key's record, which the next round takes as its read.
//
// Besides the schedule's reads, an exclusive wait reads to start a watch
// on the holder's revision once it outlasts its first poll (a TryLock at
// once), when that watch says the holder may be taken over, and, while
// its Lock span is recorded, after the failed polls numbered 1, 2, 4, 8
// and so on, to name each new holder: at most log2(n) reads more for n
// polls.
func (c *Client) acquire(ctx context.Context, cl claim, try bool) (*Lease, int, error) {
	x := c.newWait(ctx, cl, try)
	if l, err, done := x.start(); done {
		return l, x.attempts, err
	}
	for {
		s, err := x.round()
		if s == stepOn {
			s, err = x.settle(err)
		}
		switch s {
		case stepAgain:
			continue
		case stepDone:
			return x.lease, x.attempts, err
		}
		if err := x.pause(); err != nil {
			return nil, x.attempts, x.giveUp(err)
		}
	}
}

// A step says how a round of a wait goes on.
type step int

const (
	stepOn    step = iota // to the round's next step
	stepAgain             // to a new round at once, with no wait
	stepDone              // the wait ended
)

// A wait is one acquisition in progress: what the steps of Client.acquire
// share.
type wait struct {
	c     *Client
	ctx   context.Context
	cl    claim
	try   bool
	a     attempt
	lease *Lease // with stepDone: the hold taken

	w       watch
	ew      entryWatch
	q       queueing
	sched   schedule // when the next command goes, and which (pacer.go)
	view    *view    // a view of the key that the watcher gave the wait as it slept: the next round's read
	waitLog          // what the wait saw, for its error (acquire.go)
	holder  record   // the last record whose holders were reported to the trace
	events  int      // holders reported
	tracing bool     // the Lock span is recorded

	attempts  int
	unsure    bool      // an attempt may have applied without our seeing the reply
	firstSent time.Time // a shared claim's: when the first attempt whose outcome is unknown was sent
	queues    bool      // the wait registers in the key's queue once it must wait
	enqueue   bool      // register in the next round
	joined    bool      // tried to register since the last wait: at most once a poll
	ready     bool      // a read or registration showed room: the next round attempts
	afterRead bool      // this round follows a read (or a registration) at once: if its attempt fails too, the read lagged

	pr     *leftover        // an exclusive claim's: what the last Unlock left for this call, until the wait adopts it
	spares bool             // an exclusive claim's: its attempts reserve a spare token (keep.go)
	kept   bool             // an exclusive claim's: this call sent a kept hold's handoff (another Mutex's hold, or flawKeepAlways)
	asleep map[string]int64 // a shared claim's: the waiters ahead seen asleep, which its attempt passes only while they still are (takeable)
}

func (c *Client) newWait(ctx context.Context, cl claim, try bool) *wait {
	x := &wait{c: c, ctx: ctx, cl: cl, try: try, a: cl.attempt}
	x.a.owner, x.a.hold = c.owner, c.holdIDs.Add(1)
	x.tracing = trace.SpanFromContext(ctx).IsRecording()
	x.ew.reapLive = c.cfg.hooks.flawed(flawReapLive)
	if x.a.shared {
		x.sched = cl.pace.shared(cl.cfg, c.pacer)
		x.queues = !try && strings.HasPrefix(x.a.kind, "sem/") && c.queues(x.a.kind) // a Semaphore's; a registered writer keeps an RLock out
		if c.cfg.hooks.flawed(flawSharedOverLimit) {
			x.a.limit++
		}
		return x
	}
	x.sched = cl.pace.exclusive(cl.cfg, c.pacer)
	x.a.pastQueue = c.cfg.hooks.flawed(flawUnfair) || c.cfg.hooks.flawed(flawQueueJump)
	x.queues = !try && c.queues(x.a.kind)
	_, spares := cl.lk.(requeuer) // its Unlock may keep a hold (keep.go): reserve a spare token
	x.spares = spares && !c.cfg.hooks.flawed(flawUnfair) && x.sched.spares()
	x.pr = c.pickUp(x.a) // what the last Unlock left for this call: a kept hold, or a registration
	return x
}

// start takes over the hold that the last Unlock kept for this call, if
// it did (done), or else adopts the registration it left, if any; the
// wait then registers at once if its primitive waited less than a TTL
// ago. A shared claim starts ready to attempt when its primitive knows
// the key's token counter.
func (x *wait) start() (l *Lease, err error, done bool) {
	if x.a.shared {
		x.a.token, x.ready = x.cl.pace.token()
	} else if l, err, done = x.resumeKept(); done {
		return l, err, true
	}
	x.enqueue = x.queues && x.pr == nil && x.sched.contended(x.c.clock.Now())
	x.joined = x.enqueue || x.pr != nil
	return nil, nil, false
}

// resumeKept takes over the hold that the last Unlock kept for this
// exclusive wait, if it did (done), or else takes the hold id of the
// registration it left, if any, which the wait's first round adopts.
func (x *wait) resumeKept() (l *Lease, err error, done bool) {
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
	return nil, nil, false
}

// giveUp ends the wait with err: see Client.giveUp.
func (x *wait) giveUp(err error) error {
	x.c.unregister(x.q.reg)
	return x.c.giveUp(x.ctx, x.a, x.unsure, &x.waitLog, err)
}

// round sends the round's commands: a registration, or an attempt, or a
// read, or an attempt then a read. It returns stepOn with the round's
// error for settle.
func (x *wait) round() (step, error) {
	var s step
	var err error
	read := false
	switch {
	case x.enqueue || x.pr != nil:
		s, err = x.join()
	case x.view != nil: // a round of the watcher read the key for this one
		read = true
	case x.ready || !x.a.shared && x.sched.attempts(x.c.clock.Now(), x.q.head()):
		x.ready = false
		s, read, err = x.attempt()
	default: // behind others in the queue, or a counter to learn: read
		read = true
	}
	if s != stepOn {
		return s, err
	}
	// Every round that did not just read passes the watches' check,
	// whatever the schedule planned: the liveness bounds rest on it.
	read = read || err == nil && !x.afterRead && x.watchesDue(x.c.clock.Now())
	x.afterRead = false
	if read {
		return x.read()
	}
	return stepOn, err
}

// attempt sends one acquire, as the claim's kind does.
func (x *wait) attempt() (step, bool, error) {
	if x.a.shared {
		return x.attemptShared()
	}
	return x.attemptExclusive()
}

// attemptExclusive sends one exclusive acquire: stepDone with x.lease
// when it took the key (or with ErrClosed); otherwise the error to act on
// and whether to read the record before the next round.
func (x *wait) attemptExclusive() (s step, read bool, err error) {
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
		l, gerr := x.takeExclusive(r, t, sent, rtt)
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

// takeExclusive makes the lease of the hold with token t that the acquire
// sent at sent made in r, and tells the primitive's pacing.
func (x *wait) takeExclusive(r record, t Token, sent time.Time, rtt time.Duration) (*Lease, error) {
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

// attemptShared sends one shared acquire at the counter last seen:
// stepDone with x.lease when it took a hold (or with ErrClosed);
// otherwise the error to act on and whether to read at once (not after a
// read: that read lagged if it failed, so the wait waits for the poll).
func (x *wait) attemptShared() (s step, read bool, err error) {
	c := x.c
	x.attempts++
	x.a.registered, x.a.number, x.a.passing, x.a.ahead = x.q.registered(), x.q.number(), x.passing(), x.asleep
	sent := c.clock.Now()
	r, err := c.store.acquire(x.ctx, x.a, stamp{})
	if err == nil {
		if x.lease, err = x.takeShared(r, sent); err == nil {
			x.sched.ended(c.clock.Now())
			return stepDone, false, nil
		}
		if errors.Is(err, ErrClosed) {
			return stepDone, false, ErrClosed
		}
		if errors.Is(err, errLateReply) {
			x.forget() // counted once, here: a read must not find it and count it again
			return stepOn, false, err
		}
	}
	switch {
	case errors.Is(err, errHeld):
		return stepOn, !x.afterRead, nil // a stale counter, or taken meanwhile: read at once
	case !x.unsure:
		x.unsure, x.firstSent = true, sent
	}
	return stepOn, false, err
}

// takeShared makes the lease of the shared hold x.a has in r, its token
// counted from the floor if r is raw.
func (x *wait) takeShared(r record, sent time.Time) (*Lease, error) {
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

// found takes the shared hold that an earlier attempt of this call made,
// when r, a record read, shows it (its reply was lost): the hold counts
// from when the first attempt that may have made it was sent.
func (x *wait) found(r record) (step, error) {
	if r.Rev != 0 && r.Kind != x.a.kind || r.Shared[x.a.holdKey()].Owner == "" {
		return stepOn, nil
	}
	l, err := x.takeShared(r, x.firstSent)
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

// forget gives back, in the background, the shared hold that this call's
// attempts made and cannot use, and goes on with a new hold id.
func (x *wait) forget() {
	c, old := x.c, x.a
	c.tidy(old.ttl, func(ctx context.Context) { c.store.abandon(ctx, old) })
	x.a.hold, x.unsure = c.holdIDs.Add(1), false
}

// watchesDue reports whether an exclusive wait must read the record at
// now to keep the liveness bounds: to start watching the holder's
// revision once it outlasted the first poll (a TryLock at once), or
// because a watch says that the holder, a waiter ahead or a reader may be
// cleared. A shared wait reads every round it does not attempt.
func (x *wait) watchesDue(now time.Time) bool {
	if x.a.shared {
		return false
	}
	return x.w.rev == 0 && (x.try || x.attempts > 1) || x.w.takeover(now).rev != 0 || x.ew.wait(now) == 0
}

// traceDue reports whether a failed attempt reads to name the holder in
// the recorded Lock span: after failed attempts 1, 2, 4, 8 and so on.
func (x *wait) traceDue() bool {
	return x.tracing && x.events < maxHeldEvents && x.attempts&(x.attempts-1) == 0
}

// join registers the wait in the key's queue, or adopts the registration
// that the last Unlock made for it (requeue.go), and brings the wait up
// to date with the record its write returned.
func (x *wait) join() (step, error) {
	c := x.c
	var r record
	var err error
	var joined time.Time   // when an adopted registration was made
	var busy time.Duration // how long the hold before it lasted
	sent := c.clock.Now()
	x.ready = false // the registration's reply replaces what the wait knew of the counter
	if x.pr != nil {
		r, x.q.reg, joined, busy, x.pr = x.pr.r, x.pr.lease, x.pr.at, x.pr.busy, nil
	} else {
		x.enqueue = false
		r, err = c.enqueue(x.ctx, x.cl, x.a, &x.q)
		if err == nil && x.q.reg != nil && len(r.Waiters) > MaxQueue {
			c.unregister(x.q.reg)
			x.q = queueing{}
			err = fmt.Errorf("%w (%d, at most %d)", ErrQueueFull, len(r.Waiters)-1, MaxQueue)
		}
	}
	if err == nil {
		err = c.registeredInTime(&x.q, &x.waitLog)
	}
	if err != nil || x.a.shared && !x.q.registered() {
		return stepOn, err // unregistered, a shared claim reads before it attempts
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
	if !x.a.shared {
		c.watchHolder(x.ctx, r, &x.w)
	}
	if err := c.view(x.cl, x.a, r, &x.ew, &x.q); err != nil {
		return stepOn, err
	}
	if !joined.IsZero() && x.q.registered() {
		x.sched.requeued(joined, len(x.q.ahead), busy)
	}
	if err := x.remark(&r); err != nil {
		return stepOn, err
	}
	if x.a.shared {
		x.a.token = r.Token // the counter its next attempt compares
	}
	x.saw(r, sent)
	if x.takeable(r) {
		x.afterRead, x.ready = true, x.a.shared
		return stepAgain, nil
	}
	return stepOn, nil
}

// read reads the record, or takes the view the watcher gave the wait: it
// takes a hold that an earlier shared attempt of this call made, names a
// new holder in the trace, clears the holder, the waiters ahead or the
// readers that stopped extending, and starts a new round at once when the
// key can be taken.
func (x *wait) read() (step, error) {
	c := x.c
	sent := c.clock.Now()
	var r record
	var err error
	if v := x.view; v != nil { // read by a round of the watcher
		x.view, r, sent = nil, v.r, v.sent
	} else if r, err = c.store.read(x.ctx, x.a.key); err != nil {
		return stepOn, err
	}
	if x.a.shared {
		if s, err := x.found(r); s != stepOn || err != nil {
			return s, err
		}
		if x.q.stale(r, x.a.holdKey()) && !c.cfg.hooks.flawed(flawActOnStaleRead) {
			// Its marks may be older than the view the wait last acted on: a
			// waiter ahead seen asleep since may show awake here, and, taken
			// as news, no attempt would check it (takeable). Wait for the next.
			return stepOn, nil
		}
		x.a.token, x.ready = r.Token, false // the counter its next attempt compares
		x.cl.pace.sawToken(r.Token, c.clock.Now())
	}
	x.watchHolder(r)
	if err := c.view(x.cl, x.a, r, &x.ew, &x.q); err != nil {
		return stepOn, err
	}
	// Name the holder whatever the read leads to (a reap, an attempt at
	// once): the next read may come after the key changed hands.
	x.events += c.tel.heldBy(x.ctx, x.a.key, r, &x.holder, maxHeldEvents-x.events)
	if x.reap() {
		x.afterRead = x.q.head()
		return stepAgain, nil
	}
	if x.try && (r.free() || x.a.shared) && c.clearDeadQueue(x.ctx, x.a.key, r) {
		x.afterRead = true // one more attempt, then the try ends
		return stepAgain, nil
	}
	if err := x.remark(&r); err != nil {
		return stepOn, err
	}
	if x.takeable(r) {
		x.afterRead, x.ready = true, x.a.shared
		return stepAgain, nil // freed meanwhile, a hold of ours no call uses, or due
	}
	x.saw(r, sent)
	return stepOn, nil
}

// watchHolder brings the wait's watch of the holder up to date with r: an
// exclusive wait's as Client.watchHolder does (it takes over a dead
// holder by its acquire), a shared wait's on its own clock alone (it
// clears one by a reap).
func (x *wait) watchHolder(r record) {
	switch {
	case !x.a.shared:
		x.c.watchHolder(x.ctx, r, &x.w)
	case r.free():
		x.w = watch{} // no hold to take over: registered writers block it (ew)
	default:
		x.w.observe(r, x.c.clock.Now(), -1)
	}
}

// reap clears, by one conditional write, what the watches say stopped
// extending: the waiters ahead or the readers (entryWatch) and, for a
// shared wait, the holder; it reports whether it cleared anything.
func (x *wait) reap() bool {
	c, now := x.c, x.c.clock.Now()
	if stale := x.ew.due(now); len(stale) > 0 {
		ok, err := c.store.reap(x.ctx, x.a.key, stamp{}, stale)
		return err == nil && ok
	}
	if at := x.w.takeover(now); x.a.shared && at.rev != 0 {
		ok, err := c.store.reap(x.ctx, x.a.key, at, nil)
		return err == nil && ok
	}
	return false
}

// takeable reports whether the wait attempts at once after seeing r. An
// exclusive wait at the head of the queue does when the key is free or its
// holder may be taken over. A shared wait does when r has room for it: as
// record.sharable, or, registered and awake, with a permit left for each
// waiter ahead of it that is awake, or pending (its number may be below
// its own), each owed one first; it notes the waiters ahead it saw asleep,
// which its attempt passes only while they still are (x.asleep).
func (x *wait) takeable(r record) bool {
	switch {
	case !x.a.shared:
		return x.q.head() && (r.free() || x.w.takeover(x.c.clock.Now()).rev != 0)
	case !x.q.registered():
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

// sharable reports whether r takes a shared hold of attempt a now: no
// exclusive holder, room under the limit, no writer registered, and not a
// raw document that someone else has joined already.
func (r record) sharable(a attempt) bool {
	return r.Owner == "" && len(r.Shared) < a.limit && len(r.Waiters) == 0 && !(r.Raw && len(r.Shared) > 0)
}

// permits is how many hold the key at once: a shared claim's limit, and
// one for an exclusive claim.
func (x *wait) permits() int {
	if x.a.shared {
		return x.a.limit
	}
	return 1
}

// turns is how many waiters ahead of the wait, asleep or awake, are past
// the first permits: each holds the key before it, once awake.
func (x *wait) turns() int { return max(len(x.q.ahead)-x.permits()+1, 0) }

// place is how many hand-overs must come before the key is the wait's: how
// many awake waiters ahead of it are past the first permits; 0 for the
// head.
func (x *wait) place() int { return max(x.q.awake-x.permits()+1, 0) }

// passing is how many waiters ahead of a shared wait's registration it
// passes awake, each owed a permit before it (attempt.passing).
func (x *wait) passing() int {
	if x.c.cfg.hooks.flawed(flawSemaphoreOutOfOrder) {
		return 0
	}
	return x.q.awake
}

// remark marks the wait's registration asleep or awake, as the pacer says
// for its place (byPlace), and brings the wait, and *r, up to date with
// the record the write returned. A registration found gone was cleared:
// the wait registers again.
func (x *wait) remark(r *record) error {
	return x.c.remark(x.ctx, x.cl, x.a, r, &x.q, &x.ew, x.turns(), x.place())
}

// saw tells the pacing what the record r, returned by a command sent at
// sent, shows of the wait's place, and the wait's log who holds it. A
// shared wait, whose holds are not one at a time, makes no head plan.
func (x *wait) saw(r record, sent time.Time) {
	x.sawHeld(r)
	x.sched.saw(r, sent, x.c.clock.Now(), x.q.registered(), x.turns(), x.a.shared || x.a.kind == kindRW)
}

// settle acts on the round's error: it ends the wait on one that waiting
// will not mend (or on any, with try; or on the lateReplies-th late reply
// in a row), and registers a wait that has not yet, at once.
func (x *wait) settle(err error) (step, error) {
	if tooLate := x.tooLate(err, x.a.ttl); tooLate != nil {
		return stepDone, x.giveUp(tooLate)
	}
	switch {
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

// head reports whether the wait is among those the next hand-overs serve:
// registered and awake with fewer awake waiters ahead than permits; for an
// exclusive claim, also unregistered (queueing.head).
func (x *wait) head() bool {
	if !x.a.shared {
		return x.q.head()
	}
	return x.q.registered() && !x.q.asleep() && x.place() == 0
}

// pause waits for the next round, as long as the pacing says (waitPoll).
// Only the head of an exclusive wait watches the holder's revision: the
// acquire takes it over; any shared wait may clear a dead holder.
func (x *wait) pause() error {
	due := &x.w
	if !x.a.shared && !x.q.head() {
		due = &watch{}
	}
	now := x.c.clock.Now()
	reg, asleep := x.q.registered(), x.q.asleep()
	d, limit := x.sched.next(now, reg, x.head(), asleep), x.sched.limit(now, asleep)
	var err error
	if x.view, err = x.c.waitRound(x.ctx, x.cl.cfg, x.a.key, d, limit, due, &x.ew); err != nil {
		return err
	}
	x.joined = false
	return nil
}
