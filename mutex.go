package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
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
//
// Make a Mutex with [Client.NewMutex]. Unlike a sync.Mutex, the zero value
// is not usable, as it belongs to no Client: its Lock and TryLock return
// [ErrNoClient], and its Unlock [ErrNotHeld].
type Mutex struct {
	c   *Client // set by NewMutex; never changes
	key string
	cfg config
	err error // invalid key or options

	mu    sync.Mutex
	lease *Lease // guarded by mu: the current hold, or nil
	pace  pace   // guarded by mu: where the last wait's polls ended
}

// Key returns the Mutex's key.
func (m *Mutex) Key() string { return m.key }

// Lease returns the current lease, or nil when the Mutex is not held.
func (m *Mutex) Lease() *Lease {
	if m == nil {
		return nil
	}
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
// the key, a short clean-up write in the background gives it back (one
// that can free only that write's hold). A ctx that has already ended
// returns at once, with no command sent. Lock never returns nil with a
// lease that has already ended: one whose acquire was answered after the
// lease's local deadline is not returned, and Lock keeps trying (TryLock
// returns a [*LeaseLostError] instead).
//
// When the Client is closed, or closes while Lock waits, Lock returns
// [ErrClosed]; a hold it won as Close began is given back first.
func (m *Mutex) Lock(ctx context.Context) error {
	return m.lock(ctx, "dlock.Lock", false)
}

// TryLock makes one attempt to hold the key and returns an error matching
// [ErrLocked] when another owner holds it, or when another goroutine or
// Mutex of this Client holds it or is acquiring it (the message says
// which). An uncontended TryLock is one command; one that finds the key
// held reads the document to tell a hold this Client abandoned, which it
// takes over, and, with [WithServerClockTakeover], one abandoned more
// than a TTL ago by the server's clock.
func (m *Mutex) TryLock(ctx context.Context) error {
	return m.lock(ctx, "dlock.TryLock", true)
}

// Unlock releases the Mutex's lease (see [Lease.Release]). It returns
// [ErrNotHeld] when the Mutex holds no lease, and a [*LeaseLostError], at
// once, when the lease was lost.
func (m *Mutex) Unlock(ctx context.Context) error {
	if m == nil {
		return ErrNotHeld
	}
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
	switch {
	case m == nil || m.c == nil:
		return ErrNoClient
	case m.err != nil:
		return m.err
	case ctx.Err() != nil:
		return fmt.Errorf("dlock: lock %q: %w", m.key, ctx.Err())
	}
	c := m.c
	if err := c.begin(); err != nil {
		return fmt.Errorf("dlock: lock %q: %w", m.key, err)
	}
	defer c.finish()
	start := time.Now()
	ctx, span := c.tel.lockSpan(ctx, name, m.key, c.owner)
	var l *Lease
	attempts := 0
	defer func() { c.tel.endLock(ctx, span, start, attempts, l, err) }()

	l, err = c.enter(ctx, m, try)
	if err != nil {
		return fmt.Errorf("dlock: lock %q: %w", m.key, err)
	}
	if l != nil {
		switch err := l.Err(); {
		case errors.Is(err, ErrReleased): // handed over as the Client closed
			l = nil
			c.leave(m.key)
			return fmt.Errorf("dlock: lock %q: %w", m.key, ErrClosed)
		case err != nil: // a handoff answered too late to use: acquire afresh
			l = nil
		}
	}
	if l == nil {
		l, attempts, err = c.acquire(ctx, m, try)
		if err != nil {
			c.leave(m.key)
			l = nil
			return fmt.Errorf("dlock: lock %q: %w", m.key, err)
		}
	}
	m.mu.Lock()
	m.lease = l
	m.mu.Unlock()
	return nil
}

// errLateReply is the cause of a hold lost before Lock could return it: the
// acquire was answered after the lease's local deadline. Lock retries; a
// TryLock returns it in a *LeaseLostError.
var errLateReply = errors.New("dlock: the acquire was answered after the lease's local deadline")

// acquire takes the key for m, holding this Client's slot for it. It
// returns the lease, the number of acquire attempts, and an error when ctx
// ended, the Client closed, the key is held (with try) or the server failed
// in a way that waiting will not mend.
//
// Each poll of a held key is an acquire attempt, one command that takes the
// key when it is free: a waiter that finds the key freed takes it in the
// same command that found it. All the attempts of one call carry one hold
// id, so a retry after an unanswered attempt finds that attempt's hold
// its own. The record is read to start a watch on the holder's revision,
// when a wait outlasts its first poll (a TryLock reads at once), again when
// that watch says the revision may be taken over, and, while the Lock span
// is recorded and has named fewer than maxHeldEvents holders, after the
// failed polls numbered 1, 2, 4, 8 and so on, to name each new holder in
// it: a traced wait of n polls spends at most log2(n) reads more. A read that shows the key
// takeable is followed by an attempt at once, but only once: if that
// attempt fails too (a lagging read), the next waits for the poll.
func (c *Client) acquire(ctx context.Context, m *Mutex, try bool) (*Lease, int, error) {
	a := attempt{key: m.key, owner: c.owner, hold: c.holds.Add(1), ttl: m.cfg.ttl}
	var (
		w        watch
		polls    *poller
		attempts int
		unsure   bool   // an attempt may have applied without our seeing the reply
		rushed   bool   // this attempt followed a read at once
		lastErr  error  // the last transient failure
		holder   record // the last holder reported to the trace
		events   int    // holders reported
	)
	tracing := trace.SpanFromContext(ctx).IsRecording()
	giveUp := func(err error) (*Lease, int, error) {
		if unsure {
			c.tidy(a.ttl, func(ctx context.Context) { c.store.abandon(ctx, a) })
		}
		switch {
		case ctx.Err() != nil && !errors.Is(err, ErrClosed):
			err = ctx.Err() // not the driver's account of the cancelled command
		case lastErr != nil && err != lastErr:
			err = fmt.Errorf("%w (last error: %w)", err, lastErr)
		}
		return nil, attempts, err
	}
	var early Token // flawFloorBeforeCreate: the floor as read before the first attempt
	if c.cfg.flaw == flawFloorBeforeCreate {
		early, _ = c.store.floor(ctx)
	}
	for {
		attempts++
		sent := c.clock.Now()
		r, err := c.store.acquire(ctx, a, w.takeover(sent))
		if err == nil && r.Raw {
			r, err = c.raise(ctx, a, early)
		}
		switch {
		case err == nil:
			if c.cfg.flaw == flawDeadlineFromReply {
				sent = c.clock.Now()
			}
			l := c.newLease(m, r, sent)
			if c.isClosing() || !c.ext.add(l) {
				// Won as Close began: give it back, in the background so
				// that Lock returns at once; Close waits for it.
				l.end(ErrReleased, "")
				ref := l.ref()
				c.tidy(a.ttl, func(ctx context.Context) { c.store.release(ctx, ref) })
				return nil, attempts, ErrClosed
			}
			if l.Err() != nil {
				// Answered too late to rely on: the hold is ours on the
				// server, and the next attempt renews it (same hold id).
				l.end(ErrReleased, "")
				unsure, err = true, &LeaseLostError{Key: m.key, Token: r.Token, Cause: errLateReply}
				break
			}
			if polls != nil {
				m.mu.Lock()
				m.pace = pace{interval: polls.last, at: c.clock.Now()}
				m.mu.Unlock()
			}
			return l, attempts, nil
		case !errors.Is(err, errHeld):
			unsure = true
		case rushed:
			err = nil // wait for the poll: see the doc comment
		case (w.rev == 0 && (try || attempts > 1)) || w.takeover(c.clock.Now()) != 0 ||
			tracing && events < maxHeldEvents && attempts&(attempts-1) == 0:
			r, err = c.observe(ctx, m.key, &w)
			if err == nil && (r.free() || w.takeover(c.clock.Now()) != 0) {
				rushed = true
				continue // freed meanwhile, a hold of ours no call uses, or due
			}
			if err == nil && events < maxHeldEvents && (r.Owner != holder.Owner || r.Token != holder.Token) {
				c.tel.heldBy(ctx, r)
				holder = r
				events++
			}
		default:
			err = nil
		}
		rushed = false
		switch {
		case err != nil && (try || ctx.Err() != nil || !(transient(err) || errors.Is(err, errLateReply))):
			return giveUp(err)
		case err != nil:
			// Retry after the wait. A retried acquire that did apply the
			// first time finds the key ours.
			lastErr = err
		case try:
			return giveUp(errLockedElsewhere)
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

// raise gives the hold that attempt a just made in a record it found
// raw (one created by an acquire, its own or one whose creator stopped
// before raising it) a token above the collection's floor: it reads the
// floor, after the acquire's reply, so after the record was created, and
// raises the hold's token above it. doc.go has the argument. When the hold
// is no longer a's (taken over while this call paused) it reports errHeld;
// when the outcome is unknown, the hold may be a's, raw, which the next
// attempt, with the same hold id, finds and raises.
func (c *Client) raise(ctx context.Context, a attempt, early Token) (record, error) {
	f, err := c.store.floor(ctx)
	if err != nil {
		return record{}, err
	}
	if c.cfg.flaw == flawFloorBeforeCreate {
		f = early
	}
	r, err := c.store.raise(ctx, a, f)
	if errors.Is(err, errNotOwner) {
		err = errHeld
	}
	return r, err
}

// observe reads key's record into w. A hold of this Client's that no
// call of it uses (an earlier attempt's, whose Lock gave up before its
// reply came, or a lease that was lost) may be taken over at once: this
// call holds the Client's slot for the key, so no other call of it relies
// on that hold. With [WithServerClockTakeover], when the record's revision
// is new to w, it also estimates the server's clock (reading it when the
// last reading is over a TTL old), so that a record written long ago by the
// server's clock can be taken over without waiting a further TTL.
func (c *Client) observe(ctx context.Context, key string, w *watch) (record, error) {
	r, err := c.store.read(ctx, key)
	if err != nil || r.free() {
		return r, err
	}
	if r.Owner == c.owner {
		w.orphan(r, c.clock.Now())
		return r, nil
	}
	elapsed := time.Duration(-1)
	if c.cfg.flaw == flawWallClockExpiry {
		elapsed = c.clock.Now().Sub(r.At) // our wall clock against the server's: unsound
	}
	if r.Rev != w.rev && c.serverClock.reported() {
		now, ok := c.serverClock.estimate(c.clock.Now(), r.TTL)
		if !ok {
			sent := c.clock.Now()
			switch t, reported, err := c.store.serverTime(ctx); {
			case err != nil:
				// Not fatal: wait a full TTL on our own clock instead.
			case !reported:
				c.serverClock.markUnsupported()
			default:
				now, ok = c.serverClock.record(t, sent, c.clock.Now())
			}
		}
		if ok {
			elapsed = now.Sub(r.At)
		}
	}
	w.observe(r, c.clock.Now(), elapsed)
	return r, nil
}
