package dlock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel/trace"
)

// The in-memory store and the MongoDB store implement every conditional
// write twice: once as Go, once as a filter document. This table keeps
// them from disagreeing: each write runs against each document state on
// both stores, and the outcome (the error, and the document after) must
// be the same. States are the ones a write's conditions tell apart: free,
// held, raw, with a registered waiter, with a shared hold.

// tableStates are the document states each write is run against.
func tableStates() map[string]*record {
	hk := func(o string, h int64) string { return holdKey(o, h) }
	return map[string]*record{
		"absent":   nil,
		"free":     {Token: 3, Rev: 5},
		"held":     {Owner: "o1", Hold: 7, Token: 3, Rev: 5, TTL: time.Second},
		"free raw": {Token: 1, Rev: 2, Raw: true},
		"held raw": {Owner: "o1", Hold: 7, Token: 1, Rev: 1, TTL: time.Second, Raw: true},
		// The next life of "held"'s key, held by the same owner: its raw
		// counter shows the token of "held"'s hold (old).
		"next life":   {Owner: "o1", Hold: 12, Token: 3, Rev: 1, TTL: time.Second, Raw: true},
		"free waiter": {Token: 3, Rev: 5, Queue: 1, Waiters: map[string]entry{hk("o2", 9): {Owner: "o2", Hold: 9, TTL: time.Second, Q: 1}}},
		// Two waiters, the first marked asleep or not (the second may pass
		// it only while it is).
		"free, first waiter asleep": {Token: 3, Rev: 5, Queue: 2, Waiters: map[string]entry{
			hk("o2", 9): {Owner: "o2", Hold: 9, TTL: time.Second, Q: 1, Sleep: true}, hk("o6", 3): {Owner: "o6", Hold: 3, TTL: time.Second, Q: 2}}},
		"free, first waiter awake": {Token: 3, Rev: 5, Queue: 2, Waiters: map[string]entry{
			hk("o2", 9): {Owner: "o2", Hold: 9, TTL: time.Second, Q: 1}, hk("o6", 3): {Owner: "o6", Hold: 3, TTL: time.Second, Q: 2, Sleep: true}}},
		"rw shared":     {Kind: kindRW, Token: 3, Rev: 5, Shared: map[string]entry{hk("o3", 4): {Owner: "o3", Hold: 4, Token: 3, TTL: time.Second}}},
		"rw shared raw": {Kind: kindRW, Token: 1, Rev: 1, Raw: true, Shared: map[string]entry{hk("o3", 4): {Owner: "o3", Hold: 4, Token: 1, TTL: time.Second}}},
		"rw free":       {Kind: kindRW, Token: 3, Rev: 5},
		// Holds that stored a trace context (tableTraces).
		"held traced": {Owner: "o1", Hold: 7, Token: 3, Rev: 5, TTL: time.Second, Trace: tableTraces[0]},
		"rw shared traced": {Kind: kindRW, Token: 3, Rev: 5, Shared: map[string]entry{
			hk("o3", 4): {Owner: "o3", Hold: 4, Token: 3, TTL: time.Second, Trace: tableTraces[0]}}},
	}
}

// tableTraces are trace contexts that holds store: one of the states',
// one of the writes'.
var tableTraces = [2]holdTrace{
	{traceID: trace.TraceID{1, 2}, spanID: trace.SpanID{3}, flags: trace.FlagsSampled},
	{traceID: trace.TraceID{4, 5}, spanID: trace.SpanID{6}},
}

