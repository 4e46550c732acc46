package testserver

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// sideTimeout bounds each read the capture makes on its private client.
const sideTimeout = 30 * time.Second

// capturer turns the writes the proxy forwards into change events: it
// reads the documents a write may touch before it, forwards the write,
// reads them again by _id, and diffs. It runs with the proxy's turn held,
// so nothing else changes the data in between.
type capturer struct {
	side *mongo.Client // a private client of the backend
	hist *history
}

// touched is a document a write may change, with the statement it is
// first matched by, which decides the order of its event and its kind.
type touched struct {
	stmt     int
	doc      bson.Raw // as it was; for an upsert, just its _id
	upserted bool
}

// stmtKind says how a statement changes the documents it matches.
type stmtKind struct {
	replace bool     // a replacement document: a replace event
	paths   []string // the paths its operators name
	upsert  bool
	q       bson.Raw // its filter
}

func idKey(v bson.RawValue) string { return string(rune(v.Type)) + string(v.Value) }

// write forwards the write command m (insert, update, delete or
// findAndModify) by forward and records the events it caused.
func (c *capturer) write(name string, m *msg, forward func(*msg) (bson.Raw, error)) (bson.Raw, error) {
	db, _ := m.body.Lookup("$db").StringValueOK()
	coll, _ := m.body.Index(0).Value().StringValueOK()
	ctx, cancel := context.WithTimeout(context.Background(), sideTimeout)
	defer cancel()
	cl := c.side.Database(db).Collection(coll)
	switch strings.ToLower(name) {
	case "insert":
		return c.insert(ctx, cl, m, forward)
	case "update":
		return c.statements(ctx, cl, m, "updates", forward)
	case "delete":
		return c.statements(ctx, cl, m, "deletes", forward)
	}
	return c.findAndModify(ctx, cl, m, forward)
}

func (c *capturer) insert(ctx context.Context, cl *mongo.Collection, m *msg, forward func(*msg) (bson.Raw, error)) (bson.Raw, error) {
	docs, err := withIDs(m)
	if err != nil {
		return nil, err
	}
	ids := make([]bson.RawValue, len(docs))
	for i, d := range docs {
		ids[i] = d.Lookup("_id")
	}
	was, err := byID(ctx, cl, ids)
	if err != nil {
		return nil, err
	}
	reply, err := forward(m)
	if err != nil {
		return nil, err
	}
	now, err := byID(ctx, cl, ids)
	if err != nil {
		return nil, err
	}
	var evs []*event
	for _, id := range ids {
		k := idKey(id)
		if d, ok := now[k]; ok && was[k] == nil {
			evs = append(evs, &event{db: cl.Database().Name(), coll: cl.Name(), op: "insert", key: id, doc: d})
			delete(now, k) // one event for an _id given twice
		}
	}
	c.hist.append(evs)
	return reply, nil
}

// withIDs gives each document of an insert without an _id a new ObjectID,
// as the driver does, so that its event can name it; it returns the
// documents.
func withIDs(m *msg) ([]bson.Raw, error) {
	docs, err := m.seq("documents")
	if err != nil {
		return nil, err
	}
	changed := false
	for i, d := range docs {
		if _, err := d.LookupErr("_id"); err != nil {
			elems, err := d.Elements()
			if err != nil {
				return nil, fmt.Errorf("testserver: bad document in insert: %w", err)
			}
			nd := bson.D{{Key: "_id", Value: bson.NewObjectID()}}
			for _, e := range elems {
				nd = append(nd, bson.E{Key: e.Key(), Value: e.Value()})
			}
			if docs[i], err = bson.Marshal(nd); err != nil {
				return nil, err
			}
			changed = true
		}
	}
	if changed {
		if err := m.setSeq("documents", docs); err != nil {
			return nil, err
		}
	}
	return docs, nil
}

