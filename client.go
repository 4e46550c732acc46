package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// cleanupTimeout bounds the detached write that gives back a hold whose
// acquisition raced with a cancelled context.
const cleanupTimeout = time.Second

// A Client hands out distributed locks stored in one MongoDB collection,
// one document per key. It runs one background goroutine, which extends
// every lease the Client holds in one bulk write per cadence. A Client is
// safe for concurrent use; make one per process and collection, and Close it.
type Client struct {
	store store
	cfg   config
	owner string
	clock clock
	tel   *telemetry
	ext   *extender

	mu      sync.Mutex
	slots   map[string]*slot
	closed  bool
	closing chan struct{}

	serverClock serverClock
}

// A slot queues this Client's callers for one key, so that they wait here
// rather than each polling the server; busy while one of them holds the
// key or is acquiring it.
type slot struct {
	busy    bool
	waiters []*waiter
}

// A waiter is a queued Lock call. It receives the slot on ch, with a lease
// when the previous holder handed its hold over, nil otherwise.
type waiter struct {
	m  *Mutex
	ch chan *Lease
}

// NewClient returns a Client that keeps its locks in coll. It validates the
// options, makes no round trip to the server and needs no index beyond _id.
// Lock writes use majority write concern and reads majority read concern,
// whatever coll was configured with; both work on a standalone server too.
func NewClient(coll *mongo.Collection, opts ...Option) (*Client, error) {
	if coll == nil {
		return nil, fmt.Errorf("%w: nil collection", ErrInvalidOption)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.owner == "" {
		cfg.owner = randomOwner()
	}
	tel, err := newTelemetry(&cfg)
	if err != nil {
		return nil, fmt.Errorf("dlock: telemetry: %w", err)
	}
	c := &Client{
		cfg: cfg, owner: cfg.owner, clock: cfg.clock, tel: tel,
		slots: map[string]*slot{}, closing: make(chan struct{}),
	}
	c.store = newMongoStore(coll, tel.countCommands)
	if cfg.wrapStore != nil {
		c.store = cfg.wrapStore(c.store)
	}
	c.ext = newExtender(c)
	return c, nil
}

// Owner returns the Client's owner identity, as stored in the locks it holds.
func (c *Client) Owner() string { return c.owner }

// NewMutex returns a Mutex for key. Options given here override the
// Client's for this Mutex. An invalid key or option is reported by the
// Mutex's first Lock or TryLock ([ErrInvalidKey], [ErrInvalidOption]).
func (c *Client) NewMutex(key string, opts ...Option) *Mutex {
	cfg := c.cfg
	cfg.forMutex = true
	for _, o := range opts {
		o.apply(&cfg)
	}
	m := &Mutex{c: c, key: key, cfg: cfg}
	if err := validKey(key); err != nil {
		m.err = err
	} else if err := cfg.validate(); err != nil {
		m.err = err
	}
	return m
}

func validKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidKey, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidKey)
	case containsNUL(key):
		return fmt.Errorf("%w: contains NUL", ErrInvalidKey)
	}
	return nil
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// Close ends every lease the Client holds (their Done channels close, their
// Err reports [ErrReleased]), frees their keys in one write, stops the
// Client's goroutine and waits for it. Waiting Lock calls return
// [ErrClosed], and so does every later call. Closing twice returns
// [ErrClosed].
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closed = true
	close(c.closing)
	c.mu.Unlock()

	leases := c.ext.shutdown()
	refs := make([]leaseRef, 0, len(leases))
	for _, l := range leases {
		if l.end(ErrReleased, "") {
			refs = append(refs, l.ref())
		}
	}
	return c.store.releaseAll(ctx, refs)
}

// enter takes this Client's slot for the Mutex's key, queueing behind other
// callers. It returns a lease when the previous holder handed one over. With
// try, it fails with ErrLocked instead of queueing.
func (c *Client) enter(ctx context.Context, m *Mutex, try bool) (*Lease, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	s := c.slots[m.key]
	if s == nil {
		s = &slot{}
		c.slots[m.key] = s
	}
	if !s.busy {
		s.busy = true
		c.mu.Unlock()
		return nil, nil
	}
	if try {
		c.mu.Unlock()
		return nil, ErrLocked
	}
	w := &waiter{m: m, ch: make(chan *Lease, 1)}
	s.waiters = append(s.waiters, w)
	c.mu.Unlock()

	var err error
	select {
	case l := <-w.ch:
		return l, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-c.closing:
		err = ErrClosed
	}
	c.mu.Lock()
	for i, x := range s.waiters {
		if x == w {
			s.waiters = append(s.waiters[:i], s.waiters[i+1:]...)
			c.mu.Unlock()
			return nil, err
		}
	}
	c.mu.Unlock()
	// Too late to leave the queue: the slot is on its way. Pass it on.
	if l := <-w.ch; l != nil {
		ctx, cancel := detached(ctx, l.ttl)
		defer cancel()
		l.Release(ctx)
	} else {
		c.leave(m.key, nil, nil)
	}
	return nil, err
}

// next removes and returns the first waiter for key, or nil. The slot stays
// busy: the caller hands it to the waiter, or calls leave.
func (c *Client) next(key string) *waiter {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[key]
	if len(s.waiters) == 0 {
		return nil
	}
	w := s.waiters[0]
	s.waiters = s.waiters[1:]
	return w
}

// leave passes the slot for key to w, with lease l (which may be nil), or,
// with no w, to the first waiter, or frees it.
func (c *Client) leave(key string, w *waiter, l *Lease) {
	if w == nil {
		c.mu.Lock()
		s := c.slots[key]
		if len(s.waiters) == 0 {
			delete(c.slots, key) // in the same critical section as the check
			c.mu.Unlock()
			return
		}
		w, s.waiters = s.waiters[0], s.waiters[1:]
		c.mu.Unlock()
	}
	w.ch <- l
}

// release gives lease l back and passes this Client's slot for its key on.
// With a local waiter, it hands the hold over in one command instead of
// freeing the key and having the waiter take it again.
func (c *Client) release(ctx context.Context, l *Lease) error {
	lostErr := l.ended()
	if errors.Is(lostErr, ErrReleased) { // ended by Close
		return ErrClosed
	}
	w := c.next(l.key)
	if w != nil && lostErr == nil {
		sent := c.clock.Now()
		r, err := c.store.handoff(ctx, l.ref(), w.m.cfg.ttl)
		switch {
		case err == nil:
			l.end(ErrReleased, "")
			next := c.newLease(w.m, r, sent)
			if !c.ext.add(next) {
				// Closed meanwhile: free the key, and the waiter gets ErrClosed.
				c.store.release(ctx, next.ref())
				next.end(ErrReleased, "")
			}
			w.ch <- next
			return nil
		case errors.Is(err, errNotOwner):
			err = l.steal()
			c.leave(l.key, w, nil)
			return err
		default:
			l.end(ErrReleased, "")
			c.leave(l.key, w, nil)
			return err
		}
	}
	err := c.store.release(ctx, l.ref())
	switch {
	case lostErr != nil:
		err = lostErr // the release only tidied up
	case errors.Is(err, errNotOwner):
		err = l.steal()
	default:
		l.end(ErrReleased, "")
	}
	c.leave(l.key, w, nil)
	return err
}

// detached returns a context for a cleanup write after ctx was cancelled.
func detached(ctx context.Context, ttl time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), min(ttl, cleanupTimeout))
}
