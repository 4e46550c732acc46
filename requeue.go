package dlock

import (
	"context"
	"errors"
	"time"
)

// This file is the requeue: an Unlock that, in its release's own write,
// queues the next Lock of its primitive; and what the requeue and the keep
// (keep.go) share: what an Unlock leaves for its primitive's next Lock, and
// how it is picked up or disposed of. docs/fairness.md has why.
//
// Under contention a Client that loops Lock, work, Unlock spends two
// writes on every Lock to register behind the others. When its primitive's last
// Lock came soon after the Unlock before it (within the requeue window),
// and that Lock had to wait, the next Unlock frees the key and registers
// the Client's next Lock in one write. The registration is kept, with the
// record that write returned, for the Client's next exclusive Lock of the
// key, which adopts it and waits in its place. If no Lock comes within the
// window, it is removed: a registration no call uses would hold up those
// behind it once it reached the head.

// A requeuer is a primitive whose Unlock may queue its next Lock.
type requeuer interface {
	requeueClaim() claim
}

// A leftover is what an Unlock left for its primitive's next Lock of the
// key: the registration it requeued, or the hold it kept (keep.go). A
// Client keeps at most one per key (an Unlock leaves one or the other),
// until a Lock picks it up, or the requeue window passes (then it is
// disposed of: see leaveFor), or Close begins (Close frees it in its own
// write, with the leases, even when its ctx has ended).
type leftover struct {
	lease   *Lease        // the registration (extended by the extender), or the kept hold (not extended)
	a       attempt       // its attempt: the registration's hold id, and the kind and TTL a Lock must have to pick it up
	r       record        // a registration: the record the requeue wrote
	at      time.Time     // a registration: when the requeue's reply came, when the adopting Lock joined the queue
	busy    time.Duration // a registration: how long the holds it ended lasted, from their first acquire's send to at
	pace    *pacing       // the primitive it was left for
	handoff bool          // a kept hold without a spare: its pick-up is a handoff write (flawKeepAlways only)
	taken   chan struct{} // closed when a Lock picks it up
}

// kept reports whether lo is a kept hold rather than a registration.
func (lo *leftover) kept() bool { return lo.lease.role == roleExclusive }

// byHandoff reports whether kept hold lo is taken over by cl's primitive
// with a handoff write rather than with none: when it was kept for
// another primitive, or kept without a spare (flawKeepAlways).
func (lo *leftover) byHandoff(cl claim) bool { return lo.handoff || lo.pace != cl.pace }

// requeue releases exclusive lease l, whose primitive's claim is cl, and
// registers cl's next Lock in the same write. It reports false, having
// written nothing, when that write did not apply (the key is no longer
// l's, or a waiter registered since the primitive last saw the queue
// counter, which its Lock's acquire returned):
// the caller then releases l as usual. A transient failure is returned as
// a release's would be, with the registration, if it was made, removed in
// the background.
func (c *Client) requeue(ctx context.Context, l *Lease, cl claim) (bool, error) {
	rc := cl.cfg.registrations()
	a := cl.attempt
	a.owner, a.hold, a.queue, a.ttl = c.owner, c.holdIDs.Add(1), cl.pace.queueGuess(), rc.ttl
	a.sleep = cl.pace.sleepy(c.pacer)
	sent := c.clock.Now()
	r, err := c.store.requeue(ctx, l.ref(), a)
	if errors.Is(err, errNotOwner) { // perhaps a stale counter: once, guess again (see queueSlack)
		a.queue += queueSlack + 1
		sent = c.clock.Now()
		r, err = c.store.requeue(ctx, l.ref(), a)
	}
	at := c.clock.Now()
	switch {
	case errors.Is(err, errNotOwner):
		return false, nil
	case err != nil:
		c.dropRegistration(a, a.queue+1)
		return true, err
	}
	cl.pace.sawQueue(r)
	reg := c.registration(rc, a, sent)
	picked := a
	picked.ttl = cl.attempt.ttl // the wait's, which a Lock that picks it up must have
	lo := &leftover{lease: reg, a: picked, pace: cl.pace, r: r, at: at, busy: at.Sub(cl.pace.batchSince(l.acquired)), taken: make(chan struct{})}
	if !c.ext.add(reg) || !c.leaveFor(cl, lo) {
		// Close could not wait for this call, and runs no clean-up now:
		// remove the registration here (if this fails too, it lapses a
		// TTL from now, as a crashed waiter's does).
		reg.end(ErrReleased, "")
		c.store.release(ctx, reg.ref())
	}
	return true, nil
}

// leaveFor keeps lo for the next Lock of its key by cl's primitive, and
// disposes of it in the background if no Lock picks it up within the
// requeue window (or if Close began after Close took the leftovers, which
// it frees itself). It reports false, having kept nothing, when Close no
// longer runs clean-ups (it could not wait for the calling Unlock): the
// caller then disposes of lo itself. Called by an
// Unlock, which holds the key's slot: no Lock of the key picks lo up
// before leaveFor returns.
func (c *Client) leaveFor(cl claim, lo *leftover) bool {
	key := lo.a.key
	c.mu.Lock()
	old := c.leftovers[key]
	c.leftovers[key] = lo
	c.mu.Unlock()
	if old != nil { // cannot happen while the slot orders Unlock and Lock; kept safe
		c.tidy(old.a.ttl, func(context.Context) { c.dispose(old) })
	}
	window := requeueWindow(cl.cfg)
	disposer := func(context.Context) {
		t := c.clock.NewTimer(window)
		defer t.Stop()
		select {
		case <-t.C:
		case <-lo.taken:
			return
		case <-c.closing:
		}
		c.mu.Lock()
		mine := c.leftovers[key] == lo
		if mine {
			delete(c.leftovers, key)
		}
		c.mu.Unlock()
		if mine {
			c.dispose(lo)
		}
	}
	if c.tidy(lo.a.ttl, disposer) {
		return true
	}
	c.mu.Lock()
	if c.leftovers[key] == lo {
		delete(c.leftovers, key)
	}
	c.mu.Unlock()
	return false
}

// dispose ends what lo holds and frees it, with a context of its own (a
// caller's tidy counts from before the window). A registration ended
// already (by Close, which releases it with the other leases) is left to
// that; a kept hold is released whatever ended it: the release is
// conditional on the hold, so it frees nothing once the hold was taken
// over.
func (c *Client) dispose(lo *leftover) {
	if !lo.lease.end(ErrReleased, "") && !lo.kept() {
		return
	}
	ctx, cancel := context.WithTimeout(c.tidyCtx, min(lo.a.ttl, cleanupTimeout))
	defer cancel()
	c.store.release(ctx, lo.lease.ref())
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