// statements captures an update or delete command's statements (field
// updates or deletes, each {q: filter, ...}).
func (c *capturer) statements(ctx context.Context, cl *mongo.Collection, m *msg, field string, forward func(*msg) (bson.Raw, error)) (bson.Raw, error) {
	stmts, err := m.seq(field)
	if err != nil {
		return nil, err
	}
	filters := make([]bson.Raw, len(stmts))
	kinds := make([]stmtKind, len(stmts))
	for i, s := range stmts {
		filters[i], _ = s.Lookup("q").DocumentOK()
		if u, ok := s.Lookup("u").DocumentOK(); ok {
			kinds[i] = kindOf(u)
		}
		kinds[i].upsert, kinds[i].q = flag(s.Lookup("upsert")), filters[i]
	}
	was, err := matching(ctx, cl, filters)
	if err != nil {
		return forward(m) // a filter the backend rejects: so will the write
	}
	reply, err := forward(m)
	if err != nil {
		return nil, err
	}
	if up, ok := reply.Lookup("upserted").ArrayOK(); ok {
		vals, _ := up.Values()
		for _, v := range vals {
			d, _ := v.DocumentOK()
			i, _ := d.Lookup("index").AsInt64OK()
			was = append(was, upsert(int(i), d.Lookup("_id")))
		}
	}
	return reply, c.record(ctx, cl, was, kinds)
}

func (c *capturer) findAndModify(ctx context.Context, cl *mongo.Collection, m *msg, forward func(*msg) (bson.Raw, error)) (bson.Raw, error) {
	q, ok := m.body.Lookup("query").DocumentOK()
	if !ok {
		q = emptyDoc
	}
	var kind stmtKind
	if u, ok := m.body.Lookup("update").DocumentOK(); ok {
		kind = kindOf(u)
	}
	was, err := matching(ctx, cl, []bson.Raw{q})
	if err != nil {
		return forward(m) // a filter the backend rejects: so will the write
	}
	reply, err := forward(m)
	if err != nil {
		return nil, err
	}
	if id, err := reply.LookupErr("lastErrorObject", "upserted"); err == nil {
		was = append(was, upsert(0, id))
	}
	return reply, c.record(ctx, cl, was, []stmtKind{kind})
}

var emptyDoc, _ = bson.Marshal(bson.D{})

// flag reads an optional boolean option: false if absent or not a boolean.
func flag(v bson.RawValue) bool {
	b, _ := v.BooleanOK()
	return b
}

func upsert(stmt int, id bson.RawValue) touched {
	d, _ := bson.Marshal(bson.D{{Key: "_id", Value: id}})
	return touched{stmt: stmt, doc: d, upserted: true}
}

func kindOf(u bson.Raw) stmtKind {
	if !isOperatorDoc(u) {
		return stmtKind{replace: true}
	}
	return stmtKind{paths: updatePaths(u)}
}

// record reads the touched documents again and appends the events of
// those that changed, in the order of their statements: an upserted one
// is an insert.
func (c *capturer) record(ctx context.Context, cl *mongo.Collection, was []touched, kinds []stmtKind) error {
	ids := make([]bson.RawValue, len(was))
	for i, t := range was {
		ids[i] = t.doc.Lookup("_id")
	}
	now, err := byID(ctx, cl, ids)
	if err != nil {
		return err
	}
	for i := range was {
		if was[i].upserted {
			was[i].stmt = upsertedBy(now[idKey(ids[i])], was[i].stmt, kinds)
		}
	}
	sort.SliceStable(was, func(i, j int) bool { return was[i].stmt < was[j].stmt })
	for i, t := range was {
		ids[i] = t.doc.Lookup("_id")
	}
	var evs []*event
	seen := map[string]bool{}
	for i, t := range was {
		k := idKey(ids[i])
		if seen[k] {
			continue
		}
		seen[k] = true
		e, err := change(cl, t, ids[i], now[k], kinds)
		if err != nil {
			return err
		}
		if e != nil {
			evs = append(evs, e)
		}
	}
	c.hist.append(evs)
	return nil
}

// upsertedBy returns the statement that upserted doc: the first upsert
// whose filter it matches. FerretDB v1 numbers the upserts of an update
// command from 0 in its reply, whatever their statements, so the reply's
// index (given) serves only where the filter cannot tell.
func upsertedBy(doc bson.Raw, given int, kinds []stmtKind) int {
	if doc == nil {
		return given
	}
	for i, k := range kinds {
		if ok, err := matches(doc, k.q); k.upsert && err == nil && ok {
			return i
		}
	}
	return given
}

