package dlock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// FenceField is the field in which [UpdateFenced] and [UpsertFenced]
// record, on the user's document, the highest fencing token that has
// written to it.
const FenceField = "_dlockFence"

// UpdateFenced applies update (an update document such as
// bson.D{{"$set", ...}}) to the one document matched by filter, in a
// single round trip, only if t is at least the highest token recorded on
// that document, and records t there in [FenceField]. Once the document has
// seen a token, an older token changes nothing and gets a
// [*StaleTokenError] (matching [ErrStaleToken]); finding out which of the
// two reasons made the write miss costs a second round trip. A filter that
// matches no document returns an error matching [mongo.ErrNoDocuments]; use
// [UpsertFenced] to create the document on first use.
//
// The update must be a document of update operators, not an aggregation
// pipeline, and must not itself write [FenceField] or use $max on it; and
// t must not be 0, which no hold has. Otherwise UpdateFenced returns an
// error matching [ErrInvalidOption] and sends nothing.
func UpdateFenced(ctx context.Context, coll *mongo.Collection, filter, update any, t Token) (*mongo.UpdateResult, error) {
	w, err := newFencedWrite("fenced update", coll, filter, update, t)
	if err != nil {
		return nil, err
	}
	res, err := coll.UpdateOne(ctx, w.guarded, w.update)
	if err != nil {
		return nil, failed(err, "dlock: fenced update")
	}
	if res.MatchedCount == 1 {
		return res, nil
	}
	return nil, w.missed(ctx, coll)
}

// FindFenced reads the one document matched by filter and, in the same
// round trip, raises its fence to t: it returns the document (after the
// raise) only if t is at least the highest token recorded on it, and from
// then on the document refuses every older token. A read-modify-write
// needs it: read with FindFenced, then write with [UpdateFenced]. A plain
// read is not enough: a holder paused past its lease between its own read
// and write can wake after the next holder's plain read, and its write,
// still admitted because no newer token has reached the document, lands
// between that read and the next holder's write, which then overwrites it
// (a lost update; the fence only orders writes). After FindFenced, that
// late write is refused.
//
// A document that has seen a higher token is not returned: FindFenced
// returns a [*StaleTokenError] (matching [ErrStaleToken]), at the cost of
// a second round trip. A filter that matches no document returns an error
// matching [mongo.ErrNoDocuments], and raises no fence: a paused
// holder's late [UpsertFenced] can then still create the document after
// the read, and be overwritten. A read-modify-write whose document may not
// exist yet should create it first (an UpsertFenced whose update sets the
// initial value with $setOnInsert, which also raises the fence,
// or an insert that ignores a duplicate key) and then read it with
// FindFenced. Readers that share a key (an
// [RWMutex]'s) and do not write should read as usual: raising the fence
// for one reader's token would refuse a concurrent reader's older one.
//
// A token of 0, which no hold has, returns an error matching
// [ErrInvalidOption] with nothing sent. ctx bounds the round trips; after
// an error from the network or ctx, the fence may or may not have been
// raised.
func FindFenced(ctx context.Context, coll *mongo.Collection, filter any, t Token) (bson.Raw, error) {
	w, err := newFencedWrite("fenced find", coll, filter, bson.D{}, t)
	if err != nil {
		return nil, err
	}
	after := options.FindOneAndUpdate().SetReturnDocument(options.After)
	d, err := coll.FindOneAndUpdate(ctx, w.guarded, w.update, after).Raw()
	switch {
	case err == nil:
		return d, nil
	case !errors.Is(err, mongo.ErrNoDocuments):
		return nil, failed(err, "dlock: fenced find")
	}
	return nil, w.missed(ctx, coll)
}

// upsertAttempts bounds the attempts of [UpsertFenced]: without deletes,
// a second attempt always decides (see UpsertFenced); the third covers a
// document deleted meanwhile.
const upsertAttempts = 3

