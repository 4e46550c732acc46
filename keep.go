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
// document, and nothing relies on it), and the next Lock hands it to
// itself, a new hold with a new token (one write, as a handoff between
// goroutines of one Client). The Unlock after
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
	switch cfg.flaw {
	case flawNoTurnPlan:
		return false
	case flawKeepAlways:
	default:
		if p.kept {
			return false
		}
	}
	return !p.held.IsZero() && now.Sub(p.held) < keepFactor*max(p.rtt, cfg.minBackoff/32)
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
	c.leaveFor(cl, &leftover{lease: h, a: a, taken: make(chan struct{})})
	return true
}

// resume hands kept hold h (which pickUp ended) to attempt a of claim cl,
// in one write: a new hold of this Client with a's hold id and a new
// token, taken past the queue (see the file's comment). It returns
// errNotOwner when h was no longer held, ErrClosed when Close had begun
// (the new hold is then given back), and otherwise an error with which
// the hold may be a's: the caller's next attempt, with a's hold id, finds
// and renews it.
func (c *Client) resume(ctx context.Context, cl claim, a attempt, h *Lease) (*Lease, error) {
	next := a
	next.barge = true // its turn goes on: the queue was passed by the hold's own acquire
	sent := c.clock.Now()
	r, err := c.store.handoff(ctx, h.ref(), next)
	if err != nil {
		return nil, err
	}
	l, err := c.grant(cl, a, r.Token, roleExclusive, sent)
	if err == nil {
		cl.pace.took(sent, c.clock.Now(), true)
	}
	return l, err
}
