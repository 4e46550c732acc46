package dlock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/memhook"
)

// memStore keeps lock records in memory with the semantics the MongoDB
// store has: each method is one atomic step on one record (a bulk write is
// one step per record), tokens and revisions never go back, and the server
// stamps each write with its own clock. It honours ctx as a network call
// would: a call whose ctx has ended fails without applying. Safe for
// concurrent use; it starts no goroutine, so it works inside a
// testing/synctest bubble.
type memStore struct {
	now      func() time.Time // the server's clock
	commands atomic.Int64     // calls made, as commands would be counted

	mu       sync.Mutex
	records  map[string]record // guarded by mu
	floorTok Token             // guarded by mu: the floor (see docs/design.md)

	// observe, when set, is told of every write and delete, with mu held:
	// before is key's record as it was (the zero record if it had none),
	// after as written (the zero record for a delete); it must not change
	// them. Tests set it before the store is
	// used, to check each step.
	observe func(key string, before, after record)
}

func newMemStore() *memStore {
	return &memStore{now: time.Now, records: map[string]record{}}
}

// begin counts a command and fails it when ctx has ended.
func (s *memStore) begin(ctx context.Context) error {
	s.commands.Add(1)
	return ctx.Err()
}

// write stores r as key's record, with a new revision and the server's
// stamp, and returns a copy the caller may keep: records share no maps
// with the store.
func (s *memStore) write(key string, r record) record {
	r.Rev++
	r.At = s.now()
	before := s.records[key]
	s.records[key] = r
	if s.observe != nil {
		s.observe(key, before, r)
	}
	return r.clone()
}

// delete removes key's record; s.mu is held.
func (s *memStore) delete(key string) {
	before := s.records[key]
	delete(s.records, key)
	if s.observe != nil {
		s.observe(key, before, record{})
	}
}

// get returns a copy of key's record that the caller may change and write.
func (s *memStore) get(key string) (record, bool) {
	r, ok := s.records[key]
	return r.clone(), ok
}

func (r record) clone() record {
	r.Shared = maps.Clone(r.Shared)
	r.Waiters = maps.Clone(r.Waiters)
	return r
}

