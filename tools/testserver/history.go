package testserver

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// DefaultHistorySize is how many change events the server keeps for
// resuming streams when [Config.HistorySize] is zero: the emulated oplog.
const DefaultHistorySize = 10_000

// history is the emulated oplog: the cluster clock and the last change
// events, oldest first. Its methods are safe for concurrent use.
type history struct {
	max int

	mu sync.Mutex
	// last is the newest cluster time handed out; it only grows.
	last bson.Timestamp
	// horizon is the newest cluster time whose events are gone: those
	// before the server started, then the newest event dropped for room.
	horizon bson.Timestamp
	// events, ordered by time; appended under mu, trimmed to max.
	events []*event
	// changed is closed and replaced whenever events are appended.
	changed chan struct{}
}

func newHistory(max int) *history {
	if max <= 0 {
		max = DefaultHistorySize
	}
	now := uint32(time.Now().Unix())
	return &history{
		max:     max,
		last:    bson.Timestamp{T: now},
		horizon: bson.Timestamp{T: now - 1, I: ^uint32(0)},
		changed: make(chan struct{}),
	}
}

func tsLess(a, b bson.Timestamp) bool { return a.T < b.T || a.T == b.T && a.I < b.I }

// before returns the cluster time just before t: a stream that starts at
// an operation time t reads the events after it.
func before(t bson.Timestamp) bson.Timestamp {
	if t.I > 0 {
		return bson.Timestamp{T: t.T, I: t.I - 1}
	}
	return bson.Timestamp{T: t.T - 1, I: ^uint32(0)}
}

// now returns the latest cluster time.
func (h *history) now() bson.Timestamp {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// tick advances the cluster clock; mu is held.
func (h *history) tick() bson.Timestamp {
	if now := uint32(time.Now().Unix()); now > h.last.T {
		h.last = bson.Timestamp{T: now, I: 1}
	} else {
		h.last.I++
	}
	return h.last
}

// append gives each event the next cluster time and the wall time, in the
// order given, and keeps them; the oldest beyond the bound are dropped.
func (h *history) append(evs []*event) {
	if len(evs) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	wall := time.Now()
	for _, e := range evs {
		e.at, e.wall = h.tick(), wall
	}
	h.events = append(h.events, evs...)
	if over := len(h.events) - h.max; over > 0 {
		h.horizon = h.events[over-1].at
		h.events = append(h.events[:0:0], h.events[over:]...)
	}
	h.notify()
}

// wake has every waiting stream look at the history again.
func (h *history) wake() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notify()
}

// notify closes and replaces changed; mu is held.
func (h *history) notify() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// errHistoryLost says a stream asked for events the history no longer holds.
var errHistoryLost = errors.New("testserver: resume point is older than the oldest event kept")

// since returns the events after position pos whose wall time is at or
// before cutoff (events held back by a delay are not yet visible), and the
// position a stream reaches by reading them all: the latest cluster time
// when nothing is held back. held is the wall time of the first event held
// back (zero if none); changed is closed when events are next appended.
func (h *history) since(pos bson.Timestamp, cutoff time.Time) (evs []*event, reached bson.Timestamp, held time.Time, changed <-chan struct{}, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if tsLess(pos, h.horizon) {
		return nil, pos, time.Time{}, nil, errHistoryLost
	}
	i := sort.Search(len(h.events), func(i int) bool { return tsLess(pos, h.events[i].at) })
	j := i
	for j < len(h.events) && !h.events[j].wall.After(cutoff) {
		j++
	}
	evs = append(evs, h.events[i:j]...)
	reached = h.last
	if j < len(h.events) {
		held = h.events[j].wall
		reached = pos
		if j > i {
			reached = h.events[j-1].at
		}
	} else if tsLess(h.last, pos) {
		reached = pos
	}
	return evs, reached, held, h.changed, nil
}

// token returns the resume token of the position t, as MongoDB shapes one
// ({_data: hex string}): opaque to clients, ordered as the cluster times.
func token(t bson.Timestamp) bson.D {
	return bson.D{{Key: "_data", Value: fmt.Sprintf("82%08X%08X00", t.T, t.I)}}
}

// invalidateToken returns the resume token of the invalidate event that
// follows the event at t: startAfter may name it, resumeAfter may not.
func invalidateToken(t bson.Timestamp) bson.D {
	return bson.D{{Key: "_data", Value: fmt.Sprintf("82%08X%08X01", t.T, t.I)}}
}

// parseToken returns the position a resume token names, and whether it is
// an invalidate event's.
func parseToken(v bson.RawValue) (bson.Timestamp, bool, error) {
	doc, ok := v.DocumentOK()
	if !ok {
		return bson.Timestamp{}, false, errors.New("testserver: a resume token must be a document")
	}
	data, ok := doc.Lookup("_data").StringValueOK()
	b, err := hex.DecodeString(data)
	if !ok || err != nil || len(b) != 10 || b[0] != 0x82 || b[9] > 1 {
		return bson.Timestamp{}, false, fmt.Errorf("testserver: malformed resume token %v", doc)
	}
	return bson.Timestamp{T: binary.BigEndian.Uint32(b[1:]), I: binary.BigEndian.Uint32(b[5:])}, b[9] == 1, nil
}
