package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// A Mutex is a distributed mutual exclusion lock on one key: at most one
// Mutex for the key, across all Clients and processes sharing the
// collection, holds it at a time. Each hold is a [Lease] with its own
// fencing token.
//
// Within one Client, goroutines locking the same key queue in the Client,
// as they would on a [sync.Mutex], and only the first of them talks to the
// server; on Unlock the hold passes to the next one in a single command.
//
// A Mutex is safe for concurrent use and may be unlocked by a goroutine
// other than the one that locked it. It must not be copied after first use.
// Like a sync.Mutex it is not reentrant: a goroutine that locks a Mutex it
// holds waits until the Mutex is unlocked.
type Mutex struct {
	c   *Client
	key string
	cfg config
	err error // invalid key or options

	mu    sync.Mutex
	lease *Lease
	pace  pace
}

// Key returns the Mutex's key.
func (m *Mutex) Key() string { return m.key }

// Lease returns the current lease, or nil when the Mutex is not held.
func (m *Mutex) Lease() *Lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lease
}

// Lock blocks until the Mutex holds its key, or ctx ends. While the key is
// held by another Client it polls the server with jittered exponential
// backoff; it takes a key whose holder has stopped extending it once the
// TTL has passed (see the package documentation for how this is decided
// without comparing clocks).
//
// When ctx ends first, Lock returns an error that matches ctx.Err() with
// [errors.Is], and leaves nothing held: if its last write may have acquired
// the key, it gives it back with a short, detached context.
func (m *Mutex) Lock(ctx context.Context) error {
	return m.lock(ctx, "dlock.Lock", false)
}

// TryLock makes one attempt to hold the key and returns [ErrLocked] when
// another owner holds it, or another goroutine of this Client holds or is
// acquiring it. An uncontended TryLock is one command; one that finds the
// key held spends up to three more, to take it over when its holder
// abandoned it more than a TTL ago by the server's clock.
func (m *Mutex) TryLock(ctx context.Context) error {
	return m.lock(ctx, "dlock.TryLock", true)
}

// Unlock releases the Mutex's lease (see [Lease.Release]). It returns
// [ErrNotHeld] when the Mutex holds no lease, and a [*LeaseLostError] when
// the lease was lost.
func (m *Mutex) Unlock(ctx context.Context) error {
	m.mu.Lock()
	l := m.lease
	m.mu.Unlock()
	if l == nil {
		return ErrNotHeld
	}
	return l.Release(ctx)
}

// forget clears the Mutex's lease if it is l.
func (m *Mutex) forget(l *Lease) {
	m.mu.Lock()
	if m.lease == l {
		m.lease = nil
	}
	m.mu.Unlock()
}

func (m *Mutex) lock(ctx context.Context, name string, try bool) (err error) {
	if m.err != nil {
		return m.err
	}
	c := m.c
	start := time.Now()
	ctx, span := c.tel.lockSpan(ctx, name, m.key, c.owner)
	var l *Lease
	attempts := 0
	defer func() { c.tel.endLock(ctx, span, start, attempts, l, err) }()

	l, err = c.enter(ctx, m, try)
	if err != nil {
		return fmt.Errorf("dlock: lock %q: %w", m.key, err)
	}
	if l == nil {
		l, attempts, err = c.acquire(ctx, m, try)
		if err != nil {
			c.leave(m.key, nil, nil)
			l = nil
			return fmt.Errorf("dlock: lock %q: %w", m.key, err)
		}
	} else if errors.Is(l.ended(), ErrReleased) { // handed over as the Client closed
		l = nil
		return fmt.Errorf("dlock: lock %q: %w", m.key, ErrClosed)
	}
	m.mu.Lock()
	m.lease = l
	m.mu.Unlock()
	return nil
}

