package testserver

import (
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// faultState holds the faults a test asked for, by namespace ("" for
// every stream); guarded by streams.mu.
type faultState struct {
	failures map[string][]bson.Raw    // the replies of the next getMores
	delays   map[string]time.Duration // how long events are held back
}

// nsMatch reports whether a fault for ns applies to cur.
func nsMatch(ns string, cur *cursor) bool { return ns == "" || ns == cur.ns }

func (f *faultState) takeFailure(cur *cursor) bson.Raw {
	if cur == nil {
		return nil
	}
	for ns, q := range f.failures {
		if nsMatch(ns, cur) && len(q) > 0 {
			f.failures[ns] = q[1:]
			return q[0]
		}
	}
	return nil
}

func (f *faultState) delayOf(cur *cursor) time.Duration {
	d := f.delays[""]
	if v, ok := f.delays[cur.ns]; ok {
		d = v
	}
	return d
}

// errNoStreams answers a fault asked of a server without change streams.
var errNoStreams = errors.New("testserver: change streams are off (Config.ChangeStreams)")

// KillChangeStreams kills the cursors of the change streams on ns
// ("db.coll"; "" for every stream), as a server that lost them would: the
// next getMore on each fails with CursorNotFound (43), on which the
// driver resumes. It returns how many it killed.
func (s *Server) KillChangeStreams(ns string) (int, error) {
	st := s.streams
	if st == nil {
		return 0, errNoStreams
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	n := 0
	for id, cur := range st.cursors {
		if nsMatch(ns, cur) {
			delete(st.cursors, id)
			cur.kill()
			n++
		}
	}
	return n, nil
}

// FailNextGetMore makes the next getMore on a change stream on ns (""
// for any) fail with code, codeName and the error labels given. With the
// label "ResumableChangeStreamError" (and a code such as 91,
// ShutdownInProgress) the driver resumes, as it does on MongoDB 4.4 and
// later, which label the errors a stream survives; without it, it does
// not.
func (s *Server) FailNextGetMore(ns string, code int32, codeName string, labels ...string) error {
	st := s.streams
	if st == nil {
		return errNoStreams
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.faults.failures == nil {
		st.faults.failures = map[string][]bson.Raw{}
	}
	reply := errorReply(code, codeName, "testserver: injected fault", labels...)
	st.faults.failures[ns] = append(st.faults.failures[ns], reply)
	return nil
}

// DelayChangeEvents holds the events back from the change streams on ns
// ("" for every stream) until d after their writes; 0 ends the delay.
// Writes are not delayed, only what the streams see of them.
func (s *Server) DelayChangeEvents(ns string, d time.Duration) error {
	st := s.streams
	if st == nil {
		return errNoStreams
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.faults.delays == nil {
		st.faults.delays = map[string]time.Duration{}
	}
	st.faults.delays[ns] = d
	st.hist.wake()
	return nil
}

// DropConnections closes every client connection, as a server restart or
// a network failure would; clients reconnect. The cursors the connections
// last used are killed with them.
func (s *Server) DropConnections() error {
	if s.proxy == nil {
		return errors.New("testserver: no proxy to drop connections of (Config.Raw)")
	}
	s.proxy.dropConns()
	return nil
}
