package dlock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// maxReaders bounds the shared holds of an RWMutex's key: one per Client
// at a time in practice (see RLock), so it is never the limit.
const maxReaders = 1 << 30

// An RWMutex is a distributed reader/writer lock on one key: any number of
// shared (read) holds, or one exclusive (write) hold, never both, across
// all Clients and processes sharing the collection. Every hold, shared or
// exclusive, is a [Lease] with its own fencing token from the key's one
// counter; an exclusive hold's token is greater than every token handed
// out before it, so a [Fence] behind an RWMutex works for its writers.
//
// A waiting writer is not starved by a stream of readers: a Lock that
// finds the key held registers itself in the key's document, and from
// then on no Client takes a new shared hold of the key until that writer
// has had it (or has given up, or its Client has stopped extending the
// registration for a TTL). The shared holds already there end as their
// readers unlock; this Client's readers join an existing shared hold only
// during its first extension interval (see RLock), so no shared hold
// lives on forever by being joined.
//
// Goroutines of one Client that RLock the same key share one shared hold
// on the server: the first RLock costs a command, those that join it none,
// and the last RUnlock releases it. Goroutines of one Client that Lock the
// same key queue in the Client, as for a [Mutex], and an Unlock hands the
// hold to the next of them in one command.
//
// A lost hold is the RWMutex's no more: Lease does not return it, the next
// Lock or TryLock gives a lost exclusive hold back, as Unlock would, and
// proceeds (until then Unlock returns the loss), and the next RLock takes
// a new shared hold rather than join a lost one; the RUnlocks of the RLocks
// counted on a lost shared hold report its loss (see RUnlock).
//
// An RWMutex is safe for concurrent use. Like a sync.RWMutex it is not
// reentrant: a goroutine that holds a read lock and calls Lock waits
// forever, and so does one that holds the write lock and calls RLock. Make
// one with [Client.NewRWMutex]; the zero value's calls return [ErrNoClient].
type RWMutex struct {
	c   *Client // set by NewRWMutex; never changes
	key string
	cfg config
	err error // invalid key or options

	pace pacing // what its waits and holds taught it (pacer.go)

	mu    sync.Mutex
	lease *Lease // guarded by mu: the last exclusive hold, until Unlock or the next Lock gives it back; nil when none
}

// readers are this Client's shared holds of one RWMutex key, which the
// RLocks of all its goroutines share. Client.mu guards them.
type readers struct {
	holds   []*readHold   // oldest first
	pending chan struct{} // closed when the RLock acquiring a new hold returns; nil when none does
}

// A readHold is one shared hold and the RLocks counted on it.
type readHold struct {
	l         *Lease
	n         int       // RLocks not yet RUnlocked
	joinUntil time.Time // on the Client's clock: later RLocks start a new hold
}

// NewRWMutex returns an RWMutex for key. Options given here override the
// Client's for this RWMutex. An invalid key or option is reported by its
// first Lock, TryLock, RLock or TryRLock ([ErrInvalidKey],
// [ErrInvalidOption]).
func (c *Client) NewRWMutex(key string, opts ...Option) *RWMutex {
	rw := &RWMutex{c: c, key: key}
	rw.cfg, rw.err = c.configFor(key, opts)
	return rw
}

// Key returns the RWMutex's key.
func (rw *RWMutex) Key() string { return rw.key }

// Lease returns the current hold: the exclusive one, or else the newest
// shared hold of this Client on the key; nil when there is none. A hold
// that was lost (its Err is not nil) is not returned.
func (rw *RWMutex) Lease() *Lease {
	if rw == nil || rw.c == nil {
		return nil
	}
	rw.mu.Lock()
	l := rw.lease
	rw.mu.Unlock()
	if l := stillHeld(l); l != nil {
		return l
	}
	c := rw.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if rs := c.readers[rw.key]; rs != nil {
		for _, h := range slices.Backward(rs.holds) {
			if l := stillHeld(h.l); l != nil {
				return l
			}
		}
	}
	return nil
}

// Lock blocks until it holds the key exclusively, or ctx ends; it behaves
// as [Mutex.Lock] does, and, while it waits, keeps new shared holds out
// (see RWMutex).
func (rw *RWMutex) Lock(ctx context.Context) error {
	return rw.lock(ctx, "dlock.Lock", false)
}

