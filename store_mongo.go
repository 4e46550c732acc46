package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// Field names of a lock document: {_id: key, owner, token, rev, ttl, at,
// hold, raw}, and of the floor document {_id: 0, floor}. doc.go has the
// design.
const (
	fOwner = "owner"
	fToken = "token"
	fRev   = "rev"
	fTTL   = "ttl" // milliseconds
	fAt    = "at"
	fHold  = "hold"
	fRaw   = "raw"
	fFloor = "floor"
)

// floorID is the _id of the floor document: a number, which no key (a
// string) can equal.
const floorID = int32(0)

// lockDoc is the stored form of a record.
type lockDoc struct {
	Owner string    `bson:"owner"`
	Token int64     `bson:"token"`
	Rev   int64     `bson:"rev"`
	TTL   int64     `bson:"ttl"`
	At    time.Time `bson:"at"`
	Hold  int64     `bson:"hold"`
	Raw   bool      `bson:"raw"`
}

func (d lockDoc) record() record {
	return record{Owner: d.Owner, Token: Token(d.Token), Rev: d.Rev, TTL: time.Duration(d.TTL) * time.Millisecond, At: d.At, Hold: d.Hold, Raw: d.Raw}
}

// mongoStore keeps one document per key in a collection. It relies only on
// single-document atomicity, works on a standalone server and on a replica
// set, and uses no server-side expressions ($expr, $$NOW), so it runs on
// MongoDB 4.4+ and on compatible servers that keep that atomicity.
type mongoStore struct {
	coll    *mongo.Collection
	counted func(ctx context.Context, n int) // telemetry: commands sent

	mu       sync.Mutex
	maxBatch int // statements per write command: 0 for any, -1 until known
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
	return &mongoStore{coll: coll, counted: counted, maxBatch: -1}
}

func ttlMillis(ttl time.Duration) int64 {
	return int64((ttl + time.Millisecond - 1) / time.Millisecond)
}

