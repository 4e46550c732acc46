package dlock

import "sync"

// A Fence admits fencing tokens in order: it rejects a token lower than the
// highest it has admitted, so a holder that lost its lease (paused, cut off)
// cannot act after a newer holder has. Put one in front of the resource the
// lock protects. The zero value is ready to use; a Fence is safe for
// concurrent use and must not be copied after first use.
//
// A holder that reads the resource and writes back what it computed should
// pass its token before the read as well as before the write: the fence
// then refuses an older holder's delayed write that would otherwise land
// between the two, and be overwritten.
//
// For a resource stored in MongoDB, use [UpdateFenced], or [UpsertFenced]
// for a document that may not exist yet: they apply the same rule in the
// database, in the same write as the update; [FindFenced] reads under it.
type Fence struct {
	mu      sync.Mutex
	highest Token
}

// Check admits t if it is at least the highest token admitted so far, and
// returns a [*StaleTokenError] (matching [ErrStaleToken]) otherwise. One
// holder may pass its token any number of times.
func (f *Fence) Check(t Token) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t < f.highest {
		return &StaleTokenError{Token: t, Highest: f.highest}
	}
	f.highest = t
	return nil
}
