package dlock

import (
	"fmt"
	"sync"
)

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
// holder may pass its token any number of times. A token of 0, which no
// hold has, returns an error matching [ErrInvalidOption] and changes
// nothing, as [UpdateFenced] does.
func (f *Fence) Check(t Token) error {
	if err := validToken("fence check", t); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if t < f.highest {
		return &StaleTokenError{Token: t, Highest: f.highest}
	}
	f.highest = t
	return nil
}

// validToken refuses the token 0, which no hold has (a key's tokens start
// at 1): a caller that passes it has passed no token at all, and a fence
// that admitted it would be behind every holder's.
func validToken(op string, t Token) error {
	if t == 0 {
		return fmt.Errorf("%w: %s: token 0 is no hold's token (pass the Lease's Token)", ErrInvalidOption, op)
	}
	return nil
}