func (s *memStore) acquire(ctx context.Context, a attempt, takeover stamp) (record, error) {
	if err := s.begin(ctx); err != nil {
		return record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.take(a, takeover)
}

// take is acquire, with s.mu held.
func (s *memStore) take(a attempt, takeover stamp) (record, error) {
	r, exists := s.get(a.key)
	if exists && r.Kind != a.kind {
		return record{}, errHeld
	}
	if !exists {
		r = record{Kind: a.kind, Raw: true, Token: a.token}
	}
	if a.shared {
		hk := a.holdKey()
		if !exists && a.registered || exists && (r.Owner != "" || len(r.Shared)+a.passing >= a.limit || !r.queueOpen(a) || r.Token != a.token || r.Raw && len(r.Shared) > 0) {
			return record{}, errHeld
		}
		if a.registered {
			delete(r.Waiters, hk)
		}
		r.Token = a.token + 1
		if r.Shared == nil {
			r.Shared = map[string]entry{}
		}
		r.Shared[hk] = entry{Owner: a.owner, Hold: a.hold, Token: r.Token, TTL: a.ttl, Data: a.data, Trace: a.trace}
		return s.write(a.key, r), nil
	}
	ours := r.Owner == a.owner && r.Hold == a.hold
	took := r.at(takeover)
	if !exists && a.registered { // as the MongoDB store: a registered attempt does not upsert
		return record{}, errHeld
	}
	if exists && !ours && !((r.free() || took) && r.queueOpen(a)) {
		return record{}, errHeld
	}
	if !exists {
		r.Token = 0
	}
	r.Owner, r.Hold, r.TTL, r.Data, r.Trace = a.owner, a.hold, a.ttl, a.data, a.trace
	r.Token++
	if a.spare {
		r.Token++
	}
	r.Shared = nil // none, or stale ones cleared by a takeover
	if a.registered {
		delete(r.Waiters, a.holdKey())
	}
	return s.write(a.key, r), nil
}

func (s *memStore) register(ctx context.Context, a attempt) (record, error) {
	pending, err := s.registerStep(ctx, a, 0, func(r *record) {
		r.Queue++
		r.enqueue(a, 0, true)
	})
	if err != nil {
		return record{}, err
	}
	q := pending.Queue
	r, err := s.registerStep(ctx, a, pending.Waiters[a.holdKey()].Epoch, func(r *record) { r.enqueue(a, q, a.sleep) })
	if err != nil {
		return pending, err
	}
	return r, nil
}

// registerStep is one of register's writes: change, applied to a's key's
// record if it is of a's kind and, for the second (epoch not 0), still
// has a's pending entry with that epoch; errHeld otherwise.
func (s *memStore) registerStep(ctx context.Context, a attempt, epoch int64, change func(*record)) (record, error) {
	if err := s.begin(ctx); err != nil {
		return record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, exists := s.get(a.key)
	if e, ok := r.Waiters[a.holdKey()]; !exists || r.Kind != a.kind || epoch != 0 && (!ok || e.Q != 0 || e.Epoch != epoch) {
		return record{}, errHeld
	}
	change(&r)
	r.Rev-- // a registration is not a hold: it leaves the revision alone
	return s.write(a.key, r), nil
}

// enqueue adds a's registration with queue number q, marked asleep or
// not.
func (r *record) enqueue(a attempt, q int64, sleep bool) {
	if r.Waiters == nil {
		r.Waiters = map[string]entry{}
	}
	r.Waiters[a.holdKey()] = entry{Owner: a.owner, Hold: a.hold, TTL: a.ttl, Epoch: 1 + rand.Int64N(1<<62), Q: q, Sleep: sleep}
}

func (s *memStore) mark(ctx context.Context, ref leaseRef, sleep bool) (record, error) {
	if err := s.begin(ctx); err != nil {
		return record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.holds(ref)
	if !ok || ref.role != roleWaiter {
		return record{}, errNotOwner
	}
	hk := holdKey(ref.owner, ref.hold)
	e := r.Waiters[hk]
	e.Sleep = sleep
	r.Waiters[hk] = e
	r.Rev-- // a registration is not a hold: its mark leaves the revision alone
	return s.write(ref.key, r), nil
}

func (s *memStore) requeue(ctx context.Context, ref leaseRef, next attempt) (record, error) {
	if err := s.begin(ctx); err != nil {
		return record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.holds(ref)
	if !ok || ref.role != roleExclusive || r.Queue > next.queue {
		return record{}, errNotOwner
	}
	r.settle(ref)
	r.Owner, r.Data, r.Trace = "", nil, holdTrace{}
	r.Queue = next.queue + 1
	r.enqueue(next, r.Queue, next.sleep)
	return s.write(ref.key, r), nil
}

func (s *memStore) reap(ctx context.Context, key string, at stamp, stale []staleEntry) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.get(key)
	if !ok {
		return false, nil
	}
	if at.rev != 0 {
		if !r.at(at) {
			return false, nil
		}
		r.Owner, r.Data, r.Trace, r.Shared = "", nil, holdTrace{}, nil // waiters keep their places
		s.write(key, r)
		return true, nil
	}
	for _, e := range stale {
		if got, ok := r.entries(e.role)[e.key]; !ok || got.Epoch != e.epoch || got.Token != e.token {
			return false, nil
		}
	}
	holds := false
	for _, e := range stale {
		delete(r.entries(e.role), e.key)
		holds = holds || e.role == roleShared
	}
	if !holds {
		r.Rev-- // registrations only: not holds, so the revision stays (rule 6 of docs/design.md)
	}
	s.write(key, r)
	return true, nil
}

func (s *memStore) floor(ctx context.Context) (Token, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.floorTok, nil
}

func (s *memStore) idle(ctx context.Context, cutoff time.Time, limit int) ([]idleRecord, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var recs []idleRecord
	for key, r := range s.records {
		if len(recs) == limit {
			break
		}
		if r.prunable() && !r.At.After(cutoff) {
			recs = append(recs, idleRecord{key: key, token: r.Token, rev: r.Rev})
		}
	}
	return recs, nil
}

func (s *memStore) raiseFloor(ctx context.Context, t Token) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.floorTok = max(s.floorTok, t)
	return nil
}

func (s *memStore) remove(ctx context.Context, recs []idleRecord) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, d := range recs {
		if r, ok := s.records[d.key]; ok && r.prunable() && r.Rev == d.rev && r.Token == d.token {
			s.delete(d.key)
			n++
		}
	}
	return n, nil
}

// holds reports whether ref holds its key, and returns a copy of the record.
func (s *memStore) holds(ref leaseRef) (record, bool) {
	r, ok := s.get(ref.key)
	return r, ok && r.holds(ref)
}

func (s *memStore) handoff(ctx context.Context, ref leaseRef, next attempt) (record, error) {
	if err := s.begin(ctx); err != nil {
		return record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.holds(ref)
	if !ok || ref.role != roleExclusive || !r.queueOpen(next) {
		return record{}, errNotOwner
	}
	r.Hold, r.TTL, r.Data, r.Trace = next.hold, next.ttl, next.data, next.trace
	if ref.raw { // as mongoStore: $max to one above the hold's token
		r.Token, r.Raw = max(r.Token, ref.token+1), false
	} else {
		r.Token++
	}
	return s.write(ref.key, r), nil
}

func (s *memStore) extend(ctx context.Context, refs []leaseRef) ([]bool, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := make([]bool, len(refs))
	for i, ref := range refs {
		if r, held := s.holds(ref); held {
			r.settle(ref)
			if ref.role != roleExclusive {
				hk := holdKey(ref.owner, ref.hold)
				e := r.entries(ref.role)[hk]
				e.Epoch++
				r.entries(ref.role)[hk] = e
			}
			if ref.role == roleWaiter {
				r.Rev-- // a registration is not a hold: it leaves the revision alone
			}
			s.write(ref.key, r)
			ok[i] = true
		}
	}
	return ok, nil
}

func (s *memStore) release(ctx context.Context, ref leaseRef) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.free(ref)
}

// free ends ref's hold (or registration) if it is still there; s.mu is held.
func (s *memStore) free(ref leaseRef) error {
	r, ok := s.holds(ref)
	if !ok {
		return errNotOwner
	}
	r.settle(ref)
	if ref.role == roleExclusive {
		r.Owner, r.Data, r.Trace = "", nil, holdTrace{}
	} else {
		delete(r.entries(ref.role), holdKey(ref.owner, ref.hold))
	}
	if ref.role == roleWaiter {
		r.Rev-- // a registration is not a hold: its end leaves the revision alone
	}
	s.write(ref.key, r)
	return nil
}

func (s *memStore) setData(ctx context.Context, ref leaseRef, data []byte) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.holds(ref)
	if !ok || ref.role != roleExclusive {
		return errNotOwner
	}
	r.settle(ref)
	r.Data = bytes.Clone(data)
	s.write(ref.key, r)
	return nil
}

