package testserver

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// streams is the proxy's replica-set mode: it answers hello as the primary
// of a one-member replica set, stamps every reply with the cluster time,
// records the change events of the writes it forwards, and serves change
// streams from them. Its methods are safe for concurrent use.
type streams struct {
	proxy   *serializer
	hist    *history
	capture *capturer
	side    *mongo.Client // private reads: before and after writes, updateLookup
	addr    string        // the proxy's host:port, as hello reports it
	setName string
	done    chan struct{} // closed by close: ends every await

	mu      sync.Mutex
	cursors map[int64]*cursor // guarded by mu; added by open, removed by kill
	nextID  int64             // guarded by mu; the last cursor id handed out
	faults  faultState        // guarded by mu
	// failPoint is the failCommand fail point, nil when off; guarded by mu.
	failPoint *failPoint
	// retries holds each session's last retryable write; guarded by mu.
	retries map[string]retried
}

// clientConn stands for one client connection, which owns the cursors it
// last used. (It is not empty: pointers to distinct zero-size values may
// be equal.)
type clientConn struct{ conn net.Conn }

func newStreams(sock, addr, setName string, historySize int) (*streams, error) {
	side, err := mongo.Connect(options.Client().
		ApplyURI("mongodb://" + url.PathEscape(sock) + "/").
		SetRetryWrites(false).SetRetryReads(false))
	if err != nil {
		return nil, err
	}
	hist := newHistory(historySize)
	return &streams{
		hist:    hist,
		capture: &capturer{side: side, hist: hist},
		side:    side,
		addr:    addr,
		setName: setName,
		done:    make(chan struct{}),
		cursors: map[int64]*cursor{},
		nextID:  cursorIDBase,
	}, nil
}

// stop ends every await, so that the relays can end.
func (st *streams) stop() { close(st.done) }

// close disconnects the private client, once the relays have ended.
func (st *streams) close() error { return st.side.Disconnect(context.Background()) }

// serve relays one client connection, answering what the replica-set mode
// answers itself.
func (st *streams) serve(client, backend net.Conn) {
	c := &clientConn{conn: client}
	defer st.forget(c)
	for {
		req, err := readMessage(client)
		if err != nil {
			return
		}
		reply, err := st.handle(c, backend, req)
		if err != nil {
			return
		}
		if reply != nil {
			if _, err := client.Write(reply); err != nil {
				return
			}
		}
	}
}

func (st *streams) handle(c *clientConn, backend net.Conn, req []byte) ([]byte, error) {
	switch opCode(req) {
	case opQuery:
		return st.legacyHello(backend, req)
	case opMsg:
	default:
		return st.proxy.roundTrip(backend, req)
	}
	m, err := parseMsg(req)
	if err != nil {
		return nil, err
	}
	name, err := commandName(m.body)
	if err != nil {
		return nil, err
	}
	reply, err := st.command(c, backend, name, m)
	if err != nil {
		return nil, err
	}
	if reply, err = withFields(reply, st.times()); err != nil {
		return nil, err
	}
	if m.flags&moreToCome != 0 {
		return nil, nil
	}
	return (&msg{body: reply}).encode(m.requestID), nil
}

func commandName(body bson.Raw) (string, error) {
	e, err := body.IndexErr(0)
	if err != nil {
		return "", err
	}
	return e.Key(), nil
}

// command answers one OP_MSG command with its reply document.
func (st *streams) command(c *clientConn, backend net.Conn, name string, m *msg) (bson.Raw, error) {
	if reply, err := st.trip(name); reply != nil || err != nil {
		return reply, err
	}
	switch {
	case name == "configureFailPoint":
		return st.configureFailPoint(m.body), nil
	case isHello(name):
		reply, err := st.forward(backend, m)
		if err != nil {
			return nil, err
		}
		return withFields(reply, st.topology(name))
	case name == "aggregate" && isChangeStream(m.body):
		return st.open(c, m), nil
	case name == "getMore" && ownsCursor(m.body.Lookup("getMore")):
		return st.getMore(c, m), nil
	case name == "killCursors" && ownsCursors(m.body):
		return st.killCursors(m), nil
	case m.body.Lookup("startTransaction").Type != 0:
		return errorReply(codeIllegalOperation, "IllegalOperation", "testserver: transactions are not emulated"), nil
	case isWrite(name):
		return st.write(backend, name, m)
	case name == "drop" || name == "dropDatabase":
		return st.drop(backend, name, m)
	}
	return st.forward(backend, m)
}

