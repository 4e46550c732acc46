package dlock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/description"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"
	"go.opentelemetry.io/otel/trace"
)

// Field names of a lock document: {_id: key, owner, token, rev, ttl, at,
// hold, raw, data, tc, kind, n, h, w, wq}, and of the floor document
// {_id: "", floor}. docs/design.md has the design.
const (
	fOwner = "owner"
	fToken = "token"
	fRev   = "rev"
	fTTL   = "ttl" // milliseconds
	fAt    = "at"
	fHold  = "hold"
	fRaw   = "raw"
	fData  = "data"
	fTrace = "tc" // the exclusive hold's trace context (traceValue); a shared hold's entry has one too
	fKind  = "kind"
	fN     = "n"  // entries in h
	fH     = "h"  // shared holds by hold key
	fW     = "w"  // registered waiters by hold key
	fQueue = "wq" // the greatest queue number handed out
	fSleep = "z"  // the registrations marked asleep: hold key to queue number
	fFloor = "floor"
)

// Fields of a shared hold's entry in h (entryDoc has them all). A
// registration in w is one string (waiterValue); dlock stored it before
// as an entry too, with q, its queue number (decodeWaiters reads both).
const (
	eToken = "t"
	eEpoch = "e"
)

// floorID is the _id of the floor document: "", which no key can be (an
// empty key is invalid), and a string, which every supported server finds
// from its _id index (FerretDB v1 scans the collection for a number).
// oldFloorID is where dlock kept the floor before: floor copies it once.
const floorID = ""

const oldFloorID = int32(0)

// lockDoc is the stored form of a record.
type lockDoc struct {
	Owner string    `bson:"owner"`
	Token int64     `bson:"token"`
	Rev   int64     `bson:"rev"`
	TTL   int64     `bson:"ttl"`
	At    time.Time `bson:"at"`
	Hold  int64     `bson:"hold"`
	Raw   bool      `bson:"raw"`
	Data  []byte    `bson:"data"`
	Kind  string    `bson:"kind"`

	TC    bson.RawValue            `bson:"tc"` // read leniently: see traceFrom
	H     map[string]entryDoc      `bson:"h"`
	W     map[string]bson.RawValue `bson:"w"` // registrations: see waiterValue
	Queue int64                    `bson:"wq"`
	Z     map[string]int64         `bson:"z"` // registrations marked asleep, by hold key: their queue numbers
}

// entryDoc is the stored form of a shared hold's entry, and of a
// registration as an older dlock stored it.
type entryDoc struct {
	Owner string `bson:"o"`
	Hold  int64  `bson:"hold"`
	Token int64  `bson:"t"`
	TTL   int64  `bson:"ttl"`
	Data  []byte `bson:"d,omitempty"`
	Epoch int64  `bson:"e"`
	Q     int64  `bson:"q,omitempty"`

	TC bson.RawValue `bson:"tc,omitempty"` // a shared hold's trace context (traceValue)
}

func (d lockDoc) record() record {
	return record{Owner: d.Owner, Token: Token(d.Token), Rev: d.Rev, TTL: time.Duration(d.TTL) * time.Millisecond, At: d.At, Hold: d.Hold, Raw: d.Raw,
		Data: d.Data, Trace: traceFrom(d.TC, d.Owner, d.Hold), Kind: d.Kind, Shared: entries(d.H), Waiters: asleep(decodeWaiters(d.W), d.Z), Queue: d.Queue}
}

// asleep marks the registrations in w that z marks asleep: those whose
// queue number z names (a mark names the registration it was written
// for, so one left behind by a Client that did not remove it marks no
// later registration under the same hold key), a pending one's (number
// 0: register) included.
func asleep(w map[string]entry, z map[string]int64) map[string]entry {
	for hk, q := range z {
		if e, ok := w[hk]; ok && e.Q == q {
			e.Sleep = true
			w[hk] = e
		}
	}
	return w
}

// traceLen is the length of a stored trace context (traceValue).
const traceLen = 16 + 8 + 1 + 8

// traceValue is the stored form of trace context t of the hold named by
// owner and hold: binary (subtype 0) of traceLen bytes, the trace id, the
// span id, the trace flags, and a fingerprint of the hold's name
// (holdPrint). It is written by the write that makes the hold, in the
// same command, and only when t is valid (otherwise that write unsets the
// field); a write that ends the hold unsets it.
func traceValue(t holdTrace, owner string, hold int64) bson.Binary {
	b := make([]byte, traceLen)
	copy(b, t.traceID[:])
	copy(b[16:], t.spanID[:])
	b[24] = byte(t.flags)
	binary.BigEndian.PutUint64(b[25:], holdPrint(owner, hold))
	return bson.Binary{Data: b}
}

// traceFrom reads back the trace context that traceValue stored for the
// hold named by owner and hold. Anything else is none, and no error: an
// absent field (a document of an older dlock, or a hold whose Lock had no
// span), a value not of traceValue's form, or one stored for another hold,
// which an older dlock leaves in place when it takes over a hold of this
// one: the fingerprint ties the field to the hold it was written with.
func traceFrom(v bson.RawValue, owner string, hold int64) holdTrace {
	sub, b, ok := v.BinaryOK()
	if !ok || sub != 0 || len(b) != traceLen || binary.BigEndian.Uint64(b[25:]) != holdPrint(owner, hold) {
		return holdTrace{}
	}
	var t holdTrace
	copy(t.traceID[:], b)
	copy(t.spanID[:], b[16:])
	t.flags = trace.TraceFlags(b[24])
	if !t.valid() {
		return holdTrace{}
	}
	return t
}

// holdPrint is a 64-bit fingerprint (FNV-1a) of the name of a hold, its
// owner and hold id, which never repeats for a key.
func holdPrint(owner string, hold int64) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(owner); i++ {
		h = (h ^ uint64(owner[i])) * 1099511628211
	}
	for i := range 8 {
		h = (h ^ uint64(byte(hold>>(8*i)))) * 1099511628211
	}
	return h
}

// traced adds to update, the write that makes the hold named by owner and
// hold, the hold's trace context t: set when valid, otherwise unset (it
// may be a former hold's, in a document of an older dlock).
func traced(update bson.D, t holdTrace, owner string, hold int64) bson.D {
	if !t.valid() {
		return withOp(update, "$unset", bson.E{Key: fTrace, Value: ""})
	}
	return withOp(update, "$set", bson.E{Key: fTrace, Value: traceValue(t, owner, hold)})
}

