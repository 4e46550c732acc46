package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MaxMultiKeys is the most keys one [MultiMutex] locks: its uncontended
// Lock sends one acquire per key in a single bulk write, and reads them
// back in a single find. A thousand keys of [MaxKeyLen] bytes make a
// command of about 2.5 MB, well under MongoDB's 16 MiB and its 100,000
// statements per bulk write.
const MaxMultiKeys = 1000

// A MultiMutex locks a set of keys at once, all or none: while it holds
// them, no other [Mutex] or MultiMutex, in any process sharing the
// collection, holds any of them. Use it where one operation needs several
// locks: the two accounts of a transfer, the data sets one job reads.
//
// Its keys are locked in one canonical order, sorted and with duplicates
// removed, whatever order they were given in: two MultiMutexes whose sets
// overlap never wait for each other in a cycle, across processes too, as
// long as every lock on more than one key is taken by a MultiMutex (a
// program that takes Mutexes one by one, in its own order, while it holds
// others, can still deadlock with it). Each key is an ordinary Mutex key:
// [Client.Holders] and dlock status show it, and a Mutex on one of the
// keys excludes the MultiMutex as it would another Mutex.
//
// Lock first tries to take every key with one bulk write of conditional
// acquires, each of which takes its key only if it is free and nobody
// waits for it, and reads the tokens back in one command: two commands for
// any number of free keys. When some keys are not free, it keeps those
// that come before the first of them in the canonical order, gives the
// others back in one write, and waits for the rest one key at a time, in
// that order, each wait exactly that of [Mutex.Lock]: in the key's queue,
// first come, first served (docs/fairness.md has what this costs a
// multi-key waiter).
//
// A MultiMutex is safe for concurrent use; like a Mutex it is not
// reentrant, must not be copied after first use, and its zero value is
// not usable (make one with [Client.NewMultiMutex]).
type MultiMutex struct {
	c     *Client  // set by NewMultiMutex; never changes
	keys  []string // canonical order: sorted, without duplicates; never changes
	cfg   config
	err   error    // invalid keys or options
	paces []pacing // one per key, in keys' order: what the waits for it taught it (pacer.go)

	mu    sync.Mutex
	lease *MultiLease // guarded by mu: the last hold, until Unlock or the next Lock gives it back; nil when none
}

// NewMultiMutex returns a MultiMutex for keys: at least one, at most
// [MaxMultiKeys] once duplicates are removed, each a valid key. Options
// given here override the Client's, for every key. An empty set, an
// invalid key, too many keys or an invalid option are reported by the
// first Lock or TryLock ([ErrInvalidKey], [ErrTooManyKeys],
// [ErrInvalidOption]), which then sends nothing.
func (c *Client) NewMultiMutex(keys []string, opts ...Option) *MultiMutex {
	canon := slices.Compact(slices.Sorted(slices.Values(keys)))
	if c.cfg.hooks.flawed(flawMultiCallerOrder) {
		canon = callerOrder(keys)
	}
	m := &MultiMutex{c: c, keys: canon, paces: make([]pacing, len(canon))}
	switch {
	case len(canon) == 0:
		m.cfg, m.err = c.configFor("-", opts)
		m.err = fmt.Errorf("%w: no keys", ErrInvalidKey)
		return m
	case len(canon) > MaxMultiKeys:
		m.err = fmt.Errorf("%w: %d keys, at most %d", ErrTooManyKeys, len(canon), MaxMultiKeys)
		return m
	}
	m.cfg, m.err = c.configFor(canon[0], opts)
	for _, k := range canon {
		if err := validKey(k); err != nil && m.err == nil {
			m.err = fmt.Errorf("%w (key %q of %d)", err, k, len(canon))
		}
	}
	return m
}

