package dlock

import (
	"context"
	"fmt"
)

// MaxPermits is the most permits a [Semaphore] may have: each permit held is
// an entry in the key's document, which a server keeps under 16 MB and
// rewrites on every acquire and release.
const MaxPermits = 1000

// A Semaphore is a distributed counting semaphore on one key: at most n
// permits are held at once, across all Clients and processes sharing the
// collection. Each permit is a [Lease] with its own fencing token from the
// key's one counter, extended in the background with the Client's other
// leases, and given back with [Lease.Release] (which frees the permit even
// when given a ctx that has ended, as [Mutex.Unlock] does). A permit whose holder
// crashed or was cut off is free again within the same bound as a
// [Mutex]'s key (see the package documentation).
//
// Every Semaphore on a key must have the same n: a Semaphore that finds
// the key used with another n (or by a Mutex or RWMutex) returns an error
// matching [ErrKindMismatch], never a silently larger limit.
//
// A Semaphore keeps no lease: each permit's Lease is the caller's. A permit
// that was lost is the Semaphore's no more, as a lost lease is a
// [Mutex]'s: its Release returns the loss (and frees its entry in the
// background), and the next Acquire does not wait for it beyond its TTL,
// as for any holder that stopped extending.
//
// A Semaphore is safe for concurrent use. Each Acquire takes a permit of its
// own, on the server (goroutines of one Client do not share permits). Make
// one with [Client.NewSemaphore]; the zero value's calls return [ErrNoClient].
type Semaphore struct {
	c   *Client // set by NewSemaphore; never changes
	key string
	n   int
	cfg config
	err error // invalid key, n or options

	pace pacing // what its waits and holds taught it (pacer.go)
}

// NewSemaphore returns a Semaphore of n permits on key. Options given here
// override the Client's for this Semaphore. An invalid key, n (below 1 or
// above [MaxPermits]) or option is reported by its first Acquire or
// TryAcquire ([ErrInvalidKey], [ErrInvalidOption]).
func (c *Client) NewSemaphore(key string, n int, opts ...Option) *Semaphore {
	s := &Semaphore{c: c, key: key, n: n}
	s.cfg, s.err = c.configFor(key, opts)
	if s.err == nil && (n < 1 || n > MaxPermits) {
		s.err = fmt.Errorf("%w: %d permits: a Semaphore has 1 to %d", ErrInvalidOption, n, MaxPermits)
	}
	return s
}

// Key returns the Semaphore's key.
func (s *Semaphore) Key() string { return s.key }

// N returns the Semaphore's number of permits.
func (s *Semaphore) N() int { return s.n }

// Acquire blocks until it holds one of the n permits, or ctx ends, and
// returns the permit's lease; give it back with [Lease.Release]. Waiters
// are served first come, first served, across Clients and permits: one
// that finds no permit for it registers in the key's queue, and takes a
// permit only while one is left for each waiter registered before it.
// While it waits it polls the server, one read a poll, and takes a permit
// whose holder has stopped extending it once its TTL has passed.
//
// When ctx ends first, Acquire returns an error that matches ctx.Err() with
// [errors.Is] and wraps a [*WaitError] (who held the permits when it last
// read them, the last error from the server), and leaves no permit held: a permit its last write may have
// taken is given back in the background. When the Client is closed, or
// closes meanwhile, it returns [ErrClosed].
func (s *Semaphore) Acquire(ctx context.Context) (*Lease, error) {
	return s.acquire(ctx, "dlock.Acquire", false)
}

// TryAcquire makes one attempt to take a permit and returns an error
// matching [ErrLocked] when all n are held, or while any waiter is
// registered in the key's queue, whatever number of permits is free: it
// never passes the queue ([Client.Holders] names the waiters). A crashed
// waiter's registration blocks it until a waiting Acquire clears it, or
// until no registration was extended for its TTL (two of the Semaphore's)
// by the server's clock, when TryAcquire clears them itself (two commands
// more) and tries once more. It costs one command when the
// Semaphore knows the key's token counter from an earlier call, and two
// (a read, then the acquire) otherwise.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lease, error) {
	return s.acquire(ctx, "dlock.TryAcquire", true)
}

func (s *Semaphore) acquire(ctx context.Context, name string, try bool) (*Lease, error) {
	switch {
	case s == nil || s.c == nil:
		return nil, ErrNoClient
	case s.err != nil:
		return nil, s.err
	case ctx.Err() != nil:
		return nil, keyError("acquire", s.key, ctx.Err())
	}
	cl := claim{lk: s, cfg: &s.cfg, pace: &s.pace,
		attempt: attempt{key: s.key, ttl: s.cfg.ttl, data: s.cfg.data, kind: semKind(s.n), shared: true, limit: s.n}}
	l, err := s.c.lockShared(ctx, cl, name, try)
	if err != nil {
		return nil, keyError("acquire", s.key, err)
	}
	return l, nil
}

// forget: a Semaphore keeps no lease.
func (s *Semaphore) forget(*Lease) {}
