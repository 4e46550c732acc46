package dlock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// ackServer speaks just enough of the MongoDB wire protocol (OP_MSG) to
// acknowledge dlock's writes at once without storing anything: every
// update statement matches, every findAndModify returns the hold it asked
// for. Benchmarks run a Client against it to measure the Client's own
// costs (CPU, memory, commands) apart from the server's. It is no database:
// nothing is checked, so no test of exclusion, order or tokens may use it.
// Tests use it for the replies of servers that no CI machine runs, or that
// no server gives on demand: FerretDB v2's (ferretV2) and a server's
// deadline (deadlines).
type ackServer struct {
	ferretV2 bool // answer as FerretDB v2.7 does where it differs from MongoDB
	ln       net.Listener
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{} // guarded by mu
	// deadlines is how many findAndModify commands still to answer as
	// FerretDB does when it gives up on one at a deadline of its own
	// (deadlineReply); a negative number answers them all so. Atomic: an
	// uncontended read on the benchmarks' path.
	deadlines atomic.Int64
}

// deadlineReply is FerretDB's reply to a command it gave up on at a
// deadline of its own, as under load: code 1, InternalError, and a message
// that ends with the Go context's error (its middle varies with where the
// server gave up). The command may or may not have applied.
var deadlineReply = bson.D{
	{Key: "ok", Value: 0.0},
	{Key: "errmsg", Value: "(InternalError) [pool.go:129 pool.(*Pool).Get] context deadline exceeded"},
	{Key: "code", Value: int32(1)}, {Key: "codeName", Value: "InternalError"},
}

// gaveUp reports whether to answer a findAndModify with deadlineReply, and
// counts it.
func (s *ackServer) gaveUp() bool {
	for {
		switch n := s.deadlines.Load(); {
		case n < 0:
			return true
		case n == 0:
			return false
		case s.deadlines.CompareAndSwap(n, n-1):
			return true
		}
	}
}

// newAckClient starts an ackServer and returns a collection on it, both
// closed when the benchmark ends. Commands are counted in commands.
func newAckClient(tb testing.TB) *mongo.Collection {
	return startAckServer(tb, &ackServer{})
}

// startAckServer starts s and returns a collection on it, both closed when
// the test ends; opts adjust the driver's options.
func startAckServer(tb testing.TB, s *ackServer, opts ...func(*options.ClientOptions)) *mongo.Collection {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s.ln, s.conns = ln, map[net.Conn]struct{}{}
	s.wg.Add(1)
	go s.accept()
	o := options.Client().
		ApplyURI("mongodb://" + ln.Addr().String() + "/?directConnection=true").
		SetServerAPIOptions(options.ServerAPI(options.ServerAPIVersion1)). // OP_MSG from the handshake on
		SetMonitor(&event.CommandMonitor{Started: commands.started})
	for _, opt := range opts {
		opt(o)
	}
	client, err := mongo.Connect(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		client.Disconnect(tb.Context())
		s.close()
	})
	return client.Database("ack").Collection("locks")
}

func (s *ackServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			for s.serve(c) == nil {
			}
		}()
	}
}

func (s *ackServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// serve reads one OP_MSG and writes its reply.
func (s *ackServer) serve(c net.Conn) error {
	var hdr [16]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return err
	}
	size := int(binary.LittleEndian.Uint32(hdr[0:]))
	if size < 21 || size > 48<<20 || binary.LittleEndian.Uint32(hdr[12:]) != 2013 {
		return errors.New("ackServer: not an OP_MSG")
	}
	msg := make([]byte, size-16)
	if _, err := io.ReadFull(c, msg); err != nil {
		return err
	}
	var body bson.Raw
	statements := 0
	for rest := msg[4:]; len(rest) > 0; { // sections after the flag bits
		kind, n := rest[0], int(binary.LittleEndian.Uint32(rest[1:]))
		if kind == 0 {
			body = bson.Raw(rest[1 : 1+n])
		} else { // a document sequence: count its documents
			for seq := rest[1+4 : 1+n]; len(seq) > 0; {
				if seq[0] == 0 { // end of the identifier
					seq = seq[1:]
					for len(seq) > 0 {
						statements++
						seq = seq[binary.LittleEndian.Uint32(seq):]
					}
					break
				}
				seq = seq[1:]
			}
		}
		rest = rest[1+n:]
	}
	reply, err := bson.Marshal(s.ack(body, statements))
	if err != nil {
		return err
	}
	out := make([]byte, 16+4+1, 16+4+1+len(reply))
	binary.LittleEndian.PutUint32(out[0:], uint32(len(out)+len(reply)))
	binary.LittleEndian.PutUint32(out[8:], binary.LittleEndian.Uint32(hdr[4:])) // responseTo
	binary.LittleEndian.PutUint32(out[12:], 2013)
	_, err = c.Write(append(out, reply...))
	return err
}

