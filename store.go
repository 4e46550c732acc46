package dlock

import (
	"context"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"
)

// record is the state of one key as the store keeps it. The document for a
// key is created on first use and deleted only by Prune, after the floor
// was raised to its token (see docs/design.md), so the tokens handed
// out for a key never go back.
type record struct {
	Owner string        // identity of the holder; "" when free
	Token Token         // fencing token of the current or last hold
	Rev   int64         // bumped by every write: acquire, extend, release
	TTL   time.Duration // the holder's lease duration
	At    time.Time     // the server's clock at the last write
	Hold  int64         // names the acquisition (or handoff) that made the hold, unique per owner
	Raw   bool          // created by an acquire, and no hold has written its base yet: Token counts from 0, not from the floor (docs/design.md)
	Data  []byte        // the exclusive hold's data
	Trace holdTrace     // the exclusive hold's trace context, or none (telemetry.go): data, which no write's filter names

	Kind    string           // "" (Mutex), kindRW, kindElection or "sem/N"
	Shared  map[string]entry // shared holds by hold key (see holdKey)
	Waiters map[string]entry // registered waiters for the exclusive hold, by hold key
	Queue   int64            // the greatest queue number handed to a waiter (0: none yet)
}

// An entry is a shared hold or a registration in a record, watched for
// liveness by its epoch, which each extension changes (a shared hold's is
// incremented; a registration's, in mongoStore, is the next value of its
// Client's epoch counter).
type entry struct {
	Owner string
	Hold  int64
	Token Token
	TTL   time.Duration
	Data  []byte
	Epoch int64
	Q     int64     // a waiter's queue number: waiters take the key in its order
	Sleep bool      // a waiter marked asleep: a claim may pass it (record.queueOpen)
	Trace holdTrace // a shared hold's trace context, or none (a registration has none)

	// Stored is a registration's value exactly as the store keeps it,
	// opaque, or "" for a store that keeps none (memStore). mongoStore
	// keeps the BSON value's type byte, then its bytes, whatever the value
	// is: a reap matches it whole, so it clears only a value that nobody
	// rewrote since it was read, a malformed one included.
	Stored string
}

// holdOnly is r without its entries, data and trace context: the part of
// a record that readAll returns.
func (r record) holdOnly() record {
	r.Shared, r.Waiters, r.Data, r.Trace = nil, nil, nil, holdTrace{}
	return r
}

// free reports whether nobody holds the key, exclusively or shared.
func (r record) free() bool { return r.Owner == "" && len(r.Shared) == 0 }

// holds reports whether ref holds r (or, for a waiter's registration,
// is registered in it), by the name of the hold, which never repeats: an
// exclusive hold by its owner and hold id, a shared hold by its key in
// Shared, which names the same two. A token alone would not do: a raw
// record's counter starts again in each life of a key, so a hold of an
// earlier life can have the token that a new raw record's counter shows
// (docs/design.md, "The conditional writes").
func (r record) holds(ref leaseRef) bool {
	if ref.role == roleExclusive {
		return r.Owner == ref.owner && r.Hold == ref.hold
	}
	e, ok := r.entries(ref.role)[holdKey(ref.owner, ref.hold)]
	if ref.role == roleWaiter {
		// A registration's token is its queue number. A wait whose
		// registration was cleared (by a waiter behind it, while its
		// Client could not extend it) registers again under the same hold
		// key, with a greater number: a late write for the first one, an
		// extension or a removal, must not touch the second (an extension
		// would put the old number, and the old place, back).
		return ok && Token(e.Q) == ref.token
	}
	return ok && (ref.raw || e.Token == ref.token)
}

// queueOpen reports whether the registered waiters let attempt a take the
// key when it is free (see attempt and queueGate): a registered attempt
// passes the waiters ahead of it that are marked asleep, never one that
// is awake.
func (r record) queueOpen(a attempt) bool {
	switch {
	case a.pastQueue:
		return true
	case !a.registered:
		return len(r.Waiters) == 0
	}
	if e, ok := r.Waiters[a.holdKey()]; !ok || e.Hold != a.hold || e.Q != a.number {
		return false
	}
	for hk, q := range a.ahead {
		if e, ok := r.Waiters[hk]; ok && !(e.Sleep && e.Q == q) {
			return false
		}
	}
	return true
}

// ahead returns the waiters registered in r before the one with queue
// number q: their queue numbers by hold key.
func (r record) ahead(q int64) map[string]int64 {
	ahead := map[string]int64{}
	for hk, e := range r.Waiters {
		if e.Q < q {
			ahead[hk] = e.Q
		}
	}
	return ahead
}

