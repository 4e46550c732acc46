package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Token is a fencing token: a number that strictly increases with each hold
// of a key, for the key's whole life, across releases, expiries, takeovers
// and client restarts. Hand it to the storage your critical section writes,
// and have that storage reject tokens older than one it has seen ([Fence],
// [UpdateFenced]): then even a holder that was paused past its lease cannot
// overwrite the work of the holder that followed it.
type Token uint64

// errDeadline is the cause of a lease lost at its local deadline with no
// failed extension to blame (the process did not run, say).
var errDeadline = errors.New("dlock: local deadline passed without a successful extension")

// A Lease is one hold of a key. It is extended in the background until it is
// released or lost. Done is closed when it ends for any reason; Lost only
// when it was lost. A Lease is safe for concurrent use.
type Lease struct {
	c        *Client
	lk       locker // what the hold is for; told when Release is called
	key      string
	token    Token
	count    Token // the key's token counter for this hold, which its writes name: token, or token+1 when its acquire reserved a spare (keep.go)
	hold     int64 // the hold id
	role     role  // exclusive or shared (or, internally, a waiter's registration)
	ttl      time.Duration
	every    time.Duration
	acquired time.Time     // on the Client's clock: when the acquire (or handoff) that made the hold was sent; for a kept hold's lease, the hold's last write's send, from which WithMaxHold counts too
	maxHold  time.Duration // WithMaxHold; 0 for no cap
	holdEnd  time.Time     // with maxHold: acquired+maxHold, which the deadline never passes; else zero
	stop     time.Time     // with maxHold: holdEnd-ttl, after which no extension is sent; else zero
	lastDue  time.Time     // with maxHold: when the last extension is due, a timer's lateness before stop
	raw      atomic.Bool   // the hold's base may be unwritten (leaseRef.raw); cleared by its first write that applied
	trace    holdTrace     // the trace context of the Lock that made the hold (traceOf): its LeaseLost span's parent

	mu       sync.Mutex
	data     []byte        // the hold's data; replaced (never modified) by Election.Proclaim
	deadline time.Time     // on the Client's clock: held until then
	next     time.Time     // when the next extension is due
	last     bool          // the extension due at next is the last (at lastDue); set once
	capped   bool          // no extension is sent any more (past stop); set once
	lastErr  error         // the last failed extension
	err      error         // nil while held
	returned bool          // Release was called
	done     chan struct{} // made by the first Done (closedChan if the lease had ended); closed when the lease ends
	lost     chan struct{} // made by the first Lost (closedChan if the lease was lost); closed when it is lost
	ctx      context.Context
	cancel   context.CancelCauseFunc
}

// closedChan is the channel Done and Lost return when the lease had ended
// before the first call. Like context's cancelCtx, a lease makes its
// channels only when asked for them: most are never asked, and two
// channels were a sixth of a held lease's heap.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// A locker is what a hold is for: a Mutex, an RWMutex, a Semaphore.
type locker interface {
	// forget is called when Release is called on one of its leases.
	forget(l *Lease)
}

// newLease returns the lease of a hold that attempt a made, with token t,
// by a write sent at sent. When a reserved a spare, the key's counter is
// t+1.
func (c *Client) newLease(lk locker, cfg *config, a attempt, t Token, ro role, sent time.Time) *Lease {
	l := &Lease{
		c: c, lk: lk, key: a.key, token: t, count: t, hold: a.hold, role: ro, data: a.data, ttl: cfg.ttl, every: cfg.every(),
		acquired: sent, deadline: sent.Add(holdFor(cfg.ttl)), trace: a.trace,
	}
	if d := cfg.maxHold; d > 0 && ro != roleWaiter { // a registration is not a hold
		l.maxHold, l.holdEnd, l.stop = d, sent.Add(d), sent.Add(d-l.ttl)
		l.lastDue = l.stop.Add(-lastGuard(l.ttl))
		if l.deadline.After(l.holdEnd) {
			l.deadline = l.holdEnd
		}
	}
	if a.spare && ro == roleExclusive {
		l.count++
	}
	l.raw.Store(a.raw && ro != roleWaiter)
	l.setNextExtension(sent, sent.Add(l.every))
	return l
}

// lastGuard is how long before the last moment for an extension (the cap
// less a TTL) the last extension of a capped hold is due: the share of the
// TTL that holdFor keeps for the lateness of timers.
func lastGuard(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl) * lostGuard)
}