func (s *memStore) releaseAll(ctx context.Context, refs []leaseRef) error {
	if len(refs) == 0 {
		return nil
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ref := range refs {
		s.free(ref)
	}
	return nil
}

func (s *memStore) abandon(ctx context.Context, a attempt) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.get(a.key)
	switch {
	case !ok:
	case a.shared:
		if _, held := r.Shared[a.holdKey()]; held {
			delete(r.Shared, a.holdKey())
			s.write(a.key, r)
		}
	case r.Owner == a.owner && r.Hold == a.hold:
		r.Owner, r.Data, r.Trace = "", nil, holdTrace{}
		s.write(a.key, r)
	}
	return nil
}

func (s *memStore) readMany(ctx context.Context, keys []string) ([]record, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := make([]record, len(keys))
	for i, k := range keys {
		rs[i], _ = s.get(k)
	}
	return rs, nil
}

func (s *memStore) read(ctx context.Context, key string) (record, error) {
	if err := s.begin(ctx); err != nil {
		return record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, _ := s.get(key)
	return r, nil
}

func (s *memStore) acquireAll(ctx context.Context, as []attempt) ([]bool, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	took := make([]bool, len(as))
	for i, a := range as {
		a.registered, a.shared, a.spare = false, false, false // as mongoStore sends them
		if _, err := s.take(a, stamp{}); err != nil {
			break // an ordered bulk write stops at its first failure
		}
		took[i] = true
	}
	return took, nil
}

func (s *memStore) readAll(ctx context.Context, keys []string) ([]record, Token, error) {
	if err := s.begin(ctx); err != nil {
		return nil, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	recs := make([]record, len(keys))
	for i, key := range keys {
		recs[i] = s.records[key].holdOnly()
	}
	return recs, s.floorTok, nil
}

func (s *memStore) serverTime(ctx context.Context) (time.Time, bool, error) {
	if err := s.begin(ctx); err != nil {
		return time.Time{}, false, err
	}
	return s.now(), true, nil
}

// errUnreachable is what a partitioned memLink answers: a network fault,
// transient, with nothing applied.
var errUnreachable = errors.New("dlock: server unreachable (partitioned)")

// A memLink is one Client's connection to a memStore; while down, every
// request fails with errUnreachable before reaching the store.
type memLink struct {
	*memStore
	down atomic.Bool
}

func (l *memLink) check(ctx context.Context) error {
	if l.down.Load() {
		return errUnreachable
	}
	return nil
}

func (l *memLink) acquire(ctx context.Context, a attempt, takeover stamp) (record, error) {
	if err := l.check(ctx); err != nil {
		return record{}, err
	}
	return l.memStore.acquire(ctx, a, takeover)
}

func (l *memLink) handoff(ctx context.Context, ref leaseRef, next attempt) (record, error) {
	if err := l.check(ctx); err != nil {
		return record{}, err
	}
	return l.memStore.handoff(ctx, ref, next)
}

func (l *memLink) mark(ctx context.Context, ref leaseRef, sleep bool) (record, error) {
	if err := l.check(ctx); err != nil {
		return record{}, err
	}
	return l.memStore.mark(ctx, ref, sleep)
}

func (l *memLink) acquireAll(ctx context.Context, as []attempt) ([]bool, error) {
	if err := l.check(ctx); err != nil {
		return nil, err
	}
	return l.memStore.acquireAll(ctx, as)
}

func (l *memLink) readAll(ctx context.Context, keys []string) ([]record, Token, error) {
	if err := l.check(ctx); err != nil {
		return nil, 0, err
	}
	return l.memStore.readAll(ctx, keys)
}

func (l *memLink) register(ctx context.Context, a attempt) (record, error) {
	if err := l.check(ctx); err != nil {
		return record{}, err
	}
	return l.memStore.register(ctx, a)
}

func (l *memLink) reap(ctx context.Context, key string, at stamp, stale []staleEntry) (bool, error) {
	if err := l.check(ctx); err != nil {
		return false, err
	}
	return l.memStore.reap(ctx, key, at, stale)
}

func (l *memLink) extend(ctx context.Context, refs []leaseRef) ([]bool, error) {
	if err := l.check(ctx); err != nil {
		return nil, err
	}
	return l.memStore.extend(ctx, refs)
}

func (l *memLink) requeue(ctx context.Context, ref leaseRef, next attempt) (record, error) {
	if err := l.check(ctx); err != nil {
		return record{}, err
	}
	return l.memStore.requeue(ctx, ref, next)
}

func (l *memLink) release(ctx context.Context, ref leaseRef) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	return l.memStore.release(ctx, ref)
}

func (l *memLink) setData(ctx context.Context, ref leaseRef, data []byte) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	return l.memStore.setData(ctx, ref, data)
}