// A registration is stored as one string, waiterValue's "q:ttl:epoch"
// (its queue number, its TTL in milliseconds, and its epoch), under its
// hold key, which names the owner and the hold id. Every write of the
// document rewrites the whole of it on some servers, and evaluates the
// filter on the whole of it, so the queue, which grows with the waiters,
// is kept to one field each: measured on the test server (FerretDB v1),
// a lock write on a document with 7 registrations took 0.4 to 0.6 ms less
// with them stored so than as sub-documents of six fields (2.0 to 2.5 ms
// against 2.4 to 3.1), and a hand-over is two such writes. An extension
// replaces the string with one of a new epoch, and only while it still
// has the registration's queue number (held, record.holds); a reap
// matches the value it read, so it clears nothing extended since.
func waiterValue(q int64, ttl time.Duration, epoch int64) string {
	return strconv.FormatInt(q, 10) + ":" + strconv.FormatInt(ttlMillis(ttl), 10) + ":" + strconv.FormatInt(epoch, 10)
}

// maxTTLMillis is the longest TTL, in milliseconds, that a time.Duration
// holds.
const maxTTLMillis = int64(math.MaxInt64 / time.Millisecond)

// decodeWaiters decodes the registrations of a record. One stored as a
// sub-document (as dlock stored them before) is read as such; one that
// is neither, or whose TTL is negative or too long for a time.Duration,
// is read with no TTL and queue number 0, so that the waiters that read
// it clear it at once rather than wait behind it. Each keeps its value as
// stored (entry.Stored), which is what a reap of it matches.
func decodeWaiters(docs map[string]bson.RawValue) map[string]entry {
	if len(docs) == 0 {
		return nil
	}
	m := make(map[string]entry, len(docs))
	for hk, v := range docs {
		owner, hold := parseHoldKey(hk)
		e := entry{Owner: owner, Hold: hold, Stored: string(append([]byte{byte(v.Type)}, v.Value...))}
		if s, ok := v.StringValueOK(); ok {
			if f := strings.Split(s, ":"); len(f) == 3 {
				q, err1 := strconv.ParseInt(f[0], 10, 64)
				ttl, err2 := strconv.ParseInt(f[1], 10, 64)
				epoch, err3 := strconv.ParseInt(f[2], 10, 64)
				if err1 == nil && err2 == nil && err3 == nil && ttl >= 0 && ttl <= maxTTLMillis {
					e.Q, e.TTL, e.Epoch = q, time.Duration(ttl)*time.Millisecond, epoch
				}
			}
		} else {
			var ed entryDoc
			if v.Unmarshal(&ed) == nil && ed.TTL >= 0 && ed.TTL <= maxTTLMillis {
				e.TTL, e.Epoch, e.Q = time.Duration(ed.TTL)*time.Millisecond, ed.Epoch, ed.Q
			}
		}
		m[hk] = e
	}
	return m
}

// storedValue is the BSON value that entry.Stored s keeps.
func storedValue(s string) bson.RawValue {
	return bson.RawValue{Type: bson.Type(s[0]), Value: []byte(s[1:])}
}

func entries(docs map[string]entryDoc) map[string]entry {
	if len(docs) == 0 {
		return nil
	}
	m := make(map[string]entry, len(docs))
	for k, e := range docs {
		m[k] = entry{Owner: e.Owner, Hold: e.Hold, Token: Token(e.Token), TTL: time.Duration(e.TTL) * time.Millisecond, Data: e.Data, Epoch: e.Epoch, Q: e.Q,
			Trace: traceFrom(e.TC, e.Owner, e.Hold)}
	}
	return m
}

// path is the field path of the entry named by hk in sub-document sub.
func path(sub, hk string, field ...string) string {
	p := sub + "." + hk
	for _, f := range field {
		p += "." + f
	}
	return p
}

func sub(ro role) string {
	if ro == roleWaiter {
		return fW
	}
	return fH
}

// noneAbove matches a field absent, null or not above 0.
var (
	notPositive = bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: 0}}}}
	emptyOrNone = bson.D{{Key: "$in", Value: bson.A{nil, bson.D{}}}}
)

// kindFilter matches a record of kind k ("" for a Mutex's: the field
// absent, as in documents written before kinds, or null).
func kindFilter(k string) bson.E {
	if k == "" {
		return bson.E{Key: fKind, Value: nil}
	}
	return bson.E{Key: fKind, Value: k}
}

// mongoStore keeps one document per key in a collection. It relies only on
// single-document atomicity, works on a standalone server and on a replica
// set, and uses no server-side expressions ($expr, $$NOW), so it runs on
// MongoDB 4.4+ and on compatible servers that keep that atomicity.
type mongoStore struct {
	coll    *mongo.Collection
	counted func(ctx context.Context, n int) // telemetry: commands sent
	epochs  atomic.Int64                     // the last epoch written to a registration (waiterValue)

	mu       sync.Mutex
	maxBatch int // statements per write command: 0 for any, -1 until known

	pruneIndexed atomic.Bool // pruneIndex created, or refused: not asked for again
}

// ferretBatch is the most update statements dlock puts in one command on
// FerretDB. FerretDB v1 keeps a backend connection for each statement of a
// command until the command ends, from a pool of 100: measured on v1.24.0,
// an update of 99 statements takes 3 ms a statement and one of 100 takes
// 2.8 s a statement. MongoDB takes any number (the driver splits at the
// server's maxWriteBatchSize, 100,000), so there a bulk is one command.
const ferretBatch = 64

func newMongoStore(coll *mongo.Collection, counted func(context.Context, int)) *mongoStore {
	coll = coll.Clone(options.Collection().
		SetWriteConcern(writeconcern.Majority()).
		SetReadConcern(readconcern.Majority()).
		SetReadPreference(readpref.Primary())) // a lagging secondary would show a stale holder
	s := &mongoStore{coll: coll, counted: counted, maxBatch: -1}
	s.epochs.Store(rand.Int64N(1 << 62))
	return s
}

// epoch returns a new epoch for a registration of this store's owner:
// each differs from every one before it (see waiterValue).
func (s *mongoStore) epoch() int64 { return s.epochs.Add(1) }

func ttlMillis(ttl time.Duration) int64 {
	return int64((ttl + time.Millisecond - 1) / time.Millisecond)
}

