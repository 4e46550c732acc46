package testserver

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Wire protocol opcodes beside OP_MSG, for the legacy handshake the driver
// sends first (MongoDB wire protocol, "Legacy Opcodes").
const (
	opReply = 1
	opQuery = 2004
)

// msg is a parsed OP_MSG: the command document (the kind-0 section) and the
// document sequences (kind-1 sections) beside it.
type msg struct {
	requestID int32
	flags     uint32
	body      bson.Raw
	seqs      []docSeq
}

// docSeq is an OP_MSG kind-1 section: documents that belong in the command
// under the field named id (the driver sends an insert's documents so).
type docSeq struct {
	id   string
	docs []bson.Raw
}

func opCode(b []byte) int32 { return int32(binary.LittleEndian.Uint32(b[12:16])) }

// parseMsg parses an OP_MSG frame as readMessage returns it.
func parseMsg(b []byte) (*msg, error) {
	if len(b) < headerLen+5 || opCode(b) != opMsg {
		return nil, errors.New("testserver: not an OP_MSG")
	}
	m := &msg{requestID: int32(binary.LittleEndian.Uint32(b[4:8])), flags: binary.LittleEndian.Uint32(b[16:20])}
	rest := b[20:]
	if m.flags&1 != 0 { // checksumPresent
		rest = rest[:len(rest)-4]
	}
	for len(rest) > 0 {
		kind := rest[0]
		rest = rest[1:]
		switch kind {
		case 0:
			doc, tail, err := readDoc(rest)
			if err != nil {
				return nil, err
			}
			m.body, rest = doc, tail
		case 1:
			if len(rest) < 4 {
				return nil, errors.New("testserver: short document sequence")
			}
			n := int(binary.LittleEndian.Uint32(rest))
			if n < 5 || n > len(rest) {
				return nil, errors.New("testserver: bad document sequence length")
			}
			seq, err := parseSeq(rest[4:n])
			if err != nil {
				return nil, err
			}
			m.seqs, rest = append(m.seqs, seq), rest[n:]
		default:
			return nil, fmt.Errorf("testserver: unknown OP_MSG section kind %d", kind)
		}
	}
	if m.body == nil {
		return nil, errors.New("testserver: OP_MSG without a body")
	}
	return m, nil
}

func parseSeq(b []byte) (docSeq, error) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return docSeq{}, errors.New("testserver: bad document sequence identifier")
	}
	seq := docSeq{id: string(b[:i])}
	for rest := b[i+1:]; len(rest) > 0; {
		doc, tail, err := readDoc(rest)
		if err != nil {
			return docSeq{}, err
		}
		seq.docs, rest = append(seq.docs, doc), tail
	}
	return seq, nil
}

func readDoc(b []byte) (bson.Raw, []byte, error) {
	if len(b) < 5 {
		return nil, nil, errors.New("testserver: short document")
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n < 5 || n > len(b) {
		return nil, nil, errors.New("testserver: bad document length")
	}
	return bson.Raw(b[:n]), b[n:], nil
}

// encode frames m as an OP_MSG that answers (or, for a request, carries)
// responseTo. Flags other than moreToCome are dropped: no checksum is sent.
func (m *msg) encode(responseTo int32) []byte {
	b := make([]byte, headerLen, headerLen+4+1+len(m.body))
	binary.LittleEndian.PutUint32(b[4:], uint32(m.requestID))
	binary.LittleEndian.PutUint32(b[8:], uint32(responseTo))
	binary.LittleEndian.PutUint32(b[12:], opMsg)
	b = binary.LittleEndian.AppendUint32(b, m.flags&moreToCome)
	b = append(b, 0)
	b = append(b, m.body...)
	for _, s := range m.seqs {
		b = append(b, 1)
		at := len(b)
		b = append(b, 0, 0, 0, 0)
		b = append(b, s.id...)
		b = append(b, 0)
		for _, d := range s.docs {
			b = append(b, d...)
		}
		binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at))
	}
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