// TryLock makes one attempt to hold the key exclusively and returns an
// error matching [ErrLocked] when anyone else holds it, shared or
// exclusively, or another goroutine of this Client holds or is acquiring
// it exclusively. It does not register as a waiting writer.
func (rw *RWMutex) TryLock(ctx context.Context) error {
	return rw.lock(ctx, "dlock.TryLock", true)
}

// Unlock releases the exclusive hold (see [Lease.Release]). It returns
// [ErrNotHeld] when the RWMutex holds the key not exclusively, and a
// [*LeaseLostError] when the hold was lost. As for [Mutex.Unlock], a ctx
// that has ended does not stop the release, which is sent bounded by a
// second of its own; Unlock returns an error matching ctx's error only
// when the release could not complete.
func (rw *RWMutex) Unlock(ctx context.Context) error {
	if rw == nil {
		return ErrNotHeld
	}
	rw.mu.Lock()
	l := rw.lease
	rw.mu.Unlock()
	if l == nil {
		return ErrNotHeld
	}
	return l.Release(ctx)
}

func (rw *RWMutex) lock(ctx context.Context, name string, try bool) error {
	if err := rw.check(ctx); err != nil {
		return keyError("lock", rw.key, err)
	}
	rw.mu.Lock()
	old := rw.lease
	rw.mu.Unlock()
	giveBackLost(ctx, old)
	cl := claim{lk: rw, cfg: &rw.cfg, pace: &rw.pace,
		attempt: attempt{key: rw.key, ttl: rw.cfg.ttl, data: rw.cfg.data, kind: rw.kind()}}
	l, err := rw.c.lockExclusive(ctx, cl, name, try)
	if err != nil {
		return keyError("lock", rw.key, err)
	}
	rw.mu.Lock()
	rw.lease = l
	rw.mu.Unlock()
	return nil
}

// kind is the kind of the RWMutex's key (see kindOf).
func (rw *RWMutex) kind() string { return kindRW }

func (rw *RWMutex) check(ctx context.Context) error {
	switch {
	case rw == nil || rw.c == nil:
		return ErrNoClient
	case rw.err != nil:
		return rw.err
	}
	return ctx.Err()
}

// RLock blocks until it holds the key shared, or ctx ends. It joins a
// shared hold of this Client on the key when there is one in its first
// extension interval (no command); otherwise it takes a new shared hold
// (one command when the RWMutex knows the key's token counter, two the
// first time), or waits for the one another goroutine of this Client is
// taking. While the key is held exclusively, or a writer waits for it, it
// polls the server, one read a poll.
//
// When ctx ends first, RLock returns an error that matches ctx.Err() with
// [errors.Is] and wraps a [*WaitError], as [Mutex.Lock] does, and leaves
// nothing held. When the Client is closed, or
// closes while RLock waits, RLock returns [ErrClosed]: once Close has
// begun, as Lock does, even where it would join a hold.
func (rw *RWMutex) RLock(ctx context.Context) error {
	return rw.rlock(ctx, "dlock.RLock", false)
}

// TryRLock makes one attempt to hold the key shared and returns an error
// matching [ErrLocked] when it is held exclusively or a writer waits for
// it. It joins a shared hold of this Client as RLock does.
func (rw *RWMutex) TryRLock(ctx context.Context) error {
	return rw.rlock(ctx, "dlock.TryRLock", true)
}

// RUnlock undoes one RLock. As with a [sync.RWMutex], an RLock belongs to
// no goroutine, so when this Client's RLocks of the key count on more than
// one shared hold (an RLock after a hold's first extension interval takes
// a new one: see RLock), RUnlock cannot tell which of them it undoes. It
// counts down the oldest hold still held (a lost one only when no hold is
// held), and releases a hold when its count reaches zero (see
// [Lease.Release]). So that no RUnlock returns nil while the RLock it
// undoes counted on a hold that was lost, it returns a [*LeaseLostError]
// whenever a hold that any RLock not yet undone counts on was lost, even
// if it counted down another: with several holds, one loss may be
// reported to the RUnlocks of goroutines that counted on a hold still
// held, never withheld from one that counted on the lost hold. Otherwise
// it returns what its release returns, or nil. It returns [ErrNotHeld]
// when this Client holds no shared hold of the key. A release is sent even
// when ctx has ended, as [Mutex.Unlock]'s is, and RUnlock returns an error
// matching ctx's error only when it could not complete.
func (rw *RWMutex) RUnlock(ctx context.Context) error {
	if rw == nil || rw.c == nil {
		return ErrNotHeld
	}
	c := rw.c
	c.mu.Lock()
	rs := c.readers[rw.key]
	if rs == nil || len(rs.holds) == 0 {
		c.mu.Unlock()
		return ErrNotHeld
	}
	i, lost := rs.countDown()
	h := rs.holds[i]
	if h.n--; h.n > 0 {
		c.mu.Unlock()
		return lost
	}
	rs.holds = slices.Delete(rs.holds, i, i+1)
	if len(rs.holds) == 0 && rs.pending == nil {
		delete(c.readers, rw.key)
	}
	c.mu.Unlock()
	if err := h.l.Release(ctx); err != nil {
		return err
	}
	return lost
}

