package testserver

import (
	"net"
	"net/url"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// A retryable write sent twice (same lsid and txnNumber, as the driver
// retries one whose reply was lost) runs once: the retry gets the first
// reply, not a duplicate key error.
func TestRetryableWriteRunsOnce(t *testing.T) {
	srv, _, _ := csServer(t, 0)
	u, err := url.Parse(srv.URI())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}
	for attempt := range 2 {
		body, err := bson.Marshal(bson.D{
			{Key: "insert", Value: "retry"},
			{Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 1}}}},
			{Key: "lsid", Value: lsid},
			{Key: "txnNumber", Value: int64(1)},
			{Key: "$db", Value: "cs"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write((&msg{requestID: int32(attempt + 1), body: body}).encode(0)); err != nil {
			t.Fatal(err)
		}
		raw, err := readMessage(conn)
		if err != nil {
			t.Fatal(err)
		}
		reply, err := parseMsg(raw)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := reply.body.Lookup("n").AsInt64OK()
		if _, hasErrs := reply.body.LookupErr("writeErrors"); n != 1 || hasErrs == nil {
			t.Fatalf("attempt %d: %v, want n: 1 and no write errors", attempt+1, reply.body)
		}
	}
}
