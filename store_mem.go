package dlock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
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

	mu      sync.Mutex
	records map[string]record // guarded by mu
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
	return s.write(a.key, r), nil
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
