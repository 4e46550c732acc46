package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// cleanupTimeout bounds a clean-up write: the detached write that gives
// back a hold whose acquisition raced with a cancelled context, or that
// tidies up after a lost lease; and a release (Unlock, Close) whose
// caller's ctx had ended (cleanupContext).
const cleanupTimeout = time.Second

// cleanupContext returns the context of a release that a call makes with
// ctx: ctx itself while it lasts; once it has ended, a context with its
// values, detached from its end and bounded by cleanupTimeout. A release
// is clean-up: a deferred Unlock with a request's ctx that has ended must
// still free the key at once, not leave it held for a TTL. Call stop once
// the release returns.
func cleanupContext(ctx context.Context) (_ context.Context, stop context.CancelFunc) {
	if ctx.Err() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}

// cleanupError is the error of a release (what: the operation and key)
// that a call with ctx sent on cleanupContext(ctx) and that returned err:
// err as it is, unless ctx has ended and the release got no answer (a
// store's error, not a lost lease's); then an error that matches ctx's
// error, and err.
func cleanupError(ctx context.Context, what string, err error) error {
	if err == nil || ctx.Err() == nil || errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrClosed) {
		return err
	}
	return errorf(prefix+"%s: %w; the release, sent regardless, failed: %w", what, ctx.Err(), err)
}

// A Client hands out distributed locks stored in one MongoDB collection,
// one document per key (and one floor document, see [Client.Prune]). It
// runs one background goroutine, which extends every lease the Client
// holds in one bulk write per cadence, one more that prunes with
// [WithPruneIdle], and short clean-up writes in the background (each
// bounded by a second or the TTL); Close stops and waits for all of them. A Client is safe for concurrent
// use; make one per process and collection, and Close it.
type Client struct {
	store   store
	cfg     config
	owner   string
	clock   clock // the system clock, but for tests' hooks
	pacer   pacer // rulesPacer, but for tests' hooks
	tel     *telemetry
	ext     *extender
	watcher watcher      // the keys the waits want a view of (watcher.go)
	source  viewSource   // where the watcher's rounds read them: pollSource
	holdIDs atomic.Int64 // the last hold id handed out (see attempt)

	mu        sync.Mutex
	slots     map[string]*slot     // guarded by mu
	leftovers map[string]*leftover // guarded by mu: what an Unlock left for the next Lock (requeue.go)
	readers   map[string]*readers  // guarded by mu: RWMutex shared holds by key
	closing   chan struct{}        // closed by Close
	calls     tracker              // guarded by mu: Lock, TryLock and Release calls under way; closed by Close
	tidying   tracker              // guarded by mu: background clean-up writes under way

	observations map[string]*observation // guarded by mu: Election.Observe's pollers, by key
	observing    tracker                 // guarded by mu: their goroutines (pollers and forwarders); closed by Close

	tidyCtx    context.Context // parent of the clean-up writes; cancelled by Close
	tidyCancel context.CancelFunc
	prunerDone chan struct{} // closed when the pruner (WithPruneIdle) returns; nil without one

	serverClock serverClock
}

// A tracker counts work under way so that Close can wait for it. Its owner
// guards it.
type tracker struct {
	n      int
	closed bool
	idle   chan struct{} // closed once closed and n is 0
}

// add counts one more unless the tracker is closed.
func (t *tracker) add() bool {
	if t.closed {
		return false
	}
	t.n++
	return true
}

func (t *tracker) done() {
	if t.n--; t.n == 0 && t.closed {
		close(t.idle)
	}
}

// close refuses further adds and returns a channel closed when none is
// under way.
func (t *tracker) close() <-chan struct{} {
	t.closed = true
	t.idle = make(chan struct{})
	if t.n == 0 {
		close(t.idle)
	}
	return t.idle
}

// A slot queues this Client's callers for one key, so that they wait here
// rather than each polling the server; busy while one of them holds the
// key or is acquiring it. Client.mu guards it.
type slot struct {
	busy    bool
	waiters []*waiter
}

