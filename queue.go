package dlock

import (
	"context"
	"errors"
	"time"
)

// This file is the queue of a key's waiters, as each wait keeps its
// place in it: registration (two writes that no other can outrun), the
// wait's view of the waiters ahead and their marks, the marks of its own
// registration by its place, and the clearing of registrations that
// stopped being extended. docs/fairness.md has the queue's contract;
// docs/design.md, its writes.

// remark marks the registration of the wait of a in q asleep or awake,
// as the pacer says for its place (byPlace: ahead waiters ahead of it,
// awake of them awake), and brings q, and *r, up to date with the record
// the write returned. A registration found gone was cleared: the wait
// registers again.
func (c *Client) remark(ctx context.Context, cl claim, a attempt, r *record, q *queueing, ew *entryWatch, ahead, awake int) error {
	if !q.registered() {
		return nil
	}
	sleep, change := c.pacer.doze(ahead, awake, q.sleep)
	if !change || sleep == q.sleep {
		return nil
	}
	marked, err := c.store.mark(ctx, q.reg.ref(), sleep)
	switch {
	case errors.Is(err, errNotOwner):
		q.reg.end(ErrReleased, "") // cleared already: nothing to remove
		*q = queueing{}
		return nil
	case err != nil:
		return err
	}
	*r = marked
	return c.view(cl, a, marked, ew, q)
}

// queues reports whether an exclusive wait for a key of kind queues in
// the document (not with the flawed variants that keep waiters out).
func (c *Client) queues(kind string) bool {
	switch {
	case c.cfg.hooks.flawed(flawUnfair):
		return kind == kindRW // as before fair queueing: only an RWMutex's writers registered
	case c.cfg.hooks.flawed(flawNoWriterRegistration):
		return kind != kindRW
	}
	return true
}

// A queueing is one wait's place in its key's queue.
type queueing struct {
	reg   *Lease           // the registration, kept alive by the extender; nil when not registered
	ahead map[string]int64 // the waiters registered before it, as last seen: their queue numbers by hold key
	awake int              // how many of them were awake, as last seen
	sleep bool             // its registration is marked asleep, as last seen
}

// registered reports whether the wait is registered, as far as it knows.
func (q *queueing) registered() bool { return q.reg != nil && q.reg.Err() == nil }

// number is the wait's queue number (its registration's token), or 0.
func (q *queueing) number() int64 {
	if q.reg == nil {
		return 0
	}
	return int64(q.reg.token)
}

// stale reports whether r, the record as read, is from before the wait's
// registration (of hold key hk) was numbered: a late read, or a watcher's
// round. It tells nothing of the queue: its waiters ahead may be too few,
// and their marks older than those the wait last saw.
func (q *queueing) stale(r record, hk string) bool {
	if q.reg == nil {
		return false
	}
	e, ok := r.Waiters[hk]
	return r.Queue < q.number() || ok && e.Q != q.number()
}

// asleep reports whether the wait's registration is marked asleep.
func (q *queueing) asleep() bool { return q.registered() && q.sleep }

// head reports whether the wait may send an acquire: unregistered (it
// then takes a free key only while no one is registered), or registered,
// awake, with no waiter ahead of it awake as last seen. The acquire's
// filter checks that those ahead are gone or still asleep, so a stale
// view costs a failed attempt, not the order. A sleeper is never the head:
// it sends only its plan's attempts, reads, and wakes when its place says
// (wait.remark).
func (q *queueing) head() bool { return !q.registered() || !q.sleep && q.awake == 0 }

// enqueue registers attempt a as a waiter for its key, with the next
// queue number, in two writes that no other registration can outrun
// (store.register). It returns the record written; unregistered (no
// record of a's kind, or the entry cleared between the two writes), the
// record it then read (the zero record when the key has none), to wait
// unregistered until the next poll. A registration whose outcome is
// unknown is removed in the background.
func (c *Client) enqueue(ctx context.Context, cl claim, a attempt, q *queueing) (record, error) {
	rc := cl.cfg.registrations()
	a.ttl = rc.ttl
	a.sleep = !a.shared && cl.pace.sleepy(c.pacer) // a Semaphore's waiter registers awake, and marks itself by its place past the first n (wait.remark)
	sent := c.clock.Now()
	r, err := c.store.register(ctx, a)
	switch {
	case errors.Is(err, errHeld):
		return c.store.read(ctx, a.key)
	case err != nil:
		c.dropRegistration(a, 0) // pending
		if r.Queue != 0 {
			c.dropRegistration(a, r.Queue) // or numbered
		}
		return record{}, err
	}
	a.queue = r.Waiters[a.holdKey()].Q - 1
	reg := c.registration(rc, a, sent)
	if !c.ext.add(reg) {
		c.tidy(a.ttl, func(ctx context.Context) { c.store.release(ctx, reg.ref()) })
		return record{}, ErrClosed
	}
	*q = queueing{reg: reg, sleep: a.sleep}
	return r, nil
}

