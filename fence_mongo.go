package dlock

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// FenceField is the field in which [UpdateFenced] records, on the user's
// document, the highest fencing token that has written to it.
const FenceField = "_dlockFence"

// UpdateFenced applies update (an update document such as
// bson.D{{"$set", ...}}) to the one document matched by filter, in a
// single round trip, only if t is at least the highest token recorded on
// that document, and records t there in [FenceField]. Once the document has
// seen a token, an older token changes nothing and gets a
// [*StaleTokenError] (matching [ErrStaleToken]); finding out which of the
// two reasons made the write miss costs a second round trip. A filter that
// matches no document returns an error matching [mongo.ErrNoDocuments].
//
// The update must not itself write [FenceField] or use $max on it.
func UpdateFenced(ctx context.Context, coll *mongo.Collection, filter, update any, t Token) (*mongo.UpdateResult, error) {
	if coll == nil {
		return nil, fmt.Errorf("%w: nil collection", ErrInvalidOption)
	}
	f, err := toDoc(filter)
	if err != nil {
		return nil, fmt.Errorf("dlock: fenced update: filter: %w", err)
	}
	u, err := toDoc(update)
	if err != nil {
		return nil, fmt.Errorf("dlock: fenced update: update: %w", err)
	}
	if u, err = withFence(u, t); err != nil {
		return nil, err
	}
	guarded := bson.D{{Key: "$and", Value: bson.A{f, bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: FenceField, Value: bson.D{{Key: "$lte", Value: int64(t)}}}},
		bson.D{{Key: FenceField, Value: bson.D{{Key: "$exists", Value: false}}}},
	}}}}}}
	res, err := coll.UpdateOne(ctx, guarded, u)
	if err != nil {
		return nil, fmt.Errorf("dlock: fenced update: %w", err)
	}
	if res.MatchedCount == 1 {
		return res, nil
	}
	// Missed: tell a stale token from a missing document.
	var d bson.Raw
	switch err := coll.FindOne(ctx, f).Decode(&d); {
	case errors.Is(err, mongo.ErrNoDocuments):
		return nil, fmt.Errorf("dlock: fenced update: %w", mongo.ErrNoDocuments)
	case err != nil:
		return nil, fmt.Errorf("dlock: fenced update: %w", err)
	}
	stale := &StaleTokenError{Token: t}
	if v, ok := d.Lookup(FenceField).AsInt64OK(); ok {
		stale.Highest = Token(v)
	}
	return nil, stale
}

func toDoc(v any) (bson.D, error) {
	b, err := bson.Marshal(v)
	if err != nil {
		return nil, err
	}
	var d bson.D
	err = bson.Unmarshal(b, &d)
	return d, err
}

// withFence adds {$max: {FenceField: t}} to update.
func withFence(update bson.D, t Token) (bson.D, error) {
	rec := bson.E{Key: FenceField, Value: int64(t)}
	for i, op := range update {
		if len(op.Key) == 0 || op.Key[0] != '$' {
			return nil, fmt.Errorf("%w: fenced update: %q is not an update operator", ErrInvalidOption, op.Key)
		}
		fields, ok := op.Value.(bson.D)
		if !ok {
			return nil, fmt.Errorf("%w: fenced update: %s takes a document", ErrInvalidOption, op.Key)
		}
		for _, f := range fields {
			if f.Key == FenceField {
				return nil, fmt.Errorf("%w: fenced update writes %s itself", ErrInvalidOption, FenceField)
			}
		}
		if op.Key == "$max" {
			update[i].Value = append(fields, rec)
			return update, nil
		}
	}
	return append(update, bson.E{Key: "$max", Value: bson.D{rec}}), nil
}
