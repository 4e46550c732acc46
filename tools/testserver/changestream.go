package testserver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// cursorIDBase is above every cursor id FerretDB v1 hands out (it counts
// in 32 bits), so a change stream's cursor id never collides with one.
const cursorIDBase = 1 << 40

// defaultAwait is how long a getMore on a change stream waits for events
// when it sets no maxTimeMS, as MongoDB's awaitData cursors do.
const defaultAwait = time.Second

// cursor is a change stream's cursor.
type cursor struct {
	id     int64
	db     string // "" for a cluster stream
	coll   string // "" for a database or cluster stream
	ns     string // as replies name it
	mode   string // fullDocument
	stages []stage

	conn atomic.Pointer[clientConn] // the connection that last used it

	killOnce sync.Once
	killed   chan struct{} // closed by kill

	mu  sync.Mutex     // held by a getMore, which serializes them
	pos bson.Timestamp // guarded by mu: the cluster time read up to
}

func (c *cursor) kill() { c.killOnce.Do(func() { close(c.killed) }) }

// wants reports whether an event is the stream's: its collection, its
// database, or, for a cluster stream, any but the admin, config and local
// databases'.
func (c *cursor) wants(e *event) bool {
	if c.db == "" {
		return e.db != "admin" && e.db != "config" && e.db != "local"
	}
	return e.db == c.db && (c.coll == "" || e.coll == c.coll)
}

func isChangeStream(body bson.Raw) bool {
	first, err := body.LookupErr("pipeline", "0")
	if err != nil {
		return false
	}
	doc, ok := first.DocumentOK()
	if !ok {
		return false
	}
	_, err = doc.LookupErr("$changeStream")
	return err == nil
}

func ownsCursor(v bson.RawValue) bool {
	id, ok := v.AsInt64OK()
	return ok && id >= cursorIDBase
}

func ownsCursors(body bson.Raw) bool {
	first, err := body.LookupErr("cursors", "0")
	return err == nil && ownsCursor(first)
}

// open answers an aggregate whose first stage is $changeStream.
func (st *streams) open(c *clientConn, m *msg) bson.Raw {
	cur, err := st.newCursor(m.body)
	if err != nil {
		return errReply(err)
	}
	if lost := st.checkHistory(cur); lost != nil {
		return lost
	}
	batchSize := int64(101)
	if n, ok := m.body.Lookup("cursor", "batchSize").AsInt64OK(); ok {
		batchSize = n
	}
	cur.conn.Store(c)
	st.mu.Lock()
	st.nextID++
	cur.id = st.nextID
	st.cursors[cur.id] = cur
	st.mu.Unlock()
	batch, reply := st.next(cur, batchSize, 0, true)
	if reply != nil {
		st.retire(cur) // an aggregate that fails leaves no cursor
		return reply
	}
	return cursorReply(cur, "firstBatch", batch)
}

// newCursor parses a $changeStream aggregate.
func (st *streams) newCursor(body bson.Raw) (*cursor, error) {
	db, _ := body.Lookup("$db").StringValueOK()
	spec, ok := body.Lookup("pipeline", "0", "$changeStream").DocumentOK()
	if !ok {
		return nil, errors.New("testserver: $changeStream takes a document")
	}
	arr, _ := body.Lookup("pipeline").ArrayOK()
	stages, err := arr.Values()
	if err != nil || len(stages) == 0 {
		return nil, errors.New("testserver: pipeline must be an array")
	}
	cur := &cursor{db: db, mode: fullDefault, killed: make(chan struct{})}
	coll, isColl := body.Lookup("aggregate").StringValueOK()
	switch {
	case isColl:
		cur.coll, cur.ns = coll, db+"."+coll
	case flag(spec.Lookup("allChangesForCluster")):
		if db != "admin" {
			return nil, errors.New("testserver: allChangesForCluster needs the admin database")
		}
		cur.db, cur.ns = "", "admin.$cmd.aggregate"
	default:
		cur.ns = db + ".$cmd.aggregate"
	}
	if cur.stages, err = parseStages(stages[1:]); err != nil {
		return nil, err
	}
	if cur.pos, err = st.startPosition(cur, spec); err != nil {
		return nil, err
	}
	return cur, nil
}