// newHold is the update that starts a hold: a new token, a new revision.
func newHold(owner string, hold int64, ttl time.Duration) bson.D {
	return bson.D{
		{Key: "$set", Value: bson.D{{Key: fOwner, Value: owner}, {Key: fTTL, Value: ttlMillis(ttl)}, {Key: fHold, Value: hold}}},
		{Key: "$inc", Value: bson.D{{Key: fToken, Value: int64(1)}, {Key: fRev, Value: int64(1)}}},
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
		{Key: "$inc", Value: bson.D{{Key: fRev, Value: int64(1)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
	}
	returnAfter = options.FindOneAndUpdate().SetReturnDocument(options.After)
	upsertAfter = options.FindOneAndUpdate().SetReturnDocument(options.After).SetUpsert(true)
)

func held(ref leaseRef) bson.D {
	return bson.D{{Key: "_id", Value: ref.key}, {Key: fOwner, Value: ref.owner}, {Key: fToken, Value: int64(ref.token)}}
}

func (s *mongoStore) acquire(ctx context.Context, a attempt, takeover int64) (record, error) {
	ours := bson.D{{Key: fOwner, Value: a.owner}, {Key: fHold, Value: a.hold}}
	or := bson.A{bson.D{{Key: fOwner, Value: ""}}, ours}
	if takeover != 0 {
		or = append(or, bson.D{{Key: fRev, Value: takeover}})
	}
	filter := bson.D{{Key: "_id", Value: a.key}, {Key: "$or", Value: or}}
	update := append(newHold(a.owner, a.hold, a.ttl), bson.E{Key: "$setOnInsert", Value: bson.D{{Key: fRaw, Value: true}}})
	s.counted(ctx, 1)
	var d lockDoc
	err := s.coll.FindOneAndUpdate(ctx, filter, update, upsertAfter).Decode(&d)
	switch {
	case err == nil:
		return d.record(), nil
	case duplicateKey(err):
		// The record exists and the filter did not match: someone else holds it.
		return record{}, errHeld
	default:
		return record{}, fmt.Errorf("dlock: acquire %q: %w", a.key, err)
	}
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

func (s *mongoStore) handoff(ctx context.Context, ref leaseRef, hold int64, ttl time.Duration) (record, error) {
	update := bson.D{
		{Key: "$set", Value: bson.D{{Key: fTTL, Value: ttlMillis(ttl)}, {Key: fHold, Value: hold}}},
		{Key: "$inc", Value: bson.D{{Key: fToken, Value: int64(1)}, {Key: fRev, Value: int64(1)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
	}
	s.counted(ctx, 1)
	var d lockDoc
	err := s.coll.FindOneAndUpdate(ctx, held(ref), update, returnAfter).Decode(&d)
	switch {
	case err == nil:
		return d.record(), nil
	case errors.Is(err, mongo.ErrNoDocuments):
		return record{}, errNotOwner
	default:
		return record{}, fmt.Errorf("dlock: hand off %q: %w", ref.key, err)
	}
}

func (s *mongoStore) extend(ctx context.Context, refs []leaseRef) ([]bool, error) {
	models := make([]mongo.WriteModel, len(refs))
	for i, ref := range refs {
		models[i] = mongo.NewUpdateOneModel().SetFilter(held(ref)).SetUpdate(touch)
	}
	matched, err := s.bulkWrite(ctx, models)
	if err != nil {
		return nil, fmt.Errorf("dlock: extend %d leases: %w", len(refs), err)
	}
	ok := make([]bool, len(refs))
	if matched == int64(len(refs)) {
		for i := range ok {
			ok[i] = true
		}
		return ok, nil
	}
	// Some were not matched: find which of them this owner still holds.
	keys := make(bson.A, len(refs))
	for i, ref := range refs {
		keys[i] = ref.key
	}
	s.counted(ctx, 1)
	cur, err := s.coll.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: keys}}}},
		options.Find().SetProjection(bson.D{{Key: fOwner, Value: 1}, {Key: fToken, Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("dlock: extend %d leases: %w", len(refs), err)
	}
	var docs []struct {
		ID    string `bson:"_id"`
		Owner string `bson:"owner"`
		Token int64  `bson:"token"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("dlock: extend %d leases: %w", len(refs), err)
	}
	type hold struct {
		owner string
		token Token
	}
	now := make(map[string]hold, len(docs))
	for _, d := range docs {
		now[d.ID] = hold{d.Owner, Token(d.Token)}
	}
	for i, ref := range refs {
		ok[i] = now[ref.key] == hold{ref.owner, ref.token}
	}
	return ok, nil
}

func (s *mongoStore) release(ctx context.Context, ref leaseRef) error {
	s.counted(ctx, 1)
	res, err := s.coll.UpdateOne(ctx, held(ref), free)
	switch {
	case err != nil:
		return fmt.Errorf("dlock: release %q: %w", ref.key, err)
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
		models[i] = mongo.NewUpdateOneModel().SetFilter(held(ref)).SetUpdate(free)
	}
	if _, err := s.bulkWrite(ctx, models); err != nil {
		return fmt.Errorf("dlock: release %d leases: %w", len(refs), err)
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

// buildInfo is what dlock reads of the buildInfo reply. FerretDB v1 names
// itself in ferretdbVersion; FerretDB v2 in ferretdb.version, and needs no
// cap, so it is not read.
type buildInfo struct {
	FerretDBVersion string `bson:"ferretdbVersion"`
}

func (b buildInfo) ferretV1() bool { return b.FerretDBVersion != "" }

func (s *mongoStore) abandon(ctx context.Context, a attempt) error {
	s.counted(ctx, 1)
	_, err := s.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: a.key}, {Key: fOwner, Value: a.owner}, {Key: fHold, Value: a.hold}}, free)
	if err != nil {
		return fmt.Errorf("dlock: abandon %q: %w", a.key, err)
	}
	return nil
}

func (s *mongoStore) floor(ctx context.Context) (Token, error) {
	s.counted(ctx, 1)
	var d struct {
		Floor int64 `bson:"floor"`
	}
	err := s.coll.FindOne(ctx, bson.D{{Key: "_id", Value: floorID}}).Decode(&d)
	switch {
	case err == nil:
		return Token(d.Floor), nil
	case errors.Is(err, mongo.ErrNoDocuments):
		return 0, nil
	default:
		return 0, fmt.Errorf("dlock: read the floor: %w", err)
	}
}

func (s *mongoStore) raise(ctx context.Context, a attempt, floor Token) (record, error) {
	filter := bson.D{{Key: "_id", Value: a.key}, {Key: fOwner, Value: a.owner}, {Key: fHold, Value: a.hold}}
	update := bson.D{
		{Key: "$max", Value: bson.D{{Key: fToken, Value: int64(floor) + 1}}},
		{Key: "$unset", Value: bson.D{{Key: fRaw, Value: ""}}},
		{Key: "$inc", Value: bson.D{{Key: fRev, Value: int64(1)}}},
		{Key: "$currentDate", Value: bson.D{{Key: fAt, Value: true}}},
	}
	s.counted(ctx, 1)
	var d lockDoc
	err := s.coll.FindOneAndUpdate(ctx, filter, update, returnAfter).Decode(&d)
	switch {
	case err == nil:
		return d.record(), nil
	case errors.Is(err, mongo.ErrNoDocuments):
		return record{}, errNotOwner
	default:
		return record{}, fmt.Errorf("dlock: raise %q above the floor: %w", a.key, err)
	}
}

func (s *mongoStore) idle(ctx context.Context, cutoff time.Time, limit int) ([]idleRecord, error) {
	s.counted(ctx, 1)
	cur, err := s.coll.Find(ctx, bson.D{{Key: fOwner, Value: ""}, {Key: fAt, Value: bson.D{{Key: "$lte", Value: cutoff}}}},
		options.Find().SetProjection(bson.D{{Key: fToken, Value: 1}, {Key: fRev, Value: 1}}).SetLimit(int64(limit)))
	if err != nil {
		return nil, fmt.Errorf("dlock: find idle keys: %w", err)
	}
	var docs []struct {
		ID    string `bson:"_id"`
		Token int64  `bson:"token"`
		Rev   int64  `bson:"rev"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		return nil, fmt.Errorf("dlock: find idle keys: %w", err)
	}
	recs := make([]idleRecord, len(docs))
	for i, d := range docs {
		recs[i] = idleRecord{key: d.ID, token: Token(d.Token), rev: d.Rev}
	}
	return recs, nil
}

func (s *mongoStore) raiseFloor(ctx context.Context, t Token) error {
	filter := bson.D{{Key: "_id", Value: floorID}}
	update := bson.D{{Key: "$max", Value: bson.D{{Key: fFloor, Value: int64(t)}}}}
	for try := 0; ; try++ {
		s.counted(ctx, 1)
		_, err := s.coll.UpdateOne(ctx, filter, update, options.UpdateOne().SetUpsert(true))
		switch {
		case err == nil:
			return nil
		case duplicateKey(err) && try == 0:
			// Two first raises raced to insert the floor: it exists now.
		default:
			return fmt.Errorf("dlock: raise the floor: %w", err)
		}
	}
}

func (s *mongoStore) remove(ctx context.Context, recs []idleRecord) (int, error) {
	if len(recs) == 0 {
		return 0, nil
	}
	models := make([]mongo.WriteModel, len(recs))
	for i, d := range recs {
		models[i] = mongo.NewDeleteOneModel().SetFilter(bson.D{{Key: "_id", Value: d.key}, {Key: fOwner, Value: ""}, {Key: fRev, Value: d.rev}})
	}
	n, err := s.bulkWrite(ctx, models)
	if err != nil {
		return int(n), fmt.Errorf("dlock: delete %d idle keys: %w", len(recs), err)
	}
	return int(n), nil
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
		return record{}, fmt.Errorf("dlock: read %q: %w", key, err)
	}
}

func (s *mongoStore) serverTime(ctx context.Context) (time.Time, bool, error) {
	s.counted(ctx, 1)
	var reply struct {
		LocalTime time.Time `bson:"localTime"`
	}
	err := s.coll.Database().RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&reply)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("dlock: read server time: %w", err)
	}
	return reply.LocalTime, !reply.LocalTime.IsZero(), nil
}

// transient reports whether err may go away by itself: the network, a
// timeout, a primary stepping down. Other errors (bad credentials, a
// rejected command) are returned to the caller at once.
func transient(err error) bool {
	var le mongo.LabeledError
	return errors.Is(err, errUnreachable) || mongo.IsNetworkError(err) || mongo.IsTimeout(err) ||
		(errors.As(err, &le) && (le.HasErrorLabel("RetryableWriteError") || le.HasErrorLabel("TransientTransactionError")))
}