// newHold is the update that starts a hold: the token counter raised by
// tokens (two when the acquire reserves a spare), a new revision.
func newHold(owner string, hold int64, ttl time.Duration, tokens int64) bson.D {
	return bson.D{
		{Key: "$set", Value: bson.D{{Key: fOwner, Value: owner}, {Key: fTTL, Value: ttlMillis(ttl)}, {Key: fHold, Value: hold}}},
		{Key: "$inc", Value: bson.D{{Key: fToken, Value: tokens}, {Key: fRev, Value: int64(1)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
	}
}

var (
	touch = bson.D{
		{Key: "$inc", Value: bson.D{{Key: fRev, Value: int64(1)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
	}
	free = bson.D{
		{Key: "$set", Value: bson.D{{Key: fOwner, Value: ""}}},
		{Key: "$unset", Value: bson.D{{Key: fData, Value: ""}, {Key: fTrace, Value: ""}}},
		{Key: "$inc", Value: bson.D{{Key: fRev, Value: int64(1)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
	}
	returnAfter = options.FindOneAndUpdate().SetReturnDocument(options.After)
	upsertAfter = options.FindOneAndUpdate().SetReturnDocument(options.After).SetUpsert(true)
)

// held matches the record while ref holds it (record.holds): by the
// hold's name, which never repeats for a key, and, for a shared hold that
// has written its base, its token too.
func held(ref leaseRef) bson.D {
	id := bson.E{Key: "_id", Value: ref.key}
	entry := path(sub(ref.role), holdKey(ref.owner, ref.hold))
	switch {
	case ref.role == roleExclusive:
		return bson.D{id, {Key: fOwner, Value: ref.owner}, {Key: fHold, Value: ref.hold}}
	case ref.role == roleWaiter: // its token is its queue number
		return bson.D{id, {Key: entry, Value: queueNumber(int64(ref.token))}}
	case ref.raw: // the entry's t may still be unwritten (leaseRef.raw)
		return bson.D{id, {Key: entry, Value: bson.D{{Key: "$exists", Value: true}}}}
	}
	return bson.D{id, {Key: path(entry, eToken), Value: int64(ref.token)}}
}

// based is update with ref's base added when ref is raw (record.settle):
// the counter raised to ref.token with $max, a shared hold's t set to it
// (unless update removes the hold), and raw unset; the same write whether
// the base was written before or not.
func based(update bson.D, ref leaseRef) bson.D {
	if !ref.raw {
		return update
	}
	entry := path(fH, holdKey(ref.owner, ref.hold))
	ends := false
	for _, op := range update {
		if op.Key == "$unset" {
			ends = slices.ContainsFunc(op.Value.(bson.D), func(e bson.E) bool { return e.Key == entry })
		}
	}
	update = withOp(update, "$unset", bson.E{Key: fRaw, Value: ""})
	update = withOp(update, "$max", bson.E{Key: fToken, Value: int64(ref.token)})
	if ref.role == roleShared && !ends {
		update = withOp(update, "$set", bson.E{Key: path(entry, eToken), Value: int64(ref.token)})
	}
	return update
}

// withOp returns a copy of update with e added to its operator op (update
// may be shared: free, touch).
func withOp(update bson.D, op string, e bson.E) bson.D {
	out := slices.Clone(update)
	for i := range out {
		if out[i].Key == op {
			out[i].Value = append(slices.Clone(out[i].Value.(bson.D)), e)
			return out
		}
	}
	return append(out, bson.E{Key: op, Value: bson.D{e}})
}

// extension is the update that extends ref.
func (s *mongoStore) extension(ref leaseRef) bson.D {
	switch ref.role {
	case roleExclusive:
		return touch
	case roleWaiter: // a registration's token is its queue number
		return bson.D{
			{Key: "$set", Value: bson.D{{Key: path(fW, holdKey(ref.owner, ref.hold)), Value: waiterValue(int64(ref.token), ref.ttl, s.epoch())}}},
			{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
		}
	}
	return bson.D{
		{Key: "$inc", Value: bson.D{{Key: path(fH, holdKey(ref.owner, ref.hold), eEpoch), Value: int64(1)}, {Key: fRev, Value: int64(1)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
	}
}

// ending is the update that ends ref's hold or registration.
func ending(ref leaseRef) bson.D {
	if ref.role == roleExclusive {
		return free
	}
	hk := holdKey(ref.owner, ref.hold)
	unset := bson.D{{Key: path(sub(ref.role), hk), Value: ""}}
	if ref.role == roleWaiter {
		unset = append(unset, bson.E{Key: path(fSleep, hk), Value: ""})
	}
	update := bson.D{
		{Key: "$unset", Value: unset},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
	}
	if ref.role == roleShared { // a registration is not a hold: its end leaves the revision alone
		update = append(update, bson.E{Key: "$inc", Value: bson.D{{Key: fRev, Value: int64(1)}, {Key: fN, Value: -1}}})
	}
	return update
}

func (s *mongoStore) acquire(ctx context.Context, a attempt, takeover stamp) (record, error) {
	if a.shared {
		return s.acquireShared(ctx, a)
	}
	filter, update := exclusiveAcquire(a, takeover)
	if a.registered {
		// Registered, so the record exists: no upsert, whose miss costs
		// the server a failed insert as well (measured on FerretDB v1: a
		// miss takes a fifth less time without it).
		r, err := s.modify(ctx, filter, update, "acquire", a.key)
		if errors.Is(err, errNotOwner) {
			err = errHeld
		}
		return r, err
	}
	return s.upsert(ctx, a.key, filter, update)
}

// exclusiveAcquire is the filter and update of an exclusive acquire
// (store.acquire).
func exclusiveAcquire(a attempt, takeover stamp) (filter, update bson.D) {
	ours := bson.D{{Key: fOwner, Value: a.owner}, {Key: fHold, Value: a.hold}}
	free := append(bson.D{{Key: fOwner, Value: ""}}, queueGate(a)...)
	if a.kind == kindRW {
		free = append(free, bson.E{Key: fN, Value: notPositive})
	}
	or := bson.A{free, ours}
	if takeover.rev != 0 {
		or = append(or, append(stampFilter(takeover), queueGate(a)...))
	}
	filter = bson.D{{Key: "_id", Value: a.key}, kindFilter(a.kind), {Key: "$or", Value: or}}
	tokens := int64(1)
	if a.spare {
		tokens = 2
	}
	update = append(newHold(a.owner, a.hold, a.ttl, tokens), bson.E{Key: "$setOnInsert", Value: bson.D{{Key: fRaw, Value: true}}})
	var unset bson.D
	if a.data != nil {
		update[0].Value = append(update[0].Value.(bson.D), bson.E{Key: fData, Value: a.data})
	} else {
		unset = append(unset, bson.E{Key: fData, Value: ""})
	}
	if a.kind == kindRW { // an RWMutex's writer: no shared holds, or only stale ones (a takeover)
		update[0].Value = append(update[0].Value.(bson.D), bson.E{Key: fH, Value: bson.D{}}, bson.E{Key: fN, Value: 0})
	}
	if a.registered {
		unset = append(unset, bson.E{Key: path(fW, a.holdKey()), Value: ""}, bson.E{Key: path(fSleep, a.holdKey()), Value: ""})
	}
	if a.trace.valid() {
		update[0].Value = append(update[0].Value.(bson.D), bson.E{Key: fTrace, Value: traceValue(a.trace, a.owner, a.hold)})
	} else {
		unset = append(unset, bson.E{Key: fTrace, Value: ""})
	}
	if unset != nil {
		update = append(update, bson.E{Key: "$unset", Value: unset})
	}
	return filter, update
}

// stampFilter matches a record in state s (record.at).
func stampFilter(s stamp) bson.D {
	f := bson.D{{Key: fRev, Value: s.rev}, {Key: fToken, Value: int64(s.token)}, {Key: fOwner, Value: s.owner}}
	switch {
	case s.owner != "":
		f = append(f, bson.E{Key: fHold, Value: s.hold})
	case s.shared != "":
		f = append(f, bson.E{Key: path(fH, s.shared), Value: bson.D{{Key: "$exists", Value: true}}})
	}
	return f
}

// queueGate is the condition on the registered waiters under which
// attempt a may take a free key (or take one over): none registered, or,
// for a registered waiter, its registration still there and every waiter
// registered before it gone. docs/design.md has why that is the head of the queue.
func queueGate(a attempt) bson.D {
	switch {
	case a.pastQueue:
		return nil
	case !a.registered:
		return bson.D{{Key: fW, Value: emptyOrNone}}
	}
	gate := bson.D{{Key: path(fW, a.holdKey()), Value: queueNumber(a.number)}}
	var passed bson.A
	for _, hk := range slices.Sorted(maps.Keys(a.ahead)) {
		gone := bson.D{{Key: path(fW, hk), Value: bson.D{{Key: "$exists", Value: false}}}}
		q := a.ahead[hk]
		sleeping := bson.D{{Key: path(fSleep, hk), Value: q}, {Key: path(fW, hk), Value: queueNumber(q)}}
		passed = append(passed, bson.D{{Key: "$or", Value: bson.A{gone, sleeping}}})
	}
	if passed != nil {
		gate = append(gate, bson.E{Key: "$and", Value: passed})
	}
	return gate
}

// queueNumber matches a registration whose queue number is q: its string
// begins with it. A regular expression, not a range of strings: a
// collection's default collation may order ':' and ';' otherwise.
func queueNumber(q int64) bson.D {
	return bson.D{{Key: "$regex", Value: "^" + strconv.FormatInt(q, 10) + ":"}}
}

func (s *mongoStore) upsert(ctx context.Context, key string, filter, update bson.D) (record, error) {
	s.counted(ctx, 1)
	var d lockDoc
	err := s.coll.FindOneAndUpdate(ctx, filter, update, upsertAfter).Decode(&d)
	switch {
	case err == nil:
		return d.record(), nil
	case duplicateKey(err):
		return record{}, errHeld
	default:
		return record{}, failed(err, "dlock: acquire %q", key)
	}
}

// modify applies update to the record that filter matches and returns
// it as it is after; errNotOwner when filter matches nothing (the hold or
// the key it names is gone). what names the write in errors.
func (s *mongoStore) modify(ctx context.Context, filter, update bson.D, what, key string) (record, error) {
	s.counted(ctx, 1)
	var d lockDoc
	err := s.coll.FindOneAndUpdate(ctx, filter, update, returnAfter).Decode(&d)
	switch {
	case err == nil:
		return d.record(), nil
	case errors.Is(err, mongo.ErrNoDocuments):
		return record{}, errNotOwner
	default:
		return record{}, failed(err, "dlock: %s %q", what, key)
	}
}

// acquireShared adds a shared hold, by a compare-and-set on the token
// counter (docs/design.md has why).
func (s *mongoStore) acquireShared(ctx context.Context, a attempt) (record, error) {
	filter := bson.D{
		{Key: "_id", Value: a.key}, {Key: fKind, Value: a.kind}, {Key: fOwner, Value: ""},
		{Key: fToken, Value: int64(a.token)},
		{Key: fN, Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gte", Value: a.limit - a.passing}}}}},
		{Key: "$or", Value: bson.A{bson.D{{Key: fRaw, Value: bson.D{{Key: "$exists", Value: false}}}}, bson.D{{Key: fN, Value: notPositive}}}},
	}
	filter = append(filter, queueGate(a)...)
	t := int64(a.token) + 1
	e := entryDoc{Owner: a.owner, Hold: a.hold, Token: t, TTL: ttlMillis(a.ttl), Data: a.data}
	if a.trace.valid() {
		typ, v, _ := bson.MarshalValue(traceValue(a.trace, a.owner, a.hold)) // a bson.Binary always marshals
		e.TC = bson.RawValue{Type: typ, Value: v}
	}
	update := bson.D{
		{Key: "$set", Value: bson.D{{Key: fToken, Value: t}, {Key: path(fH, a.holdKey()), Value: e}}},
		{Key: "$inc", Value: bson.D{{Key: fN, Value: 1}, {Key: fRev, Value: int64(1)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
		{Key: "$setOnInsert", Value: bson.D{{Key: fRaw, Value: true}}},
	}
	if !a.registered {
		return s.upsert(ctx, a.key, filter, update)
	}
	update = append(update[:len(update)-1], bson.E{Key: "$unset", Value: bson.D{{Key: path(fW, a.holdKey()), Value: ""}, {Key: path(fSleep, a.holdKey()), Value: ""}}})
	r, err := s.modify(ctx, filter, update, "acquire", a.key) // registered: the record exists (see acquire)
	if errors.Is(err, errNotOwner) {
		err = errHeld
	}
	return r, err
}

// register makes a's registration in two writes, so that no other can
// outrun it (as a compare-and-set on the queue counter could be, again
// and again): the first takes the next number of the counter and writes
// a pending entry, with number 0 and marked asleep, which no claim waits
// for; the second numbers that entry, if it is still there, by its exact
// value. While the entry is there the record cannot be pruned, so the
// counter cannot start again between the two.
func (s *mongoStore) register(ctx context.Context, a attempt) (record, error) {
	hk := a.holdKey()
	pending := waiterValue(0, a.ttl, s.epoch())
	update := bson.D{ // a registration is not a hold: it leaves the revision alone
		{Key: "$inc", Value: bson.D{{Key: fQueue, Value: int64(1)}}},
		{Key: "$set", Value: bson.D{{Key: path(fW, hk), Value: pending}, {Key: path(fSleep, hk), Value: int64(0)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
	}
	first, err := s.modify(ctx, bson.D{{Key: "_id", Value: a.key}, kindFilter(a.kind)}, update, "register a waiter for", a.key)
	if errors.Is(err, errNotOwner) {
		return record{}, errHeld
	} else if err != nil {
		return record{}, err
	}
	a.queue = first.Queue - 1
	update = bson.D{{Key: "$set", Value: s.entrySet(a)}} // the counter is there already
	if !a.sleep {
		update = append(update, bson.E{Key: "$unset", Value: bson.D{{Key: path(fSleep, hk), Value: ""}}})
	}
	update = append(update, bson.E{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}})
	r, err := s.modify(ctx, bson.D{{Key: "_id", Value: a.key}, {Key: path(fW, hk), Value: pending}}, update, "register a waiter for", a.key)
	if errors.Is(err, errNotOwner) {
		err = errHeld // cleared while pending
	}
	if err != nil {
		return first, err
	}
	return r, nil
}

func (s *mongoStore) reap(ctx context.Context, key string, at stamp, stale []staleEntry) (bool, error) {
	filter := bson.D{{Key: "_id", Value: key}}
	var update bson.D
	if at.rev != 0 {
		filter = append(filter, stampFilter(at)...)
		update = bson.D{
			{Key: "$set", Value: bson.D{{Key: fOwner, Value: ""}, {Key: fH, Value: bson.D{}}, {Key: fN, Value: 0}}},
			{Key: "$unset", Value: bson.D{{Key: fData, Value: ""}, {Key: fTrace, Value: ""}}},
			{Key: "$inc", Value: bson.D{{Key: fRev, Value: int64(1)}}},
			{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
		}
	} else {
		var unset bson.D
		shared := 0
		for _, e := range stale {
			if e.stored != "" { // a registration: its value as read, whatever it is
				filter = append(filter, bson.E{Key: path(fW, e.key), Value: storedValue(e.stored)})
			} else {
				filter = append(filter, bson.E{Key: path(sub(e.role), e.key, eEpoch), Value: e.epoch})
			}
			if e.role == roleShared {
				filter = append(filter, bson.E{Key: path(fH, e.key, eToken), Value: int64(e.token)})
			}
			unset = append(unset, bson.E{Key: path(sub(e.role), e.key), Value: ""})
			if e.role == roleShared {
				shared++
			} else {
				unset = append(unset, bson.E{Key: path(fSleep, e.key), Value: ""})
			}
		}
		update = bson.D{
			{Key: "$unset", Value: unset},
			{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
		}
		if shared > 0 { // registrations alone are not holds: the revision stays (rule 6 of docs/design.md)
			update = append(update, bson.E{Key: "$inc", Value: bson.D{{Key: fN, Value: -shared}, {Key: fRev, Value: int64(1)}}})
		}
	}
	s.counted(ctx, 1)
	res, err := s.coll.UpdateOne(ctx, filter, update)
	if err != nil {
		return false, failed(err, "dlock: clear stale holds of %q", key)
	}
	return res.MatchedCount == 1, nil
}

// duplicateKey reports whether err says that an upsert found the document
// already there. MongoDB and FerretDB v1 answer DuplicateKey (11000);
// FerretDB v2 answers a findAndModify upsert with code 1, InternalError,
// carrying PostgreSQL's unique-violation message (its plain update and
// insert upserts do answer 11000).
func duplicateKey(err error) bool {
	if mongo.IsDuplicateKeyError(err) {
		return true
	}
	var se mongo.ServerError
	return errors.As(err, &se) && se.HasErrorCodeWithMessage(1, "duplicate key value violates unique constraint")
}

func (s *mongoStore) handoff(ctx context.Context, ref leaseRef, next attempt) (record, error) {
	set := bson.D{{Key: fTTL, Value: ttlMillis(next.ttl)}, {Key: fHold, Value: next.hold}}
	if next.data != nil {
		set = append(set, bson.E{Key: fData, Value: next.data})
	}
	update := bson.D{
		{Key: "$set", Value: set},
		{Key: "$inc", Value: bson.D{{Key: fToken, Value: int64(1)}, {Key: fRev, Value: int64(1)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
	}
	if next.data == nil {
		update = withOp(update, "$unset", bson.E{Key: fData, Value: ""})
	}
	update = traced(update, next.trace, ref.owner, next.hold)
	if ref.raw {
		// The counter is at most ref.token while ref holds the key, base
		// written or not: one above it is the next token either way.
		update[1].Value = bson.D{{Key: fRev, Value: int64(1)}}
		update = withOp(withOp(update, "$unset", bson.E{Key: fRaw, Value: ""}), "$max", bson.E{Key: fToken, Value: int64(ref.token) + 1})
	}
	return s.modify(ctx, append(held(ref), queueGate(next)...), update, "hand off", ref.key)
}

func (s *mongoStore) extend(ctx context.Context, refs []leaseRef) ([]bool, error) {
	models := make([]mongo.WriteModel, len(refs))
	for i, ref := range refs {
		models[i] = mongo.NewUpdateOneModel().SetFilter(held(ref)).SetUpdate(based(s.extension(ref), ref))
	}
	matched, err := s.bulkWrite(ctx, models)
	if err != nil {
		return nil, failed(err, "dlock: extend %s", count(len(refs), "lease"))
	}
	ok := make([]bool, len(refs))
	if matched == int64(len(refs)) {
		for i := range ok {
			ok[i] = true
		}
		return ok, nil
	}
	// Some were not matched: find which of them this owner still holds.
	keys := make([]string, len(refs))
	for i, ref := range refs {
		keys[i] = ref.key
	}
	now, err := s.readMany(ctx, keys)
	if err != nil {
		return nil, err
	}
	for i, ref := range refs {
		ok[i] = now[i].holds(ref)
	}
	return ok, nil
}

// queueAtMost matches a record whose queue counter is at most q (absent
// in a record no one has queued on).
func queueAtMost(q int64) bson.E {
	return bson.E{Key: fQueue, Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: q}}}}}
}

// registration is the $set of a's registration with queue number
// a.queue+1, which also becomes the queue counter.
func (s *mongoStore) registration(a attempt) bson.D {
	return append(bson.D{{Key: fQueue, Value: a.queue + 1}}, s.entrySet(a)...)
}

// entrySet is the $set of a's entry with queue number a.queue+1, and of its
// mark if a.sleep.
func (s *mongoStore) entrySet(a attempt) bson.D {
	q := a.queue + 1
	set := bson.D{{Key: path(fW, a.holdKey()), Value: waiterValue(q, a.ttl, s.epoch())}}
	if a.sleep {
		set = append(set, bson.E{Key: path(fSleep, a.holdKey()), Value: q})
	}
	return set
}

func (s *mongoStore) mark(ctx context.Context, ref leaseRef, sleep bool) (record, error) {
	e := bson.E{Key: path(fSleep, holdKey(ref.owner, ref.hold)), Value: int64(ref.token)}
	op := "$set"
	if !sleep {
		op, e.Value = "$unset", ""
	}
	update := bson.D{ // a registration is not a hold: its mark leaves the revision alone
		{Key: op, Value: bson.D{e}},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
	}
	return s.modify(ctx, held(ref), update, "mark a waiter of", ref.key)
}

func (s *mongoStore) requeue(ctx context.Context, ref leaseRef, next attempt) (record, error) {
	update := bson.D{
		{Key: "$set", Value: append(bson.D{{Key: fOwner, Value: ""}}, s.registration(next)...)},
		{Key: "$unset", Value: bson.D{{Key: fData, Value: ""}, {Key: fTrace, Value: ""}}},
		{Key: "$inc", Value: bson.D{{Key: fRev, Value: int64(1)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
	}
	return s.modify(ctx, append(held(ref), queueAtMost(next.queue)), based(update, ref), "release and requeue", ref.key)
}

func (s *mongoStore) release(ctx context.Context, ref leaseRef) error {
	s.counted(ctx, 1)
	res, err := s.coll.UpdateOne(ctx, held(ref), based(ending(ref), ref))
	switch {
	case err != nil:
		return failed(err, "dlock: release %q", ref.key)
	case res.MatchedCount == 0:
		return errNotOwner
	}
	return nil
}

func (s *mongoStore) setData(ctx context.Context, ref leaseRef, data []byte) error {
	update := bson.D{
		{Key: "$set", Value: bson.D{{Key: fData, Value: data}}},
		{Key: "$inc", Value: bson.D{{Key: fRev, Value: int64(1)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
	}
	s.counted(ctx, 1)
	res, err := s.coll.UpdateOne(ctx, held(ref), based(update, ref))
	switch {
	case err != nil:
		return failed(err, "dlock: set the data of %q", ref.key)
	case res.MatchedCount == 0:
		return errNotOwner
	}
	return nil
}

func (s *mongoStore) releaseAll(ctx context.Context, refs []leaseRef) error {
	if len(refs) == 0 {
		return nil
	}
	models := make([]mongo.WriteModel, len(refs))
	for i, ref := range refs {
		models[i] = mongo.NewUpdateOneModel().SetFilter(held(ref)).SetUpdate(based(ending(ref), ref))
	}
	if _, err := s.bulkWrite(ctx, models); err != nil {
		return failed(err, "dlock: release %s", count(len(refs), "lease"))
	}
	return nil
}

// bulkWrite applies independent updates (or deletes) in one command, or
// in as few as the server handles well, and returns how many documents
// matched (or were deleted).
func (s *mongoStore) bulkWrite(ctx context.Context, models []mongo.WriteModel) (matched int64, err error) {
	limit := len(models)
	if limit > ferretBatch {
		if limit, err = s.batchLimit(ctx, limit); err != nil {
			return 0, err
		}
	}
	unordered := options.BulkWrite().SetOrdered(false)
	for len(models) > 0 {
		n := min(limit, len(models))
		s.counted(ctx, 1)
		res, err := s.coll.BulkWrite(ctx, models[:n], unordered)
		if err != nil {
			return matched, err
		}
		matched += res.MatchedCount + res.DeletedCount
		models = models[n:]
	}
	return matched, nil
}

// batchLimit returns how many statements to put in one command, asking
// the server what it is the first time: [ferretBatch] on FerretDB v1 (its
// buildInfo has ferretdbVersion), n elsewhere. FerretDB v2 (buildInfo
// ferretdb.version) runs on PostgreSQL with DocumentDB and takes big
// commands whole, as MongoDB does.
func (s *mongoStore) batchLimit(ctx context.Context, n int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.maxBatch < 0 {
		s.counted(ctx, 1)
		var info buildInfo
		err := s.coll.Database().RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&info)
		if err != nil {
			return 0, fmt.Errorf("buildInfo: %w", err)
		}
		s.maxBatch = 0
		if info.ferretV1() {
			s.maxBatch = ferretBatch
		}
	}
	if s.maxBatch == 0 {
		return n, nil
	}
	return s.maxBatch, nil
}

// ferretV1 reports whether the server is FerretDB v1 (see batchLimit),
// asking it the first time.
func (s *mongoStore) ferretV1(ctx context.Context) (bool, error) {
	n, err := s.batchLimit(ctx, ferretBatch+1)
	return n == ferretBatch, err
}

// buildInfo is what dlock reads of the buildInfo reply. FerretDB v1 names
// itself in ferretdbVersion; FerretDB v2 in ferretdb.version, and needs no
// cap, so it is not read.
type buildInfo struct {
	FerretDBVersion string `bson:"ferretdbVersion"`
}

func (b buildInfo) ferretV1() bool { return b.FerretDBVersion != "" }

func (s *mongoStore) abandon(ctx context.Context, a attempt) error {
	s.counted(ctx, 1)
	filter := bson.D{{Key: "_id", Value: a.key}, {Key: fOwner, Value: a.owner}, {Key: fHold, Value: a.hold}}
	update := free
	if a.shared {
		ref := leaseRef{key: a.key, owner: a.owner, hold: a.hold, role: roleShared}
		filter = bson.D{{Key: "_id", Value: a.key}, {Key: path(fH, a.holdKey()), Value: bson.D{{Key: "$exists", Value: true}}}}
		update = ending(ref)
	}
	_, err := s.coll.UpdateOne(ctx, filter, update)
	if err != nil {
		return failed(err, "dlock: abandon %q", a.key)
	}
	return nil
}

func (s *mongoStore) floor(ctx context.Context) (Token, error) {
	f, ok, err := s.readFloor(ctx, floorID)
	if err != nil || ok {
		return f, err
	}
	// No floor document at "": the collection was never pruned, or only
	// by a dlock that kept the floor at _id 0. Copy that one (0 when it
	// is missing too), once, so that every later read finds the floor by
	// its string _id.
	old, _, err := s.readFloor(ctx, oldFloorID)
	if err != nil {
		return 0, err
	}
	return old, s.maxFloor(ctx, old)
}

// readFloor reads the floor document with _id id; ok=false when there is
// none.
func (s *mongoStore) readFloor(ctx context.Context, id any) (f Token, ok bool, err error) {
	s.counted(ctx, 1)
	var d struct {
		Floor int64 `bson:"floor"`
	}
	err = s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d)
	switch {
	case err == nil:
		return Token(d.Floor), true, nil
	case errors.Is(err, mongo.ErrNoDocuments):
		return 0, false, nil
	default:
		return 0, false, failed(err, "dlock: read the floor")
	}
}

// pruneIndexName names the index of Prune's query (pruneIndex).
const pruneIndexName = "dlock_prune"

// pruneIndex is the index that answers Prune's query (idle) without a
// scan of the collection: the free documents (owner "", its partial
// filter) by their last write, at. That query's filter has owner "", so
// it implies the partial filter, and a range on at, and it sorts by at:
// MongoDB (4.4 and later) answers it with a scan of the index from its
// start to the cutoff, fetching each document to check n, w and raw, and
// no sort stage. Partial, because then only the writes that move a
// document into or out of the free set (a release, an acquire) touch it,
// not a held document's extensions, which set at too; and it holds only
// the free documents.
func pruneIndex() mongo.IndexModel {
	return mongo.IndexModel{
		Keys: bson.D{{Key: fAt, Value: 1}},
		Options: options.Index().SetName(pruneIndexName).
			SetPartialFilterExpression(bson.D{{Key: fOwner, Value: ""}}),
	}
}

// ensurePruneIndex creates pruneIndex, with one command on the store's
// first Prune (MongoDB answers at once when the index exists). A server's
// refusal (FerretDB v1, which has no partial indexes; a user without the
// createIndex privilege; another index of that name) is recorded on ctx's
// span and not asked again: Prune works without the index, its query a
// scan of the collection. An error that may go away (transient, or the
// end of ctx) leaves the index to the next Prune.
func (s *mongoStore) ensurePruneIndex(ctx context.Context) {
	if s.pruneIndexed.Load() {
		return
	}
	s.counted(ctx, 1)
	_, err := s.coll.Indexes().CreateOne(ctx, pruneIndex())
	if err != nil {
		if transient(err) || ctx.Err() != nil {
			return
		}
		trace.SpanFromContext(ctx).RecordError(failed(err, "dlock: prune without the index %s", pruneIndexName))
	}
	s.pruneIndexed.Store(true)
}

// idle reads prunable documents last written at cutoff or before, oldest
// first: the order of pruneIndex, so that the server reads them from it.
func (s *mongoStore) idle(ctx context.Context, cutoff time.Time, limit int) ([]idleRecord, error) {
	s.ensurePruneIndex(ctx)
	s.counted(ctx, 1)
	cur, err := s.coll.Find(ctx, append(prunable(), bson.E{Key: fAt, Value: bson.D{{Key: "$lte", Value: cutoff}}}),
		options.Find().SetProjection(bson.D{{Key: fToken, Value: 1}, {Key: fRev, Value: 1}}).
			SetSort(bson.D{{Key: fAt, Value: 1}}).SetLimit(int64(limit)))
	if err != nil {
		return nil, failed(err, "dlock: find idle keys")
	}
	var docs []struct {
		ID    string `bson:"_id"`
		Token int64  `bson:"token"`
		Rev   int64  `bson:"rev"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return nil, failed(err, "dlock: find idle keys")
	}
	recs := make([]idleRecord, len(docs))
	for i, d := range docs {
		recs[i] = idleRecord{key: d.ID, token: Token(d.Token), rev: d.Rev}
	}
	return recs, nil
}

func (s *mongoStore) raiseFloor(ctx context.Context, t Token) error {
	s.counted(ctx, 1)
	res, err := s.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: floorID}}, bson.D{{Key: "$max", Value: bson.D{{Key: fFloor, Value: int64(t)}}}})
	switch {
	case err != nil:
		return failed(err, "dlock: raise the floor")
	case res.MatchedCount == 1:
		return nil
	}
	// No floor document yet: create it from the old one first (floor), so
	// that it never stands below a floor raised at the old _id.
	if _, err := s.floor(ctx); err != nil {
		return err
	}
	return s.maxFloor(ctx, t)
}

// maxFloor raises the floor document to at least t, creating it if need be.
//
// The upsert's filter matches only a floor below t, never the floor's _id
// alone: FerretDB v2 (DocumentDB 0.107) runs an upsert filtered on _id
// alone as an insert that, when the _id exists by then, replaces the
// document with no error, and so could put a racing raise's higher floor
// back down, and a pruned key then repeat tokens. With the condition, a
// raise that finds the floor at t or above, or created meanwhile, fails
// to insert with a duplicate key, as on every server; it then raises the
// floor that exists, by a plain update, which matches nothing when the
// floor is at t already.
func (s *mongoStore) maxFloor(ctx context.Context, t Token) error {
	filter, update := floorRaise(t)
	s.counted(ctx, 1)
	_, err := s.coll.UpdateOne(ctx, filter, update, options.UpdateOne().SetUpsert(true))
	if duplicateKey(err) {
		s.counted(ctx, 1)
		_, err = s.coll.UpdateOne(ctx, filter, update)
	}
	if err != nil {
		return failed(err, "dlock: raise the floor")
	}
	return nil
}

// floorRaise is the filter and update that raise the floor to t: they
// match a floor document below t (or with none).
func floorRaise(t Token) (filter, update bson.D) {
	filter = bson.D{{Key: "_id", Value: floorID}, {Key: fFloor, Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gte", Value: int64(t)}}}}}}
	return filter, bson.D{{Key: "$max", Value: bson.D{{Key: fFloor, Value: int64(t)}}}}
}

// prunable matches a record that Prune may delete (record.prunable).
func prunable() bson.D {
	return bson.D{{Key: fOwner, Value: ""}, {Key: fN, Value: notPositive}, {Key: fW, Value: emptyOrNone}, {Key: fRaw, Value: bson.D{{Key: "$exists", Value: false}}}}
}

func (s *mongoStore) remove(ctx context.Context, recs []idleRecord) (int, error) {
	if len(recs) == 0 {
		return 0, nil
	}
	models := make([]mongo.WriteModel, len(recs))
	for i, d := range recs {
		filter := append(bson.D{{Key: "_id", Value: d.key}, {Key: fRev, Value: d.rev}, {Key: fToken, Value: int64(d.token)}}, prunable()...)
		models[i] = mongo.NewDeleteOneModel().SetFilter(filter)
	}
	n, err := s.bulkWrite(ctx, models)
	if err != nil {
		return int(n), failed(err, "dlock: delete %s", count(len(recs), "idle key"))
	}
	return int(n), nil
}

// readBatch is the most keys readMany asks for in one find: the reply of a
// thousand documents with queues of a few waiters each stays well under
// the 16 MB of one reply batch.
const readBatch = 1000

func (s *mongoStore) readMany(ctx context.Context, keys []string) ([]record, error) {
	recs := make([]record, len(keys))
	for start := 0; start < len(keys); start += readBatch {
		batch := keys[start:min(start+readBatch, len(keys))]
		s.counted(ctx, 1)
		// A batch bigger than the reply: a full one leaves the cursor open,
		// and costs a getMore.
		opts := options.Find().SetBatchSize(int32(len(batch) + 1))
		cur, err := s.coll.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: batch}}}}, opts)
		if err != nil {
			return nil, failed(err, "dlock: read %s", count(len(keys), "key"))
		}
		var docs []struct {
			ID  string  `bson:"_id"`
			Doc lockDoc `bson:",inline"` // named: the driver skips an embedded unexported type
		}
		if err := cur.All(ctx, &docs); err != nil {
			return nil, failed(err, "dlock: read %s", count(len(keys), "key"))
		}
		byKey := make(map[string]record, len(docs))
		for _, d := range docs {
			byKey[d.ID] = d.Doc.record()
		}
		for i, k := range batch {
			recs[start+i] = byKey[k]
		}
	}
	return recs, nil
}

func (s *mongoStore) read(ctx context.Context, key string) (record, error) {
	s.counted(ctx, 1)
	var d lockDoc
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&d)
	switch {
	case err == nil:
		return d.record(), nil
	case errors.Is(err, mongo.ErrNoDocuments):
		return record{}, nil
	default:
		return record{}, failed(err, "dlock: read %q", key)
	}
}

func (s *mongoStore) serverTime(ctx context.Context) (time.Time, bool, error) {
	s.counted(ctx, 1)
	var reply struct {
		LocalTime time.Time `bson:"localTime"`
	}
	err := s.coll.Database().RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&reply)
	if err != nil {
		return time.Time{}, false, failed(err, "dlock: read server time")
	}
	return reply.LocalTime, !reply.LocalTime.IsZero(), nil
}

// transient reports whether err may go away by itself: the network, a
// timeout, a primary stepping down, a server that gave up on a command at
// a deadline of its own. Other errors (bad credentials, a rejected
// command) are returned to the caller at once.
func transient(err error) bool {
	var le mongo.LabeledError
	return errors.Is(err, errUnreachable) || mongo.IsNetworkError(err) || mongo.IsTimeout(err) ||
		(errors.As(err, &le) && (le.HasErrorLabel("RetryableWriteError") || le.HasErrorLabel("TransientTransactionError"))) ||
		serverDeadline(err)
}

// serverDeadline reports whether err is a server's reply that it gave up
// on the command at a deadline of its own: FerretDB, under load, answers
// code 1, InternalError, with a message that ends with the Go context's
// error, "context deadline exceeded". Like a lost reply, the command may
// or may not have applied. Only a server's reply with that code matches:
// the end of the caller's own context is no server error, and is not
// taken for this one.
func serverDeadline(err error) bool {
	var se mongo.ServerError
	return errors.As(err, &se) && se.HasErrorCodeWithMessage(1, "context deadline exceeded")
}

// failed is the error of a store operation that failed with the driver's
// error err: what the store was doing (format and args, as for [errorf])
// and err, wrapped, told as briefly as [brief] tells it. Every driver error
// that leaves the store goes through it.
func failed(err error, format string, args ...any) error {
	return errorf(format+": %w", append(args, brief(err))...)
}

// brief returns err as it is, or, when it is or wraps a server selection
// error, an error that wraps it (for [errors.As] and the driver's
// predicates) but tells it in a line: the driver's own error, and each
// server's address, type (unless Unknown) and last error, without the
// topology description that the driver's message spells out in full.
func brief(err error) error {
	var sel topology.ServerSelectionError
	if !errors.As(err, &sel) {
		return err
	}
	short := "server selection error"
	if sel.Wrapped != nil {
		short += ": " + sel.Wrapped.Error()
	}
	servers := make([]string, 0, len(sel.Desc.Servers))
	for _, sv := range sel.Desc.Servers {
		s := string(sv.Addr)
		if sv.Kind != description.Unknown { // a server out of reach is of type Unknown
			s += " (" + sv.Kind.String() + ")"
		}
		if sv.LastError != nil {
			s += ": " + sv.LastError.Error()
		}
		servers = append(servers, s)
	}
	if len(servers) > 0 {
		short += " [" + strings.Join(servers, "; ") + "]"
	}
	return &wrapError{msg: strings.Replace(err.Error(), sel.Error(), short, 1), err: err}
}

// unanswered reports whether err is the driver's failure to select a
// server: the command was not sent, and err says why each server was out
// of reach, even when ctx's end cut the selection short (WaitError keeps
// it as the wait's last error).
func unanswered(err error) bool {
	var sel topology.ServerSelectionError
	return errors.As(err, &sel)
}

// count is n things, in words: "1 lease", "2 leases".
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return strconv.Itoa(n) + " " + thing + "s"
}

func (s *mongoStore) acquireAll(ctx context.Context, as []attempt) ([]bool, error) {
	limit, applied := len(as), 0
	if limit > ferretBatch {
		var err error
		if limit, err = s.batchLimit(ctx, limit); err != nil {
			return nil, failed(err, "dlock: acquire %s", count(len(as), "key"))
		}
	}
	models := make([]mongo.WriteModel, limit)
	for i, a := range as[:limit] {
		a.registered, a.shared, a.spare = false, false, false
		filter, update := exclusiveAcquire(a, stamp{})
		models[i] = mongo.NewUpdateOneModel().SetFilter(filter).SetUpdate(update).SetUpsert(true)
	}
	took := make([]bool, limit)
	// Ordered: the statements apply in order and the first that fails
	// ends the command, so the keys taken are a prefix of as. (FerretDB v1
	// ends an unordered one there too, while it reports the statements
	// after it as applied.)
	s.counted(ctx, 1)
	_, err := s.coll.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(true))
	var bwe mongo.BulkWriteException
	switch {
	case err == nil:
		applied = limit
	case errors.As(err, &bwe) && bwe.WriteConcernError == nil && len(bwe.WriteErrors) == 1:
		// The statement that failed did not apply: a duplicate key (its
		// filter missed a record that exists: held, or waited for) or
		// another refusal of that statement alone. FerretDB v1 names the
		// wrong statement (the first, whichever failed): there, any of the
		// command's may have applied.
		applied = bwe.WriteErrors[0].Index
		if v1, err := s.ferretV1(ctx); err != nil || v1 {
			applied = limit
		}
	default:
		return nil, failed(err, "dlock: acquire %s", count(len(as), "key"))
	}
	for i := range applied {
		took[i] = true
	}
	return took, nil
}

// holdProjection leaves out of a record what readAll does not return
// (record.holdOnly), so that a reply for many keys stays small.
var holdProjection = bson.D{{Key: fH, Value: 0}, {Key: fW, Value: 0}, {Key: fData, Value: 0}, {Key: fTrace, Value: 0}}

func (s *mongoStore) readAll(ctx context.Context, keys []string) ([]record, Token, error) {
	ids := make(bson.A, 0, len(keys)+1)
	for _, k := range keys {
		ids = append(ids, k)
	}
	ids = append(ids, floorID) // the floor, in the same command
	s.counted(ctx, 1)
	// A batch bigger than the reply: a full one leaves the cursor open,
	// and costs a getMore.
	opts := options.Find().SetProjection(holdProjection).SetBatchSize(int32(len(ids) + 1))
	cur, err := s.coll.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}}, opts)
	if err != nil {
		return nil, 0, failed(err, "dlock: read %s", count(len(keys), "key"))
	}
	var docs []struct {
		ID    string  `bson:"_id"`
		Floor int64   `bson:"floor"`
		Doc   lockDoc `bson:",inline"` // named: the driver skips an embedded unexported type
	}
	if err := cur.All(ctx, &docs); err != nil {
		return nil, 0, failed(err, "dlock: read %s", count(len(keys), "key"))
	}
	byKey := make(map[string]record, len(docs))
	var floor Token
	hasFloor, raw := false, false
	for _, d := range docs {
		if d.ID == floorID {
			floor, hasFloor = Token(d.Floor), true
			continue
		}
		byKey[d.ID] = d.Doc.record().holdOnly()
		raw = raw || d.Doc.Raw
	}
	recs := make([]record, len(keys))
	for i, k := range keys {
		recs[i] = byKey[k]
	}
	if raw && !hasFloor { // never read at its string _id yet: see floor
		if floor, err = s.floor(ctx); err != nil {
			return nil, 0, err
		}
	}
	return recs, floor, nil
}