// acquire takes the key for m, holding this Client's slot for it. It
// returns the lease, the number of acquire attempts, and an error when ctx
// ended, the Client closed, the key is held (with try) or the server failed
// in a way that waiting will not mend.
//
// Each poll of a held key is an acquire attempt, one command that takes the
// key when it is free: a waiter that finds the key freed takes it in the
// same command that found it. The record is read only to start a watch on
// the holder's revision, when a wait outlasts its first poll (a TryLock
// reads at once), and again when that watch says the revision may be taken
// over.
func (c *Client) acquire(ctx context.Context, m *Mutex, try bool) (*Lease, int, error) {
	var (
		w        watch
		polls    *poller
		attempts int
		unsure   bool   // an acquire may have applied without our seeing the reply
		lastErr  error  // the last transient failure
		holder   record // the last holder reported to the trace
		events   int    // holders reported
	)
	giveUp := func(err error) (*Lease, int, error) {
		if unsure {
			ctx, cancel := detached(ctx, m.cfg.ttl)
			c.store.abandon(ctx, m.key, c.owner)
			cancel()
		}
		if lastErr != nil && err != lastErr {
			err = fmt.Errorf("%w (last error: %w)", err, lastErr)
		}
		return nil, attempts, err
	}
	for {
		attempts++
		sent := c.clock.Now()
		r, err := c.store.acquire(ctx, m.key, c.owner, m.cfg.ttl, w.takeover(sent))
		switch {
		case err == nil:
			l := c.newLease(m, r, sent)
			if !c.ext.add(l) {
				return giveUp(ErrClosed)
			}
			if polls != nil {
				m.mu.Lock()
				m.pace = pace{interval: polls.last, at: c.clock.Now()}
				m.mu.Unlock()
			}
			return l, attempts, nil
		case !errors.Is(err, errHeld):
			unsure = true
		case (w.rev == 0 && (try || attempts > 1)) || w.takeover(c.clock.Now()) != 0:
			// Held, and no watch yet on a wait that outlasted its first
			// poll, or the watched revision was due for takeover: read
			// what holds it now.
			r, err = c.observe(ctx, m.key, &w)
			if err == nil && (r.free() || r.Owner == c.owner || w.takeover(c.clock.Now()) != 0) {
				continue // freed meanwhile, ours from an acquire whose reply was lost, or due
			}
			if err == nil && events < maxHeldEvents && (r.Owner != holder.Owner || r.Token != holder.Token) {
				c.tel.heldBy(ctx, r)
				holder = r
				events++
			}
		default:
			err = nil
		}
		switch {
		case err != nil && (try || ctx.Err() != nil || !transient(err)):
			return giveUp(err)
		case err != nil:
			// Retry after the wait. A retried acquire that did apply the
			// first time finds the key ours.
			lastErr = err
		case try:
			return giveUp(ErrLocked)
		}
		now := c.clock.Now()
		if polls == nil {
			m.mu.Lock()
			p := m.pace.start(now, &m.cfg)
			m.mu.Unlock()
			polls = &p
		}
		d := polls.next()
		if w.rev != 0 {
			d = min(d, max(w.wait(now), 0))
		}
		t := c.clock.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return giveUp(ctx.Err())
		case <-c.closing:
			t.Stop()
			return giveUp(ErrClosed)
		}
	}
}

// observe reads key's record into w. When the record's revision is new to
// w, it also estimates the server's clock (reading it when the last reading
// is over a TTL old), so that a record written long ago by the server's
// clock can be taken over without waiting a further TTL.
func (c *Client) observe(ctx context.Context, key string, w *watch) (record, error) {
	r, err := c.store.read(ctx, key)
	if err != nil || r.free() || r.Owner == c.owner {
		return r, err
	}
	elapsed := time.Duration(-1)
	if r.Rev != w.rev && c.serverClock.reported() {
		now, ok := c.serverClock.estimate(c.clock.Now(), r.TTL)
		if !ok {
			switch t, reported, err := c.store.serverTime(ctx); {
			case err != nil:
				// Not fatal: wait a full TTL on our own clock instead.
			case !reported:
				c.serverClock.markUnsupported()
			default:
				c.serverClock.record(t, c.clock.Now())
				now, ok = t, true
			}
		}
		if ok {
			elapsed = now.Sub(r.At)
		}
	}
	w.observe(r, c.clock.Now(), elapsed)
	return r, nil
}