// ack is the reply to a command: a hello, an update of any number of
// statements, a findAndModify that grants the hold it asks for, or ok.
func (s *ackServer) ack(cmd bson.Raw, statements int) bson.D {
	elems, _ := cmd.Elements()
	if len(elems) == 0 {
		return bson.D{{Key: "ok", Value: 0}}
	}
	switch name := elems[0].Key(); {
	case name == "findAndModify" && s.gaveUp():
		return deadlineReply
	case s.ferretV2 && name == "findAndModify":
		// FerretDB v2.7 on an upsert whose filter misses an existing _id:
		// PostgreSQL's unique violation, unmapped, as code 1.
		return bson.D{
			{Key: "ok", Value: 0.0},
			{Key: "errmsg", Value: `(InternalError) duplicate key value violates unique constraint "collection_pk_5"`},
			{Key: "code", Value: int32(1)}, {Key: "codeName", Value: "InternalError"},
		}
	case s.ferretV2 && name == "find": // the key, held by another owner
		return bson.D{
			{Key: "cursor", Value: bson.D{
				{Key: "firstBatch", Value: bson.A{bson.D{
					{Key: "_id", Value: cmd.Lookup("filter", "_id")}, {Key: fOwner, Value: "other"},
					{Key: fToken, Value: int64(1)}, {Key: fRev, Value: int64(1)}, {Key: fTTL, Value: int64(1000)},
					{Key: fAt, Value: time.Now()}, {Key: fHold, Value: int64(1)},
				}}},
				{Key: "id", Value: int64(0)}, {Key: "ns", Value: "ack.locks"},
			}},
			{Key: "ok", Value: 1.0},
		}
	case s.ferretV2 && name == "buildInfo":
		return bson.D{
			{Key: "version", Value: "7.0.77"},
			{Key: "ferretdb", Value: bson.D{{Key: "version", Value: "v2.7.0"}}},
			{Key: "ok", Value: 1.0},
		}
	}
	switch elems[0].Key() {
	case "hello", "isMaster", "ismaster":
		return bson.D{
			{Key: "isWritablePrimary", Value: true}, {Key: "helloOk", Value: true},
			{Key: "maxBsonObjectSize", Value: int32(16 << 20)}, {Key: "maxMessageSizeBytes", Value: int32(48000000)},
			{Key: "maxWriteBatchSize", Value: int32(100000)}, {Key: "localTime", Value: time.Now()},
			{Key: "logicalSessionTimeoutMinutes", Value: int32(30)},
			{Key: "minWireVersion", Value: int32(0)}, {Key: "maxWireVersion", Value: int32(21)},
			{Key: "ok", Value: 1.0},
		}
	case "update":
		return bson.D{{Key: "n", Value: int32(statements)}, {Key: "nModified", Value: int32(statements)}, {Key: "ok", Value: 1.0}}
	case "findAndModify":
		set := cmd.Lookup("update", "$set")
		return bson.D{
			{Key: "lastErrorObject", Value: bson.D{{Key: "n", Value: int32(1)}, {Key: "updatedExisting", Value: true}}},
			{Key: "value", Value: bson.D{
				{Key: "_id", Value: cmd.Lookup("query", "_id")},
				{Key: fOwner, Value: set.Document().Lookup(fOwner)},
				{Key: fToken, Value: int64(1)}, {Key: fRev, Value: int64(1)},
				{Key: fTTL, Value: set.Document().Lookup(fTTL)}, {Key: fAt, Value: time.Now()},
			}},
			{Key: "ok", Value: 1.0},
		}
	default:
		return bson.D{{Key: "ok", Value: 1.0}}
	}
}

