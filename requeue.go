package dlock

import (
	"context"
	"errors"
	"time"
)

// This file is the requeue: an Unlock that, in its release's own write,
// queues the next Lock of its primitive. doc.go ("Fairness") has why.
//
// Under contention a Client that loops Lock, work, Unlock spends a command
// on every Lock to register behind the others. When its primitive's last
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

// A prereg is a registration made by a requeue, kept for the next Lock.
type prereg struct {
	reg   *Lease        // the registration, kept alive by the extender
	a     attempt       // its attempt: the adopting Lock's hold id, kind and TTL
	r     record        // the record the requeue wrote
	at    time.Time     // when its reply came: when the adopting Lock joined the queue
	busy  time.Duration // how long the holds it ended lasted, from their first acquire's send to at
	taken chan struct{} // closed when a Lock adopts it
}

// requeueWindow is how soon after an Unlock a primitive's next Lock must
// come for its Unlocks to requeue it, and how long a requeued registration
// waits for that Lock.
func requeueWindow(cfg *config) time.Duration { return cfg.minBackoff }

// relocking notes that a Lock of the primitive begins at now.
func (p *pacing) relocking(now time.Time, window time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.soon = !p.unlocked.IsZero() && now.Sub(p.unlocked) < window
}

// unlocking reports whether an Unlock of the primitive that begins at now
// should requeue: its last Lock came within the window after the Unlock
// before it returned, and had to wait less than a TTL ago.
func (p *pacing) unlocking(now time.Time, cfg *config) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.soon && !p.last.at.IsZero() && now.Sub(p.last.at) < cfg.ttl
}

// unlockedAt notes that an Unlock of the primitive returned at now. The
// window is counted from there, not from when the Unlock began: its write
// may have waited behind other Clients' commands for longer than the
// window (measured: under 8 Clients on the test server, the requeue then
// stopped at every other Unlock).
func (p *pacing) unlockedAt(now time.Time) {
	p.mu.Lock()
	p.unlocked = now
	p.mu.Unlock()
}

// requeue releases exclusive lease l, whose primitive's claim is cl, and
// registers cl's next Lock in the same write. It reports false, having
// written nothing, when that write did not apply (the key is no longer
// l's, or a waiter registered since the primitive last saw the queue
// counter, which its Lock's acquire returned):
// the caller then releases l as usual. A transient failure is returned as
// a release's would be, with the registration, if it was made, removed in
// the background.
func (c *Client) requeue(ctx context.Context, l *Lease, cl claim) (bool, error) {
	a := cl.spec
	a.owner, a.hold, a.queue = c.owner, c.holds.Add(1), cl.pace.queueGuess()
	sent := c.clock.Now()
	r, err := c.store.requeue(ctx, l.ref(), a)
	at := c.clock.Now()
	switch {
	case errors.Is(err, errNotOwner):
		return false, nil
	case err != nil:
		ref := leaseRef{key: a.key, owner: a.owner, hold: a.hold, ttl: a.ttl, role: roleWaiter}
		c.tidy(a.ttl, func(ctx context.Context) { c.store.release(ctx, ref) })
		return true, err
	}
	cl.pace.sawQueue(r.Queue)
	reg := c.newLease(nil, cl.cfg, a, 0, roleWaiter, sent)
	reg.data = nil
	if !c.ext.add(reg) { // closing
		c.tidy(a.ttl, func(ctx context.Context) { c.store.release(ctx, reg.ref()) })
		return true, nil
	}
	pr := &prereg{reg: reg, a: a, r: r, at: at, busy: at.Sub(cl.pace.batchSince(l.acquired)), taken: make(chan struct{})}
	c.mu.Lock()
	old := c.preregs[a.key]
	c.preregs[a.key] = pr
	c.mu.Unlock()
	if old != nil { // cannot happen while the slot orders Unlock and Lock; kept safe
		c.unregister(old.reg)
	}
	window := requeueWindow(cl.cfg)
	c.tidy(a.ttl, func(context.Context) {
		t := c.clock.NewTimer(window)
		defer t.Stop()
		select {
		case <-t.C:
		case <-pr.taken:
			return
		case <-c.closing: // Close releases the registration with the other leases
			return
		}
		c.mu.Lock()
		mine := c.preregs[a.key] == pr
		if mine {
			delete(c.preregs, a.key)
		}
		c.mu.Unlock()
		if mine && reg.end(ErrReleased, "") {
			// A context of its own: tidy's counts from before the window.
			ctx, cancel := context.WithTimeout(c.tidyCtx, min(a.ttl, cleanupTimeout))
			defer cancel()
			c.store.release(ctx, reg.ref())
		}
	})
	return true, nil
}

// adopt returns the registration a requeue made for key, for an exclusive
// acquire of a's kind and TTL, or nil when there is none. One of another
// kind or TTL is removed.
func (c *Client) adopt(a attempt) *prereg {
	c.mu.Lock()
	pr := c.preregs[a.key]
	delete(c.preregs, a.key)
	c.mu.Unlock()
	if pr == nil {
		return nil
	}
	close(pr.taken)
	if pr.a.kind != a.kind || pr.a.ttl != a.ttl || pr.reg.Err() != nil {
		c.unregister(pr.reg)
		return nil
	}
	return pr
}