// A waiter is a queued Lock call. The slot reaches it on ch (buffered: the
// one send never blocks), with a lease when the previous holder handed its
// hold over, nil otherwise. gone is set, under Client.mu, when the caller
// left (its ctx ended) after it was taken off the queue but before the
// slot reached it; whoever brings the slot then passes it on instead.
type waiter struct {
	cl   claim
	ch   chan *Lease
	gone bool
}

// NewClient returns a Client that keeps its locks in coll. It validates the
// options, makes no round trip to the server and needs no index beyond _id
// ([Client.Prune] creates the one it uses).
// Lock writes use majority write concern and reads majority read concern,
// whatever coll was configured with; both work on a standalone server too.
func NewClient(coll *mongo.Collection, opts ...Option) (*Client, error) {
	if coll == nil {
		return nil, fmt.Errorf("%w: nil collection", ErrInvalidOption)
	}
	return newClientOn(func(t *telemetry) store { return newMongoStore(coll, t.countCommands) }, opts...)
}

// newClientOn makes a Client on the store that newStore returns.
func newClientOn(newStore func(*telemetry) store, opts ...Option) (*Client, error) {
	cfg := defaultConfig()
	cfg.applyAll(opts)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.owner = identity(cfg.owner)
	tel, err := newTelemetry(&cfg)
	if err != nil {
		return nil, fmt.Errorf("dlock: telemetry: %w", err)
	}
	c := &Client{
		cfg: cfg, owner: cfg.owner, clock: systemClock{}, pacer: rulesPacer{}, tel: tel,
		slots: map[string]*slot{}, leftovers: map[string]*leftover{}, readers: map[string]*readers{}, closing: make(chan struct{}),
		observations: map[string]*observation{},
	}
	c.tidyCtx, c.tidyCancel = context.WithCancel(context.Background())
	c.store = newStore(tel)
	if h := cfg.hooks; h != nil {
		if h.clock != nil {
			c.clock = h.clock
		}
		if h.pacer != nil {
			c.pacer = h.pacer
		}
		if h.wrap != nil {
			c.store = h.wrap(c.store)
		}
	}
	c.source = pollSource{c.store}
	if !cfg.serverClock {
		c.serverClock.markUnsupported()
	}
	c.ext = newExtender(c)
	if cfg.pruneIdle > 0 {
		c.prunerDone = make(chan struct{})
		go c.pruner()
	}
	return c, nil
}

// Owner returns the Client's owner identity, as stored in the locks it
// holds: the label given with [WithOwner], "#" and 128 random bits in
// hex, or, without WithOwner, the random bits alone. It is unique to the
// Client, so no other Client, whatever its label, can extend, release or
// take back as its own a hold of this one.
func (c *Client) Owner() string { return c.owner }

// NewMutex returns a Mutex for key. Options given here override the
// Client's for this Mutex. An invalid key or option is reported by the
// Mutex's first Lock or TryLock ([ErrInvalidKey], [ErrInvalidOption]).
func (c *Client) NewMutex(key string, opts ...Option) *Mutex {
	m := &Mutex{c: c, key: key}
	m.cfg, m.err = c.configFor(key, opts)
	return m
}