// entries returns the sub-document of entries of role.
func (r record) entries(ro role) map[string]entry {
	if ro == roleWaiter {
		return r.Waiters
	}
	return r.Shared
}

// maxTTL is the longest TTL of any hold in r: a record whose revision
// stood still that long has no live hold left. Registrations are not
// holds (they leave the revision alone), so theirs do not count.
func (r record) maxTTL() time.Duration {
	d := r.TTL
	for _, e := range r.Shared {
		d = max(d, e.TTL)
	}
	return d
}

// kindRW is the kind of an RWMutex's key.
const kindRW = "rw"

// kindElection is the kind of an Election's key: an exclusive hold, as a
// Mutex's, whose data is the leader's value.
const kindElection = "election"

// semKind is the kind of a Semaphore's key of n permits.
func semKind(n int) string { return "sem/" + strconv.Itoa(n) }

// holdKey names a hold in a sub-document: the owner in base64url (so no
// "." or "$"), ":" and the hold id. Unique forever, as owner and hold are.
func holdKey(owner string, hold int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(owner)) + ":" + strconv.FormatInt(hold, 10)
}

// parseHoldKey returns the owner and hold id that hk names, or "" and 0
// if it is not a hold key.
func parseHoldKey(hk string) (string, int64) {
	i := strings.LastIndexByte(hk, ':')
	if i < 0 {
		return "", 0
	}
	owner, err := base64.RawURLEncoding.DecodeString(hk[:i])
	hold, err2 := strconv.ParseInt(hk[i+1:], 10, 64)
	if err != nil || err2 != nil {
		return "", 0
	}
	return string(owner), hold
}

// staleEntry names an entry, for reap: a registration as stored
// (entry.Stored) when the store keeps that; otherwise by its epoch (and a
// shared hold by its token).
type staleEntry struct {
	role   role // roleShared or roleWaiter
	key    string
	epoch  int64
	token  Token
	stored string
}

// A stamp names one state of a record, for a takeover: its revision, its
// token counter and one of its holds. No value that can repeat for a key
// is a guard on its own. The revision starts again from 1 when Prune
// deletes a record and a Lock creates it again; so does the token counter
// of a raw record, until it is raised above the floor (docs/design.md). A hold's
// name (its owner and hold id, or a shared hold's key) never repeats, as
// owners are unique to one Client and hold ids to one owner. The zero
// stamp is none.
type stamp struct {
	rev    int64
	token  Token
	owner  string // the exclusive holder, or "" for a record of shared holds
	hold   int64  // the exclusive holder's hold id
	shared string // with owner "": the least key of the record's shared holds
}

// stampOf returns the stamp of r's state.
func stampOf(r record) stamp {
	s := stamp{rev: r.Rev, token: r.Token, owner: r.Owner, hold: r.Hold}
	if r.Owner == "" {
		s.hold = 0
		for hk := range r.Shared {
			if s.shared == "" || hk < s.shared {
				s.shared = hk
			}
		}
	}
	return s
}

// at reports whether r is in state s.
func (r record) at(s stamp) bool {
	if s.rev == 0 || r.Rev != s.rev || r.Token != s.token || r.Owner != s.owner {
		return false
	}
	if s.owner != "" {
		return r.Hold == s.hold
	}
	_, ok := r.Shared[s.shared]
	return s.shared == "" || ok
}

// prunable reports whether Prune may delete r: nobody holds it or waits
// for it, and its token was raised above the floor (a raw record's token
// counter may repeat one that an earlier record of its key had).
func (r record) prunable() bool { return r.free() && len(r.Waiters) == 0 && !r.Raw }

// idleRecord is a record that Prune may delete: its key, and its state
// when read, which the delete matches. Revision and token together: the
// revision starts again when the record is created anew, the token of a
// record that is not raw never does (docs/design.md).

type idleRecord struct {
	key   string
	token Token
	rev   int64
}

// leaseRef identifies one hold in the store.
type leaseRef struct {
	key   string
	owner string
	token Token
	ttl   time.Duration
	hold  int64
	role  role

	// raw: the hold was made on a raw record and may not have written its
	// base yet, so the record's counter may still be below token. Every
	// write of the hold then writes the base: the counter raised to token,
	// a shared hold's t set to it, raw unset; and a shared hold's writes
	// name it by its key alone, its t being unwritten yet. The write is
	// the same whether the base was written already or not (docs/design.md,
	// rule 5). (An exclusive hold's writes name it by its owner and hold id
	// either way: record.holds.)
	raw bool
}

