// Package dlock provides distributed locks stored in MongoDB: a [Mutex], an
// [RWMutex], a [Semaphore] and an [Election], each hold of which is a [Lease]
// with a fencing [Token]; and a [MultiMutex], which holds several Mutex keys
// at once, all or none, taken in one order so that it cannot deadlock.
//
// A [Client] keeps one document per key. [Mutex.Lock] blocks until the
// Client holds the key; the Lease is extended in the background, its
// context cancelled if it is lost, and its token orders the holds:
//
//	client, err := dlock.NewClient(db.Collection("locks"))
//	if err != nil {
//		return err
//	}
//	defer client.Close(ctx)
//	mu := client.NewMutex("nightly-report")
//	if err := mu.Lock(ctx); err != nil {
//		return err // if ctx ended: ctx's error, in a *WaitError (who held the key, the last server error)
//	}
//	defer mu.Unlock(ctx) // sent even if ctx has ended by then: a release is clean-up
//	lease := mu.Lease()
//	return writeReport(lease.Context(), lease.Token()) // fence the writes with the token
//
// # What is guaranteed
//
// Provided the server applies each single-document update atomically (MongoDB
// and FerretDB v2 do; FerretDB v1 alone does not) and each client's clock runs
// within [MaxClockDrift] of true time:
//
//   - Exclusion: at most one lease on a key is valid (its [Lease.Err] is nil)
//     at a time, across all Clients sharing the collection; an [RWMutex]'s
//     exclusive lease is never valid beside another, and at most n of a
//     Semaphore's are.
//   - A lease ends before anyone can take its place: a holder relies on it
//     until its local deadline, ttl·(1-ρ)/(1+ρ) less a 1% guard (ρ =
//     MaxClockDrift) after it sent its last successful write, and a waiter
//     takes the key over only after seeing the document's revision unchanged
//     for a full TTL on its own clock. At the deadline [Lease.Lost] closes and
//     [Lease.Context] is cancelled.
//   - Fencing tokens increase: each hold's token is greater than that of
//     every hold of the key returned before its Lock was called, across
//     releases, expiries, takeovers, restarts and [Client.Prune].
//   - No clock comparisons between machines: every deadline and takeover
//     is counted on the client's own monotonic clock, so wall clocks may be
//     set or stepped at any time (a step of the server's, whose stamps pace
//     polls, costs a poll). [WithServerClockTakeover] trades this for faster
//     takeovers.
//   - Liveness: a key whose holder crashed is free at most two TTLs after its
//     last write, plus a poll interval (at most 1.5 maximum backoffs,
//     [WithBackoff]); a crashed reader's or permit holder's hold likewise.
//
// # What is not guaranteed
//
//   - A process paused past its deadline (garbage collection, a frozen VM)
//     can wake and act before it checks [Lease.Err]. No lease can prevent
//     that; a fence can: pass the token to the storage you write and have it
//     reject older ones ([Fence], [UpdateFenced], [UpsertFenced]). For a
//     read-modify-write, fence the read too ([FindFenced]).
//   - Lost closes when the Client's goroutine gets to run; Err reads the clock
//     itself, so check Err, or work under Context, right before acting.
//   - Tokens may skip numbers: compare them, never count holds by them.
//   - A Lock that gives up with its last acquire unanswered may leave the key
//     held by no one, until that hold's TTL passes.
//   - [Client.Holders] and [Election.Leader] report what the document says: a
//     crashed holder is listed until it is taken over.
//   - Lock documents deleted other than by [Client.Prune] (a TTL index, a
//     script) hand out tokens that a fence which saw the old ones rejects.
//
// # Fairness
//
// Across Clients, a [Mutex.Lock], [RWMutex.Lock] or [Election.Campaign] that
// finds the key held queues in its document, first come, first served among
// the waiters awake (one behind eight awake may sleep, and is passed while it
// does); a waiter with k ahead gets the key after at most 2(k+1) holds, and
// one ahead that crashed is cleared within 2½ TTLs and a poll of its last
// extension. A [Semaphore.Acquire] queues too, across permits; TryLock does
// not. [docs/fairness.md]
// has the queue and its bounds, [docs/design.md] the document and the proof.
//
// [docs/design.md]: https://github.com/dlock-go/dlock/blob/main/docs/design.md
// [docs/fairness.md]: https://github.com/dlock-go/dlock/blob/main/docs/fairness.md
package dlock