// configFor returns the configuration of one primitive on key: the
// Client's, with opts applied; and what is wrong with key or opts.
func (c *Client) configFor(key string, opts []Option) (config, error) {
	cfg := c.cfg
	cfg.forLock = true
	cfg.applyAll(opts)
	if err := validKey(key); err != nil {
		return cfg, err
	}
	return cfg, cfg.validate()
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
// Client's goroutines and waits for them. Waiting Lock calls return
// [ErrClosed], and so does every later call. Close first waits for calls
// under way (a Lock whose acquire is in flight, an Unlock handing its hold
// over) to finish, so that what they hold is freed too; and last for
// background clean-up writes. When ctx ends first, Close stops waiting,
// cancels the clean-ups, and the keys they were to free are free again a
// TTL later. The one write that frees the keys of the leases, and of what
// the last Unlocks left for a next Lock (a kept hold, a requeued
// registration), is sent even when ctx has ended already, as
// [Mutex.Unlock]'s release is, bounded by a second of its own; Close
// returns an error matching ctx's error only when that write could not
// complete. Closing twice returns [ErrClosed].
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.calls.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	close(c.closing)
	leftovers := c.leftovers // Close frees them below, not their disposers (leaveFor)
	c.leftovers = map[string]*leftover{}
	calls := c.calls.close()
	for _, o := range c.observations {
		o.cancel() // its observers see closing
	}
	observing := c.observing.close()
	c.mu.Unlock()
	select {
	case <-calls:
	case <-ctx.Done():
	}

	leases := c.ext.shutdown()
	refs := make([]leaseRef, 0, len(leases)+len(leftovers))
	for _, lo := range leftovers {
		// A kept hold's lease ended with its Unlock (its release is
		// conditional on the hold all the same); a registration's is
		// ended here, so it is not named twice.
		if lo.lease.end(ErrReleased, "") || lo.kept() {
			refs = append(refs, lo.lease.ref())
		}
	}
	for _, l := range leases {
		if l.end(ErrReleased, "") {
			refs = append(refs, l.ref())
		}
	}
	rctx, stop := cleanupContext(ctx)
	err := cleanupError(ctx, "close", c.store.releaseAll(rctx, refs))
	stop()

	c.mu.Lock()
	tidying := c.tidying.close()
	c.mu.Unlock()
	select {
	case <-tidying:
	case <-ctx.Done():
		c.tidyCancel()
		<-tidying
	}
	c.tidyCancel()
	if c.prunerDone != nil {
		<-c.prunerDone // it saw closing; its Prune, if any, was a call waited for above, or cancelled
	}
	<-observing // they saw closing, or their contexts cancelled above
	return err
}

// begin counts a call under way, or returns ErrClosed.
func (c *Client) begin() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.calls.add() {
		return ErrClosed
	}
	return nil
}

// finish ends a call that begin counted.
func (c *Client) finish() {
	c.mu.Lock()
	c.calls.done()
	c.mu.Unlock()
}

// isClosing reports whether Close has begun.
func (c *Client) isClosing() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

