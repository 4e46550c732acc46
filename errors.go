package dlock

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Sentinel errors. Test for them with [errors.Is]: dlock wraps them with
// context (the key, the token, the cause), in a message that keeps one
// "dlock: " prefix.
var (
	// ErrLocked is returned, wrapped with who holds the key, by
	// [Mutex.TryLock] when another owner holds the key or another goroutine
	// or Mutex of the same Client holds it or is acquiring it.
	ErrLocked = errors.New("dlock: locked")
	// ErrNotHeld is returned by [Mutex.Unlock] when the Mutex holds no
	// lease, and by [Election.Proclaim] when the Election does not lead.
	ErrNotHeld = errors.New("dlock: not held")
	// ErrReleased is what [Lease.Err] reports after a clean release.
	ErrReleased = errors.New("dlock: lease released")
	// ErrLeaseLost is what [Lease.Err] reports, wrapped in a [*LeaseLostError],
	// once the lease can no longer be relied on: its extensions failed until
	// its local deadline, it reached the cap set by [WithMaxHold], or the
	// store showed that another owner took the key.
	ErrLeaseLost = errors.New("dlock: lease lost")
	// ErrMaxHold is the cause, in a [*LeaseLostError], of a lease that
	// reached the maximum hold time set by [WithMaxHold].
	ErrMaxHold = errors.New("dlock: maximum hold time reached")
	// ErrStaleToken is returned by [Fence.Check], [UpdateFenced] and
	// [UpsertFenced] for a fencing token lower than one already admitted.
	ErrStaleToken = errors.New("dlock: stale fencing token")
	// ErrClosed is returned by every call on a [Client], or on a [Mutex] made
	// by it, after [Client.Close].
	ErrClosed = errors.New("dlock: client closed")
	// ErrInvalidKey is returned for a key that is empty, longer than
	// [MaxKeyLen] bytes, not valid UTF-8 or contains a NUL byte.
	ErrInvalidKey = errors.New("dlock: invalid key")
	// ErrInvalidOption is returned for an option value out of range, or an
	// option given where it does not apply.
	ErrInvalidOption = errors.New("dlock: invalid option")
	// ErrKindMismatch is returned when a key is used by two kinds of
	// primitive ([Mutex], [RWMutex], [Semaphore], [Election]) or by Semaphores with
	// different numbers of permits: a misuse that would otherwise make one
	// of them wait forever, or give a larger limit than one of them asked
	// for. The message names the key's kind.
	ErrKindMismatch = errors.New("dlock: key used by another kind of lock")
	// ErrNoClient is returned by the Lock and TryLock of a Mutex that no
	// Client made: the zero value, or a nil pointer. Make Mutexes with
	// [Client.NewMutex].
	ErrNoClient = errors.New("dlock: Mutex not made by a Client (use Client.NewMutex)")
	// ErrNoLeader is returned by [Election.Leader] when nobody leads the
	// election: its key is free, or has never been campaigned for.
	ErrNoLeader = errors.New("dlock: no leader")
	// ErrQueueFull is returned by a Lock (of a [Mutex] or an [RWMutex]), a
	// [Election.Campaign] or a [Semaphore.Acquire] that must wait while
	// [MaxQueue] waiters are registered in the key's queue already. It
	// leaves nothing registered.
	ErrQueueFull = errors.New("dlock: too many waiters registered for the key")
	// ErrTooManyKeys is returned by the Lock and TryLock of a [MultiMutex]
	// of more than [MaxMultiKeys] keys. They send nothing.
	ErrTooManyKeys = errors.New("dlock: too many keys")
	// ErrTTLTooShort is returned by a Lock (and RLock, Acquire, Campaign)
	// whose acquires are answered, several times in a row, after the
	// lease's local deadline: the TTL ([WithTTL]) is shorter than the
	// server's round trip, and no hold it wins could be relied on. The Lock
	// leaves nothing held.
	ErrTTLTooShort = errors.New("dlock: TTL too short for this server's round trip")
)

// What TryLock's ErrLocked says of the holder.
var (
	errLockedElsewhere = fmt.Errorf("%w by another owner", ErrLocked)
	errLockedHere      = fmt.Errorf("%w by this Client: another goroutine or Mutex of it holds the key or is acquiring it", ErrLocked)
)

// LeaseLostError reports why a lease was lost. It matches [ErrLeaseLost]
// with [errors.Is], and unwraps to the cause when there is one.
type LeaseLostError struct {
	Key   string
	Token Token
	// Cause is the last store error when extensions failed until the local
	// deadline; an error matching [ErrMaxHold] when the hold reached the
	// cap set by [WithMaxHold] (matching the last store error too, when
	// the last extension failed); or nil when the store showed the key held
	// by someone else.
	Cause error
}

// Error says which hold was lost, and why.
func (e *LeaseLostError) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("dlock: lease on %q (token %d) lost: %v", e.Key, e.Token, unprefixed{e.Cause})
	}
	return fmt.Sprintf("dlock: lease on %q (token %d) lost: taken over or released by another owner", e.Key, e.Token)
}

// Is reports whether target is [ErrLeaseLost].
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// Unwrap returns the cause.
func (e *LeaseLostError) Unwrap() error { return e.Cause }