// setNextExtension sets when the next extension is due, at, after an extension
// sent, or a failure seen, at from. With a maximum hold no extension is
// sent after l.stop, so that no write of the hold comes later than a TTL
// before its cap: the extension that would be due after l.lastDue is due
// at l.lastDue instead, as the last, and after the last none is (a failed
// last extension is not retried). Called with l.mu held, or before l is
// shared.
func (l *Lease) setNextExtension(from, at time.Time) {
	switch {
	case l.last:
		l.capped = true
	case l.stop.IsZero() || at.Before(l.lastDue):
		l.next = at
	case from.Before(l.lastDue):
		l.next, l.last = l.lastDue, true
	default:
		l.capped = true
	}
}

func (l *Lease) ref() leaseRef {
	return leaseRef{key: l.key, owner: l.c.owner, token: l.count, ttl: l.ttl, hold: l.hold, role: l.role, raw: l.raw.Load()}
}

// Data returns the data stored with this hold ([WithData]; for an
// [Election], the leader's value, as [Election.Proclaim] last set it), or
// nil. The caller must not modify it.
func (l *Lease) Data() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.data
}

// setData records data as the hold's, once the store has it.
func (l *Lease) setData(data []byte) {
	l.mu.Lock()
	l.data = data
	l.mu.Unlock()
}

// Key returns the key this lease holds.
func (l *Lease) Key() string { return l.key }

// Token returns the fencing token of this hold.
func (l *Lease) Token() Token { return l.token }

// Done returns a channel that is closed when the lease ends: released, lost,
// or ended by [Client.Close].
func (l *Lease) Done() <-chan struct{} { return l.made(&l.done) }

// Lost returns a channel that is closed when the lease is lost, never on a
// clean release. It is closed at the lease's local deadline, before any
// other client can acquire the key, unless the process was paused past it
// (which is what fencing tokens are for).
func (l *Lease) Lost() <-chan struct{} { return l.made(&l.lost) }

// made returns *ch, l.done or l.lost, making it on the first call (end
// closes it, or marks it closed if it was never made).
func (l *Lease) made(ch *chan struct{}) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if *ch == nil {
		*ch = make(chan struct{})
	}
	return *ch
}

// Err returns nil while the lease is held; after it ends, [ErrReleased] or
// a [*LeaseLostError] (which matches [ErrLeaseLost]). Err reads the clock:
// past the local deadline it reports the loss even if the background
// goroutine has not run yet.
func (l *Lease) Err() error {
	l.mu.Lock()
	expired := l.err == nil && !l.c.clock.Now().Before(l.deadline)
	l.mu.Unlock()
	if expired {
		l.expire()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Context returns a context that is cancelled when the lease ends, with
// [context.Cause] reporting why. Run the protected work under it.
func (l *Lease) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil {
		l.ctx, l.cancel = context.WithCancelCause(context.Background())
		if l.err != nil {
			l.cancel(l.err)
		}
	}
	return l.ctx
}

// Release gives the lease back: one command to the server, which frees the
// key only if this lease still holds it; or, when another goroutine of this
// Client waits for the key, one command that passes it to that goroutine
// with a new token. The lease ends before that command is sent: Err
// reports [ErrReleased], Done closes and Context is cancelled, so that
// nothing still relies on it when the key passes on. If the server shows
// that the hold had been taken over already, Release returns a
// [*LeaseLostError]. If the lease was lost (its Err is not nil, which
// includes a lease past its local deadline that the background goroutine
// has not yet ended), Release returns its [*LeaseLostError] at once,
// changes nothing for a new holder, and tidies up in the background. A
// second Release returns [ErrNotHeld]; a Release after [Client.Close]
// ended the lease returns [ErrClosed].
//
// A release is clean-up, so an ended ctx does not stop it: ctx bounds the
// command while ctx lasts, and when ctx has ended already (a deferred
// Release with a request's ctx), the command is sent all the same, on a
// context detached from ctx and bounded by a second. Release returns an
// error matching ctx's error only when the command could not complete.
// When Release fails for want of an answer from the server, the lease is
// ended here all the same, and the key is free again at the latest a TTL
// later.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.returned {
		l.mu.Unlock()
		return ErrNotHeld
	}
	l.returned = true
	l.mu.Unlock()
	if l.lk != nil {
		l.lk.forget(l)
	}
	if l.c.begin() == nil { // else Close has begun; it ends the lease if this does not
		defer l.c.finish()
	}
	ctx, span := l.c.tel.releaseSpan(ctx, l)
	rctx, stop := cleanupContext(ctx)
	err := cleanupError(ctx, "release "+strconv.Quote(l.key), l.c.release(rctx, l))
	stop()
	endSpan(span, err)
	return err
}

