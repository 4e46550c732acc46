package dlock

import (
	"context"
	"errors"
	"sync"
)

// Locker returns a [sync.Locker] for code written against that interface
// (a [sync.Cond], say, or a library that takes a Locker). Its Lock is
// [Mutex.Lock] and its Unlock [Mutex.Unlock], with no context and no error
// to return; the Mutex's own methods, which return errors, remain the
// better choice where the code can take them. The Locker's Lock and
// Unlock act on m: a hold taken through one may be released through the
// other, and every Locker of m is the same lock.
//
// Lock blocks until m holds its key, for as long as that takes: it waits
// for other holders, and retries the errors that waiting may mend (a
// server that cannot be reached, a timeout, a write the server asks to
// retry), just as [Mutex.Lock] does; so Lock blocks for as long as the
// server cannot be reached. Lock panics, with a message that starts
// "dlock:" and a value that is an error wrapping the cause (so that a
// recover can test it with [errors.Is]), when it cannot hold the key and
// waiting will not change that:
//   - [ErrNoClient]: m is the zero Mutex, or nil;
//   - [ErrInvalidKey], [ErrInvalidOption]: m's key or options are invalid;
//   - [ErrClosed]: the Client is closed, or closes while Lock waits;
//   - [ErrTTLTooShort]: the TTL is shorter than the server's round trip;
//   - an error the server returned that is not retried (a denied
//     authorization, say).
//
// Unlock releases the hold, waiting at most the Mutex's TTL for the
// server's answer (the key is free by then in any case). It panics, with
// a "dlock:" message wrapping [ErrNotHeld], only when m holds nothing, as
// unlocking an unlocked [sync.Mutex] is a fatal error. It does not panic,
// and reports nothing, when the hold has ended without it, since there is
// nothing left to release: the lease was lost (its extensions failed until
// its local deadline, another owner took the key, or it reached
// [WithMaxHold]'s cap), the Client was closed, or the release went
// unanswered. So code behind a Locker does not learn that its hold was lost:
// where that matters, take [Mutex.Lease] at the start of the critical
// section (it returns nil once the lease is lost), watch its Lost or
// Context, and fence the writes the section makes with the lease's [Token].
func (m *Mutex) Locker() sync.Locker {
	return syncLocker{m}
}

// syncLocker is the sync.Locker of a Mutex.
type syncLocker struct {
	m *Mutex
}

// Lock blocks until the Mutex holds its key; see [Mutex.Locker].
func (l syncLocker) Lock() {
	if err := l.m.Lock(context.Background()); err != nil {
		panic(errorf("dlock: Locker.Lock: %w", err))
	}
}

// Unlock releases the Mutex's hold; see [Mutex.Locker].
func (l syncLocker) Unlock() {
	m := l.m
	ctx := context.Background()
	if m != nil && m.c != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.ttl)
		defer cancel()
	}
	if err := m.Unlock(ctx); errors.Is(err, ErrNotHeld) {
		panic(errorf("dlock: Locker.Unlock of an unlocked Mutex: %w", err))
	}
}
