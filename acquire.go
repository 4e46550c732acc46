package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// This file is the lease core's acquisition, shared by every primitive:
// the entry of an exclusive Lock (Mutex, RWMutex.Lock, Election) and of a
// shared one (RWMutex.RLock, Semaphore), whose wait is in wait.go; and
// what the wait uses besides the queue (queue.go) and the liveness
// watches (liveness.go): its log, the grant of a lease, how a wait gives
// up, and the token of a raw record. docs/design.md has the lock
// document's design.

// A claim is what one locking call asks for, and for whom.
type claim struct {
	lk      locker
	cfg     *config
	pace    *pacing // what the primitive's waits and holds taught it (pacer.go)
	attempt attempt // key, ttl, kind, data; shared and limit for a shared hold
}

// lockExclusive takes an exclusive hold for cl: first this Client's slot
// for the key, queueing behind its other callers (or, with try, failing
// with errLockedHere), then the key, unless the previous holder of the
// slot handed its hold over. name is the span's.
func (c *Client) lockExclusive(ctx context.Context, cl claim, name string, try bool) (l *Lease, err error) {
	key := cl.attempt.key
	if err := c.begin(); err != nil {
		return nil, err
	}
	defer c.finish()
	start := time.Now()
	cl.pace.relocking(c.clock.Now(), requeueWindow(cl.cfg))
	parent := ctx
	ctx, span := c.tel.lockSpan(ctx, name, key, c.owner)
	cl.attempt.trace = traceOf(span, parent) // also for a handoff to this call (handOver)
	attempts := 0
	defer func() { c.tel.endLock(ctx, span, start, attempts, l, err) }()

	l, err = c.enter(ctx, cl, try)
	if err != nil {
		return nil, err
	}
	if l != nil {
		switch err := l.Err(); {
		case errors.Is(err, ErrReleased): // handed over as the Client closed
			c.leave(key)
			return nil, ErrClosed
		case err != nil: // a handoff answered too late to use: acquire afresh
			l = nil
		}
	}
	if l == nil {
		l, attempts, err = c.acquire(ctx, cl, try)
		if err != nil {
			c.leave(key)
			return nil, err
		}
	}
	return l, nil
}

// lockShared takes a shared hold for cl (a Semaphore's permit, an
// RWMutex's read hold), with no local queue.
func (c *Client) lockShared(ctx context.Context, cl claim, name string, try bool) (l *Lease, err error) {
	if err := c.begin(); err != nil {
		return nil, err
	}
	defer c.finish()
	start := time.Now()
	parent := ctx
	ctx, span := c.tel.lockSpan(ctx, name, cl.attempt.key, c.owner)
	cl.attempt.trace = traceOf(span, parent)
	attempts := 0
	defer func() { c.tel.endLock(ctx, span, start, attempts, l, err) }()
	l, attempts, err = c.acquire(ctx, cl, try)
	return l, err
}

// errLateReply is the cause of a hold lost before Lock could return it: the
// acquire was answered after the lease's local deadline. Lock retries, up
// to lateReplies times in a row; a TryLock returns it in a
// *LeaseLostError.
var errLateReply = errors.New("dlock: the acquire was answered after the lease's local deadline")

// lateReplies is how many of a wait's writes that won something (a hold,
// a place in the queue), in a row, answered after their local deadline,
// end the wait with ErrTTLTooShort: one is a slow reply (a pause, a
// failover), three in a row are a TTL under the round trip.
const lateReplies = 3

// A waitLog is what a wait saw, for the error it ends with.
type waitLog struct {
	lastErr error    // the last transient failure
	late    int      // writes answered after their local deadline since the last that won in time
	holders []Holder // the holds of the last record seen held, up to maxHeldEvents
	more    int      // the holds of that record beyond holders
}

// sawHeld records who holds r, a record the wait read or wrote, if anyone
// does.
func (w *waitLog) sawHeld(r record) {
	hs := holdersOf(r)
	if len(hs) == 0 {
		return
	}
	n := min(len(hs), maxHeldEvents)
	w.holders, w.more = hs[:n:n], len(hs)-n
}

// waitError is the error of a wait for key that ctx ended, whose last
// round failed with err: a *WaitError with what the wait saw. err is its
// last error when it is the server's (not an account of the command ctx
// cut short), or the driver's failure to select a server, which names
// why none could be reached.
func (w *waitLog) waitError(ctx context.Context, key string, err error) error {
	last := w.lastErr
	if err != nil && (unanswered(err) || !errors.Is(err, ctx.Err())) {
		last = err
	}
	return &WaitError{Key: key, Err: ctx.Err(), LastErr: last, Holders: w.holders, more: w.more}
}