// settle writes ref's base into r when ref is raw (see leaseRef.raw):
// what every write of the hold does besides its own change.
func (r *record) settle(ref leaseRef) {
	if !ref.raw {
		return
	}
	r.Token, r.Raw = max(r.Token, ref.token), false
	if hk := holdKey(ref.owner, ref.hold); ref.role == roleShared {
		e := r.Shared[hk]
		e.Token = ref.token
		r.Shared[hk] = e
	}
}

// role says what a leaseRef names in its record.
type role uint8

const (
	roleExclusive role = iota // the top-level hold
	roleShared                // an entry in Shared
	roleWaiter                // an entry in Waiters: a registration, not a hold
)

// An attempt is one Lock call's claim on a key: every acquire it sends
// carries the same hold id, unique among its owner's, so that a retry
// finds a hold an earlier unanswered send made ("ours"), and so that the
// clean-up of an attempt whose outcome is unknown (abandon) matches that
// hold alone, never a later hold of the same owner.
type attempt struct {
	key   string
	owner string
	hold  int64
	ttl   time.Duration
	kind  string    // the key's kind: "" for a Mutex
	data  []byte    // stored with the hold
	trace holdTrace // stored with the hold: the trace context of the Lock that makes it (traceOf)

	// Shared holds (RWMutex.RLock, Semaphore) only.
	shared bool
	limit  int   // shared holds allowed at once
	token  Token // the key's token counter as last seen: a shared acquire is a compare-and-set on it
	// passing: a Semaphore's registered waiter passes this many waiters
	// ahead of it, awake as seen (those not in ahead), each owed a permit
	// before it: it takes one only while fewer than limit-passing are held.
	passing int

	// An exclusive hold of a registered waiter: the registration ends
	// with the acquire, which may take the key only once each waiter
	// registered before it (ahead) has left the queue or is marked
	// asleep, with the queue number it was seen with.
	// Unregistered, an exclusive acquire takes a free key only when no
	// waiter is registered. pastQueue lets it pass the queue: a keep's
	// own handoff (keep.go), and the flaws that ignore the queue.
	registered bool
	number     int64            // registered: its own queue number, which the gate names (a stale attempt does not apply under a later registration of its hold id)
	ahead      map[string]int64 // by hold key: the queue number seen, which a pass names
	pastQueue  bool

	// raw: the reply that made the hold showed a raw record, so its
	// token counts from the floor read after that reply (docs/design.md, rule 5).
	raw bool

	// spare: the acquire raises the token counter by two, not one, and
	// the hold's token is the counter less one: the counter itself is
	// reserved for the hold the primitive's Unlock may keep (keep.go).
	spare bool

	// A registration takes queue number queue+1: a compare-and-set on the
	// record's queue counter, as last seen (or a guess above it).
	queue int64

	// sleep: the registration is made marked asleep (register, requeue).
	sleep bool
}

func (a attempt) holdKey() string { return holdKey(a.owner, a.hold) }

// errHeld: the key is held by another owner. errNotOwner: a conditional
// write found that the key is no longer held by this lease.
var (
	errHeld     = errors.New("dlock: held by another owner")
	errNotOwner = errors.New("dlock: not held by this lease")
)