// tableWrites are the writes, each as it is sent to a store for key.
func tableWrites() map[string]func(ctx context.Context, s store, key string) (record, error) {
	held := record{Owner: "o1", Hold: 7, Token: 3, Rev: 5}
	shared := record{Kind: kindRW, Token: 3, Rev: 5, Shared: map[string]entry{holdKey("o3", 4): {}}}
	mutex := func(key string) attempt { return attempt{key: key, owner: "o9", hold: 1, ttl: time.Second} }
	reader := func(key string, token Token) attempt {
		return attempt{key: key, owner: "o8", hold: 2, ttl: time.Second, kind: kindRW, shared: true, limit: 1 << 30, token: token}
	}
	writer := func(key string) attempt {
		a := mutex(key)
		a.kind = kindRW
		return a
	}
	removal := func(rev int64, token Token) func(ctx context.Context, s store, key string) (record, error) {
		return func(ctx context.Context, s store, key string) (record, error) {
			n, err := s.remove(ctx, []idleRecord{{key: key, rev: rev, token: token}})
			return record{Rev: int64(n)}, err
		}
	}
	traced := func(a attempt) attempt {
		a.trace = tableTraces[1]
		return a
	}
	return map[string]func(ctx context.Context, s store, key string) (record, error){
		"acquire traced": func(ctx context.Context, s store, key string) (record, error) {
			return s.acquire(ctx, traced(mutex(key)), stamp{})
		},
		"acquire traced, takeover of held": func(ctx context.Context, s store, key string) (record, error) {
			return s.acquire(ctx, traced(mutex(key)), stampOf(held))
		},
		"reader acquire traced at 3": func(ctx context.Context, s store, key string) (record, error) {
			return s.acquire(ctx, traced(reader(key, 3)), stamp{})
		},
		"hand off traced": func(ctx context.Context, s store, key string) (record, error) {
			return s.handoff(ctx, old(key), traced(attempt{key: key, owner: "o1", hold: 8, ttl: time.Second}))
		},
		"remove as read":          removal(5, 3),
		"remove, token of before": removal(5, 2),
		"remove raw":              removal(2, 1),
		"acquire": func(ctx context.Context, s store, key string) (record, error) {
			return s.acquire(ctx, mutex(key), stamp{})
		},
		"acquire, takeover of held": func(ctx context.Context, s store, key string) (record, error) {
			return s.acquire(ctx, mutex(key), stampOf(held))
		},
		"acquire, takeover of another holder": func(ctx context.Context, s store, key string) (record, error) {
			return s.acquire(ctx, mutex(key), stamp{rev: 5, token: 3, owner: "o1", hold: 6})
		},
		"rw writer acquire, takeover of shared": func(ctx context.Context, s store, key string) (record, error) {
			return s.acquire(ctx, writer(key), stampOf(shared))
		},
		"reader acquire at 3": func(ctx context.Context, s store, key string) (record, error) {
			return s.acquire(ctx, reader(key, 3), stamp{})
		},
		"reader acquire at 1": func(ctx context.Context, s store, key string) (record, error) {
			return s.acquire(ctx, reader(key, 1), stamp{})
		},
		"release": func(ctx context.Context, s store, key string) (record, error) {
			return record{}, s.release(ctx, old(key))
		},
		"extend": func(ctx context.Context, s store, key string) (record, error) {
			ok, err := s.extend(ctx, []leaseRef{old(key)})
			return record{Raw: len(ok) == 1 && ok[0]}, err
		},
		"requeue": func(ctx context.Context, s store, key string) (record, error) {
			return s.requeue(ctx, old(key), attempt{key: key, owner: "o1", hold: 8, ttl: time.Second, queue: 1})
		},
		"set data": func(ctx context.Context, s store, key string) (record, error) {
			return record{}, s.setData(ctx, old(key), []byte("d"))
		},
		"hand off": func(ctx context.Context, s store, key string) (record, error) {
			return s.handoff(ctx, old(key), attempt{key: key, owner: "o1", hold: 8, ttl: time.Second})
		},
		"second waiter's acquire past the first": func(ctx context.Context, s store, key string) (record, error) {
			return s.acquire(ctx, second(key, 1), stamp{})
		},
		"second waiter's acquire, the first seen with another number": func(ctx context.Context, s store, key string) (record, error) {
			return s.acquire(ctx, second(key, 4), stamp{})
		},
		"mark the first waiter asleep": func(ctx context.Context, s store, key string) (record, error) {
			return s.mark(ctx, firstWaiter(key), true)
		},
		"mark the first waiter awake": func(ctx context.Context, s store, key string) (record, error) {
			return s.mark(ctx, firstWaiter(key), false)
		},
		"release the first waiter": func(ctx context.Context, s store, key string) (record, error) {
			return record{}, s.release(ctx, firstWaiter(key))
		},
		"register asleep at 2": func(ctx context.Context, s store, key string) (record, error) {
			return s.register(ctx, attempt{key: key, owner: "o5", hold: 2, ttl: time.Second, queue: 2, sleep: true})
		},
		"register at 0": func(ctx context.Context, s store, key string) (record, error) {
			return s.register(ctx, attempt{key: key, owner: "o5", hold: 2, ttl: time.Second})
		},
		"release, raw ref": func(ctx context.Context, s store, key string) (record, error) {
			return record{}, s.release(ctx, rawRef(key))
		},
		"extend, raw ref": func(ctx context.Context, s store, key string) (record, error) {
			ok, err := s.extend(ctx, []leaseRef{rawRef(key)})
			return record{Raw: len(ok) == 1 && ok[0]}, err
		},
		"requeue, raw ref": func(ctx context.Context, s store, key string) (record, error) {
			return s.requeue(ctx, rawRef(key), attempt{key: key, owner: "o1", hold: 8, ttl: time.Second})
		},
		"set data, raw ref": func(ctx context.Context, s store, key string) (record, error) {
			return record{}, s.setData(ctx, rawRef(key), []byte("d"))
		},
		"hand off, raw ref": func(ctx context.Context, s store, key string) (record, error) {
			return s.handoff(ctx, rawRef(key), attempt{key: key, owner: "o1", hold: 8, ttl: time.Second})
		},
		"release, raw shared ref": func(ctx context.Context, s store, key string) (record, error) {
			return record{}, s.release(ctx, rawShared(key))
		},
		"extend, raw shared ref": func(ctx context.Context, s store, key string) (record, error) {
			ok, err := s.extend(ctx, []leaseRef{rawShared(key)})
			return record{Raw: len(ok) == 1 && ok[0]}, err
		},
		"reap takeover of shared": func(ctx context.Context, s store, key string) (record, error) {
			ok, err := s.reap(ctx, key, stampOf(shared), nil)
			return record{Raw: ok}, err
		},
	}
}