// tooLate counts err, a round's error (nil for none), if it is
// errLateReply, and returns the error to end the wait with once the late
// writes in a row number lateReplies: the TTL is shorter than the round
// trip. A write that won in time resets the count (registeredInTime); an
// acquire that won in time ends the wait. The late replies are the
// error: no last error is named beside it.
func (w *waitLog) tooLate(err error, ttl time.Duration) error {
	if !errors.Is(err, errLateReply) {
		return nil
	}
	if w.late++; w.late < lateReplies {
		return nil
	}
	w.lastErr = nil
	return fmt.Errorf("%w: %d writes in a row were answered after their local deadline (TTL %v)",
		ErrTTLTooShort, w.late, ttl)
}

// grant makes the lease of a hold that a made with token t, by a write
// sent at sent, and has the extender keep it. When Close has begun it
// gives the hold back in the background and returns ErrClosed; when the
// lease has already expired (the reply came too late) it returns a
// *LeaseLostError whose cause is errLateReply: the hold is still a's on
// the server, which the caller's next attempt finds.
func (c *Client) grant(cl claim, a attempt, t Token, ro role, sent time.Time) (*Lease, error) {
	l := c.newLease(cl.lk, cl.cfg, a, t, ro, sent)
	if c.isClosing() || !c.ext.add(l) {
		// Won as Close began: give it back, in the background so that the
		// call returns at once; Close waits for it.
		l.end(ErrReleased, "")
		ref := l.ref()
		c.tidy(a.ttl, func(ctx context.Context) { c.store.release(ctx, ref) })
		return nil, ErrClosed
	}
	if l.Err() != nil {
		l.end(ErrReleased, "")
		return nil, &LeaseLostError{Key: a.key, Token: t, Cause: errLateReply}
	}
	return l, nil
}

// giveUp is how an acquisition that gives up with err ends: the attempt a
// whose outcome is unknown (unsure) is given back in the background; a
// wait that ctx ended reports ctx's error, in a *WaitError with what the
// wait saw (log), not the driver's account of the cancelled command; and
// otherwise the last transient failure is named.
func (c *Client) giveUp(ctx context.Context, a attempt, unsure bool, log *waitLog, err error) error {
	if unsure {
		bound := a.ttl
		if errors.Is(err, ErrTTLTooShort) {
			bound = cleanupTimeout // a TTL is too short for an answer
		}
		c.tidy(bound, func(ctx context.Context) { c.store.abandon(ctx, a) })
	}
	switch {
	case ctx.Err() != nil && !errors.Is(err, ErrClosed):
		return log.waitError(ctx, a.key, err)
	case log.lastErr != nil && err != log.lastErr:
		return errorf("dlock: %w (last error: %w)", err, log.lastErr)
	}
	return err
}

// kindError reports a key used by another kind of primitive than cl's.
func kindError(key, want, got string) error {
	name := func(k string) string {
		switch {
		case k == "":
			return "a Mutex"
		case k == kindRW:
			return "an RWMutex"
		case k == kindElection:
			return "an Election"
		case strings.HasPrefix(k, "sem/"):
			return "a Semaphore of " + k[len("sem/"):] + " permits"
		default:
			return "a " + k
		}
	}
	return fmt.Errorf("%w: %q is used as %s, not as %s", ErrKindMismatch, key, name(got), name(want))
}

// token returns the token of the hold whose counter r, the reply to its
// acquire, shows as t. A raw record's counter counts from 0, not from the
// floor: the token is then the floor, read now, after the reply, so after
// the record was created, plus that count; and a record this very acquire
// created (its first revision) counts 1, whatever counter the acquire set
// (a shared acquire sets its Client's guess plus one, which may have been
// a deleted record's: counted, it would add the old counter to every new
// life of the key). The hold writes its token into the record, as its
// base, with its first write (leaseRef.raw). docs/design.md has the
// argument.
func (c *Client) token(ctx context.Context, r record, t Token) (Token, error) {
	if !r.Raw {
		return t, nil
	}
	f, err := c.store.floor(ctx)
	if r.Rev == 1 {
		t = 1
	}
	return f + t, err
}