// store is what the lease logic needs from storage. Each method is one
// round trip unless its comment says otherwise, and each write is atomic on
// one record. Every write of a hold named by a raw leaseRef (extend,
// handoff, release, releaseAll, requeue, setData) also writes its base
// (record.settle).
type store interface {
	// acquire makes a.owner the holder of a.key with a new token and hold
	// id a.hold if the record is absent, already held by this very attempt
	// (same owner and hold), or, when no waiter ahead of a is registered
	// awake (see attempt), free or still in state takeover (the zero stamp for
	// none). A shared attempt (a.shared) instead adds a shared
	// hold, with token a.token+1, if the record is absent, or of a's kind
	// with its counter still at a.token and room for it (record.sharable):
	// unregistered, with no waiter registered; registered (a Semaphore's
	// waiter), its registration still there, each waiter of a.ahead gone
	// or asleep as seen, and fewer than limit-passing shared holds, and
	// its registration then ends.
	// It returns the record written, or errHeld; errHeld also when the
	// record is of another kind.
	acquire(ctx context.Context, a attempt, takeover stamp) (record, error)
	// handoff passes an exclusive hold to a new hold of the same owner
	// with a new token and next's hold id, ttl and data, if no waiter is
	// registered (the queue gate of next, an unregistered attempt);
	// errNotOwner when ref no longer holds the key or a waiter is. For a
	// raw ref the new token is ref.token+1, the base written.
	handoff(ctx context.Context, ref leaseRef, next attempt) (record, error)
	// extend refreshes every hold in refs in one write command (or a few,
	// on servers that handle big commands badly: see ferretBatch), and
	// reports for each whether it is still held. When some are not, it spends a second round
	// trip to tell which.
	extend(ctx context.Context, refs []leaseRef) ([]bool, error)
	// release frees key if ref still holds it; errNotOwner otherwise.
	release(ctx context.Context, ref leaseRef) error
	// requeue frees key as release does and, in the same write, registers
	// next (same owner, a new hold id) as register does: if ref still
	// holds the key and the queue counter is at most next.queue. It
	// returns the record written; errNotOwner when either fails, and then
	// nothing is written.
	requeue(ctx context.Context, ref leaseRef, next attempt) (record, error)
	// setData replaces the data of ref's exclusive hold if ref still holds
	// its key, errNotOwner otherwise. It keeps the token and bumps the
	// revision, as every write of a hold does (an Election's Proclaim).
	setData(ctx context.Context, ref leaseRef, data []byte) error
	// releaseAll frees, in one write command (or a few, as extend), every
	// hold in refs that is still held.
	releaseAll(ctx context.Context, refs []leaseRef) error
	// abandon frees a.key if attempt a holds it (same owner and hold id):
	// used after an acquire whose outcome is unknown. It cannot touch a
	// later hold, even of the same owner.
	abandon(ctx context.Context, a attempt) error
	// floor returns the collection's floor: at least the token of every
	// record ever deleted (0 when none was).
	floor(ctx context.Context) (Token, error)
	// idle returns up to limit records that are prunable and were last written
	// no later than cutoff by the server's clock.
	idle(ctx context.Context, cutoff time.Time, limit int) ([]idleRecord, error)
	// raiseFloor raises the floor to at least t.
	raiseFloor(ctx context.Context, t Token) error
	// remove deletes each of recs that is still prunable at the same
	// revision and token, in one write command (or a few, as extend), and returns how many it
	// deleted.
	remove(ctx context.Context, recs []idleRecord) (int, error)
	// mark marks ref's registration asleep or awake, if it is still
	// there, and returns the record written; errNotOwner otherwise. It
	// leaves the revision and the epoch alone.
	mark(ctx context.Context, ref leaseRef, sleep bool) (record, error)
	// acquireAll sends, in one write command, an exclusive acquire of
	// each of as (a MultiMutex's keys), in order, or of as many of the
	// first of them as the server takes in one command; unregistered and
	// with no takeover: each makes its attempt the holder of its key, with
	// a new token, if the record is absent, or of its kind, free and with
	// no waiter registered (or held by that very attempt). It stops at
	// the first that does not apply (an ordered bulk write). It returns
	// one entry for each statement sent, true for those that may have
	// applied: a prefix, which may run past the first that did not
	// (FerretDB v1 misreports which statement failed). readAll tells which
	// did, and their tokens.
	acquireAll(ctx context.Context, as []attempt) ([]bool, error)
	// readAll returns the records of keys, in order, in one command (the
	// zero record for a key that has none), and the floor; of each record
	// only its exclusive hold and counters (record.holdOnly). The floor
	// is read in the same command (a few more, once per collection, when
	// its document is missing and a record is raw); only raw records need
	// it, and it may be 0 when none is.
	readAll(ctx context.Context, keys []string) ([]record, Token, error)
	// register records attempt a as waiting for the exclusive hold of its
	// key, if the record exists and is of a's kind, with the next number
	// of the queue counter (so numbers only grow, in the order
	// registrations take them), marked asleep if a.sleep; it returns the
	// record written, or errHeld. It takes two writes (mongoStore.register),
	// and no other registration can make either fail: between them a's
	// entry is pending, numbered 0 and marked asleep. It returns errHeld
	// too when that entry was cleared before the second, and with another
	// error the record the first wrote, if it applied (its counter is a's
	// number). While registered and awake, a waiter is owed the key before
	// every waiter registered after it; while registered, asleep or not,
	// no new shared hold is taken.
	register(ctx context.Context, a attempt) (record, error)
	// reap removes, in one write, entries whose epochs show their owners
	// stopped extending them; all or nothing: false when any has changed.
	// With at non-zero it instead clears every hold of the record if it is
	// still at that revision and token (a takeover by a shared attempt).
	reap(ctx context.Context, key string, at stamp, stale []staleEntry) (bool, error)
	// read returns the record for key (the zero record when absent).
	read(ctx context.Context, key string) (record, error)
	// readMany returns the records of keys, in order, whole (the zero
	// record for a key that has none), in one find per thousand keys
	// (readBatch): the watcher's rounds (watcher.go).
	readMany(ctx context.Context, keys []string) ([]record, error)
	// serverTime returns the server's clock, or ok=false when the server
	// does not report it.
	serverTime(ctx context.Context) (t time.Time, ok bool, err error)
}
