package dlock

import (
	"context"
	"sync"
	"time"
)

// An extender keeps a Client's leases alive: one goroutine for all of them,
// with no timer or goroutine per lease. When the first lease is due it
// extends, in one bulk write, every lease due within half a cadence, so
// leases fall into step and a cadence costs one command however many leases
// the Client holds. It ends a lease at its local deadline even while a write
// is in flight, so a hung server cannot delay Lost. It sends no extension
// of a hold with a maximum hold later than a TTL before its cap (see
// Lease.schedule).
type extender struct {
	c      *Client
	mu     sync.Mutex
	leases map[*Lease]struct{}
	closed bool
	wake   chan struct{}
	stop   chan struct{}
	done   chan struct{}
}

type extendResult struct {
	batch []*Lease
	sent  time.Time
	ok    []bool
	err   error
}

func newExtender(c *Client) *extender {
	e := &extender{
		c: c, leases: map[*Lease]struct{}{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go e.run()
	return e
}

// add starts keeping l alive; false when the Client is closed.
func (e *extender) add(l *Lease) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	e.leases[l] = struct{}{}
	if l.role != roleWaiter { // a registration is not a hold
		e.c.tel.held.Add(context.Background(), 1)
	}
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return true
}

// remove stops keeping l alive; it reports whether l was live.
func (e *extender) remove(l *Lease) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, live := e.leases[l]
	delete(e.leases, l)
	return live
}

// shutdown stops the goroutine, waits for it, and returns the leases held.
func (e *extender) shutdown() []*Lease {
	e.mu.Lock()
	e.closed = true // leases stay in the map until ended, so end() sees them live
	leases := make([]*Lease, 0, len(e.leases))
	for l := range e.leases {
		leases = append(leases, l)
	}
	e.mu.Unlock()
	close(e.stop)
	<-e.done
	return leases
}

func (e *extender) run() {
	defer close(e.done)
	clk := e.c.clock
	results := make(chan extendResult, 1)
	inflight := false
	cancel := context.CancelFunc(func() {})
	for {
		now := clk.Now()
		expired, batch, wakeAt := e.scan(now, !inflight)
		for _, l := range expired {
			l.expire()
		}
		if len(batch) > 0 {
			inflight = true
			var ctx context.Context
			ctx, cancel = context.WithTimeout(context.Background(), e.timeout(now, batch))
			go func() {
				refs := make([]leaseRef, len(batch))
				for i, l := range batch {
					refs[i] = l.ref()
				}
				sent := clk.Now()
				ok, err := e.c.store.extend(ctx, refs)
				results <- extendResult{batch, sent, ok, err}
			}()
		}
		var timer *time.Timer
		var fire <-chan time.Time
		if !wakeAt.IsZero() {
			timer = clk.NewTimer(wakeAt.Sub(now))
			fire = timer.C
		}
		select {
		case <-fire:
		case <-e.wake:
		case r := <-results:
			inflight = false
			cancel()
			e.apply(r)
		case <-e.stop:
			if timer != nil {
				timer.Stop()
			}
			cancel()
			if inflight {
				<-results
			}
			return
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// scan finds, at now, the leases past their deadline and, when want, the
// batch to extend; and when to look again.
func (e *extender) scan(now time.Time, want bool) (expired, batch []*Lease, wakeAt time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	due := false
	soon := func(t time.Time) {
		if wakeAt.IsZero() || t.Before(wakeAt) {
			wakeAt = t
		}
	}
	for l := range e.leases {
		l.mu.Lock()
		if !l.capped && !l.stop.IsZero() && now.After(l.stop) {
			l.capped = true // running late: past the last moment for an extension
		}
		deadline, next, every, returned, last, capped := l.deadline, l.next, l.every, l.returned, l.last, l.capped
		l.mu.Unlock()
		if !now.Before(deadline) {
			expired = append(expired, l)
			continue
		}
		soon(deadline)
		if !want || capped || returned && !e.c.cfg.hooks.flawed(flawExtendReleasing) { // a lease being released is not extended
			continue
		}
		ready := !now.Before(next)
		if ready {
			due = true
		}
		// A lease due within half a cadence joins the batch early, but not
		// for its last extension, due at l.lastDue: the hold then lasts as
		// close to its cap as it may.
		if ready || !last && next.Sub(now) <= every/2 {
			batch = append(batch, l)
		} else {
			soon(next)
		}
	}
	if !due {
		// Nothing is due yet: wait for the first of the batch.
		for _, l := range batch {
			l.mu.Lock()
			soon(l.next)
			l.mu.Unlock()
		}
		batch = nil
	}
	return expired, batch, wakeAt
}

// timeout bounds an extension: half the time left before the batch's first
// deadline, so that a hung extension leaves room for a retry (on a new
// connection, say) before the deadline.
func (e *extender) timeout(now time.Time, batch []*Lease) time.Duration {
	var d time.Duration
	for i, l := range batch {
		l.mu.Lock()
		if left := l.deadline.Sub(now); i == 0 || left < d {
			d = left
		}
		l.mu.Unlock()
	}
	return max(d/2, time.Millisecond)
}

func (e *extender) apply(r extendResult) {
	now := e.c.clock.Now()
	for i, l := range r.batch {
		switch {
		case l.ended() != nil || l.returning() && !e.c.cfg.hooks.flawed(flawExtendReleasing):
			// flawExtendReleasing applies the reply to a lease being
			// released, as the old order did: left unapplied, the lease
			// stays due, and the extender would send again at once.
		case r.err != nil:
			l.failed(now, r.err)
		case r.ok[i] && e.c.cfg.hooks.flawed(flawDeadlineFromReply):
			l.extended(now)
		case r.ok[i]:
			l.extended(r.sent)
		default:
			l.steal()
		}
	}
}