// seq returns the documents of the command's array field name, whether the
// client sent them in the body or as a document sequence.
func (m *msg) seq(name string) ([]bson.Raw, error) {
	for _, s := range m.seqs {
		if s.id == name {
			return s.docs, nil
		}
	}
	v, err := m.body.LookupErr(name)
	if err != nil {
		return nil, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, fmt.Errorf("testserver: %s is not an array", name)
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, err
	}
	docs := make([]bson.Raw, 0, len(vals))
	for _, v := range vals {
		d, ok := v.DocumentOK()
		if !ok {
			return nil, fmt.Errorf("testserver: %s holds a non-document", name)
		}
		docs = append(docs, d)
	}
	return docs, nil
}

// legacyQuery is a parsed OP_QUERY, the frame of the driver's first
// handshake.
type legacyQuery struct {
	requestID int32
	query     bson.Raw
}

func parseQuery(b []byte) (*legacyQuery, error) {
	if len(b) < headerLen+4 || opCode(b) != opQuery {
		return nil, errors.New("testserver: not an OP_QUERY")
	}
	rest := b[headerLen+4:]
	i := bytes.IndexByte(rest, 0) // fullCollectionName
	if i < 0 || len(rest) < i+1+8 {
		return nil, errors.New("testserver: bad OP_QUERY")
	}
	doc, _, err := readDoc(rest[i+1+8:])
	if err != nil {
		return nil, err
	}
	return &legacyQuery{requestID: int32(binary.LittleEndian.Uint32(b[4:8])), query: doc}, nil
}

// replyDoc returns the single document of an OP_REPLY.
func replyDoc(b []byte) (bson.Raw, error) {
	const docsAt = headerLen + 4 + 8 + 4 + 4
	if len(b) < docsAt || opCode(b) != opReply {
		return nil, errors.New("testserver: not an OP_REPLY")
	}
	doc, _, err := readDoc(b[docsAt:])
	return doc, err
}

// encodeReply frames doc as an OP_REPLY answering responseTo.
func encodeReply(responseTo int32, doc bson.Raw) []byte {
	b := make([]byte, headerLen, headerLen+20+len(doc))
	binary.LittleEndian.PutUint32(b[8:], uint32(responseTo))
	binary.LittleEndian.PutUint32(b[12:], opReply)
	b = binary.LittleEndian.AppendUint32(b, 0) // responseFlags
	b = binary.LittleEndian.AppendUint64(b, 0) // cursorID
	b = binary.LittleEndian.AppendUint32(b, 0) // startingFrom
	b = binary.LittleEndian.AppendUint32(b, 1) // numberReturned
	b = append(b, doc...)
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

// withFields returns doc with fields set: existing fields of those names
// are replaced in place, new ones appended, the rest copied as they are.
func withFields(doc bson.Raw, fields bson.D) (bson.Raw, error) {
	elems, err := doc.Elements()
	if err != nil {
		return nil, err
	}
	out := make(bson.D, 0, len(elems)+len(fields))
	used := make([]bool, len(fields))
	for _, e := range elems {
		k := e.Key()
		v := bson.E{Key: k, Value: e.Value()}
		for i, f := range fields {
			if f.Key == k {
				v, used[i] = f, true
			}
		}
		out = append(out, v)
	}
	for i, f := range fields {
		if !used[i] {
			out = append(out, f)
		}
	}
	return bson.Marshal(out)
}

// without returns doc less the named fields, and whether any was there.
func without(doc bson.Raw, names ...string) (bson.Raw, bool, error) {
	elems, err := doc.Elements()
	if err != nil {
		return nil, false, err
	}
	out := make(bson.D, 0, len(elems))
	dropped := false
outer:
	for _, e := range elems {
		for _, n := range names {
			if e.Key() == n {
				dropped = true
				continue outer
			}
		}
		out = append(out, bson.E{Key: e.Key(), Value: e.Value()})
	}
	if !dropped {
		return doc, false, nil
	}
	b, err := bson.Marshal(out)
	return b, true, err
}

// setSeq replaces the documents of the command's array field name, where
// the client sent them.
func (m *msg) setSeq(name string, docs []bson.Raw) error {
	for i, s := range m.seqs {
		if s.id == name {
			m.seqs[i].docs = docs
			return nil
		}
	}
	arr := make(bson.A, len(docs))
	for i, d := range docs {
		arr[i] = d
	}
	body, err := withFields(m.body, bson.D{{Key: name, Value: arr}})
	m.body = body
	return err
}
