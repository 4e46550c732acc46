package testserver

import (
	"go.mongodb.org/mongo-driver/v2/bson"
)

// maxSessions bounds the retryable-write records kept: past it they are
// all dropped, and a retry of an older write runs again.
const maxSessions = 10_000

// retried is the last retryable write of a session: its txnNumber and the
// reply it got.
type retried struct {
	txn   int64
	reply bson.Raw
}

// retryKey names a retryable write's session (its lsid), or "" for a
// write that is not retryable (no txnNumber).
func retryKey(body bson.Raw) (string, int64) {
	txn, ok := body.Lookup("txnNumber").AsInt64OK()
	if !ok {
		return "", 0
	}
	id, err := body.LookupErr("lsid", "id")
	if err != nil {
		return "", 0
	}
	return string(id.Value), txn
}

// replayed returns the reply a retryable write already got, if this is a
// retry of it: MongoDB runs a retryable write once and answers its retries
// from the session's record. The caller holds the proxy's turn.
func (st *streams) replayed(key string, txn int64) bson.Raw {
	if key == "" {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if r, ok := st.retries[key]; ok && r.txn == txn {
		return r.reply
	}
	return nil
}

// remember records a retryable write's reply for its retries.
func (st *streams) remember(key string, txn int64, reply bson.Raw) {
	if key == "" {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.retries) >= maxSessions {
		st.retries = nil
	}
	if st.retries == nil {
		st.retries = map[string]retried{}
	}
	st.retries[key] = retried{txn: txn, reply: reply}
}
