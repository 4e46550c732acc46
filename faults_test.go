package dlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// errInjected stands for a network failure: transient, outcome unknown.
var errInjected = errors.New("injected fault")

// faultyStore wraps a store and fails chosen operations.
type faultyStore struct {
	store
	failExtend   atomic.Bool // extensions fail without reaching the server
	loseExtReply atomic.Bool // extensions apply, but their replies are lost
	extends      atomic.Int64
	mu           sync.Mutex
	onExtend     func(extendRound)
}

// extendRound describes one call to extend, for onExtend.
type extendRound struct {
	leases   int   // leases in the batch
	commands int64 // commands sent during the call
	err      error
}

func (f *faultyStore) extend(ctx context.Context, refs []leaseRef) (ok []bool, err error) {
	f.extends.Add(1)
	f.mu.Lock()
	hook := f.onExtend
	f.mu.Unlock()
	if hook != nil {
		mark := commands.total.Load()
		defer func() { hook(extendRound{len(refs), commands.since(mark), err}) }()
	}
	if f.failExtend.Load() {
		return nil, errInjected
	}
	ok, err = f.store.extend(ctx, refs)
	if err == nil && f.loseExtReply.Load() {
		return nil, errInjected
	}
	return ok, err
}

func withFaults(f *faultyStore) Option {
	return withStoreWrapper(func(s store) store { f.store = s; return f })
}

// crash makes a Client behave as if its process died: no more writes of
// its own reach the server, and nothing is released.
func (f *faultyStore) crash() { f.failExtend.Store(true) }

func waitClosed(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}
