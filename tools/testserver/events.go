package testserver

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// event is one change event as the emulated oplog keeps it.
type event struct {
	at   bson.Timestamp // cluster time, set by history.append
	wall time.Time      // wall time, set by history.append
	db   string
	coll string
	op   string        // insert, update, replace, delete, drop, dropDatabase, invalidate
	key  bson.RawValue // documentKey._id; absent for drop, dropDatabase
	doc  bson.Raw      // the document after an insert or replace
	desc bson.D        // an update's updateDescription
}

// lookup answers an update event's fullDocument when a stream asks for
// updateLookup: the document as it is now, or nil once it is gone.
type lookup func(db, coll string, id bson.RawValue) (bson.Raw, error)

// fullDocument modes of $changeStream.
const (
	fullDefault        = "default"
	fullUpdateLookup   = "updateLookup"
	fullWhenAvailable  = "whenAvailable"
	fullRequired       = "required"
	errPostImageAbsent = "Change stream was configured to require a post-image for all update, delete and replace events, but the post-image was not found"
)

// shape returns the event as MongoDB's change events reference shows it,
// field for field, in its order. An update's fullDocument follows mode:
// the current document (updateLookup), null (whenAvailable, as no
// collection here records post-images), or absent.
func (e *event) shape(mode string, look lookup) (bson.D, error) {
	d := bson.D{
		{Key: "_id", Value: token(e.at)},
		{Key: "operationType", Value: e.op},
		{Key: "clusterTime", Value: e.at},
		{Key: "wallTime", Value: bson.NewDateTimeFromTime(e.wall)},
	}
	ns := bson.D{{Key: "db", Value: e.db}}
	if e.coll != "" {
		ns = append(ns, bson.E{Key: "coll", Value: e.coll})
	}
	key := bson.D{{Key: "_id", Value: e.key}}
	switch e.op {
	case "insert", "replace":
		d = append(d, bson.E{Key: "fullDocument", Value: e.doc}, bson.E{Key: "ns", Value: ns}, bson.E{Key: "documentKey", Value: key})
	case "update":
		d = append(d, bson.E{Key: "ns", Value: ns}, bson.E{Key: "documentKey", Value: key}, bson.E{Key: "updateDescription", Value: e.desc})
		switch mode {
		case fullUpdateLookup:
			doc, err := look(e.db, e.coll, e.key)
			if err != nil {
				return nil, err
			}
			if doc == nil {
				d = append(d, bson.E{Key: "fullDocument", Value: nil})
			} else {
				d = append(d, bson.E{Key: "fullDocument", Value: doc})
			}
		case fullWhenAvailable:
			d = append(d, bson.E{Key: "fullDocument", Value: nil})
		}
	case "delete":
		d = append(d, bson.E{Key: "ns", Value: ns}, bson.E{Key: "documentKey", Value: key})
	case "drop", "dropDatabase":
		d = append(d, bson.E{Key: "ns", Value: ns})
	}
	return d, nil
}