// tidy runs a clean-up write in the background, with a context detached
// from any caller's, bounded by timeout (and by cleanupTimeout), and
// cancelled if Close cannot wait for it. Once Close has stopped waiting
// for clean-ups it does nothing: every clean-up write only frees a key
// sooner than its TTL would. It reports whether it ran write.
func (c *Client) tidy(timeout time.Duration, write func(ctx context.Context)) bool {
	c.mu.Lock()
	ok := c.tidying.add()
	c.mu.Unlock()
	if !ok {
		return false
	}
	go func() {
		defer func() {
			c.mu.Lock()
			c.tidying.done()
			c.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(c.tidyCtx, min(timeout, cleanupTimeout))
		defer cancel()
		write(ctx)
	}()
	return true
}

// enter takes this Client's slot for the claim's key, queueing behind other
// callers. It returns a lease when the previous holder handed one over. With
// try, it fails with errLockedHere instead of queueing.
func (c *Client) enter(ctx context.Context, cl claim, try bool) (*Lease, error) {
	key := cl.attempt.key
	c.mu.Lock()
	s := c.slots[key]
	if s == nil {
		s = &slot{}
		c.slots[key] = s
	}
	if !s.busy {
		s.busy = true
		c.mu.Unlock()
		return nil, nil
	}
	if try {
		c.mu.Unlock()
		return nil, errLockedHere
	}
	w := &waiter{cl: cl, ch: make(chan *Lease, 1)}
	s.waiters = append(s.waiters, w)
	c.mu.Unlock()

	var err error
	select {
	case l := <-w.ch:
		return l, nil
	case <-ctx.Done():
		err = &WaitError{Key: key, Err: ctx.Err(), Holders: []Holder{{Owner: c.owner}}, local: true}
	case <-c.closing:
		err = ErrClosed
	}
	c.mu.Lock()
	if i := slices.Index(s.waiters, w); i >= 0 {
		s.waiters = slices.Delete(s.waiters, i, i+1)
		c.mu.Unlock()
		return nil, err
	}
	// Taken off the queue: the slot is here already, or on its way (a
	// handoff in flight); then its bearer passes it on.
	select {
	case l := <-w.ch:
		c.mu.Unlock()
		c.passOn(key, l)
	default:
		w.gone = true
		c.mu.Unlock()
	}
	return nil, err
}

// next removes and returns the first waiter for key, or nil. The slot stays
// busy: the caller delivers it to the waiter.
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

// leave passes the slot for key, with no lease, to the first waiter, or
// frees it.
func (c *Client) leave(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slots[key]
	if len(s.waiters) == 0 {
		delete(c.slots, key) // in the same critical section as the check
		return
	}
	w := s.waiters[0]
	s.waiters = s.waiters[1:]
	w.ch <- nil
}

// deliver gives the slot for key, with lease l (nil for none), to w, which
// was taken off the queue; if w has left meanwhile, the slot is passed on.
func (c *Client) deliver(key string, w *waiter, l *Lease) {
	c.mu.Lock()
	if !w.gone {
		w.ch <- l
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.passOn(key, l)
}

// passOn passes on a slot whose waiter left: a lease in it is given back
// in the background, which passes the slot to the next waiter; with no
// lease, the slot goes to the next waiter at once, or is freed.
func (c *Client) passOn(key string, l *Lease) {
	if l == nil {
		c.leave(key)
		return
	}
	c.tidy(l.ttl, func(ctx context.Context) { l.Release(ctx) })
}

// release gives lease l back and passes this Client's slot for its key on.
// The lease ends before any write is sent (Err reports ErrReleased, Done
// closes, Context is cancelled): once the write lands the key may be
// another's, so nothing may still be relying on the lease. With a local
// waiter, it hands the hold over in one command instead of freeing the key
// and having the waiter take it again, unless waiters of other Clients are
// registered in the document: then it frees the key for them (the handoff
// is refused, a second command) and the local waiter queues behind them;
// nor to a waiter of another kind (see handOver). A lease already lost (by the
// extender, or past its local deadline) is not handed over: its error is
// returned at once and the key is tidied up in the background.
func (c *Client) release(ctx context.Context, l *Lease) error {
	if l.role != roleExclusive {
		return c.releaseShared(ctx, l)
	}
	// One reading of the lease's state: Close may end it at any moment,
	// and one that ended it before this reading returns ErrClosed, never
	// the ErrReleased that Err then reports.
	err := l.Err()
	if errors.Is(err, ErrReleased) { // ended by Close
		return ErrClosed
	}
	if err != nil {
		var lost *LeaseLostError
		if errors.As(err, &lost) && lost.Cause != nil { // expired: the store may still show the hold
			ref := l.ref()
			c.tidy(l.ttl, func(ctx context.Context) { c.store.release(ctx, ref) })
		}
		c.leave(l.key)
		return err
	}
	if !c.cfg.hooks.flawed(flawExtendReleasing) && !l.end(ErrReleased, "") { // lost or closed a moment ago
		c.leave(l.key)
		if err := l.ended(); !errors.Is(err, ErrReleased) {
			return err
		}
		return ErrClosed // only Close ends a lease as released before its Release does
	}
	if c.cfg.hooks.flawed(flawExtendReleasing) { // the old order: ended once the write is answered
		defer l.end(ErrReleased, "")
	}
	if w := c.next(l.key); w != nil {
		return c.handOver(ctx, l, w)
	}
	if rq, ok := l.lk.(requeuer); ok && !c.cfg.hooks.flawed(flawUnfair) {
		cl := rq.requeueClaim()
		defer func() { cl.pace.unlockedAt(c.clock.Now()) }()
		if cl.pace.unlocking(c.clock.Now(), cl.cfg) && !c.isClosing() { // nothing is left for a Lock once Close begins
			if c.pacer.uses(ruleKeep) && cl.pace.keeping(cl.cfg) && c.keep(l, cl) {
				c.leave(l.key)
				return nil
			}
			cl.pace.freeing(c.clock.Now(), l.count)
			if c.pacer.uses(ruleRequeue) {
				if done, err := c.requeue(ctx, l, cl); done {
					c.leave(l.key)
					return err
				}
			}
		}
		cl.pace.freeing(c.clock.Now(), l.count)
	}
	err = c.store.release(ctx, l.ref())
	if errors.Is(err, errNotOwner) {
		err = l.takenOver()
	}
	c.leave(l.key)
	return err
}

// handOver passes this Client's slot for the key of exclusive lease l,
// which its Release has ended, to w, the next of the Client's callers
// queued for it, with the hold: in one command (handoff), unless waiters
// of other Clients are registered (then the key is freed for them, and w
// queues behind them). A waiter of another kind than l's (a misuse: the
// key is used as two kinds of primitive) is never handed the hold, which
// would make it hold a document of l's kind: the key is freed, and w,
// given the slot alone, finds the kind as any other Client's call would,
// and returns [ErrKindMismatch].
func (c *Client) handOver(ctx context.Context, l *Lease, w *waiter) error {
	if w.cl.attempt.kind != kindOf(l.lk) {
		err := c.store.release(ctx, l.ref())
		if errors.Is(err, errNotOwner) {
			err = l.takenOver()
		}
		c.deliver(l.key, w, nil)
		return err
	}
	a := w.cl.attempt
	a.owner, a.hold = c.owner, c.holdIDs.Add(1)
	a.pastQueue = c.cfg.hooks.flawed(flawUnfair) || c.cfg.hooks.flawed(flawQueueJump)
	sent := c.clock.Now()
	r, err := c.store.handoff(ctx, l.ref(), a)
	if errors.Is(err, errNotOwner) && !a.pastQueue {
		// Lost, or waiters of other Clients are queued: the key is
		// theirs first, and the local waiter queues behind them.
		if err = c.store.release(ctx, l.ref()); err == nil {
			c.deliver(l.key, w, nil)
			return nil
		}
	}
	switch {
	case err == nil:
		next := c.newLease(w.cl.lk, w.cl.cfg, a, r.Token, roleExclusive, sent)
		if !c.ext.add(next) { // Close could not wait for this call: free the key
			c.store.release(ctx, next.ref())
			next.end(ErrReleased, "")
		}
		c.deliver(l.key, w, next)
		return nil
	case errors.Is(err, errNotOwner):
		err = l.takenOver()
	}
	c.deliver(l.key, w, nil) // the outcome unknown: the waiter takes over a hold of ours at once
	return err
}

// kindOf is the kind of the keys that lk holds exclusively: "" for a
// Mutex's.
func kindOf(lk locker) string {
	if k, ok := lk.(interface{ kind() string }); ok {
		return k.kind()
	}
	return ""
}

// releaseShared gives a shared hold back: no local queue, no handoff.
func (c *Client) releaseShared(ctx context.Context, l *Lease) error {
	err := l.Err()
	if errors.Is(err, ErrReleased) { // ended by Close
		return ErrClosed
	}
	if err != nil {
		var lost *LeaseLostError
		if errors.As(err, &lost) && lost.Cause != nil {
			ref := l.ref()
			c.tidy(l.ttl, func(ctx context.Context) { c.store.release(ctx, ref) })
		}
		return err
	}
	if !l.end(ErrReleased, "") {
		if err := l.ended(); !errors.Is(err, ErrReleased) {
			return err
		}
		return ErrClosed
	}
	err = c.store.release(ctx, l.ref())
	if errors.Is(err, errNotOwner) {
		err = l.takenOver()
	}
	return err
}
