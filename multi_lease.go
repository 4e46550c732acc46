package dlock

import (
	"context"
	"errors"
	"slices"
	"sync"
)

// A MultiLease is one hold of every key of a [MultiMutex]: a [Lease] per
// key, extended together by the Client's one background write per
// cadence, and seen as one. Done is closed when it ends for any reason;
// Lost, and Context's cancellation, as soon as the hold of any one key is
// lost: at that key's local deadline, before any other client can take
// that key. The other keys stay held until Release (or Unlock). A
// MultiLease is safe for concurrent use.
type MultiLease struct {
	c      *Client
	keys   []string // the MultiMutex's, in its order; never changes
	leases []*Lease // by key: set while Lock gathers them, never changed once it returns
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when the hold ends
	lost   chan struct{} // closed when the hold of a key is lost

	mu       sync.Mutex
	stops    []func() bool // guarded by mu: by key, the watch of its lease's end (context.AfterFunc), or nil
	lostHook func()        // guarded by mu: while Lock gathers the keys, what to tell of a loss
	err      error         // guarded by mu: nil while every key is held
	returned bool          // guarded by mu: Release was called
}

func (c *Client) newMultiLease(keys []string) *MultiLease {
	ml := &MultiLease{c: c, keys: keys, leases: make([]*Lease, len(keys)), stops: make([]func() bool, len(keys)),
		done: make(chan struct{}), lost: make(chan struct{})}
	ml.ctx, ml.cancel = context.WithCancelCause(context.Background())
	return ml
}

// add makes l the hold of key i, and watches for its end.
func (ml *MultiLease) add(i int, l *Lease) {
	stop := context.AfterFunc(l.Context(), func() { ml.ended(l) })
	ml.mu.Lock()
	ml.leases[i], ml.stops[i] = l, stop
	ml.mu.Unlock()
}

// drop forgets the holds of the keys from i on (Lock gives them back).
func (ml *MultiLease) drop(from int) {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	for i := from; i < len(ml.leases); i++ {
		if ml.stops[i] != nil {
			ml.stops[i]()
		}
		ml.leases[i], ml.stops[i] = nil, nil
	}
}

// stop stops watching the leases: they are about to be ended by Release
// (or by a Lock that gives them back).
func (ml *MultiLease) stop() {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	ml.lostHook = nil
	for i, stop := range ml.stops {
		if stop != nil {
			stop()
			ml.stops[i] = nil
		}
	}
}

// onLost sets what to call when the hold of a key is lost (nil: nothing).
func (ml *MultiLease) onLost(f func()) {
	ml.mu.Lock()
	ml.lostHook = f
	ml.mu.Unlock()
}

// ended is told that lease l ended other than by Release: lost, or
// ended by Client.Close.
func (ml *MultiLease) ended(l *Lease) {
	err := l.ended()
	ml.end(err, errors.Is(err, ErrLeaseLost))
}

// end ends the hold with err, as lost or not, unless it has ended.
func (ml *MultiLease) end(err error, lost bool) {
	ml.mu.Lock()
	if ml.err != nil {
		ml.mu.Unlock()
		return
	}
	ml.err = err
	ml.cancel(err) // first: whoever sees Done or Lost closed finds Context cancelled too
	close(ml.done)
	if lost {
		close(ml.lost)
	}
	hook := ml.lostHook
	ml.mu.Unlock()
	if lost && hook != nil {
		hook()
	}
}

// Keys returns the keys held, in the order they were locked (sorted).
// The caller must not modify the slice.
func (ml *MultiLease) Keys() []string { return ml.keys }

// Token returns the fencing token of the hold of key, or 0 when key is
// not one of the keys held.
func (ml *MultiLease) Token(key string) Token {
	if i := slices.Index(ml.keys, key); i >= 0 && ml.leases[i] != nil {
		return ml.leases[i].Token()
	}
	return 0
}

