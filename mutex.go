package dlock

import (
	"context"
	"sync"
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
// A lost lease (see [Lease.Lost]) is the Mutex's no more: Lease returns nil
// from then on, and the next Lock or TryLock gives the lost hold back, as
// Unlock would, and proceeds, without waiting for an Unlock. Until then,
// Unlock returns the lease's [*LeaseLostError]. (An [Election] and the
// write side of an [RWMutex] do the same; a [Semaphore] keeps no lease.)
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
	lease *Lease // guarded by mu: the last hold, until Unlock or the next Lock gives it back; nil when none
	pace  pacing // what its waits and holds taught it (pacer.go)
}

// Key returns the Mutex's key.
func (m *Mutex) Key() string { return m.key }

// Lease returns the current lease, or nil when the Mutex is not held:
// before Lock, after Unlock, and once the lease is lost (its Err is not
// nil).
func (m *Mutex) Lease() *Lease {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	l := m.lease
	m.mu.Unlock()
	return stillHeld(l)
}

// Lock blocks until the Mutex holds its key, or ctx ends. While the key is
// held by another Client, Lock registers in the key's document and waits
// its turn: across processes the key goes to waiters first come, first
// served (docs/fairness.md has the queue, its bounds and how a waiter paces
// its commands). It takes a key whose holder has stopped extending it once
// the TTL has passed (see the package documentation for how this is
// decided without comparing clocks).
//
// When ctx ends first, Lock returns an error that matches ctx.Err() with
// [errors.Is] and wraps a [*WaitError], which also matches the last error
// the server gave (with errors.Is and errors.As: a network fault, or no
// server that could be selected) and says who held the key when the wait
// last saw it held. Lock then leaves nothing held: if its last write may
// have acquired the key, a short clean-up write in the background gives it
// back (one that can free only that write's hold). A ctx that has already
// ended returns at once, with no command sent and ctx's error alone. A
// lease of the Mutex that was lost is given back first (see Mutex). Lock
// never returns nil with a lease that has already ended: one whose acquire
// was answered after the lease's local deadline is not returned, and Lock
// keeps trying (TryLock returns a [*LeaseLostError] instead); after three
// such answers in a row (or registrations in the queue answered as late),
// the TTL is shorter than the server's round trip, and Lock returns an
// error matching [ErrTTLTooShort], leaving nothing held.
//
// When the Client is closed, or closes while Lock waits, Lock returns
// [ErrClosed]; a hold it won as Close began is given back first.
func (m *Mutex) Lock(ctx context.Context) error {
	return m.lock(ctx, "dlock.Lock", false)
}

// TryLock makes one attempt to hold the key and returns an error matching
// [ErrLocked] when another owner holds it, or when another goroutine or
// Mutex of this Client holds it or is acquiring it (the message says
// which). It never queues, and fails while any waiter is registered in the
// key's document ([Client.Holders] names them); a crashed waiter's
// registration blocks it until a waiter behind it clears it, or until no
// registration was extended for its TTL (two of the Mutex's) by the
// server's clock, when TryLock clears them all itself (two commands more)
// and tries once more: so two TTLs after the key's document was last
// written (any write stamps it: a holder's extension too, so a crashed
// waiter behind a live hold blocks TryLock until two TTLs after that
// hold's last write). An uncontended TryLock is one command; one that finds the key
// held reads the document to tell a hold this Client abandoned, which it
// takes over, and, with [WithServerClockTakeover], one abandoned more
// than a TTL ago by the server's clock. Like Lock, it gives a lost lease of
// the Mutex back first.
func (m *Mutex) TryLock(ctx context.Context) error {
	return m.lock(ctx, "dlock.TryLock", true)
}

// Unlock releases the Mutex's lease (see [Lease.Release]). It returns
// [ErrNotHeld] when the Mutex holds no lease, and a [*LeaseLostError], at
// once, when the lease was lost.
//
// A ctx that has ended does not keep Unlock from freeing the key: its
// release is sent all the same, bounded by a second of its own, so that
// defer mu.Unlock(ctx) with a request's ctx frees the key at once. Unlock
// returns an error matching ctx's error only when that release could not
// complete; the key is then free again at the latest a TTL later.
//
// Under contention, when the Mutex is locked again as soon as it is
// unlocked, Unlock may queue the Mutex's next Lock in its release's write,
// or keep a short hold for that Lock, which then takes it over with a new
// token and no write (another Mutex of the key, in the same Client, takes
// it by a handoff write, with its own data); a kept hold that no Lock
// takes within the minimum backoff ([WithBackoff]) is released in the
// background. Either way the lease has ended when Unlock returns.
// docs/fairness.md has when ("Requeue" and "Keep"), and the bound on other
// Clients' waits.
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

func (m *Mutex) lock(ctx context.Context, name string, try bool) error {
	switch {
	case m == nil || m.c == nil:
		return ErrNoClient
	case m.err != nil:
		return m.err
	case ctx.Err() != nil:
		return keyError("lock", m.key, ctx.Err())
	}
	m.mu.Lock()
	old := m.lease
	m.mu.Unlock()
	giveBackLost(ctx, old)
	l, err := m.c.lockExclusive(ctx, m.claim(), name, try)
	if err != nil {
		return keyError("lock", m.key, err)
	}
	m.mu.Lock()
	m.lease = l
	m.mu.Unlock()
	return nil
}

// requeueClaim is the claim of the Mutex's next Lock, for a requeue.
func (m *Mutex) requeueClaim() claim { return m.claim() }

func (m *Mutex) claim() claim {
	return claim{lk: m, cfg: &m.cfg, pace: &m.pace, attempt: attempt{key: m.key, ttl: m.cfg.ttl, data: m.cfg.data}}
}