// startPosition reads the options of $changeStream: fullDocument, and
// where the stream starts (now, or resumeAfter, startAfter,
// startAtOperationTime).
func (st *streams) startPosition(cur *cursor, spec bson.Raw) (bson.Timestamp, error) {
	pos, starts := st.hist.now(), 0
	elems, err := spec.Elements()
	if err != nil {
		return pos, err
	}
	for _, e := range elems {
		v := e.Value()
		switch e.Key() {
		case "fullDocument":
			cur.mode, _ = v.StringValueOK()
			switch cur.mode {
			case fullDefault, fullUpdateLookup, fullWhenAvailable, fullRequired:
			default:
				return pos, fmt.Errorf("testserver: unknown fullDocument %q", cur.mode)
			}
		case "fullDocumentBeforeChange":
			if mode, _ := v.StringValueOK(); mode != "off" {
				return pos, errUnsupported{"fullDocumentBeforeChange " + mode}
			}
		case "resumeAfter", "startAfter":
			starts++
			t, inv, err := parseToken(v)
			if err != nil {
				return pos, err
			}
			if inv && e.Key() == "resumeAfter" {
				return pos, errInvalidate
			}
			pos = t
		case "startAtOperationTime":
			starts++
			t, i, ok := v.TimestampOK()
			if !ok {
				return pos, errors.New("testserver: startAtOperationTime must be a timestamp")
			}
			pos = before(bson.Timestamp{T: t, I: i})
		case "allChangesForCluster", "showExpandedEvents":
		default:
			return pos, fmt.Errorf("testserver: unknown $changeStream option %s", e.Key())
		}
	}
	if starts > 1 {
		return pos, errors.New("testserver: only one of resumeAfter, startAfter and startAtOperationTime may be given")
	}
	return pos, nil
}

// errInvalidate answers a resumeAfter that names an invalidate event.
var errInvalidate = errors.New("testserver: attempting to resume a change stream using 'resumeAfter' is not allowed from an invalidate notification")

func (st *streams) checkHistory(cur *cursor) bson.Raw {
	if _, _, _, _, err := st.hist.since(cur.pos, time.Now()); err != nil {
		return historyLost()
	}
	return nil
}

// nonResumable is the label MongoDB puts on the change stream errors in
// its NonResumableChangeStreamError category (error_codes.yml).
const nonResumable = "NonResumableChangeStreamError"

// historyLost is MongoDB's answer to a stream that asks for events the
// oplog no longer holds (as a production server answers it, label
// included); the driver does not resume on it.
func historyLost() bson.Raw {
	return errorReply(codeChangeStreamHistory, "ChangeStreamHistoryLost",
		"Resume of change stream was not possible, as the resume point may no longer be in the oplog.", nonResumable)
}

func cursorReply(cur *cursor, batchName string, batch bson.A) bson.Raw {
	id := cur.id
	select {
	case <-cur.killed:
		id = 0 // closed after an invalidate
	default:
	}
	b, _ := bson.Marshal(bson.D{
		{Key: "cursor", Value: bson.D{
			{Key: batchName, Value: batch},
			{Key: "postBatchResumeToken", Value: token(cur.pos)},
			{Key: "id", Value: id},
			{Key: "ns", Value: cur.ns},
		}},
		{Key: "ok", Value: 1.0},
	})
	return b
}

// getMore answers a getMore on a change stream's cursor: it waits up to
// maxTimeMS for events, without the proxy's turn.
func (st *streams) getMore(c *clientConn, m *msg) bson.Raw {
	id, _ := m.body.Lookup("getMore").AsInt64OK()
	st.mu.Lock()
	cur := st.cursors[id]
	fail := st.faults.takeFailure(cur)
	st.mu.Unlock()
	if cur == nil {
		return errorReply(codeCursorNotFound, "CursorNotFound", fmt.Sprintf("cursor id %d not found", id))
	}
	if fail != nil {
		st.retire(cur) // a getMore that fails ends its cursor, as on MongoDB
		return fail
	}
	cur.conn.Store(c)
	batchSize := int64(0)
	if n, ok := m.body.Lookup("batchSize").AsInt64OK(); ok {
		batchSize = n
	}
	await := defaultAwait
	if n, ok := m.body.Lookup("maxTimeMS").AsInt64OK(); ok {
		await = time.Duration(n) * time.Millisecond
	}
	batch, reply := st.next(cur, batchSize, await, false)
	if reply != nil {
		st.retire(cur)
		return reply
	}
	return cursorReply(cur, "nextBatch", batch)
}

// next reads the stream's next batch (up to limit events, no limit if 0),
// waiting up to await for the first. It answers an error reply instead
// when the cursor is killed or its history lost.
func (st *streams) next(cur *cursor, limit int64, await time.Duration, first bool) (bson.A, bson.Raw) {
	cur.mu.Lock()
	defer cur.mu.Unlock()
	deadline := time.Now().Add(await)
	for {
		if first && limit == 0 {
			return bson.A{}, nil
		}
		batch, held, changed, reply := st.collect(cur, limit)
		if reply != nil || len(batch) > 0 || !time.Now().Before(deadline) {
			return batch, reply
		}
		wait := time.Until(deadline)
		if !held.IsZero() {
			wait = min(wait, time.Until(held))
		}
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-t.C:
		case <-cur.killed:
		case <-st.done:
		}
		t.Stop()
		select {
		case <-cur.killed:
			return nil, errorReply(codeCursorNotFound, "CursorNotFound", fmt.Sprintf("cursor id %d not found", cur.id))
		default:
		}
	}
}

