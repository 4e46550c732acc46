package testserver

import (
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// failPoint is MongoDB's failCommand fail point (a test command of
// mongod's), as far as the driver's tests configure it: fail or delay the
// next times commands of the names given. It answers configureFailPoint
// in replica-set mode only.
type failPoint struct {
	times     int // how many more commands it fails; -1: until turned off
	commands  map[string]bool
	code      int32
	labels    []string
	closeConn bool          // close the connection instead of answering
	block     time.Duration // wait this long first (blockConnection)
}

// errCloseConn has serve close the client's connection.
var errCloseConn = errors.New("testserver: connection closed by a fail point")

// configureFailPoint answers {configureFailPoint: "failCommand", mode,
// data}; other fail points are not emulated.
func (st *streams) configureFailPoint(body bson.Raw) bson.Raw {
	if name, _ := body.Lookup("configureFailPoint").StringValueOK(); name != "failCommand" {
		return errorReply(codeBadValue, "BadValue", fmt.Sprintf("testserver: fail point %q is not emulated", name))
	}
	fp, err := parseFailPoint(body)
	if err != nil {
		return errReply(err)
	}
	st.mu.Lock()
	st.failPoint = fp
	st.mu.Unlock()
	b, _ := bson.Marshal(bson.D{{Key: "count", Value: int32(0)}, {Key: "ok", Value: 1.0}})
	return b
}

func parseFailPoint(body bson.Raw) (*failPoint, error) {
	mode := body.Lookup("mode")
	fp := &failPoint{times: -1, commands: map[string]bool{}}
	if s, ok := mode.StringValueOK(); ok {
		switch s {
		case "off":
			return nil, nil
		case "alwaysOn":
		default:
			return nil, fmt.Errorf("testserver: fail point mode %q", s)
		}
	} else {
		d, _ := mode.DocumentOK()
		n, ok := d.Lookup("times").AsInt64OK()
		if !ok {
			return nil, errUnsupported{"fail point mode " + mode.String()}
		}
		fp.times = int(n)
	}
	data, _ := body.Lookup("data").DocumentOK()
	elems, _ := data.Elements()
	for _, e := range elems {
		v := e.Value()
		switch e.Key() {
		case "failCommands":
			arr, _ := v.ArrayOK()
			names, _ := arr.Values()
			for _, n := range names {
				s, _ := n.StringValueOK()
				fp.commands[s] = true
			}
		case "errorCode":
			n, _ := v.AsInt64OK()
			fp.code = int32(n)
		case "errorLabels":
			arr, _ := v.ArrayOK()
			labels, _ := arr.Values()
			for _, l := range labels {
				s, _ := l.StringValueOK()
				fp.labels = append(fp.labels, s)
			}
		case "closeConnection":
			fp.closeConn = flag(v)
		case "blockConnection":
		case "blockTimeMS":
			n, _ := v.AsInt64OK()
			fp.block = time.Duration(n) * time.Millisecond
		default:
			return nil, errUnsupported{"fail point option " + e.Key()}
		}
	}
	if !flag(data.Lookup("blockConnection")) {
		fp.block = 0
	}
	return fp, nil
}

// trip applies the fail point to a command named name: it answers the
// reply to send instead of running it, or errCloseConn, or nil to run it.
func (st *streams) trip(name string) (bson.Raw, error) {
	st.mu.Lock()
	fp := st.failPoint
	if fp == nil || !fp.commands[name] || fp.times == 0 {
		st.mu.Unlock()
		return nil, nil
	}
	if fp.times > 0 {
		fp.times--
	}
	st.mu.Unlock()
	if fp.block > 0 {
		t := time.NewTimer(fp.block)
		select {
		case <-t.C:
		case <-st.done:
		}
		t.Stop()
	}
	switch {
	case fp.closeConn:
		return nil, errCloseConn
	case fp.code != 0:
		return errorReply(fp.code, "", "Failing command via 'failCommand' failpoint", fp.labels...), nil
	}
	return nil, nil
}