// firstWaiter names the registration of "o2" in the states with waiters;
// second is the attempt of the registration of "o6", which saw o2's
// registration with queue number q ahead of it.
func firstWaiter(key string) leaseRef {
	return leaseRef{key: key, owner: "o2", hold: 9, token: 1, ttl: time.Second, role: roleWaiter}
}

func second(key string, q int64) attempt {
	return attempt{key: key, owner: "o6", hold: 3, ttl: time.Second, registered: true, number: 2, ahead: map[string]int64{holdKey("o2", 9): q}}
}

// old names the hold of the state "held", which wrote its base: in the
// state "next life" it is a hold of an earlier life of the key.
func old(key string) leaseRef {
	return leaseRef{key: key, owner: "o1", hold: 7, token: 3, ttl: time.Second}
}

// rawRef and rawShared name the holds of the states "held raw" and "rw
// shared raw" as a hold made on a raw record does, with a token counted
// from a floor of 9 (leaseRef.raw).
func rawRef(key string) leaseRef {
	return leaseRef{key: key, owner: "o1", hold: 7, token: 10, ttl: time.Second, raw: true}
}

func rawShared(key string) leaseRef {
	return leaseRef{key: key, owner: "o3", hold: 4, token: 10, ttl: time.Second, role: roleShared, raw: true}
}

