package dlock

import (
	"cmp"
	"context"
	"maps"
	"slices"

	"go.opentelemetry.io/otel/trace"
)

// A Holder is one hold of a key, as [Client.Holders] reads it.
type Holder struct {
	Owner  string // the holder's Client ([Client.Owner])
	Token  Token  // the hold's fencing token; for an exclusive hold, the key's counter, which may be one above it (see below)
	Data   []byte // what the holder stored with it ([WithData]), or nil
	Shared bool   // a shared (read) hold or a Semaphore permit

	// TraceID and SpanID name the span of the Lock (or RLock, Acquire,
	// Campaign) that made the hold, when its Client was given a context
	// with a valid span: the Lock span if recorded, else the caller's span
	// (see "Telemetry" in the README). Zero (not IsValid) when the hold
	// stored none: no span, a Client of an older dlock, or a waiter. Paste
	// TraceID into a tracing UI to see what the holder is doing.
	TraceID trace.TraceID
	SpanID  trace.SpanID

	// Waiting marks a waiter registered in the key's queue for its
	// exclusive hold, not a hold (Token is 0): while one is registered, a
	// try fails and a free key goes to the queue's head. A registration
	// whose Client stopped is cleared by the next waiter behind it, or by
	// a try once it was not extended for its TTL.
	Waiting bool
}

// Holders returns who holds key, as one read of its document shows it, and
// acquires nothing: the exclusive holder, or the shared holders in the
// order of their tokens; then the waiters registered in its queue
// (Holder.Waiting), in queue order; none when the key is free and no one
// waits. A hold whose holder
// crashed is shown until another Client takes the key over or clears it
// (at most a TTL after a waiter first saw it), so the list may name a
// holder that no longer relies on its hold. The exclusive holder's Token
// is the key's token counter, which is the holder's [Lease.Token] except
// in two cases. The first Lock of a new (or pruned) key counts its token
// from the collection's floor (see [Client.Prune]) and writes that base
// into the document with its first write, an extension or its Unlock:
// until then the list shows the counter counted from 0. And when the hold's
// acquire reserved a spare (a Mutex's hold that waited in the queue after
// a short hold: see "Keep" in docs/fairness.md): then it is one above,
// the token of the Mutex's next Lock, which may hold by it without a
// write, so the list shows no change when it does. So a Holder's Token is
// for display and ordering only: never raise a fence to it, which could
// refuse the holder's own writes.
func (c *Client) Holders(ctx context.Context, key string) ([]Holder, error) {
	if c == nil {
		return nil, ErrNoClient
	}
	if err := validKey(key); err != nil {
		return nil, err
	}
	if err := c.begin(); err != nil {
		return nil, keyError("holders of", key, err)
	}
	defer c.finish()
	r, err := c.store.read(ctx, key)
	if err != nil {
		return nil, err
	}
	return append(holdersOf(r), waitersOf(r)...), nil
}

// holdersOf returns who holds r: the exclusive holder, or the shared
// holders in the order of their tokens; none when the key is free.
func holdersOf(r record) []Holder {
	var hs []Holder
	if r.Owner != "" {
		hs = append(hs, Holder{Owner: r.Owner, Token: r.Token, Data: r.Data, TraceID: r.Trace.traceID, SpanID: r.Trace.spanID})
	}
	for _, e := range r.Shared {
		hs = append(hs, Holder{Owner: e.Owner, Token: e.Token, Data: e.Data, Shared: true, TraceID: e.Trace.traceID, SpanID: e.Trace.spanID})
	}
	slices.SortFunc(hs, func(a, b Holder) int { return cmp.Compare(a.Token, b.Token) })
	return hs
}

// waitersOf returns the waiters registered in r, in queue order, as
// Holders marked Waiting.
func waitersOf(r record) []Holder {
	var hs []Holder
	for _, e := range slices.SortedFunc(maps.Values(r.Waiters), func(a, b entry) int { return cmp.Compare(a.Q, b.Q) }) {
		hs = append(hs, Holder{Owner: e.Owner, Waiting: true})
	}
	return hs
}
