package dlock

import (
	"context"
	"time"
)

// This file is the keep: an Unlock under contention that, instead of
// freeing the key, keeps it for its primitive's next Lock, which takes it
// over in one write. doc.go ("Fairness") has the bound this gives.
//
// A turn that passes the key to another Client costs the release, the
// next holder's acquire, and the time the key waits for that acquire (no
// server wakes a waiter, so it comes when the waiter's schedule says).
// When holds are short those are most of a turn. So a Client that loops
// Lock, work, Unlock takes two turns in a row: the Unlock that ends a hold
// its Lock waited for keeps the hold (no write; the hold stays in the
// document until its lease's deadline, and nothing relies on it), and
// the next Lock hands it to itself, a new hold with a new token (one
// write, as a handoff between goroutines of one Client). The Unlock after
// that one requeues as usual. Hand-overs, and their cost, are halved; a
// waiter gets the key after at most twice as many holds as there are
// waiters ahead of it, plus the two under way.
//
// Only a short hold is kept: one that lasted less than keepFactor round
// trips of the primitive's acquires, for which the cost of a hand-over is
// more than about a tenth of the turn. If no Lock comes within the requeue
// window, or Close begins, the kept hold is released in the background
// (Close waits for that write). The extender does not extend a kept hold:
// the window is far shorter than the time left on its lease, and a Lock
// that comes after the lease's deadline does not take it over.

// keepFactor: a hold is kept when it lasted less than keepFactor round
// trips of its primitive's acquires.
const keepFactor = 32

// A kept is a hold an Unlock kept for its primitive's next Lock.
type kept struct {
	hold  *Lease        // the kept hold; no call relies on it, and the extender does not extend it
	kind  string        // its primitive's kind and TTL: a Lock of another takes no kept hold
	ttl   time.Duration //
	taken chan struct{} // closed when a Lock takes it
}

// took notes that a Lock of the primitive took the key by a write sent at
// sent and answered at now: a hold an Unlock kept, or not (then the write
// was an acquire, whose round trip it averages, and which begins a run of
// holds).
func (p *pacing) took(sent, now time.Time, kept bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held, p.kept = now, kept
	if kept {
		return
	}
	p.batch = sent
	if rtt := now.Sub(sent); p.rtt == 0 {
		p.rtt = rtt
	} else {
		p.rtt = (3*p.rtt + rtt) / 4
	}
}

// batchSince returns when the acquire was sent that began the primitive's
// run of holds that ends with a hold acquired (sent) at from: from itself,
// unless that hold was kept.
func (p *pacing) batchSince(from time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.kept && !p.batch.IsZero() {
		return p.batch
	}
	return from
}

// keeping reports whether an Unlock at now, of a hold that its Lock had
// to wait for, keeps the hold (see the file's comment). A round trip
// counts as at least a 32nd of the minimum backoff: a hand-over costs at
// least the waiter's poll, however near the server.
func (p *pacing) keeping(now time.Time, cfg *config) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return (!p.kept || cfg.flaw == flawKeepAlways) && !p.held.IsZero() && now.Sub(p.held) < keepFactor*max(p.rtt, cfg.minBackoff/32)
}

// keep keeps exclusive lease l, which its Unlock has ended, for the next
// Lock of its primitive (claim cl). It reports false, having kept nothing,
// when the hold is past its deadline or the Client is closing: the caller
// then releases it as usual.
func (c *Client) keep(l *Lease, cl claim) bool {
	a := attempt{key: l.key, owner: c.owner, hold: l.hold, ttl: l.ttl, kind: cl.spec.kind}
	h := c.newLease(nil, cl.cfg, a, l.token, roleExclusive, l.lastSent())
	if h.Err() != nil || c.isClosing() {
		return false
	}
	k := &kept{hold: h, kind: a.kind, ttl: a.ttl, taken: make(chan struct{})}
	c.mu.Lock()
	old := c.kept[a.key]
	c.kept[a.key] = k
	c.mu.Unlock()
	if old != nil { // cannot happen while the slot orders Unlock and Lock; kept safe
		c.unkeep(old)
	}
	window := requeueWindow(cl.cfg)
	c.tidy(a.ttl, func(context.Context) {
		t := c.clock.NewTimer(window)
		defer t.Stop()
		select {
		case <-t.C:
		case <-k.taken:
			return
		case <-c.closing:
		}
		c.mu.Lock()
		mine := c.kept[a.key] == k
		if mine {
			delete(c.kept, a.key)
		}
		c.mu.Unlock()
		if mine {
			c.unkeep(k)
		}
	})
	return true
}

// unkeep ends kept hold k and releases it, with a context of its own (the
// release is conditional on the hold, so it frees nothing once the hold
// was taken over).
func (c *Client) unkeep(k *kept) {
	k.hold.end(ErrReleased, "")
	ctx, cancel := context.WithTimeout(c.tidyCtx, min(k.ttl, cleanupTimeout))
	defer cancel()
	c.store.release(ctx, k.hold.ref())
}

// takeKept returns the hold an Unlock kept for an exclusive acquire of a's
// key, kind and TTL, or nil when there is none; it is ended (the caller
// hands it over). One of another kind or TTL, or past its lease's
// deadline, is released.
func (c *Client) takeKept(a attempt) *Lease {
	c.mu.Lock()
	k := c.kept[a.key]
	delete(c.kept, a.key)
	c.mu.Unlock()
	if k == nil {
		return nil
	}
	close(k.taken)
	if k.kind != a.kind || k.ttl != a.ttl || k.hold.Err() != nil {
		c.tidy(k.ttl, func(context.Context) { c.unkeep(k) })
		return nil
	}
	k.hold.end(ErrReleased, "")
	return k.hold
}