// UpsertFenced is [UpdateFenced] for a document that may not exist yet. It
// applies update to the one document matched by filter if t is at least
// the highest token recorded on it, and records t there in [FenceField];
// if no document matches, it creates one, from the filter's equality
// conditions and the update (as an upsert does), with t recorded. Once the
// document has seen a higher token it changes nothing and returns a
// [*StaleTokenError] (matching [ErrStaleToken]). The result reports an
// update (MatchedCount 1) or a creation (UpsertedCount 1, UpsertedID).
//
// The filter must pin the document's _id by equality at its top level
// ({_id: v} or {_id: {$eq: v}}, beside any other conditions); otherwise
// UpsertFenced returns an error matching [ErrInvalidOption] and sends
// nothing. The _id is what keeps a stale writer from creating a second
// document: when a higher fence makes the guarded filter miss, the upsert
// tries to insert, and the collection's unique _id index refuses it. That
// refusal costs a second round trip to read the fence and report the stale
// token. Two writers that create the document at once end with one
// document: the one whose insert loses reads the other's fence and either
// is stale or writes over it, so the writes admitted are applied in token
// order. If the _id is held by a document the rest of the filter does not
// match, UpsertFenced neither creates nor updates and returns the server's
// duplicate key error, wrapped.
//
// The update and t have the same rules as for [UpdateFenced]. ctx bounds the
// round trips. A stale token or an invalid argument leaves the collection
// unchanged; after an error from the network or ctx, the write may or may
// not have applied.
func UpsertFenced(ctx context.Context, coll *mongo.Collection, filter, update any, t Token) (*mongo.UpdateResult, error) {
	if coll == nil {
		return nil, fmt.Errorf("%w: fenced upsert: nil collection", ErrInvalidOption)
	}
	return upsertFenced(ctx, coll, coll.UpdateOne, filter, update, t)
}

// updateOneFunc is [mongo.Collection.UpdateOne]; tests replace it to play
// an interleaving the server they run on does not produce.
type updateOneFunc func(ctx context.Context, filter, update any, opts ...options.Lister[options.UpdateOneOptions]) (*mongo.UpdateResult, error)

func upsertFenced(ctx context.Context, coll *mongo.Collection, updateOne updateOneFunc, filter, update any, t Token) (*mongo.UpdateResult, error) {
	w, err := newFencedWrite("fenced upsert", coll, filter, update, t)
	if err != nil {
		return nil, err
	}
	i, id, err := pinnedID(w.filter)
	if err != nil {
		return nil, err
	}
	// The guarded filter keeps the filter's top-level elements in place;
	// its _id becomes a plain equality, which every server copies into the
	// document it inserts.
	guarded := append(bson.D(nil), w.guarded...)
	guarded[i].Value = id
	upsert := options.UpdateOne().SetUpsert(true)
	for attempt := 1; ; attempt++ {
		res, err := updateOne(ctx, guarded, w.update, upsert)
		if err == nil {
			return res, nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return nil, failed(err, "dlock: fenced upsert")
		}
		// The filter missed and the insert found the _id taken: by a
		// fence above t, or by a writer that created the document since
		// the filter missed, or by a document the filter does not match.
		stale, rerr := w.stale(ctx, coll)
		switch {
		case stale != nil:
			return nil, stale
		case rerr != nil && !errors.Is(rerr, mongo.ErrNoDocuments):
			return nil, failed(rerr, "dlock: fenced upsert")
		case attempt == upsertAttempts && rerr != nil:
			return nil, failed(err, "dlock: fenced upsert: the filter's _id belongs to a document the filter does not match")
		case attempt == upsertAttempts:
			return nil, failed(err, "dlock: fenced upsert: %d attempts", attempt)
		}
		// Created (or deleted) since the filter missed: the next attempt
		// updates it (or creates it).
	}
}

// A fencedWrite is a user's filter and update made into a write guarded by
// a fencing token.
type fencedWrite struct {
	op      string // for errors: "fenced update", ...
	filter  bson.D // the user's
	guarded bson.D // filter, and t at least the document's fence
	update  bson.D // the user's, with {$max: {FenceField: t}}
	t       Token
}

func newFencedWrite(op string, coll *mongo.Collection, filter, update any, t Token) (*fencedWrite, error) {
	if coll == nil {
		return nil, fmt.Errorf("%w: %s: nil collection", ErrInvalidOption, op)
	}
	if err := validToken(op, t); err != nil {
		return nil, err
	}
	f, err := toDoc(op, "filter", filter)
	if err != nil {
		return nil, err
	}
	u, err := toDoc(op, "update", update)
	if err != nil {
		return nil, err
	}
	if u, err = withFence(op, u, t); err != nil {
		return nil, err
	}
	return &fencedWrite{op: op, filter: f, guarded: guard(f, t), update: u, t: t}, nil
}

// missed tells, after the guarded filter matched nothing, a stale token
// (a [*StaleTokenError]) from a missing document (an error matching
// [mongo.ErrNoDocuments]), with a second round trip.
func (w *fencedWrite) missed(ctx context.Context, coll *mongo.Collection) error {
	stale, err := w.stale(ctx, coll)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return fmt.Errorf("dlock: %s: %w", w.op, mongo.ErrNoDocuments)
	case err != nil:
		return failed(err, "dlock: %s", w.op)
	case stale == nil:
		// The document admits t now: it changed between the two round
		// trips. The operation missed all the same; report it as stale,
		// without a highest token (the one that refused it is gone).
		stale = &StaleTokenError{Token: w.t}
	}
	return stale
}

