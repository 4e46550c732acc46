// Package dlock provides distributed locks with leases and fencing tokens,
// stored in MongoDB: mutexes, reader/writer locks, semaphores and leader
// election.
//
// A [Client] keeps one document per key in a collection. [Mutex.Lock]
// blocks until the Mutex holds the key; the hold is a [Lease], extended in
// the background, with a fencing [Token] and channels that close when it
// ends ([Lease.Done]) or is lost ([Lease.Lost]). An [RWMutex] gives shared
// (read) holds and exclusive (write) holds of a key, a [Semaphore] up to n
// permits, an [Election] one leader at a time; each of their holds is a
// Lease of the same kind, with its own token, so everything below holds
// for them too. [WithMaxHold] caps any hold, [Mutex.Locker] adapts a Mutex
// to [sync.Locker], and [Client.Prune] keeps the collection small. [WithData] stores a few
// bytes with each hold and [Client.Holders] reads who holds a key.
//
// # Guarantees
//
// At most one lease on a key is valid at a time (its Err is nil), across
// all Clients that share the collection; for an RWMutex, never an
// exclusive lease beside any other; for a Semaphore of n permits, at most
// n. This holds provided the server applies each single-document update
// atomically (MongoDB does; FerretDB v1 does not, see the README), and the
// clock of each client runs within [MaxClockDrift] of true time. Clocks may be set to any time, and stepped
// at any time: by default dlock never compares one machine's wall clock
// with another's, nor two readings of the server's wall clock, and never
// reads a client's wall clock at all (only its monotonic clock).
//
// Fencing tokens for a key strictly increase for the key's whole life,
// across all its holds, shared or exclusive: each hold's token is greater
// than every token handed out for the key before it. So a writer of an
// RWMutex has a token above every reader's before it, and a [Fence] behind
// an RWMutex works. They may skip numbers (a Lock that waited may reserve
// one for its Mutex's next Lock: see Fairness), so compare tokens, never
// count holds by them. Releases, expiries, takeovers and restarts do not
// reset the counter, and
// neither does [Client.Prune], which deletes the documents of idle keys
// only after raising a collection-wide floor above their tokens; the next
// hold of a pruned key gets a token above the floor. Do not delete lock
// documents any other way (a TTL index, a script): a key re-created after
// such a delete hands out tokens from 1 again, which a [Fence] that saw
// the old ones rejects.
//
// # Pruning
//
// dlock keeps one document per key, so a collection of per-entity keys
// (one per order, per tenant) grows. [Client.Prune] deletes the documents
// of free keys not written for a given time, and [WithPruneIdle] runs it in
// the background. Before deleting, Prune raises the floor document (one per
// collection, never deleted) to at least the tokens of the documents it
// deletes, then deletes each only if it is still free at the revision it
// read. A Lock that creates a document reads the floor after creating it,
// and raises its token above the floor before the Lease reaches the
// caller; so does a Lock that takes over a document whose creator stopped
// before raising it. Reading the floor after the document exists is what
// makes this sound: a prune that deleted an earlier document of the key
// had raised the floor before the delete, so before the create, so before
// the read. Any number of Clients may prune at once, while others lock.
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
// after the holder's last write, however long ago that was. A poll
// interval, here and in every bound below, is at most one and a half
// maximum backoffs ([WithBackoff]): no wait sleeps longer than that at a
// time, whatever its pacing plans (see Fairness).
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
// # Readers, writers and permits
//
// A key is used by one kind of primitive: every Client that uses it must
// use it as a Mutex, as an RWMutex, or as a Semaphore with the same n. The
// kind is stored in the key's document, and a call that finds another
// kind (or another n) returns [ErrKindMismatch], never a silently larger
// limit.
//
// A writer is not starved by readers. An RWMutex's Lock that finds the key
// held registers itself in the key's document; from then on no new shared
// hold is taken, by any Client, so the shared holds already there end as
// their readers unlock, and the writer takes the key. A registration is
// kept alive by the writer's Client like a lease: one whose Client
// stopped extending it is cleared a TTL later by the readers it holds
// back. Goroutines of one Client share its shared hold of a key, but only
// during the hold's first extension interval: later RLocks take a new
// hold, which a registered writer holds back, so a stream of overlapping
// local readers cannot keep a hold alive forever either. Several writers
// waiting take the key in the order in which their polls find it free.
//
// A shared hold or permit whose holder crashed, or was cut off, is free
// again within the same bound as a Mutex's key: every hold in the document
// has an epoch that its holder's extensions increment, and a waiter that
// has seen an epoch unchanged for the hold's TTL, on its own clock, clears
// that hold (the rule of "How expiry works", per hold).
//
// Data ([WithData]) is stored in the clear in the lock document, where
// anyone who can read the collection, and every waiter ([Client.Holders]),
// can read it: never put secrets there. At most [MaxDataLen] bytes.
//
// # What is not guaranteed
//
// A process that is paused (garbage collection, a frozen VM, SIGSTOP) may
// wake after its lease's deadline and act on the protected resource before
// it checks Err again: the lease cannot stop that, which is why each hold
// has a token and why the resource should check it ([Fence],
// [UpdateFenced], [UpsertFenced]). A fence orders writes; it does not make
// a read-modify-write safe: an old holder's delayed write can land between
// the next holder's read and its write, and be overwritten. Raise the fence
// when you read ([FindFenced], or [Fence.Check] before the read as well as
// before the write). Lost closes at the local deadline when
// the Client's goroutine gets to run; Err reads the clock itself, so check
// Err (or run the work under [Lease.Context]) right before acting.
//
// A Lock that gives up while its last acquire is unanswered leaves that
// acquire's outcome unknown: if it lands later still (a very slow server),
// the key stays held, by no one, until its TTL passes or the same Client
// locks it again.
//
// Waiters queue in the lock document, first come first served (see
// Fairness); a Semaphore's waiters do not queue across Clients: each
// polls, in no order. A TryLock never queues and fails while any waiter
// is registered, even one whose Client crashed: only a waiting Lock clears
// a dead registration (after its TTL), and Prune keeps a document that has
// one.
//
// [Client.Holders] reports what the document says: a holder that crashed
// is listed until its hold is taken over or cleared, a TTL after a waiter
// first saw it.
//
// # Fairness
//
// A Lock, RWMutex.Lock or Campaign that finds the key held registers in
// the key's document with the next queue number, and from then on the key
// goes to the registered waiters in the order of their numbers: a free
// key may be taken only by the registered waiter that has no one
// registered before it (the head), and by an unregistered call only while
// no one is registered. The servers enforce this in the filter of the
// acquire. Within a Client, calls for one key queue in the Client first
// and one of them at a time waits in the document; an Unlock hands the
// key to the Client's next caller only while no other Client is
// registered, else it frees the key for the head; a Mutex's Unlock may
// keep a short hold for the Mutex's own next Lock, once (the keep, below).
// So, as a bound: a waiter registered behind k others gets the key after
// at most 2(k+1) holds (the current one and one each of those ahead, and
// for each of them at most one kept hold after it), each followed by the
// next holder's attempt, at most the maximum backoff after the key is
// freed; a waiter ahead that crashed or was cut off delays it by at most
// that waiter's TTL (plus a poll interval), after which its registration
// is cleared, whatever the waits plan (below). A waiter stays
// registered as long as its Client extends its registration (as it
// extends its leases); one that could not for a TTL may have been
// cleared, and registers again at the back. A call whose context ends
// leaves the queue; the clean-up write is in the background, and until it
// lands (at most a second or the TTL) the others wait for its turn.
//
// A Mutex's Unlock may also queue the Mutex's next Lock, in the release's
// own write (the requeue): when the Mutex's last Lock had to wait and came
// within the minimum backoff ([WithBackoff]) after the Unlock before it
// returned. (The write takes the queue number after the counter the
// Mutex last saw plus 64, so it applies unless more than 64 waiters
// registered since, or one registered from the same view, which took the
// number after that guess; then it tries once more, 65 higher, and if
// that fails too the Unlock releases as usual. A registration guesses
// the same way, and after two failed guesses reads the counter.) The Client keeps
// that registration for its next Lock of the key, which adopts it and
// waits in its place; if no Lock comes within the minimum backoff, the
// Client removes it (in the background; Close removes it too). So a
// Client that loops Lock, work, Unlock under contention spends one write
// per Unlock and none to register, and it is queued from its Unlock, not
// from its next Lock, a difference of the time between the two. Until an
// unused registration is removed it holds up those behind it once it
// reaches the head: at most the minimum backoff plus a round trip, and,
// for a Client that crashed meanwhile, its TTL, as for any waiter.
//
// A Mutex's Unlock under the same conditions keeps the hold instead, if
// the hold was short, its acquire reserved a spare token (below) and it
// was not itself kept (the keep): it sends no
// write, the hold stays in the document (nothing relies on it, and it is
// not extended), and the Mutex's next Lock takes it over with no command
// at all, a new Lease with a new token. The token is one the hold's own
// acquire reserved: a registered waiter's acquire of a Mutex whose last
// hold was short raises the key's counter by two and takes the lower
// number, so the counter is the spare, above every token handed out and
// below every later one. The kept hold's Lease relies on the hold's last
// write, as the hold did (its deadline is the same), and is extended from
// then on (and [WithMaxHold] counts from that write). Only the Mutex
// that kept the hold takes it with no command: another Mutex of the key
// in the same Client, whose Lock comes first, takes it over by one write
// that carries its own data, and only if no other Client's waiter is
// queued (else the hold is released and that Lock queues behind them).
// A kept hold has no spare, so the Unlock after it requeues. So a
// Client that loops takes two turns in a row, and the hand-overs between
// Clients, each of which costs a release, an acquire and the time the key
// waits for the next holder's attempt, are halved. A hold is short when
// it lasted less than 32 round trips of the Mutex's acquires (the least
// seen lately, each counted as at least a 32nd of the minimum backoff):
// when a hand-over costs more than about a tenth of a turn. A kept hold
// that no Lock takes within the minimum backoff is released in the
// background (and by Close), so it holds up the queue for at most that,
// plus a round trip.
//
// A requeued Lock knows when it joined the queue and how many waiters
// were ahead of it, so it sends no command until its turn is due: k turns
// after it joined, with k waiters ahead, a turn being learnt by the Mutex
// from its earlier waits (at first, the shorter of its own last hold and
// the turn its first requeued wait measured; see below). But it sleeps
// at most one and a half maximum backoffs at a time: woken before its
// turn, it polls as other waits do (below), and keeps its plan, so a
// crashed holder or waiter ahead, or one that left, holds it up no
// longer than it would a wait with no plan, however long a turn it
// learnt. Then it sends acquire attempts, a short interval apart (a
// sixteenth of a turn, within a sixteenth of the minimum backoff and half
// the maximum, and at least the last attempt's round trip), which take the
// key once every waiter ahead is gone; after eight early attempts it goes
// back to polling as below, reading the document at once (it is late,
// and the key may be free and owed to it). A first attempt that took the
// key makes the next wait aim earlier, one that was early makes it aim
// later, so that the key seldom waits for its next holder more than a
// retry interval. Waits that all aim late hold each other up (each waiter
// sees the lateness of those ahead as a longer turn), so while a turn is
// learnt as longer than the Mutex's own holds (from the acquire's send to
// the release's reply; the shortest seen lately, drifting up), a first
// attempt that took the key moves the aim half way down towards them.
// When turns are steady, about a third of first attempts are early;
// that pull makes more of them early when a turn is longer than the
// holds by a long hand-over (59 to 63% in four traced runs of 8 Clients
// holding 20 ms: README). With one waiter ahead (two Clients taking
// turns), where a late aim holds up no one else, a success moves the aim
// earlier by a smaller step, and pulls it no lower than a retry interval
// after the own holds; an early first attempt moves it later by a whole
// step, up to when the wait took the key (with more ahead, to no later
// than the early attempt, for a late aim would hold up those behind). So
// about one first attempt in nine is early, not a third, each a command
// saved. A Mutex's first
// requeued wait is not planned when more than one waiter is ahead: the
// Clients ahead may still be on their first Locks, whose holds are not
// kept, so an aim at its own kept holds would come late, and a late aim
// holds up every waiter behind it. It polls as below, and measures the
// turn: the time it took per waiter ahead.
//
// Other waiters poll: the head with acquire attempts, about four times
// per estimated hand-over period (estimated from how fast the key's token
// counter moves, and at least a quarter of the minimum backoff apart, so
// the head may poll faster than [WithBackoff]'s minimum), unless it was
// not requeued and saw the hold it waits for begin: a reply showed the
// token counter one more than the reply before it (or than the Mutex's
// Unlock left it). That hold began between the two commands. When the
// earlier reply showed the key free and nothing but the hold's acquire
// wrote the record since, the record's stamp (the server's clock at its
// last write), taken against the stamp of the wait's own registration,
// says when on the Client's clock: a time between two stamps of the
// server's clock, added to when the Client made its write, so no two
// machines' clocks are compared (an error costs commands or time, never
// safety: every attempt still passes the server's queue filter).
// Otherwise the head plans only if the two commands were sent at most a
// quarter of a hand-over period apart, from their midpoint. It sends its
// first attempt a hand-over period after the hold began (or a hold of its
// own Mutex, if that is shorter but at least a third of the period: as
// Clients start, the period counts the time the key sat free), sleeping
// at most the maximum backoff at a time (an attempt those sleeps bring
// forward does not count against the plan), then retries as a requeued
// wait does, but each retry twice as long after the one before.
// (No plan is made when the counter moved by more than one: two holds, or
// a spare token; nor for an RWMutex's writer, whose counter readers move
// too. A requeued wait whose plan ran out polls, for its plan's outcome
// teaches the next.) The others by
// reading the document, so that they learn when they reach the head: a
// waiter with two or more ahead reads again when about one should be left
// (but at most the maximum backoff later: an early estimate can be far
// too long), the one next after the head about twice a period; and while
// its Mutex knows no period (none seen yet, or the counter still for a
// TTL), no more often than every half hold of the Mutex's own, and at
// least every maximum backoff, once it has held the key (the stamp dates
// the hold it then sees begun). No waiter
// is woken by the server, so the key stays free until the next holder's
// attempt comes: fairness costs throughput when holds are short and many
// Clients wait.
//
// # Close
//
// [Client.Close] stops new calls, waits for calls under way (so that a
// Lock answered as Close began gives its hold back, and an Unlock's
// handoff finishes), ends and frees every lease in one write, and waits
// for its background clean-up writes. A Client runs one goroutine that
// extends its leases, one that prunes if [WithPruneIdle] asks for it, plus
// short clean-up writes (each bounded by a second and by the TTL); none
// outlives Close.
//
// # Costs
//
// An uncontended Lock of an existing key is one command, and so are an
// RLock and a Semaphore's Acquire once the primitive knows the key's token
// counter (its first costs a read more: a shared hold's acquire is a
// compare-and-set on the counter). The first Lock of
// a key (or of a pruned key) is three: the acquire that creates the
// document, a read of the floor, and the write that raises the token above
// it. Unlock is one; the extensions of all
// the leases a Client holds are one bulk write per cadence. Goroutines of
// one Client waiting for the same key queue in the Client and do not poll
// the server; on Unlock the hold passes to the next of them in one command
// (two while another Client's waiter is registered: the handoff is refused
// and the key freed). A Lock that must wait for another Client registers
// (one command; when its primitive's view of the queue counter is stale,
// or another registration beat it to the counter, a second guess, then a
// read and a retry, up to four times); then the head of the queue polls
// with acquire attempts,
// so the poll that finds the key free takes it, and the waiters behind it
// poll by reading the document. A Lock whose primitive waited less than a
// TTL ago registers at once, without a first attempt. A Client that
// loops Lock, work, Unlock under steady contention spends, every two
// turns, the Unlock's write that requeues its next Lock, the acquire that takes the
// key, and its early attempts (the Unlock that keeps the hold and the
// Lock that takes it over send nothing): measured, 1.1 to 2.1 commands an
// acquisition with short holds (up to 2.4 in other runs of 8 Clients
// holding 20 ms), 2.7 to 3.2 with holds too long to keep (README,
// "Fairness across processes"). A registered waiter's acquire does not
// upsert (its document exists), so an early one costs the server no
// failed insert. The uncontended Lock and
// Unlock filter on w (no waiter registered) and write nothing more.
//
// # Telemetry
//
// Each Client reports spans and metrics through OpenTelemetry, to the
// global providers unless [WithTracerProvider] and [WithMeterProvider] say
// otherwise. The README lists them.
package dlock