func isWrite(name string) bool {
	switch strings.ToLower(name) {
	case "insert", "update", "delete", "findandmodify":
		return true
	}
	return false
}

// forward sends m to the backend in the proxy's turn and returns the
// reply's body. A request the client wants no reply to is sent wanting
// one, so that every request is answered in turn.
func (st *streams) forward(backend net.Conn, m *msg) (bson.Raw, error) {
	st.proxy.turn.Lock()
	defer st.proxy.turn.Unlock()
	return st.exchange(backend, m)
}

// exchange is forward with the turn already held.
func (st *streams) exchange(backend net.Conn, m *msg) (bson.Raw, error) {
	cm, err := clean(m)
	if err != nil {
		return nil, err
	}
	if cm.flags&moreToCome != 0 {
		c := *cm
		c.flags &^= moreToCome
		cm = &c
	}
	reply, err := st.proxy.exchange(backend, cm.encode(0))
	if err != nil {
		return nil, err
	}
	rm, err := parseMsg(reply)
	if err != nil {
		return nil, err
	}
	return rm.body, nil
}

// write forwards a write and records its change events, all in one turn.
// A retry of a retryable write (same lsid and txnNumber) is answered with
// the first attempt's reply, and not run again.
func (st *streams) write(backend net.Conn, name string, m *msg) (bson.Raw, error) {
	st.proxy.turn.Lock()
	defer st.proxy.turn.Unlock()
	key, txn := retryKey(m.body)
	if reply := st.replayed(key, txn); reply != nil {
		return reply, nil
	}
	var netErr error
	reply, err := st.capture.write(name, m, func(m *msg) (bson.Raw, error) {
		r, err := st.exchange(backend, m)
		netErr = err
		return r, err
	})
	if netErr != nil {
		return nil, netErr
	}
	if err != nil {
		return errorReply(codeInternalError, "InternalError", err.Error()), nil
	}
	st.remember(key, txn, reply)
	return reply, nil
}

// legacyHello answers the OP_QUERY handshake as the replica set's primary.
func (st *streams) legacyHello(backend net.Conn, req []byte) ([]byte, error) {
	q, err := parseQuery(req)
	if err != nil {
		return nil, err
	}
	reply, err := st.proxy.roundTrip(backend, req)
	if err != nil {
		return nil, err
	}
	doc, err := replyDoc(reply)
	if err != nil {
		return nil, err
	}
	name, err := commandName(q.query)
	if err != nil {
		return nil, err
	}
	if isHello(name) {
		if doc, err = withFields(doc, append(st.topology(name), st.times()...)); err != nil {
			return nil, err
		}
	}
	return encodeReply(q.requestID, doc), nil
}

// Server error codes the emulation answers (MongoDB's error_codes.yml).
const (
	codeInternalError       = 1
	codeBadValue            = 2
	codeIllegalOperation    = 20
	codeCursorNotFound      = 43
	codeNotImplemented      = 238
	codeInvalidResumeToken  = 260
	codeChangeStreamFatal   = 280
	codeChangeStreamHistory = 286
)

// errorReply is a command's failure as MongoDB answers it.
func errorReply(code int32, codeName, errmsg string, labels ...string) bson.Raw {
	d := bson.D{
		{Key: "ok", Value: 0.0},
		{Key: "errmsg", Value: errmsg},
		{Key: "code", Value: code},
		{Key: "codeName", Value: codeName},
	}
	if len(labels) > 0 {
		d = append(d, bson.E{Key: "errorLabels", Value: labels})
	}
	b, _ := bson.Marshal(d)
	return b
}

// errReply answers err: an errUnsupported as NotImplemented, a resume
// from an invalidate as InvalidResumeToken, the rest as BadValue.
func errReply(err error) bson.Raw {
	var u errUnsupported
	if errors.As(err, &u) {
		return errorReply(codeNotImplemented, "NotImplemented", err.Error())
	}
	if errors.Is(err, errInvalidate) {
		return errorReply(codeInvalidResumeToken, "InvalidResumeToken", err.Error())
	}
	return errorReply(codeBadValue, "BadValue", err.Error())
}