// A WaitError reports a wait for a key that its ctx ended: a Lock, RLock,
// Acquire or Campaign that returned without the hold (and left nothing
// held). It matches ctx's error with [errors.Is], and the last error the
// wait got from the server, if any, with errors.Is and [errors.As]; its
// message says who held the key when the wait last saw it held, or that
// it never saw it held. The primitive's error wraps it, and names the
// operation and the key.
type WaitError struct {
	Key string // the key waited for
	// Err is ctx's error: [context.Canceled] or [context.DeadlineExceeded].
	Err error
	// LastErr is the last error the wait got from the server (a network
	// fault, a timeout, no server that could be selected), or nil when
	// none failed. An error that only reports ctx cutting a command short
	// is not one.
	LastErr error
	// Holders are the holds the wait last saw on the key, as
	// [Client.Holders] reports them: the exclusive one, or up to three of
	// the shared ones (an RWMutex's readers, a Semaphore's permits) in
	// token order; nil when the wait never saw the key held. A wait behind
	// another goroutine or Mutex of the same Client, which sends nothing,
	// names that Client alone, with no token.
	Holders []Holder

	more  int  // shared holds seen beyond Holders
	local bool // the wait was behind another call of the same Client
}

// Error says why the wait ended, and what it saw: "dlock: context deadline
// exceeded (last seen held by web3 with token 7; last error: ...)", with
// each holder's [WithOwner] label (or, without one, its identity).
func (e *WaitError) Error() string {
	var b strings.Builder
	b.WriteString(prefix + unprefixed{e.Err}.Error() + " (")
	switch {
	case e.local:
		b.WriteString("held by this Client: another goroutine or Mutex of it holds the key or is acquiring it")
	case len(e.Holders) == 0:
		b.WriteString("not seen held")
	default:
		b.WriteString("last seen held by ")
		for i, h := range e.Holders {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s with token %d", ownerLabel(h.Owner), h.Token)
		}
		if e.more > 0 {
			fmt.Fprintf(&b, " and %d more", e.more)
		}
	}
	if e.LastErr != nil {
		b.WriteString("; last error: " + unprefixed{e.LastErr}.Error())
	}
	b.WriteString(")")
	return b.String()
}

// Unwrap returns ctx's error, and the last error from the server if any.
func (e *WaitError) Unwrap() []error {
	if e.LastErr == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.LastErr}
}

// ownerLabel is the [WithOwner] label of an owner identity, or the
// identity itself when it has none.
func ownerLabel(owner string) string {
	if i := strings.LastIndexByte(owner, '#'); i >= 0 {
		return owner[:i]
	}
	return owner
}

// StaleTokenError reports a fencing token lower than one already admitted.
// It matches [ErrStaleToken] with [errors.Is].
type StaleTokenError struct {
	Token   Token // the token presented
	Highest Token // the highest token admitted so far, when known
}

// Error names the token turned away and, when known, the highest admitted.
func (e *StaleTokenError) Error() string {
	if e.Highest == 0 {
		return fmt.Sprintf("dlock: stale fencing token %d", e.Token)
	}
	return fmt.Sprintf("dlock: stale fencing token %d (highest admitted %d)", e.Token, e.Highest)
}

// Is reports whether target is [ErrStaleToken].
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// prefix begins every message of dlock's, once.
const prefix = "dlock: "

// errorf is [fmt.Errorf] for dlock's messages, whose format begins with
// prefix: the errors among args are printed without their own prefix, so
// that the message reads as one sentence with one "dlock: ". It wraps what
// fmt.Errorf would wrap, as fmt.Errorf would.
func errorf(format string, args ...any) error {
	wrapped := fmt.Errorf(format, args...)
	shown := make([]any, len(args))
	for i, a := range args {
		shown[i] = a
		if err, ok := a.(error); ok && err != nil {
			shown[i] = unprefixed{err}
		}
	}
	msg := fmt.Errorf(format, shown...).Error()
	switch w := wrapped.(type) {
	case interface{ Unwrap() error }:
		return &wrapError{msg, w.Unwrap()}
	case interface{ Unwrap() []error }:
		return &wrapErrors{msg, w.Unwrap()}
	}
	return errors.New(msg)
}

// keyError wraps err, the failure of op on key: "dlock: <op> <key>:
// <cause>". An error that names the key already (a store's error, a
// [*LeaseLostError], a kind mismatch) says what failed, and is returned as
// it is rather than name the key twice; a [*WaitError], whose last error
// may name the key, is always wrapped.
func keyError(op, key string, err error) error {
	q := strconv.Quote(key)
	var wait *WaitError
	if strings.Contains(err.Error(), q) && !errors.As(err, &wait) {
		return err
	}
	return errorf(prefix+"%s %s: %w", op, q, err)
}

// unprefixed prints an error without its "dlock: " prefix.
type unprefixed struct{ error }

func (e unprefixed) Error() string { return strings.TrimPrefix(e.error.Error(), prefix) }

// wrapError and wrapErrors are what [errorf] returns: fmt's wrappers, with
// the message errorf made.
type wrapError struct {
	msg string
	err error
}

func (e *wrapError) Error() string { return e.msg }
func (e *wrapError) Unwrap() error { return e.err }

type wrapErrors struct {
	msg  string
	errs []error
}

func (e *wrapErrors) Error() string   { return e.msg }
func (e *wrapErrors) Unwrap() []error { return e.errs }
