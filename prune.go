package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// pruneBatch is how many idle documents Prune reads, raises the floor for
// and deletes at a time.
const pruneBatch = 256

// Prune deletes the documents of keys that are free and have not been
// written for at least idle, by the server's clock, and returns how many it
// deleted. It keeps the tokens' promise: before deleting a document it
// raises the collection's floor (one more document, never deleted) to at
// least its token, and the next hold of a pruned key gets a token above
// the floor, so above every token the key had. It is safe to run from any
// number of Clients at once, while others lock the keys it prunes: its
// delete, however late it arrives, removes a document only if it is still
// in the state Prune read (the same revision and token, free, no waiter
// registered), so neither a document written since nor one created anew
// after another Prune deleted it is deleted. A document whose token has
// not yet been raised above the floor is not deleted either.
//
// idle may be 0; a negative idle is an [ErrInvalidOption]. The idle rule
// compares two readings of the server's clock (a document's last-write
// stamp and the time now), never a client's: a step of the server's clock
// may prune a key early or late, which costs at most a document's
// re-creation, never safety. A server that does not report its clock gives
// an error that matches [errors.ErrUnsupported].
//
// Prune costs one command for the server's clock, then, for each batch of
// up to 256 idle documents, a read, a raise of the floor and one write
// command of conditional deletes. A Client's first Prune also creates the
// index its read uses, a partial index named dlock_prune on the free
// documents' last write (one command; on a large collection it waits for
// the build); where the server refuses it (FerretDB v1, a user without the
// createIndex privilege), the Client does not ask again and Prune works
// without it, its read a scan of the collection (docs/design.md, "Prune's
// index"). The first Lock of a pruned key costs
// two commands instead of one (the acquire that creates the document and a
// read of the floor; the hold writes its token's base with its first
// extension or its Unlock, which it sends anyway), as does the first Lock
// of any new key; an RLock, Semaphore Acquire or Campaign that creates the
// document costs three, as it writes the base at once (docs/design.md,
// "Floor and raw documents"). A key whose holder crashed is not free and
// is not pruned until it has been taken over and released.
//
// When ctx ends, Prune returns an error matching ctx.Err(), with the count
// of documents deleted so far; what it had not deleted stays, with the
// floor raised at most to tokens of documents it read, which is harmless.
func (c *Client) Prune(ctx context.Context, idle time.Duration) (n int, err error) {
	switch {
	case c == nil:
		return 0, ErrNoClient
	case idle < 0:
		return 0, errorf("dlock: prune: %w: idle %v is negative", ErrInvalidOption, idle)
	}
	if err := c.begin(); err != nil {
		return 0, errorf("dlock: prune: %w", err)
	}
	defer c.finish()
	ctx, span := c.tel.pruneSpan(ctx, idle)
	defer func() { c.tel.endPrune(span, n, err) }()
	n, err = c.prune(ctx, idle)
	if err != nil {
		return n, errorf("dlock: prune: %w", err)
	}
	return n, nil
}

func (c *Client) prune(ctx context.Context, idle time.Duration) (int, error) {
	now, ok, err := c.store.serverTime(ctx)
	switch {
	case err != nil:
		return 0, err
	case !ok:
		return 0, fmt.Errorf("the server does not report its clock: %w", errors.ErrUnsupported)
	}
	cutoff := now.Add(-idle)
	deleted := 0
	for {
		recs, err := c.store.idle(ctx, cutoff, pruneBatch)
		if err != nil || len(recs) == 0 {
			return deleted, err
		}
		var top Token
		for _, r := range recs {
			top = max(top, r.token)
		}
		// The floor first: a document is deleted only once the floor is
		// at least its token (docs/design.md has why the order matters).
		if err := c.store.raiseFloor(ctx, top); err != nil {
			return deleted, err
		}
		n, err := c.store.remove(ctx, recs)
		deleted += n
		if err != nil || len(recs) < pruneBatch {
			return deleted, err
		}
		// A full batch: there may be more. The ones not deleted were
		// written since they were read, so they are no longer idle.
	}
}

// pruner runs Prune every cfg.pruneIdle (jittered by up to a tenth) until
// Close; Close stops it and waits for it. Its errors are reported as its
// spans' status.
func (c *Client) pruner() {
	defer close(c.prunerDone)
	every := c.cfg.pruneIdle
	for {
		t := c.clock.NewTimer(every - time.Duration(rand.Int64N(int64(every)/10+1)))
		select {
		case <-t.C:
		case <-c.closing:
			t.Stop()
			return
		}
		ctx, cancel := context.WithTimeout(c.tidyCtx, every)
		c.Prune(ctx, every)
		cancel()
	}
}