// countDown returns the index of the hold an RUnlock counts down: the
// oldest still held (it no longer takes new readers, so it ends soonest),
// or, when none is, the oldest. A lost hold is counted down last, so it
// stays counted while any RLock may have counted on it: lost is the loss
// of the oldest hold that was lost, nil if none was. Called with
// Client.mu held.
func (rs *readers) countDown() (i int, lost error) {
	i = -1
	for j, h := range rs.holds {
		err := h.l.Err()
		switch {
		case err == nil && i < 0:
			i = j
		case lost == nil && errors.Is(err, ErrLeaseLost):
			lost = err
		}
	}
	return max(i, 0), lost
}

func (rw *RWMutex) rlock(ctx context.Context, name string, try bool) error {
	if err := rw.check(ctx); err != nil {
		return keyError("rlock", rw.key, err)
	}
	c := rw.c
	for {
		c.mu.Lock()
		if c.calls.closed { // Close has begun: no join either
			c.mu.Unlock()
			return keyError("rlock", rw.key, ErrClosed)
		}
		rs := c.readers[rw.key]
		if rs == nil {
			rs = &readers{}
			c.readers[rw.key] = rs
		}
		if n := len(rs.holds); n > 0 {
			if h := rs.holds[n-1]; h.l.Err() == nil && c.clock.Now().Before(h.joinUntil) {
				h.n++
				c.mu.Unlock()
				return nil
			}
		}
		if rs.pending != nil && !try {
			pending := rs.pending
			c.mu.Unlock()
			select {
			case <-pending:
				continue
			case <-ctx.Done(): // waiting for this Client's own RLock, it saw nothing of the key
				return keyError("rlock", rw.key, &WaitError{Key: rw.key, Err: ctx.Err()})
			case <-c.closing:
				return keyError("rlock", rw.key, ErrClosed)
			}
		}
		mine := make(chan struct{})
		if rs.pending == nil {
			rs.pending = mine
		}
		c.mu.Unlock()

		cl := claim{lk: rw, cfg: &rw.cfg, pace: &rw.pace,
			attempt: attempt{key: rw.key, ttl: rw.cfg.ttl, data: rw.cfg.data, kind: rw.kind(), shared: true, limit: maxReaders}}
		l, err := c.lockShared(ctx, cl, name, try)

		c.mu.Lock()
		if rs.pending == mine {
			rs.pending = nil
			close(mine)
		}
		if len(rs.holds) == 0 && rs.pending == nil && c.readers[rw.key] == rs {
			delete(c.readers, rw.key)
		}
		if err == nil {
			// rs may have left the map meanwhile (a TryRLock does not
			// mark itself pending): add the hold to the current one.
			cur := c.readers[rw.key]
			if cur == nil {
				cur = &readers{}
				c.readers[rw.key] = cur
			}
			cur.holds = append(cur.holds, &readHold{l: l, n: 1, joinUntil: l.acquired.Add(l.every)})
		}
		c.mu.Unlock()
		if err != nil {
			return keyError("rlock", rw.key, err)
		}
		return nil
	}
}

// forget is told of a Release of one of the RWMutex's leases: an exclusive
// one is the RWMutex's no more; a shared one released directly (not by
// RUnlock) is dropped with the RLocks counted on it.
func (rw *RWMutex) forget(l *Lease) {
	if l.role == roleExclusive {
		rw.mu.Lock()
		if rw.lease == l {
			rw.lease = nil
		}
		rw.mu.Unlock()
		return
	}
	c := rw.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if rs := c.readers[rw.key]; rs != nil {
		rs.holds = slices.DeleteFunc(rs.holds, func(h *readHold) bool { return h.l == l })
		if len(rs.holds) == 0 && rs.pending == nil {
			delete(c.readers, rw.key)
		}
	}
}
