package testserver

import (
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// DefaultReplicaSet is the replica set name the server reports when
// [Config.ChangeStreams] is on and [Config.ReplicaSet] is empty.
const DefaultReplicaSet = "rs0"

// electionID is the one primary's election id; it never changes, as no
// election ever happens.
var electionID = bson.ObjectID{0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1}

// isHello reports whether a command is the handshake or a heartbeat.
func isHello(name string) bool {
	return name == "hello" || strings.EqualFold(name, "isMaster")
}

// topology is what a one-member replica set's primary says of itself in
// hello, beside what FerretDB answers.
func (st *streams) topology(name string) bson.D {
	writable := "isWritablePrimary"
	if name != "hello" {
		writable = "ismaster"
	}
	now := st.hist.now()
	wall := bson.NewDateTimeFromTime(time.Now())
	opTime := bson.D{{Key: "ts", Value: now}, {Key: "t", Value: int64(1)}}
	return bson.D{
		{Key: writable, Value: true},
		{Key: "hosts", Value: bson.A{st.addr}},
		{Key: "setName", Value: st.setName},
		{Key: "setVersion", Value: int32(1)},
		{Key: "secondary", Value: false},
		{Key: "primary", Value: st.addr},
		{Key: "me", Value: st.addr},
		{Key: "electionId", Value: electionID},
		{Key: "lastWrite", Value: bson.D{
			{Key: "opTime", Value: opTime}, {Key: "lastWriteDate", Value: wall},
			{Key: "majorityOpTime", Value: opTime}, {Key: "majorityWriteDate", Value: wall},
		}},
		{Key: "logicalSessionTimeoutMinutes", Value: int32(30)},
	}
}

// times returns the fields every reply of a replica set member carries:
// operationTime and $clusterTime (unsigned: a zero hash and keyId).
func (st *streams) times() bson.D {
	now := st.hist.now()
	return bson.D{
		{Key: "operationTime", Value: now},
		{Key: "$clusterTime", Value: bson.D{
			{Key: "clusterTime", Value: now},
			{Key: "signature", Value: bson.D{
				{Key: "hash", Value: bson.Binary{Subtype: 0, Data: make([]byte, 20)}},
				{Key: "keyId", Value: int64(0)},
			}},
		}},
	}
}

// clean removes from a command what replica-set clients send and FerretDB
// v1 rejects or should not see: $clusterTime, and afterClusterTime in a
// readConcern (every read here sees every write before it, as the proxy
// serializes them). It returns m itself when nothing was removed.
func clean(m *msg) (*msg, error) {
	body, dropped, err := without(m.body, "$clusterTime")
	if err != nil {
		return nil, err
	}
	if rc, ok := body.Lookup("readConcern").DocumentOK(); ok {
		rc2, dropRC, err := without(rc, "afterClusterTime", "atClusterTime")
		if err != nil {
			return nil, err
		}
		if dropRC {
			dropped = true
			if body, err = withFields(body, bson.D{{Key: "readConcern", Value: rc2}}); err != nil {
				return nil, err
			}
		}
	}
	if !dropped {
		return m, nil
	}
	c := *m
	c.body = body
	return &c, nil
}