// registration returns the lease of the registration that attempt a,
// sent at sent, made with the registrations' config rc (a.ttl is rc's):
// its token is its queue number, the one after a's guess (a.queue), and
// it carries no data.
func (c *Client) registration(rc *config, a attempt, sent time.Time) *Lease {
	reg := c.newLease(nil, rc, a, Token(a.queue+1), roleWaiter, sent)
	reg.data = nil
	return reg
}

// registrations returns the config of the registrations of waits made
// with c: registrationTTLs of their TTL, extended as much less often. No
// exclusion rests on a registration, only how long a dead waiter holds up
// the queue (docs/fairness.md), so its upkeep is cut by as much.
func (c *config) registrations() *config {
	rc := *c
	rc.ttl, rc.extendEvery = registrationTTLs*c.ttl, registrationTTLs*c.every()
	return &rc
}

// registrationTTLs: a dead waiter is reaped within two TTLs, a read of
// the one behind it (at most half a TTL) and a poll of its last extension.
const registrationTTLs = 2

// dropRegistration removes, in the background, the registration that
// attempt a may have made: its reply did not come.
func (c *Client) dropRegistration(a attempt, q int64) {
	ref := leaseRef{key: a.key, owner: a.owner, hold: a.hold, ttl: a.ttl, token: Token(q), role: roleWaiter}
	c.tidy(a.ttl, func(ctx context.Context) { c.store.release(ctx, ref) })
}

// view brings a wait up to date with r, the record as just
// read or registered in (watchHolder does the holder's revision): its
// place in the queue (a registration that is gone, cleared by another
// waiter while this Client could not extend it, is ended, and the wait
// registers again), its primitive's view of the queue and token counters,
// and the entries it watches for liveness: the waiters ahead of
// it (all of them while unregistered) and, for an RWMutex's writer, the
// shared holds.
func (c *Client) view(cl claim, a attempt, r record, ew *entryWatch, q *queueing) error {
	if r.Rev != 0 && r.Kind != a.kind {
		return kindError(a.key, a.kind, r.Kind)
	}
	if r.Rev != 0 {
		cl.pace.sawQueue(r)
		cl.pace.sawToken(r.Token, c.clock.Now())
	}
	blocking := r
	e, ok := r.Waiters[a.holdKey()]
	switch {
	case q.reg == nil:
	case q.stale(r, a.holdKey()):
		return nil // the wait goes on with what it saw last
	case !ok:
		q.reg.end(ErrReleased, "") // cleared already: nothing to remove
		*q = queueing{}
	default:
		q.ahead, q.awake, q.sleep = r.ahead(e.Q), 0, e.Sleep
		blocking.Waiters = make(map[string]entry, len(q.ahead))
		for hk := range q.ahead {
			blocking.Waiters[hk] = r.Waiters[hk]
			switch {
			case !r.Waiters[hk].Sleep || r.Waiters[hk].Q == 0:
				// Awake; or pending (store.register), marked asleep
				// only until its number, perhaps below ours, is written.
				q.awake++
			case c.cfg.hooks.flawed(flawPassAsSeen):
				delete(q.ahead, hk) // the acquire's filter no longer checks it
			}
		}
	}
	now := c.clock.Now()
	roles := []role{roleShared, roleWaiter}
	if a.shared && q.reg == nil && len(r.Shared) < a.limit {
		roles = roles[1:] // a shared hold blocks an unregistered one only in a full Semaphore
	}
	ew.observe(blocking, now, roles...)
	if a.shared {
		// A Semaphore's Acquires hold no slot: one Client's wait side by
		// side, and a registration of its own ahead may be a sibling's.
		return nil
	}
	for hk, e := range blocking.Waiters {
		if e.Owner == c.owner && hk != a.holdKey() {
			// A registration of this Client's that no call uses (one whose
			// removal did not land): this call holds the Client's slot for
			// the key, so it may clear it at once, as an orphaned hold.
			ew.dueAt(roleWaiter, hk, now)
		}
	}
	return nil
}

// unregister ends a registration that its acquire did not end, and
// removes it from the document in the background.
func (c *Client) unregister(reg *Lease) {
	if reg == nil || !reg.end(ErrReleased, "") {
		return
	}
	ref := reg.ref()
	c.tidy(reg.ttl, func(ctx context.Context) { c.store.release(ctx, ref) })
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