// callerOrder is keys without duplicates, in the order given: the order
// of flawMultiCallerOrder.
func callerOrder(keys []string) []string {
	var out []string
	for _, k := range keys {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// Keys returns the MultiMutex's keys in the order it locks them: sorted,
// without duplicates. The caller must not modify the slice.
func (m *MultiMutex) Keys() []string { return m.keys }

// Lease returns the current hold of all the keys, or nil when the
// MultiMutex does not hold them: before Lock, after Unlock, and once the
// hold of any key is lost.
func (m *MultiMutex) Lease() *MultiLease {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	l := m.lease
	m.mu.Unlock()
	if l == nil || l.Err() != nil {
		return nil
	}
	return l
}

// Lock blocks until the MultiMutex holds every one of its keys, or ctx
// ends. Uncontended, it takes them all with two commands; otherwise it
// waits for each key, in the canonical order, as [Mutex.Lock] does,
// holding the keys before it meanwhile (see MultiMutex). If the hold of a
// key it already took is lost while it waits for a later one, it gives
// every key back and starts again; the third time in a row, it fails with
// that hold's [*LeaseLostError] (holds it cannot keep: a server too slow
// to extend them all within the TTL, or a Client cut off from it). A bulk write whose reply comes too late
// for the TTL halves the next one, and a key taken alone whose replies are
// late three times in a row ends the Lock with [ErrTTLTooShort], as for a
// Mutex: on a slow server Lock makes progress while single-key round trips
// fit in the TTL, and fails with that error when they do not.
//
// When ctx ends first, Lock returns an error that matches ctx.Err() with
// [errors.Is] and wraps the [*WaitError] of the key it was waiting for,
// and leaves nothing held and nothing registered, on any key: the keys it
// held are given back in one write (in the background when ctx had ended
// already, bounded by a second; a key that write does not free in time
// expires a TTL after its last extension, as it is no longer extended),
// and the wait in progress cleans up as a Mutex's does. Any other failure
// (the Client closed: [ErrClosed]; a key used by another kind of lock:
// [ErrKindMismatch]; the server's error that waiting will not mend) leaves
// nothing held either. A ctx that has already ended returns at once, with
// no command sent. A lost hold of the MultiMutex is given back first, as
// Unlock would.
func (m *MultiMutex) Lock(ctx context.Context) error {
	return m.lock(ctx, "dlock.MultiLock", false)
}

// TryLock makes one attempt to hold every key and returns an error
// matching [ErrLocked] when any of them is held by another owner or
// waited for (its message names the key), or is held or being acquired
// by another goroutine or Mutex of this Client. It takes all the keys or
// none: whatever it took is given back, in one write, before it returns;
// when that write fails too, in the background, bounded by a second, and
// a key it could not free then expires a TTL after it was taken.
// Uncontended it is two commands; for a key its bulk write did not take,
// it makes the attempt of [Mutex.TryLock] (which takes over a hold this
// Client abandoned, and clears a queue of crashed waiters), and fails at
// the first key that attempt does not take.
func (m *MultiMutex) TryLock(ctx context.Context) error {
	return m.lock(ctx, "dlock.MultiTryLock", true)
}

// Unlock releases every key (see [MultiLease.Release]): one command. It
// returns [ErrNotHeld] when the MultiMutex holds nothing, and the
// [*LeaseLostError] of a key whose hold was lost, after releasing the
// others. An ended ctx does not keep Unlock from freeing the keys, as for
// [Mutex.Unlock].
func (m *MultiMutex) Unlock(ctx context.Context) error {
	if m == nil {
		return ErrNotHeld
	}
	m.mu.Lock()
	l := m.lease
	m.lease = nil
	m.mu.Unlock()
	if l == nil {
		return ErrNotHeld
	}
	return l.Release(ctx)
}

// forget is told when a Lease of one of the keys is released: the
// MultiLease does that itself.
func (m *MultiMutex) forget(*Lease) {}

func (m *MultiMutex) lock(ctx context.Context, name string, try bool) error {
	switch {
	case m == nil || m.c == nil:
		return ErrNoClient
	case m.err != nil:
		return m.err
	case ctx.Err() != nil:
		return m.keysError("lock", ctx.Err())
	}
	m.mu.Lock()
	old := m.lease
	m.mu.Unlock()
	if old != nil && errors.Is(old.Err(), ErrLeaseLost) {
		m.mu.Lock()
		if m.lease == old {
			m.lease = nil
		}
		m.mu.Unlock()
		old.Release(ctx)
	}
	l, err := m.c.lockAll(ctx, m, name, try)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.lease = l
	m.mu.Unlock()
	return nil
}

// keysError wraps err, the failure of op on all the keys, with them.
func (m *MultiMutex) keysError(op string, err error) error {
	return errorf(prefix+"%s %s: %w", op, keyList(m.keys), err)
}

// keyList names keys in a message: all of them, or the first few.
func keyList(keys []string) string {
	const shown = 4
	q := make([]string, 0, shown+1)
	for i, k := range keys {
		if i == shown {
			q = append(q, "… ("+strconv.Itoa(len(keys))+" keys)")
			break
		}
		q = append(q, strconv.Quote(k))
	}
	return "[" + strings.Join(q, " ") + "]"
}

// claims returns the claim on each key, with the trace context of the
// Lock that makes the holds.
func (m *MultiMutex) claims(tr holdTrace) []claim {
	cls := make([]claim, len(m.keys))
	for i, k := range m.keys {
		cls[i] = claim{lk: m, cfg: &m.cfg, pace: &m.paces[i], attempt: attempt{key: k, ttl: m.cfg.ttl, data: m.cfg.data, trace: tr}}
	}
	return cls
}

// lockAll takes every key of m (TryLock with try): the MultiMutex's Lock.
// It restarts when the hold of a key it took is lost before it holds them
// all (Lock only: TryLock returns that key's *LeaseLostError).
func (c *Client) lockAll(ctx context.Context, m *MultiMutex, name string, try bool) (ml *MultiLease, err error) {
	if err := c.begin(); err != nil {
		return nil, err
	}
	defer c.finish()
	start := time.Now()
	parent := ctx
	ctx, span := c.tel.multiLockSpan(ctx, name, m.keys, c.owner)
	cls := m.claims(traceOf(span, parent))
	attempts, limit := 0, len(cls)
	defer func() { c.tel.endMultiLock(ctx, span, start, attempts, ml, err) }()
	for losses := 1; ; losses++ {
		g := &gathering{c: c, ctx: ctx, m: m, cls: cls, try: try, held: make([]*Lease, len(cls)), slot: make([]bool, len(cls)), limit: limit}
		ml, err = g.run()
		attempts, limit = attempts+g.attempts, g.limit
		switch {
		case !errors.Is(err, errKeyLost):
			return ml, err
		case ctx.Err() != nil: // lost a key, and out of time to start again
			return nil, m.keysError("lock", (&waitLog{}).waitError(ctx, m.keys[0], nil))
		case losses == maxKeyLosses:
			return nil, m.keysError("lock", fmt.Errorf("lost a key it held %d times in a row before it held them all: %w", losses, err))
		}
	}
}

// errKeyLost ends a gathering whose hold of a key it took was lost before
// it held them all (wrapping that hold's error): Lock starts again.
var errKeyLost = errors.New("dlock: the hold of a key was lost while waiting for the next")

// maxKeyLosses is how many times in a row a Lock starts again after the
// hold of a key it took was lost before it holds them all: holds that are
// lost again and again will not be kept (a server too slow to extend so
// many of them within the TTL, or a Client cut off from it), and the Lock
// fails with the last loss's error rather than retry until ctx ends.
const maxKeyLosses = 3

// A gathering is one attempt of a MultiMutex's Lock (or TryLock) to hold
// all its keys: what its steps share.
type gathering struct {
	c        *Client
	ctx      context.Context
	m        *MultiMutex
	cls      []claim
	try      bool
	held     []*Lease // by key: the hold taken, or nil
	slot     []bool   // by key: this call holds the Client's slot for it
	ml       *MultiLease
	attempts int
	limit    int // the most keys a bulk write may take: halved after one answered too late (bulkOnce)
}

// run takes the keys in order: each run of them whose slots in this
// Client are free, with one bulk write (bulk), as far as the first it
// misses; that one alone, waiting as Mutex.Lock does (lockKey); and so on.
// On failure it gives back whatever it took.
func (g *gathering) run() (*MultiLease, error) {
	g.ml = g.c.newMultiLease(g.m.keys)
	wait, cancel := context.WithCancelCause(g.ctx)
	defer cancel(nil)
	g.ml.onLost(func() { cancel(errKeyLost) })
	if n := g.takeSlots(0); g.try && n < len(g.cls) { // another call of this Client has a key: no command
		g.abort()
		return nil, keyError("lock", g.cls[n].attempt.key, errLockedHere)
	}
	for i := 0; i < len(g.cls); i++ {
		if len(g.cls)-i >= 2 {
			n, err := g.bulk(i)
			if err != nil {
				g.abort()
				return nil, g.m.keysError("lock", err)
			}
			if i += n; i == len(g.cls) {
				break
			}
		}
		if err := g.lockKey(wait, i); err != nil {
			g.abort()
			if context.Cause(wait) == errKeyLost {
				switch {
				case g.try: // one attempt: the loss is its error
					err = g.ml.Err()
				case g.ctx.Err() == nil:
					return nil, keyLost(g.ml.Err())
				default:
					err = callersEnd(g.ctx, err) // the caller's ctx ended too, after the loss ended the wait
				}
			}
			return nil, keyError("lock", g.cls[i].attempt.key, err)
		}
	}
	g.ml.onLost(nil)
	for _, l := range g.held {
		if err := l.Err(); err != nil { // lost meanwhile: hold them all again, or none
			g.abort()
			if !g.try {
				return nil, keyLost(err)
			}
			return nil, g.m.keysError("lock", err)
		}
	}
	return g.ml, nil
}

// keyLost is errKeyLost, with err, the error of the hold that was lost
// (taken before abort ends the MultiLease as released).
func keyLost(err error) error { return fmt.Errorf("%w: %w", errKeyLost, err) }

// callersEnd is err, the error of a wait that a lost key ended, as the
// error of its Lock's ctx, which has ended since: what the wait saw, with
// ctx's error.
func callersEnd(ctx context.Context, err error) error {
	var we *WaitError
	if !errors.As(err, &we) {
		return (&waitLog{}).waitError(ctx, "", err)
	}
	w := *we
	w.Err = ctx.Err()
	return &w
}

// takeSlots takes, without waiting, this Client's slots for the keys
// from i on, up to the first that another call of the Client holds, and
// returns how many it took.
func (g *gathering) takeSlots(from int) int {
	for i := from; i < len(g.cls); i++ {
		if g.slot[i] {
			continue
		}
		if _, err := g.c.enter(g.ctx, g.cls[i], true); err != nil {
			return i - from
		}
		g.slot[i] = true
	}
	return len(g.cls) - from
}

// lockKey takes key i, as Mutex.Lock does once it is called: this
// Client's slot for it (unless this call holds it already), queueing
// behind the Client's other calls, then the key, unless the previous
// holder of the slot handed its hold over.
func (g *gathering) lockKey(ctx context.Context, i int) error {
	c, cl := g.c, g.cls[i]
	if !g.slot[i] {
		cl.pace.relocking(c.clock.Now(), requeueWindow(cl.cfg))
		l, err := c.enter(ctx, cl, g.try)
		if err != nil {
			return err
		}
		g.slot[i] = true
		if l != nil {
			switch err := l.Err(); {
			case errors.Is(err, ErrReleased): // handed over as the Client closed
				return ErrClosed
			case err == nil:
				g.hold(i, l)
				return nil
			} // a handoff answered too late to use: acquire afresh
		}
	}
	l, n, err := c.acquire(ctx, cl, g.try)
	g.attempts += n
	if err != nil {
		return err
	}
	g.hold(i, l)
	return nil
}

// hold records the hold of key i.
func (g *gathering) hold(i int, l *Lease) {
	g.held[i] = l
	g.ml.add(i, l)
}

// abort gives back everything the gathering holds: its holds, in one
// write (see giveBack), and its slots.
func (g *gathering) abort() {
	g.ml.stop()
	defer g.ml.end(ErrReleased, false)
	var refs []leaseRef
	for i, l := range g.held {
		if l != nil {
			l.end(ErrReleased, "")
			refs = append(refs, l.ref())
			g.held[i] = nil
		}
	}
	g.c.giveBack(g.ctx, refs)
	g.leave(0)
}

// leave passes on the slots this call holds for the keys from i on.
func (g *gathering) leave(from int) {
	for i := from; i < len(g.cls); i++ {
		if g.slot[i] {
			g.c.leave(g.cls[i].attempt.key)
			g.slot[i] = false
		}
	}
}

// giveBack frees the holds refs name in one write, sent with ctx while it
// lasts; once ctx has ended, or when that write fails, in the background,
// bounded by a second (Client.tidy). Every write names its hold by owner
// and hold id: a late one frees nothing else.
func (c *Client) giveBack(ctx context.Context, refs []leaseRef) {
	if len(refs) == 0 {
		return
	}
	if ctx.Err() == nil && c.store.releaseAll(ctx, refs) == nil {
		return
	}
	c.tidy(cleanupTimeout, func(ctx context.Context) { c.store.releaseAll(ctx, refs) })
}

// bulk takes keys from the one at from on, with ordered bulk writes that
// stop at the first key they miss, each followed by a read of the tokens
// of the keys it took (bulkOnce). It sends nothing for fewer than two keys
// whose slots in this Client it can take at once. It returns how many keys
// it holds from from on; it keeps the slot of the next, and passes on
// those of the keys after it.
func (g *gathering) bulk(from int) (int, error) {
	n := g.takeSlots(from)
	held := 0
	for n-held >= 2 && g.limit >= 2 {
		k, whole, err := g.bulkOnce(from+held, min(n-held, g.limit))
		held += k
		if err != nil {
			return held, err
		}
		if !whole {
			break
		}
	}
	g.leave(from + held + 1)
	return held, nil
}

// bulkOnce takes up to n keys from the one at at on, with one ordered
// bulk write (of fewer when the server takes fewer in one command), and
// reads back the tokens of those it took in one command. Each write's
// holds are timed from its own send, so a Lock of many keys on a slow
// server keeps what each write took in time. A write whose holds were
// answered too late halves the next one's size: at most log2(MaxMultiKeys)
// of them in a Lock, each followed by a key taken alone, whose late
// replies end the Lock with ErrTTLTooShort as a Mutex's do. It returns
// how many keys it took and kept, and whether those were all it sent.
func (g *gathering) bulkOnce(at, n int) (kept int, whole bool, err error) {
	c := g.c
	as := make([]attempt, n)
	for i := range as {
		as[i] = g.cls[at+i].attempt
		as[i].owner, as[i].hold = c.owner, c.holdIDs.Add(1)
	}
	g.attempts++
	sent := c.clock.Now()
	took, err := c.store.acquireAll(g.ctx, as)
	if err != nil {
		return 0, false, g.bulkFailed(at, as, nil, err)
	}
	as = as[:len(took)]            // the statements sent
	t := slices.Index(took, false) // the keys took: a prefix, as the write stops at the first miss
	if t < 0 {
		t = len(took)
	}
	late := false
	if t > 0 {
		if kept, late, err = g.grantBulk(at, as[:t], sent); err != nil {
			return kept, false, g.bulkFailed(at+kept, as[kept:], took[kept:], err)
		}
	}
	if kept < t { // read back otherwise (the read lagged, or came too late): give those back
		c.giveBack(g.ctx, abandoned(as[kept:t], nil))
	}
	if late {
		g.limit = len(as) / 2
	}
	return kept, kept == len(as), nil
}

// bulkFailed ends a bulk take at key at whose write or read failed with
// err: what the acquires of as may have taken (those that took, or all
// when took is nil) is given back, in one write while ctx lasts (giveBack).
// TryLock fails, and so does Lock when Close has begun, when ctx has
// ended, or when the error is not one that waiting mends; otherwise Lock
// goes on with the key at at alone.
func (g *gathering) bulkFailed(at int, as []attempt, took []bool, err error) error {
	g.c.giveBack(g.ctx, abandoned(as, took))
	g.ml.drop(at)
	for i := at; i < len(g.held); i++ {
		if l := g.held[i]; l != nil {
			l.end(ErrReleased, "") // given back above
			g.held[i] = nil
		}
	}
	switch {
	case g.ctx.Err() != nil:
		return (&waitLog{}).waitError(g.ctx, as[0].key, err)
	case g.try || errors.Is(err, ErrClosed) || !transient(err):
		return err
	}
	return nil
}

// grantBulk reads back the records of the keys of as, which the bulk
// write sent at sent took, and makes the lease of each, in order, while
// the read shows it held by its attempt in time for its lease (for key
// at+i, as[i]). It returns how many it made, and whether it stopped at a
// hold answered too late; the caller gives back the rest. ErrClosed when
// Close has begun.
func (g *gathering) grantBulk(at int, as []attempt, sent time.Time) (kept int, late bool, err error) {
	c := g.c
	keys := make([]string, len(as))
	for i, a := range as {
		keys[i] = a.key
	}
	g.attempts++
	recs, floor, err := c.store.readAll(g.ctx, keys)
	if err != nil {
		return 0, false, err
	}
	for i, r := range recs {
		a := as[i]
		if r.Owner != a.owner || r.Hold != a.hold {
			return i, false, nil
		}
		a.raw = r.Raw
		l, err := c.grant(g.cls[at+i], a, bulkToken(r, floor), roleExclusive, sent)
		switch {
		case errors.Is(err, ErrClosed):
			return i, false, err
		case err != nil: // answered past its deadline: the hold is a's, and given back
			return i, true, nil
		}
		g.hold(at+i, l)
	}
	return len(as), false, nil
}

// bulkToken is the token of the hold that an acquire of a bulk write made
// in r, as a later read shows it: the counter, or, on a raw record, the
// floor (read after the acquire's reply) plus the count, as
// Client.token has it. The hold is the record's own, so nothing but its
// own writes changed the counter since.
func bulkToken(r record, floor Token) Token {
	switch {
	case !r.Raw:
		return r.Token
	case r.Rev == 1:
		return floor + 1
	}
	return floor + r.Token
}

// abandoned names the holds that the acquires of as may have made (those
// that took, or all when took is nil), for a release: as abandon does,
// by the owner and the attempt's hold id, with no base (none was learnt).
func abandoned(as []attempt, took []bool) []leaseRef {
	refs := make([]leaseRef, 0, len(as))
	for i, a := range as {
		if took == nil || took[i] {
			refs = append(refs, leaseRef{key: a.key, owner: a.owner, hold: a.hold, ttl: a.ttl})
		}
	}
	return refs
}