// change returns the event of one document that was t and is now cur
// (nil if it is gone), or nil if nothing changed.
func change(cl *mongo.Collection, t touched, id bson.RawValue, cur bson.Raw, kinds []stmtKind) (*event, error) {
	e := &event{db: cl.Database().Name(), coll: cl.Name(), key: id}
	upserted := t.upserted
	switch {
	case cur == nil && upserted:
		return nil, nil
	case cur == nil:
		e.op = "delete"
	case upserted:
		e.op, e.doc = "insert", cur
	case t.stmt < len(kinds) && kinds[t.stmt].replace:
		if string(cur) == string(t.doc) {
			return nil, nil
		}
		e.op, e.doc = "replace", cur
	default:
		desc, changed, err := updateDescription(t.doc, cur, kinds[min(t.stmt, len(kinds)-1)].paths)
		if err != nil || !changed {
			return nil, err
		}
		e.op, e.desc = "update", desc
	}
	return e, nil
}

// matching returns the documents any of filters matches, each with the
// first filter that matches it (by the emulation's own evaluator; where it
// cannot tell, the first).
func matching(ctx context.Context, cl *mongo.Collection, filters []bson.Raw) ([]touched, error) {
	if len(filters) == 0 {
		return nil, nil
	}
	or := make(bson.A, len(filters))
	for i, f := range filters {
		if f == nil {
			f = emptyDoc
		}
		or[i] = f
	}
	var filter any = bson.D{{Key: "$or", Value: or}}
	if len(filters) == 1 {
		filter = or[0] // as the write reads it: FerretDB v1 uses its _id index only for {_id: ...}
	}
	var docs []bson.Raw
	cur, err := cl.Find(ctx, filter)
	if err == nil {
		err = cur.All(ctx, &docs)
	}
	if err != nil {
		return nil, fmt.Errorf("testserver: reading before a write: %w", err)
	}
	out := make([]touched, len(docs))
	for i, d := range docs {
		out[i] = touched{doc: d}
		for j, f := range filters {
			if ok, err := matches(d, f); err == nil && ok {
				out[i].stmt = j
				break
			}
		}
	}
	return out, nil
}

// byID returns the documents of ids, by idKey.
func byID(ctx context.Context, cl *mongo.Collection, ids []bson.RawValue) (map[string]bson.Raw, error) {
	out := make(map[string]bson.Raw, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	in := make(bson.A, len(ids))
	for i, id := range ids {
		in[i] = id
	}
	var docs []bson.Raw
	cur, err := cl.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: in}}}})
	if err == nil {
		err = cur.All(ctx, &docs)
	}
	if err != nil {
		return nil, fmt.Errorf("testserver: reading around a write: %w", err)
	}
	for _, d := range docs {
		out[idKey(d.Lookup("_id"))] = d
	}
	return out, nil
}

// drop forwards a drop or dropDatabase and records its events: a drop
// event for each collection dropped (none for one that was not there),
// then, for a database, dropDatabase.
func (st *streams) drop(backend net.Conn, name string, m *msg) (bson.Raw, error) {
	st.proxy.turn.Lock()
	defer st.proxy.turn.Unlock()
	db, _ := m.body.Lookup("$db").StringValueOK()
	filter := bson.D{} // the collections that go, and have drop events
	if name == "drop" {
		coll, _ := m.body.Lookup("drop").StringValueOK()
		filter = bson.D{{Key: "name", Value: coll}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), sideTimeout)
	colls, err := st.side.Database(db).ListCollectionNames(ctx, filter)
	cancel()
	if err != nil {
		return errorReply(codeInternalError, "InternalError", err.Error()), nil
	}
	reply, err := st.exchange(backend, m)
	if err != nil {
		return nil, err
	}
	if ok, _ := reply.Lookup("ok").AsFloat64OK(); ok != 1 {
		return reply, nil
	}
	var evs []*event
	for _, c := range colls {
		evs = append(evs, &event{db: db, coll: c, op: "drop"})
	}
	if name == "dropDatabase" {
		evs = append(evs, &event{db: db, op: "dropDatabase"})
	}
	st.hist.append(evs)
	return reply, nil
}