// seedDoc is the document a mongoStore keeps for r.
func seedDoc(key string, r record) bson.D {
	d := bson.D{{Key: "_id", Value: key}, {Key: fOwner, Value: r.Owner}, {Key: fToken, Value: int64(r.Token)},
		{Key: fRev, Value: r.Rev}, {Key: fTTL, Value: ttlMillis(r.TTL)}, {Key: fHold, Value: r.Hold}, {Key: fAt, Value: time.Now()}}
	if r.Raw {
		d = append(d, bson.E{Key: fRaw, Value: true})
	}
	if r.Kind != "" {
		d = append(d, bson.E{Key: fKind, Value: r.Kind})
	}
	if r.Trace.valid() {
		d = append(d, bson.E{Key: fTrace, Value: traceValue(r.Trace, r.Owner, r.Hold)})
	}
	if len(r.Shared) > 0 {
		h := bson.D{}
		for k, e := range r.Shared {
			ed := bson.D{{Key: "o", Value: e.Owner}, {Key: fHold, Value: e.Hold}, {Key: eToken, Value: int64(e.Token)}, {Key: fTTL, Value: ttlMillis(e.TTL)}, {Key: eEpoch, Value: e.Epoch}}
			if e.Trace.valid() {
				ed = append(ed, bson.E{Key: fTrace, Value: traceValue(e.Trace, e.Owner, e.Hold)})
			}
			h = append(h, bson.E{Key: k, Value: ed})
		}
		d = append(d, bson.E{Key: fN, Value: int32(len(r.Shared))}, bson.E{Key: fH, Value: h})
	}
	if len(r.Waiters) > 0 {
		w := bson.D{}
		z := bson.D{}
		for k, e := range r.Waiters {
			w = append(w, bson.E{Key: k, Value: waiterValue(e.Q, e.TTL, e.Epoch)})
			if e.Sleep {
				z = append(z, bson.E{Key: k, Value: e.Q})
			}
		}
		d = append(d, bson.E{Key: fW, Value: w}, bson.E{Key: fQueue, Value: r.Queue}, bson.E{Key: fSleep, Value: z})
	}
	return d
}

// outcome describes what a write did: its error's kind, its reply and the
// document after it, without what the stores may choose freely (stamps,
// epochs of registrations, the stored form of a registration).
func outcome(reply record, err error, after record) string {
	kind := "ok"
	switch {
	case errors.Is(err, errHeld):
		kind = "errHeld"
	case errors.Is(err, errNotOwner):
		kind = "errNotOwner"
	case err != nil:
		kind = "error: " + err.Error()
	}
	return kind + " reply " + describe(reply) + " after " + describe(after)
}

func describe(r record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{owner %q hold %d token %d rev %d raw %v kind %q queue %d data %q trace %v", r.Owner, r.Hold, r.Token, r.Rev, r.Raw, r.Kind, r.Queue, r.Data, r.Trace)
	for _, k := range slices.Sorted(maps.Keys(r.Shared)) {
		e := r.Shared[k]
		fmt.Fprintf(&b, " h[%s]{%s %d t%d e%d trace %v}", k, e.Owner, e.Hold, e.Token, e.Epoch, e.Trace)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Waiters)) {
		fmt.Fprintf(&b, " w[%s]{q%d sleep %v}", k, r.Waiters[k].Q, r.Waiters[k].Sleep)
	}
	return b.String() + "}"
}

func TestStoresAgreeOnEveryWrite(t *testing.T) {
	ctx := context.Background()
	coll := newColl(t)
	ms := newMongoStore(coll, func(context.Context, int) {})
	i := 0
	for sname, state := range tableStates() {
		for wname, write := range tableWrites() {
			t.Run(sname+"/"+wname, func(t *testing.T) {
				i++
				key := fmt.Sprint("k", i)
				mem := newMemStore()
				if state != nil {
					mem.records[key] = state.clone()
					if _, err := coll.InsertOne(ctx, seedDoc(key, *state)); err != nil {
						t.Fatal(err)
					}
				}
				mr, merr := write(ctx, mem, key)
				mafter, _ := mem.read(ctx, key)
				sr, serr := write(ctx, ms, key)
				safter, err := ms.read(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if m, s := outcome(mr, merr, mafter), outcome(sr, serr, safter); m != s {
					t.Errorf("the stores disagree\nmemory: %s\nserver: %s", m, s)
				}
			})
		}
	}
}