func (l *memLink) releaseAll(ctx context.Context, refs []leaseRef) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	return l.memStore.releaseAll(ctx, refs)
}

func (l *memLink) abandon(ctx context.Context, a attempt) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	return l.memStore.abandon(ctx, a)
}

func (l *memLink) floor(ctx context.Context) (Token, error) {
	if err := l.check(ctx); err != nil {
		return 0, err
	}
	return l.memStore.floor(ctx)
}

func (l *memLink) idle(ctx context.Context, cutoff time.Time, limit int) ([]idleRecord, error) {
	if err := l.check(ctx); err != nil {
		return nil, err
	}
	return l.memStore.idle(ctx, cutoff, limit)
}

func (l *memLink) raiseFloor(ctx context.Context, t Token) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	return l.memStore.raiseFloor(ctx, t)
}

func (l *memLink) remove(ctx context.Context, recs []idleRecord) (int, error) {
	if err := l.check(ctx); err != nil {
		return 0, err
	}
	return l.memStore.remove(ctx, recs)
}

func (l *memLink) readMany(ctx context.Context, keys []string) ([]record, error) {
	if err := l.check(ctx); err != nil {
		return nil, err
	}
	return l.memStore.readMany(ctx, keys)
}

func (l *memLink) read(ctx context.Context, key string) (record, error) {
	if err := l.check(ctx); err != nil {
		return record{}, err
	}
	return l.memStore.read(ctx, key)
}

func (l *memLink) serverTime(ctx context.Context) (time.Time, bool, error) {
	if err := l.check(ctx); err != nil {
		return time.Time{}, false, err
	}
	return l.memStore.serverTime(ctx)
}

func init() {
	memhook.NewServer = func() any { return newMemStore() }
	memhook.NewClient = func(server any, opts []any) (any, any, error) {
		st, ok := server.(*memStore)
		if !ok {
			return nil, nil, fmt.Errorf("%w: not an in-memory server", ErrInvalidOption)
		}
		options := make([]Option, len(opts))
		for i, o := range opts {
			if options[i], ok = o.(Option); !ok {
				return nil, nil, fmt.Errorf("%w: %T is not a dlock.Option", ErrInvalidOption, o)
			}
		}
		link := &memLink{memStore: st}
		c, err := newClientOn(func(*telemetry) store { return link }, options...)
		if err != nil {
			return nil, nil, err
		}
		return c, link, nil
	}
	memhook.SetPartitioned = func(link any, down bool) { link.(*memLink).down.Store(down) }
}