// stillHeld returns l if it is held (its Err is nil), else nil: what a
// primitive's Lease method returns.
func stillHeld(l *Lease) *Lease {
	if l == nil || l.Err() != nil {
		return nil
	}
	return l
}

// giveBackLost releases l, the last hold of a primitive that is about to
// lock again, if it was lost: as its Release does, at once, which frees
// the Client's slot for the key and tidies up in the background. The loss
// is reported no more. A lost hold left as it is would keep the slot, and
// the Lock would wait for itself.
func giveBackLost(ctx context.Context, l *Lease) {
	if l != nil && errors.Is(l.Err(), ErrLeaseLost) {
		l.Release(ctx)
	}
}

// returning reports whether Release was called: the release, not an
// extension racing it, decides how the lease ends.
func (l *Lease) returning() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.returned
}

// expire ends the lease as lost at its deadline. A deadline past
// l.lastDue is one that an extension could have pushed on but for the cap:
// the lease is lost to the cap.
func (l *Lease) expire() {
	l.mu.Lock()
	cause := l.lastErr
	capped := !l.stop.IsZero() && l.deadline.After(l.lastDue)
	l.mu.Unlock()
	lostCause := causeExpired
	switch {
	case capped && cause != nil:
		cause = errorf("dlock: %w (%v after the acquire; the last extension failed: %w)", ErrMaxHold, l.maxHold, cause)
		lostCause = causeMaxHold
	case capped:
		cause = fmt.Errorf("%w (%v after the acquire)", ErrMaxHold, l.maxHold)
		lostCause = causeMaxHold
	case cause == nil:
		cause = errDeadline
	}
	l.end(&LeaseLostError{Key: l.key, Token: l.token, Cause: cause}, lostCause)
}

// takenOver is the error of a hold the store showed held by someone else.
func (l *Lease) takenOver() error {
	return &LeaseLostError{Key: l.key, Token: l.token}
}

// steal ends the lease as lost because the store showed another owner.
func (l *Lease) steal() error {
	err := l.takenOver()
	if !l.end(err, causeStolen) {
		return l.ended()
	}
	return err
}

// end ends the lease with err; lostCause is "" for a clean end. It reports
// whether this call ended it.
func (l *Lease) end(err error, lostCause string) bool {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return false
	}
	l.err = err
	if l.cancel != nil { // first: whoever sees Done or Lost closed finds Context cancelled too
		l.cancel(err)
	}
	closeOrMark(&l.done)
	if lostCause != "" {
		closeOrMark(&l.lost)
	}
	l.mu.Unlock()
	if l.c.ext.remove(l) && l.role != roleWaiter {
		l.c.tel.endLease(l, l.c.clock.Now().Sub(l.acquired), lostCause, err)
	}
	return true
}

// closeOrMark closes *ch, or, if it was never made, sets it to
// closedChan. Called with the lease's mu held.
func closeOrMark(ch *chan struct{}) {
	if *ch == nil {
		*ch = closedChan
	} else {
		close(*ch)
	}
}

// ended returns the error the lease ended with.
func (l *Lease) ended() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// lastSent is when the last write that the deadline counts from was sent
// (the acquire's, or the last extension's): a lease made from this one
// with that time as its send is relied on no longer than this one.
func (l *Lease) lastSent() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline.Add(-holdFor(l.ttl))
}

// settle writes the base of a hold made on a raw record at once, with one
// extension, instead of with the hold's first write (leaseRef.raw). A
// failure leaves it to that write.
func (l *Lease) settle(ctx context.Context) {
	if !l.raw.Load() {
		return
	}
	sent := l.c.clock.Now()
	if ok, err := l.c.store.extend(ctx, []leaseRef{l.ref()}); err == nil && ok[0] {
		l.extended(sent)
	}
}

// extended records a successful extension sent at sent, which wrote the
// hold's base if it had one to write. The deadline never passes the cap
// of a maximum hold.
func (l *Lease) extended(sent time.Time) {
	l.raw.Store(false)
	l.mu.Lock()
	defer l.mu.Unlock()
	d := sent.Add(holdFor(l.ttl))
	if !l.holdEnd.IsZero() && d.After(l.holdEnd) {
		d = l.holdEnd
	}
	if d.After(l.deadline) {
		l.deadline = d
	}
	l.setNextExtension(sent, sent.Add(l.every))
	l.lastErr = nil
}

// failed records a failed extension: it is retried sooner.
func (l *Lease) failed(now time.Time, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastErr = err
	l.setNextExtension(now, now.Add(l.every/4))
}