// The lock document: one design for every primitive
//
// This comment is for maintainers; it is not part of the package's
// documentation. It fixes the shape of the documents in a lock collection
// for all the primitives dlock has and will have (Mutex, RWMutex,
// Semaphore, Election, lock data, fair queues, pruning), so that each is a
// thin layer over one lease core and no primitive needs a migration of
// another's documents. Every write is a plain conditional update of ONE
// document ($set, $unset, $inc, $max, $setOnInsert, $currentDate; filters
// of equality, $exists, $lt, $lte and $or): no $expr, no pipeline updates,
// no positional updates, no arrayFilters, no $pull (FerretDB v1 ignores a
// conditional $pull silently), no transactions. Nothing relies on a field
// being absent where MongoDB and FerretDB could disagree: "absent" is
// tested with {f: null} (absent or null) or {f: {$exists: false}}.
//
// A key's document:
//
//	_id    string  the key
//	token  int64   the key's token counter: the greatest token handed out
//	               in this document's life. Only $inc, $max and a $set
//	               conditional on its current value write it, so it never
//	               goes down while the document exists.
//	rev    int64   +1 on every write that changes a hold (acquire, extend,
//	               release, handoff, raise, reap), not on a writer's
//	               registration or its extensions (a registration is not a
//	               hold): the liveness signal of the record as a whole (see
//	               "How expiry works" in the package doc). It starts again
//	               at 1 in a document that Prune deleted and an acquire
//	               created again, so no write is conditional on a
//	               revision alone. A takeover also names the token counter
//	               and one hold (owner and hold, or a key in h), whose name
//	               never repeats; a delete names the token counter of a
//	               document that is not raw, which the floor raised above
//	               every token of the deleted one
//	at     date    $currentDate on every write: informative, except that
//	               Prune's idle rule compares it with the server's own clock
//	owner  string  the exclusive holder, "" when there is none
//	hold   int64   the exclusive hold's id, unique among its owner's holds
//	ttl    int64   the exclusive hold's TTL, ms
//	data   binary  the exclusive hold's data (WithData), absent if none
//	raw    true    set when an acquire created the document ($setOnInsert),
//	               unset by the write that raises token above the floor;
//	               absent on every document dlock created before pruning
//	kind   string  absent: a Mutex key; "election": an Election key; "rw":
//	               an RWMutex key; "sem/N": a Semaphore of N permits. Set on creation
//	               ($setOnInsert) and in every acquire's filter, so a key
//	               used as two kinds (or two Ns) never matches, and the
//	               read that follows a failed acquire names the misuse
//	n      int32   the number of entries in h (absent: 0)
//	h      {hk: {o: owner, hold, t: token, ttl, d: data, e: epoch}}
//	               the shared holds (RWMutex readers, Semaphore permits),
//	               keyed by hold: hk is the owner in base64url, ":" and the
//	               hold id, so it is unique forever and is a valid field name
//	w      {hk: "q:ttl:e"}
//	               registered waiters for the exclusive hold (Mutex,
//	               RWMutex.Lock, Election), keyed like h (so hk names the
//	               owner and the hold id), each one string: q, the
//	               waiter's queue number, ttl in ms, and e, its epoch.
//	               Epochs come from a counter of the owner's Client that
//	               starts at random, so a registration's epoch never
//	               repeats one a waiter saw. Tested for emptiness with
//	               {w: {$in: [null, {}]}}, so no count is kept. One string,
//	               not a sub-document, because every write of the document
//	               handles all of it (FerretDB v1 decodes it, evaluates the
//	               filter and encodes it again: a lock write on a document
//	               with 7 waiters took 0.4 to 0.6 ms less, and 2 such
//	               writes make a hand-over). dlock stored it before as
//	               {o: owner, hold, t, ttl, e, q}, which is still read;
//	               an older dlock cannot read the string, so all the
//	               Clients of a collection are upgraded together. A value
//	               that is neither (nothing dlock writes) is read as a
//	               crashed waiter's, and cleared at once; a reap matches
//	               a registration's value as read, whatever it is
//	wq     int64   the greatest queue number handed out (absent: 0). A
//	               registration is a compare-and-set on it: filter wq: Q,
//	               $set wq: Q+1 and w.<hk>: "Q+1:ttl:e"
//
// and one floor document for the collection, {_id: 0, floor: int64}, whose
// numeric _id no key (a string) can equal: floor is at least every token
// any deleted document had.
//
// Writers of the exclusive hold (Mutex, RWMutex.Lock, Election) keep the
// top-level fields dlock has always used, so that a Mutex's uncontended
// Lock stays one $inc-based findAndModify and documents written before
// this design are still valid: a document without kind, n, w or raw is a
// free or exclusively held Mutex key. Shared holds live in h because a
// sub-document keyed by hold is the one structure that every supported
// server updates per entry with plain paths ($set h.<hk>, $unset h.<hk>),
// where an array would need positional updates or $pull.
//
// Invariants, each kept by the filter of every write that could break it:
//
//  1. Exclusion: owner != "" implies n = 0, and n < limit (1<<31 for
//     "rw", N for "sem/N"). An exclusive acquire requires owner "" and
//     n = 0 (or a takeover, below); a shared acquire requires owner "",
//     n < limit, and w empty (no registered writer: this is what keeps a
//     stream of readers from starving a writer).
//  2. Tokens: every token in the document (the exclusive hold's, which is
//     token itself while held, and each h entry's t) is at most token, and
//     each hold's token is greater than every token handed out before it
//     for the key. An exclusive acquire does $inc token: 1, or 2 for a
//     registered Mutex waiter's acquire that reserves a spare (keep.go):
//     its hold's token is then token-1, and token itself is handed out
//     only to the Lock that takes over the hold when its Unlock keeps it,
//     with no write, so the hold is still the document's and no token
//     came between. Writes for the hold name token, either way; so does
//     [Client.Holders]. A shared acquire
//     cannot copy the incremented counter into its entry without a
//     pipeline update, so it is a compare-and-set: filter token: T (the
//     counter the Client last saw), $set token: T+1 and h.<hk>.t: T+1. A
//     stale T fails the filter like a held key; the read that follows
//     learns the counter and the next attempt uses it.
//  3. Liveness without clock comparisons: the exclusive hold is watched
//     through rev, as the package doc describes. A shared hold or a
//     waiter's registration is watched through its own epoch e, which its
//     owner's extension changes ($inc h.<hk>.e, or $set w.<hk> to the
//     string with the Client's next epoch: the Client's one bulk write
//     per cadence carries it). A waiter that has seen an entry's e
//     unchanged for the entry's ttl on its own monotonic clock, counted
//     from when its read's reply arrived, may remove it (reap) by a write
//     conditional on h.<hk>.e (and h.<hk>.t) being those values, or on
//     w.<hk> being the value it read. That is
//     the same rule, and the same argument, as the exclusive takeover,
//     applied per entry. A waiter watches, and reaps, only the entries
//     that block it: a writer the shared holds; a reader the
//     registrations, and the shared holds when the Semaphore is full. A
//     takeover of the whole record (every hold in it has ended: rev has
//     stood still for the longest TTL in it) is conditional on rev, token
//     and one of the holds seen (owner and hold, or h.<hk> existing:
//     a raw document's rev and token can repeat those of a deleted one,
//     a hold's name cannot), and clears the shared holds (not the
//     registrations: rule 6).
//  4. Floor: before any document is deleted, floor is raised to at least
//     its token. Prune reads candidates (free: owner "", n = 0, w empty,
//     raw absent; and idle: at at least idle before the server's clock,
//     which compares the server's clock with itself only), raises floor
//     with $max to their greatest token (one upsert), then deletes each
//     with a filter that repeats those conditions and names its rev and
//     token, so neither a document written after the scan nor a document
//     created anew after another Prune deleted the one scanned is
//     deleted: a delete can arrive long after it was sent, and the new
//     document's rev may equal the old one's, but its token, once it is
//     not raw, is above the floor and so above the old one's. A raw
//     document is never deleted: its counter may repeat an old token.
//  5. Raised before use: an acquire that creates a document creates it raw
//     with token 1 (or T+1 for a shared acquire). Whoever's acquire reply
//     shows raw (the creator, or anyone who took over a raw document whose
//     creator paused or crashed) reads floor AFTER that reply, then raises
//     its own hold: $max token: floor+1 and $unset raw, conditional on its
//     hold still being there (for a shared hold, a $set of token and its
//     t, conditional on token; while raw, only an empty document may be
//     joined, so the raiser is the only holder). Only then does the Lease
//     reach the caller. A raise that fails leaves the attempt unsure,
//     handled like an unanswered acquire.
//
// Why 4 and 5 keep tokens increasing across a prune: let a document D of
// key k be deleted at time t_d, with greatest token T. Floor >= T from a
// time before t_d (the $max was answered before the delete was sent). A
// later document D' of k is created at t_c > t_d (the key had no document
// between). Its first holder to use a token reads floor at t_r > t_c, so
// it reads floor >= T, and raises above it; every later token of D' comes
// from $inc or $max on the raised counter. Reading floor before creating
// is unsound (a prune between the read and the create raises floor too
// late for the reader): the simulation checks that variant is caught. So is
// deleting without raising floor first. Floor itself is never deleted and
// only ever raised with $max.
//
//  6. Queue: an exclusive acquire's filter carries a gate. Unregistered:
//     w is empty. Registered as hk: w.<hk> exists (its registration was
//     not cleared), and w.<a> does not exist for each hold key a of the
//     waiters that the waiter has seen registered before it. (A wait
//     whose registration was cleared registers again under the same hk,
//     with a greater queue number, and sees anew who is ahead of it. An
//     extension or a removal of a registration matches its own queue
//     number, w.<hk> beginning "q:", so a late extension of the cleared
//     one cannot put its old number back and stand it ahead of waiters
//     that registered in between, nor a late removal remove the new
//     one.) That list is
//     complete from its registration's reply on: queue numbers come from
//     a compare-and-set on wq, so every waiter with a smaller number was
//     in the document when it registered, and every later registration
//     gets a greater one (a registration filters wq <= G and sets wq and
//     its q to G+1, for a guess G at or above the counter: the numbers
//     grow in the order registrations apply, whatever the guesses). So
//     the gate holds exactly for the head of the
//     queue, once the waiters ahead have taken the key or been cleared,
//     and a stale view costs a failed attempt, never the order. A handoff
//     within a Client carries the unregistered gate. A takeover of the
//     whole record carries the taker's gate too, and leaves w alone
//     (registrations have their own liveness, rule 3, and no revision).
//     Nothing else takes an exclusive hold, so while waiter W is
//     registered, every new hold belongs to a waiter that was ahead of W
//     when W registered. A hold serves at most two Locks (the keep, which
//     writes nothing, needs the spare that only an acquire reserves), so
//     W waits for at most twice as many Locks, plus two. The simulation
//     checks the order on every write, and the two Locks a hold on every
//     Lock.
//
// Costs this design keeps: an uncontended exclusive Lock or Unlock of an
// existing key is one command that writes no fields beyond those above
// the line "raw" (its filter also tests that w is empty); creating a document costs a floor read and, when floor is not
// below the new token, a raise (three commands instead of one); a Client's
// extensions of all its holds of all kinds remain one bulk write.