// Tokens returns the fencing token of each key, in the order of Keys.
func (ml *MultiLease) Tokens() []Token {
	ts := make([]Token, len(ml.leases))
	for i, l := range ml.leases {
		if l != nil {
			ts[i] = l.Token()
		}
	}
	return ts
}

// Done returns a channel that is closed when the hold ends: released,
// lost (any key's), or ended by [Client.Close].
func (ml *MultiLease) Done() <-chan struct{} { return ml.done }

// Lost returns a channel that is closed when the hold of any key is lost,
// never on a clean release: at that key's local deadline (see
// [Lease.Lost]).
func (ml *MultiLease) Lost() <-chan struct{} { return ml.lost }

// Context returns a context that is cancelled when the hold ends (see
// Done), with [context.Cause] reporting why: [ErrReleased], or the
// [*LeaseLostError] of the key whose hold was lost. Run the protected work
// under it.
func (ml *MultiLease) Context() context.Context { return ml.ctx }

// Err returns nil while every key is held; after the hold ends,
// [ErrReleased], or the [*LeaseLostError] (which matches [ErrLeaseLost])
// of the first key whose hold was lost. Like [Lease.Err] it reads the
// clock: past a key's local deadline it reports the loss at once.
func (ml *MultiLease) Err() error {
	for _, l := range ml.leases {
		if l == nil {
			continue
		}
		if err := l.Err(); err != nil {
			ml.end(err, errors.Is(err, ErrLeaseLost))
			break
		}
	}
	ml.mu.Lock()
	defer ml.mu.Unlock()
	return ml.err
}

// Release gives every key back, in one command that frees each key only
// if this hold still has it. The hold ends before that command is sent
// (Err reports [ErrReleased], Done closes, Context is cancelled). When the
// hold of a key was lost, Release still frees the others, and returns that
// key's [*LeaseLostError]. A second Release returns [ErrNotHeld]; one after
// [Client.Close] ended the hold, [ErrClosed]. As for [Lease.Release], an
// ended ctx does not stop the command: it is sent on a context detached
// from ctx and bounded by a second, and Release returns an error matching
// ctx's error only when it could not complete; the keys are then free
// again at the latest a TTL later.
func (ml *MultiLease) Release(ctx context.Context) error {
	ml.mu.Lock()
	if ml.returned {
		ml.mu.Unlock()
		return ErrNotHeld
	}
	ml.returned = true
	ml.mu.Unlock()
	ml.stop()
	c := ml.c
	if c.begin() == nil { // else Close has begun; it ends the leases if this does not
		defer c.finish()
	}
	ctx, span := c.tel.multiReleaseSpan(ctx, ml.keys, c.owner)
	refs, lost, closed := ml.endAll()
	err := ErrClosed
	if !closed {
		rctx, stop := cleanupContext(ctx)
		err = cleanupError(ctx, "release "+keyList(ml.keys), c.store.releaseAll(rctx, refs))
		stop()
		for _, k := range ml.keys {
			c.leave(k)
		}
	}
	if lost != nil {
		err = lost
	}
	endSpan(span, err)
	return err
}

// endAll ends every lease still held, and returns what to release: those
// leases, and those that were lost (a release conditional on the hold
// frees a key whose holder stopped sooner than its TTL would); the first
// loss; and whether Client.Close had ended every lease (then it frees
// them).
func (ml *MultiLease) endAll() (refs []leaseRef, lost error, closed bool) {
	closed = true
	for _, l := range ml.leases {
		err := l.Err()
		if err == nil && !l.end(ErrReleased, "") {
			err = l.ended() // lost, or ended by Close, a moment ago
		}
		switch {
		case err == nil:
			refs = append(refs, l.ref())
			closed = false
		case errors.Is(err, ErrLeaseLost):
			refs = append(refs, l.ref())
			lost, closed = cmpErr(lost, err), false
		}
	}
	ml.end(cmpErr(lost, ErrReleased), false)
	return refs, lost, closed
}

// cmpErr is a if it is not nil, else b.
func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
