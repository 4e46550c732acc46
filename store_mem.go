package dlock

import (
	"context"
	"errors"
	"fmt"
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
	floorTok Token             // guarded by mu: the floor (see doc.go)
}

func newMemStore() *memStore {
	return &memStore{now: time.Now, records: map[string]record{}}
}

// begin counts a command and fails it when ctx has ended.
func (s *memStore) begin(ctx context.Context) error {
	s.commands.Add(1)
	return ctx.Err()
}

// write starts a hold on r's key for owner.
func (s *memStore) write(key string, r record) record {
	r.Rev++
	r.At = s.now()
	s.records[key] = r
	return r
}

func (s *memStore) acquire(ctx context.Context, a attempt, takeover int64) (record, error) {
	if err := s.begin(ctx); err != nil {
		return record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, exists := s.records[a.key]
	ours := r.Owner == a.owner && r.Hold == a.hold
	if exists && !r.free() && !ours && (takeover == 0 || r.Rev != takeover) {
		return record{}, errHeld
	}
	r.Owner, r.Hold, r.TTL = a.owner, a.hold, a.ttl
	r.Token++
	if !exists {
		r.Raw = true
	}
	return s.write(a.key, r), nil
}

func (s *memStore) floor(ctx context.Context) (Token, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.floorTok, nil
}

func (s *memStore) raise(ctx context.Context, a attempt, floor Token) (record, error) {
	if err := s.begin(ctx); err != nil {
		return record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.records[a.key]
	if !ok || r.Owner != a.owner || r.Hold != a.hold {
		return record{}, errNotOwner
	}
	r.Token = max(r.Token, floor+1)
	r.Raw = false
	return s.write(a.key, r), nil
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
		if r.free() && !r.At.After(cutoff) {
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
		if r, ok := s.records[d.key]; ok && r.free() && r.Rev == d.rev {
			delete(s.records, d.key)
			n++
		}
	}
	return n, nil
}

func (s *memStore) holds(ref leaseRef) (record, bool) {
	r, ok := s.records[ref.key]
	return r, ok && r.Owner == ref.owner && r.Token == ref.token
}

func (s *memStore) handoff(ctx context.Context, ref leaseRef, hold int64, ttl time.Duration) (record, error) {
	if err := s.begin(ctx); err != nil {
		return record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.holds(ref)
	if !ok {
		return record{}, errNotOwner
	}
	r.Hold, r.TTL = hold, ttl
	r.Token++
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

// free frees ref's key if ref holds it; s.mu is held.
func (s *memStore) free(ref leaseRef) error {
	r, ok := s.holds(ref)
	if !ok {
		return errNotOwner
	}
	r.Owner = ""
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
	if r, ok := s.records[a.key]; ok && r.Owner == a.owner && r.Hold == a.hold {
		r.Owner = ""
		s.write(a.key, r)
	}
	return nil
}

func (s *memStore) read(ctx context.Context, key string) (record, error) {
	if err := s.begin(ctx); err != nil {
		return record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.records[key], nil
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

func (l *memLink) acquire(ctx context.Context, a attempt, takeover int64) (record, error) {
	if err := l.check(ctx); err != nil {
		return record{}, err
	}
	return l.memStore.acquire(ctx, a, takeover)
}

func (l *memLink) handoff(ctx context.Context, ref leaseRef, hold int64, ttl time.Duration) (record, error) {
	if err := l.check(ctx); err != nil {
		return record{}, err
	}
	return l.memStore.handoff(ctx, ref, hold, ttl)
}

func (l *memLink) extend(ctx context.Context, refs []leaseRef) ([]bool, error) {
	if err := l.check(ctx); err != nil {
		return nil, err
	}
	return l.memStore.extend(ctx, refs)
}

func (l *memLink) release(ctx context.Context, ref leaseRef) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	return l.memStore.release(ctx, ref)
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

func (l *memLink) raise(ctx context.Context, a attempt, floor Token) (record, error) {
	if err := l.check(ctx); err != nil {
		return record{}, err
	}
	return l.memStore.raise(ctx, a, floor)
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