// FerretDB v2 answers a findAndModify upsert that collides with an existing
// _id with code 1 and PostgreSQL's message, not DuplicateKey: dlock reads
// it as "held", so a contended acquire is ErrLocked, not a hard error.
// Its buildInfo (ferretdb.version, no ferretdbVersion) asks for no batch
// cap: v2 takes big commands whole.
func TestFerretDBv2Replies(t *testing.T) {
	coll := startAckServer(t, &ackServer{ferretV2: true})
	ctx := context.Background()
	s := newMongoStore(coll, func(context.Context, int) {})
	_, err := s.acquire(ctx, attempt{key: "k", owner: "me", hold: 1, ttl: time.Second}, stamp{})
	require.ErrorIs(t, err, errHeld)
	n, err := s.batchLimit(ctx, 1000)
	require.NoError(t, err)
	assert.Equal(t, 1000, n, "no cap on FerretDB v2")

	c := newClient(t, coll)
	err = c.NewMutex("k").TryLock(ctx)
	require.ErrorIs(t, err, ErrLocked)
	assert.False(t, duplicateKey(errors.New("duplicate key value violates unique constraint")), "only a server error with code 1")
}

// FerretDB under load gives up on a findAndModify at a deadline of its own
// and answers code 1, InternalError, "... context deadline exceeded"
// (deadlineReply): like a lost reply, the command may or may not have
// applied, and sent again it may go through. A Lock retries through it and
// takes the key; a TryLock reports it as the server's failure, which no
// check takes for the end of the caller's own context; and a Lock that
// gets nothing else ends at its context's deadline, with its context's
// error.
func TestFerretDBDeadlineReply(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // bounds a Lock that retries for ever
	defer cancel()
	s := &ackServer{}
	c := newClient(t, startAckServer(t, s))
	s.deadlines.Store(1)
	m := c.NewMutex("k")
	require.NoError(t, m.Lock(ctx), "a Lock through one deadline reply")
	assert.Zero(t, s.deadlines.Load(), "the deadline reply was sent")
	require.NoError(t, m.Unlock(ctx))

	s.deadlines.Store(1)
	err := c.NewMutex("k").TryLock(ctx)
	var se mongo.ServerError
	require.ErrorAs(t, err, &se)
	assert.True(t, se.HasErrorCode(1), "code 1: %v", err)
	assert.NotErrorIs(t, err, ErrLocked)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "the server's deadline is not the caller's")
	require.NoError(t, ctx.Err())

	s.deadlines.Store(-1)
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	err = c.NewMutex("k").Lock(short)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Error(t, short.Err(), "the Lock returned at its own deadline")
}

// transient tells the server's deadline (FerretDB's InternalError whose
// message is the Go context's error) from other code 1 replies and from a
// message alone.
func TestTransientServerDeadline(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"FerretDB's deadline", mongo.CommandError{Code: 1, Name: "InternalError", Message: "(InternalError) [pool.go:129 pool.(*Pool).Get] context deadline exceeded"}, true},
		{"wrapped", fmt.Errorf("dlock: acquire: %w", mongo.CommandError{Code: 1, Message: "context deadline exceeded"}), true},
		{"code 1, another message", mongo.CommandError{Code: 1, Name: "InternalError", Message: `(InternalError) duplicate key value violates unique constraint "collection_pk_5"`}, false},
		{"another code", mongo.CommandError{Code: 2, Name: "BadValue", Message: "context deadline exceeded"}, false},
		{"the message alone", errors.New("(InternalError) context deadline exceeded"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, transient(tc.err))
		})
	}
}