// collect reads the events after the cursor's position through its
// stages; cur.mu is held. held is when the first event held back by a
// delay shows; changed is closed when events are next appended.
func (st *streams) collect(cur *cursor, limit int64) (batch bson.A, held time.Time, changed <-chan struct{}, reply bson.Raw) {
	st.mu.Lock()
	delay := st.faults.delayOf(cur)
	st.mu.Unlock()
	evs, reached, first, changed, err := st.hist.since(cur.pos, time.Now().Add(-delay))
	if err != nil {
		return nil, time.Time{}, nil, historyLost()
	}
	if !first.IsZero() {
		held = first.Add(delay)
	}
	batch = bson.A{}
	for _, e := range evs {
		if !cur.wants(e) {
			cur.pos = e.at
			continue
		}
		out, ok, err := st.pass(cur, e)
		if err != nil {
			return nil, held, changed, errorReply(codeChangeStreamFatal, "ChangeStreamFatalError", err.Error(), nonResumable)
		}
		cur.pos = e.at
		if ok {
			batch = append(batch, out)
		}
		if inv := invalidates(cur, e); inv != nil {
			st.retire(cur)
			return append(batch, inv), held, changed, nil
		}
		if limit > 0 && int64(len(batch)) >= limit {
			return batch, held, changed, nil
		}
	}
	cur.pos = reached
	return batch, held, changed, nil
}

// pass shapes an event for the cursor and runs it through the stages.
func (st *streams) pass(cur *cursor, e *event) (bson.Raw, bool, error) {
	if cur.mode == fullRequired && e.op == "update" {
		return nil, false, errors.New("testserver: " + errPostImageAbsent)
	}
	d, err := e.shape(cur.mode, st.lookup)
	if err != nil {
		return nil, false, err
	}
	b, err := bson.Marshal(d)
	if err != nil {
		return nil, false, err
	}
	out := bson.Raw(b)
	id := out.Lookup("_id")
	for _, s := range cur.stages {
		var ok bool
		if out, ok, err = s(out); err != nil || !ok {
			return nil, false, err
		}
	}
	if v, err := out.LookupErr("_id"); err != nil || !v.Equal(id) {
		return nil, false, errors.New("testserver: encountered an event whose _id field, which contains the resume token, was modified by the pipeline")
	}
	return out, true, nil
}

// invalidates returns the invalidate event that follows e on cur: the drop
// of a collection stream's collection, the drop of a database stream's
// database.
func invalidates(cur *cursor, e *event) bson.Raw {
	if !(cur.coll != "" && e.op == "drop" && e.coll == cur.coll || cur.coll == "" && cur.db != "" && e.op == "dropDatabase") {
		return nil
	}
	b, _ := bson.Marshal(bson.D{
		{Key: "_id", Value: invalidateToken(e.at)},
		{Key: "operationType", Value: "invalidate"},
		{Key: "clusterTime", Value: e.at},
		{Key: "wallTime", Value: bson.NewDateTimeFromTime(e.wall)},
	})
	return b
}

// lookup reads a document's current state for updateLookup.
func (st *streams) lookup(db, coll string, id bson.RawValue) (bson.Raw, error) {
	ctx, cancel := context.WithTimeout(context.Background(), sideTimeout)
	defer cancel()
	doc, err := st.side.Database(db).Collection(coll).FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Raw()
	if errors.Is(err, mongo.ErrNoDocuments) {
		return nil, nil
	}
	return doc, err
}

// killCursors answers a killCursors of change streams' cursors.
func (st *streams) killCursors(m *msg) bson.Raw {
	arr, _ := m.body.Lookup("cursors").ArrayOK()
	ids, _ := arr.Values()
	killed, notFound := bson.A{}, bson.A{}
	st.mu.Lock()
	for _, v := range ids {
		id, _ := v.AsInt64OK()
		if cur := st.cursors[id]; cur != nil {
			delete(st.cursors, id)
			cur.kill()
			killed = append(killed, id)
		} else {
			notFound = append(notFound, id)
		}
	}
	st.mu.Unlock()
	b, _ := bson.Marshal(bson.D{
		{Key: "cursorsKilled", Value: killed},
		{Key: "cursorsNotFound", Value: notFound},
		{Key: "cursorsAlive", Value: bson.A{}},
		{Key: "cursorsUnknown", Value: bson.A{}},
		{Key: "ok", Value: 1.0},
	})
	return b
}

// retire closes a cursor: after its invalidate event, or when its
// aggregate fails.
func (st *streams) retire(cur *cursor) {
	st.mu.Lock()
	delete(st.cursors, cur.id)
	st.mu.Unlock()
	cur.kill()
}

// forget kills the cursors a closed connection was the last to use.
func (st *streams) forget(c *clientConn) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for id, cur := range st.cursors {
		if cur.conn.Load() == c {
			delete(st.cursors, id)
			cur.kill()
		}
	}
}
