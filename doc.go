// Package dlock provides distributed mutexes with leases and fencing tokens,
// stored in MongoDB.
//
// A [Client] keeps one document per key in a collection. [Mutex.Lock]
// blocks until the Mutex holds the key; the hold is a [Lease], extended in
// the background, with a fencing [Token] and channels that close when it
// ends ([Lease.Done]) or is lost ([Lease.Lost]).
//
// # Guarantees
//
// At most one lease on a key is valid at a time (its Err is nil), across
// all Clients that share the collection, provided the server applies each
// single-document update atomically (MongoDB does; FerretDB v1 does not,
// see the README), and the clock of each client runs within
// [MaxClockDrift] of true time. Clocks may be set to any time, and stepped
// at any time: by default dlock never compares one machine's wall clock
// with another's, nor two readings of the server's wall clock, and never
// reads a client's wall clock at all (only its monotonic clock).
//
// Fencing tokens for a key strictly increase for the key's whole life: the
// document is never deleted, so releases, expiries, takeovers and restarts
// do not reset the counter. Do not delete lock documents.
//
// # How expiry works without comparing clocks
//
// Every write to a lock document (acquire, extend, release) increments its
// revision. A holder relies on its lease until ttl·(1-ρ)/(1+ρ) minus a 1%
// guard (ρ = [MaxClockDrift]) after it SENT its last successful write, on its
// own monotonic clock; then Lost closes and Err reports [ErrLeaseLost]. A
// waiter may take the key over only by a write conditional on the revision
// it saw, and only after seeing that revision unchanged for a full ttl on its
// own monotonic clock, counted from when its read's reply ARRIVED (after the
// holder's write was applied, which was after it was sent). Rates within ρ
// of true time make the holder's reliance end first. The ttl used is the
// one the holder wrote into the document.
//
// So a key whose holder crashed is free again at most one TTL after the
// waiter first read it (plus a poll interval), which is at most two TTLs
// after the holder's last write, however long ago that was.
//
// # The server's clock
//
// By default the server's clock is not used at all: the stamp each write
// puts in the document (the at field, $currentDate) is informative only.
// [WithServerClockTakeover] lets a waiter count the server's time since
// that stamp towards its wait, so that a key abandoned more than a TTL ago
// is taken at once. That assumes one server clock that is never stepped
// (see the option): a step forward of the server's clock, a failover to a
// member whose clock is off, or a sharded cluster (where mongos answers
// the time and a shard stamps the document) can then let a waiter take a
// key whose holder still believes it holds it. dlock cross-checks
// successive readings of the server's clock against its own and stops
// counting it when they disagree, but it cannot see a step that came
// between a holder's write and the waiter's first reading.
//
// # Holds and clean-up writes
//
// Each Lock call names its acquisition with a hold id, unique among its
// Client's, written into the document with the hold. A retry of an acquire
// whose reply was lost finds the key held by its own hold id and renews it;
// the clean-up after a Lock that gave up with its outcome unknown frees
// only a hold with that id. So no clean-up write, however late it lands,
// can free a later hold, even one of the same Client; releases and
// extensions are conditional on the owner and the token. A hold of a
// Client's that none of its calls relies on (left by a Lock that gave up,
// or by a lease that was lost) is taken over at once by that Client's next
// Lock of the key; other Clients wait for it as for any holder.
//
// # What is not guaranteed
//
// A process that is paused (garbage collection, a frozen VM, SIGSTOP) may
// wake after its lease's deadline and act on the protected resource before
// it checks Err again: the lease cannot stop that, which is why each hold
// has a token and why the resource should check it ([Fence],
// [UpdateFenced], [UpsertFenced]). Lost closes at the local deadline when
// the Client's goroutine gets to run; Err reads the clock itself, so check
// Err (or run the work under [Lease.Context]) right before acting.
//
// A Lock that gives up while its last acquire is unanswered leaves that
// acquire's outcome unknown: if it lands later still (a very slow server),
// the key stays held, by no one, until its TTL passes or the same Client
// locks it again.
//
// Waiters in different Clients race: a Client that unlocks and locks again
// often wins against the polls of other Clients (no fairness across
// Clients). Goroutines of one Client queue in order.
//
// # Close
//
// [Client.Close] stops new calls, waits for calls under way (so that a
// Lock answered as Close began gives its hold back, and an Unlock's
// handoff finishes), ends and frees every lease in one write, and waits
// for its background clean-up writes. A Client runs one goroutine that
// extends its leases, plus short clean-up writes (each bounded by a
// second and by the TTL); none outlives Close.
//
// # Costs
//
// An uncontended Lock is one command; Unlock is one; the extensions of all
// the leases a Client holds are one bulk write per cadence. Goroutines of
// one Client waiting for the same key queue in the Client and do not poll
// the server; on Unlock the hold passes to the next of them in one command.
// A Lock waiting on another Client polls with acquire attempts, so the
// poll that finds the key free takes it; it reads the lock document only
// to watch the holder's revision for takeover (and, while its trace span
// is recorded, now and then to name the holders it waits for).
//
// # Telemetry
//
// Each Client reports spans and metrics through OpenTelemetry, to the
// global providers unless [WithTracerProvider] and [WithMeterProvider] say
// otherwise. The README lists them.
package dlock
