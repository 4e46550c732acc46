package dlock

// This file is the keep: an Unlock under contention that, instead of
// freeing the key, keeps it for its primitive's next Lock, which takes it
// over with no command. docs/fairness.md has the bound this gives.
//
// A turn that passes the key to another Client costs the release, the
// next holder's acquire, and the time the key waits for that acquire (no
// server wakes a waiter, so it comes when the waiter's schedule says).
// When holds are short those are most of a turn. So a Client that loops
// Lock, work, Unlock takes two turns in a row: the Unlock that ends a hold
// its Lock waited for keeps the hold (no write; the hold stays in the
// document, and nothing relies on it), and the next Lock takes it over
// with no write either: a new Lease, with the spare token that the hold's
// acquire reserved (it raised the key's counter by two and took the lower
// number; see spare), whose writes name the counter as the hold's did,
// and whose deadline is the hold's. A kept hold has no spare, so the
// Unlock after it requeues as usual. Hand-overs, and their cost, are
// halved; a waiter gets the key after at most twice as many Locks as
// there are waiters ahead of it, plus the two under way.
//
// Only a short hold is kept: one that lasted less than keepFactor round
// trips of the primitive's acquires, for which the cost of a hand-over is
// more than about a tenth of the turn. If no Lock comes within the requeue
// window, the kept hold is released in the background; when Close begins,
// Close releases it in its own write, with the leases. The extender does not extend a kept hold:
// the window is far shorter than the time left on its lease, and a Lock
// that comes after the lease's deadline does not take it over.

// keep keeps exclusive lease l, which its Unlock has ended, for the next
// Lock of its primitive (claim cl): the hold, under the spare token its
// acquire reserved. It reports false, having kept nothing, when l has no
// spare (flawKeepAlways aside), or is past its deadline, or the Client is
// closing: the caller then releases it as usual.
func (c *Client) keep(l *Lease, cl claim) bool {
	handoff := l.count == l.token // no spare: only flawKeepAlways keeps it, for a handoff
	if handoff && !cl.cfg.hooks.flawed(flawKeepAlways) {
		return false
	}
	a := attempt{key: l.key, owner: c.owner, hold: l.hold, ttl: l.ttl, kind: cl.attempt.kind, raw: l.raw.Load()}
	h := c.newLease(nil, cl.cfg, a, l.count, roleExclusive, l.lastSent())
	if h.Err() != nil || c.isClosing() {
		return false
	}
	return c.leaveFor(cl, &leftover{lease: h, a: a, pace: cl.pace, handoff: handoff, taken: make(chan struct{})})
}