// stale reads the document the filter matches and returns a
// [*StaleTokenError] if its fence is above t, or nil and the read's error.
func (w *fencedWrite) stale(ctx context.Context, coll *mongo.Collection) (*StaleTokenError, error) {
	var d bson.Raw
	if err := coll.FindOne(ctx, w.filter).Decode(&d); err != nil {
		return nil, err
	}
	if v, ok := d.Lookup(FenceField).AsInt64OK(); ok && Token(v) > w.t {
		return &StaleTokenError{Token: w.t, Highest: Token(v)}, nil
	}
	return nil, nil
}

// guard returns filter and the condition that t is at least the
// document's fence, or that it has none. The condition joins the filter's
// own top-level $and, so that the filter's other conditions stay where the
// server looks for the equalities an upsert copies into the document.
func guard(filter bson.D, t Token) bson.D {
	cond := bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: FenceField, Value: bson.D{{Key: "$lte", Value: int64(t)}}}},
		bson.D{{Key: FenceField, Value: bson.D{{Key: "$exists", Value: false}}}},
	}}}
	g := make(bson.D, 0, len(filter)+1)
	joined := false
	for _, e := range filter {
		if all, ok := e.Value.(bson.A); ok && e.Key == "$and" && !joined {
			e.Value = append(all[:len(all):len(all)], cond)
			joined = true
		}
		g = append(g, e)
	}
	if !joined {
		g = append(g, bson.E{Key: "$and", Value: bson.A{cond}})
	}
	return g
}

// pinnedID returns the index in filter of its top-level _id equality and
// the value it pins, or an error matching [ErrInvalidOption] when there is
// none.
func pinnedID(filter bson.D) (int, any, error) {
	at := -1
	for i, e := range filter {
		if e.Key == "_id" {
			if at >= 0 {
				at = -1
				break
			}
			at = i
		}
	}
	if at < 0 {
		return 0, nil, fmt.Errorf("%w: fenced upsert: the filter must pin _id by one equality at its top level, so that a stale write cannot create a second document", ErrInvalidOption)
	}
	id := filter[at].Value
	if d, ok := id.(bson.D); ok && len(d) == 1 && d[0].Key == "$eq" {
		id = d[0].Value
	}
	bad := false
	switch v := id.(type) {
	case bson.D:
		for _, e := range v {
			bad = bad || strings.HasPrefix(e.Key, "$")
		}
	case bson.A, bson.Regex, bson.Undefined:
		bad = true // not a value an _id can hold, or a match rather than equality
	}
	if bad {
		return 0, nil, fmt.Errorf("%w: fenced upsert: the filter's _id must be an equality, not %v", ErrInvalidOption, filter[at].Value)
	}
	return at, id, nil
}

// toDoc returns v, a filter or an update, as a document. An array (an
// aggregation pipeline, for an update) is an error matching
// [ErrInvalidOption].
func toDoc(op, what string, v any) (bson.D, error) {
	if isArray(v) {
		why := ""
		if what == "update" {
			why = " (pipeline updates are not supported)"
		}
		return nil, fmt.Errorf("%w: %s: the %s is a %T: give a document%s", ErrInvalidOption, op, what, v, why)
	}
	b, err := bson.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("dlock: %s: %s: %w", op, what, err)
	}
	var d bson.D
	if err := bson.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("dlock: %s: %s: %w", op, what, err)
	}
	return d, nil
}

var (
	elemType = reflect.TypeFor[bson.E]()
	rawType  = reflect.TypeFor[bson.Raw]()
)

// isArray reports whether v is a slice or array that does not encode a
// document (bson.D and bson.Raw do).
func isArray(v any) bool {
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		return rv.Type().Elem() != elemType && rv.Type() != rawType
	}
	return false
}

// withFence adds {$max: {FenceField: t}} to update.
func withFence(op string, update bson.D, t Token) (bson.D, error) {
	rec := bson.E{Key: FenceField, Value: int64(t)}
	for i, o := range update {
		if len(o.Key) == 0 || o.Key[0] != '$' {
			return nil, fmt.Errorf("%w: %s: %q is not an update operator", ErrInvalidOption, op, o.Key)
		}
		fields, ok := o.Value.(bson.D)
		if !ok {
			return nil, fmt.Errorf("%w: %s: %s takes a document", ErrInvalidOption, op, o.Key)
		}
		for _, f := range fields {
			if f.Key == FenceField {
				return nil, fmt.Errorf("%w: %s writes %s itself", ErrInvalidOption, op, FenceField)
			}
		}
		if o.Key == "$max" {
			update[i].Value = append(fields, rec)
			return update, nil
		}
	}
	return append(update, bson.E{Key: "$max", Value: bson.D{rec}}), nil
}
