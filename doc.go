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
// At most one lease on a key is held at a time, across all Clients that
// share the collection, provided the server applies each single-document
// update atomically (MongoDB does; FerretDB v1 does not, see the README),
// and the clocks of the clients and of the server each run within
// [MaxClockDrift] of true time. Clocks may be set to any time at all: dlock
// never compares one machine's wall clock with another's.
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
// A waiter also knows the server's clock (the hello command's localTime,
// read at most once per TTL and carried forward between readings as a
// lower bound that allows for both clocks' drift), and counts the server
// time elapsed since the server stamped the revision it sees ($currentDate)
// towards its wait. Both
// stamps come from one clock, the server's, so a key abandoned more than a
// TTL ago is taken at once. On a replica set this assumes that a new primary
// elected between the two stamps has a clock that agrees with the old one
// to within the guard. Servers that do not report their clock are detected,
// and waiters then count their own clock only.
//
// A lease whose extensions fail (a partition, a slow server) is thus lost
// at its local deadline, before any other client can take the key. A
// process that is paused (garbage collection, a frozen VM) may wake after
// that deadline still believing it holds the key for an instant: that is
// why each hold has a token, and why the resource should check it ([Fence],
// [UpdateFenced]).
//
// # Costs
//
// An uncontended Lock is one command; Unlock is one; the extensions of all
// the leases a Client holds are one bulk write per cadence. Goroutines of
// one Client waiting for the same key queue in the Client and do not poll
// the server; on Unlock the hold passes to the next of them in one command.
// A Lock waiting on another Client polls with acquire attempts, so the
// poll that finds the key free takes it; it reads the lock document only
// to watch the holder's revision for takeover.
//
// # Telemetry
//
// Each Client reports spans and metrics through OpenTelemetry, to the
// global providers unless [WithTracerProvider] and [WithMeterProvider] say
// otherwise. The README lists them.
package dlock
