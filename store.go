package dlock

import (
	"context"
	"errors"
	"time"
)

// record is the state of one key as the store keeps it. The document for a
// key is created on first use and never deleted, so Token and Rev never go
// back.
type record struct {
	Owner string        // identity of the holder; "" when free
	Token Token         // fencing token of the current or last hold
	Rev   int64         // bumped by every write: acquire, extend, release
	TTL   time.Duration // the holder's lease duration
	At    time.Time     // the server's clock at the last write
}

func (r record) free() bool { return r.Owner == "" }

// lease identifies one hold in the store.
type leaseRef struct {
	key   string
	owner string
	token Token
	ttl   time.Duration
}

// errHeld: the key is held by another owner. errNotOwner: a conditional
// write found that the key is no longer held by this lease.
var (
	errHeld     = errors.New("dlock: held by another owner")
	errNotOwner = errors.New("dlock: not held by this lease")
)

// store is what the lease logic needs from storage. Each method is one
// round trip unless its comment says otherwise, and each write is atomic on
// one record.
type store interface {
	// acquire makes owner the holder of key with a new token if the record
	// is absent, free, already owner's, or still at revision takeover (0
	// for none). It returns the record written, or errHeld.
	acquire(ctx context.Context, key, owner string, ttl time.Duration, takeover int64) (record, error)
	// handoff passes a hold to a new hold of the same owner with a new token
	// and ttl; errNotOwner when ref no longer holds the key.
	handoff(ctx context.Context, ref leaseRef, ttl time.Duration) (record, error)
	// extend refreshes every hold in refs in one write command (or a few,
	// on servers that handle big commands badly: see ferretBatch), and
	// reports for each whether it is still held. When some are not, it spends a second round
	// trip to tell which.
	extend(ctx context.Context, refs []leaseRef) ([]bool, error)
	// release frees key if ref still holds it; errNotOwner otherwise.
	release(ctx context.Context, ref leaseRef) error
	// releaseAll frees, in one write command (or a few, as extend), every
	// hold in refs that is still held.
	releaseAll(ctx context.Context, refs []leaseRef) error
	// abandon frees key if owner holds it, whatever the token: used after
	// an acquire whose outcome is unknown.
	abandon(ctx context.Context, key, owner string) error
	// read returns the record for key (the zero record when absent).
	read(ctx context.Context, key string) (record, error)
	// serverTime returns the server's clock, or ok=false when the server
	// does not report it.
	serverTime(ctx context.Context) (t time.Time, ok bool, err error)
}
