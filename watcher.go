package dlock

import (
	"context"
	"sync"
	"time"
)

// This file is the watcher: how a Client's waits share their reads, so
// that a process waiting on many keys reads them together. docs/design.md
// ("One watcher per Client") has the seam for pushed views.
//
// A wait that is to sleep long enough before its next round (watches)
// asks the watcher for a view of its key (want). Whichever of the Client's
// waits is due first reads, in one round, its own key and the key of every
// wait wanting one: one find of the keys, in batches of a thousand, from
// the Client's view source, however many keys. Each waiting wait takes the record so read as the read its next
// round would have sent, and sleeps again from what it shows. So the
// rounds come as often as the most urgent wait needs, and the others'
// reads merge into them.
//
// A wait that comes due with no other wait wanting a view runs its round
// as it would alone: its own attempt or read. So a Client waiting on one
// key sends what it sent before, and only waits that overlap share.
//
// Every claim stays the wait's own conditional write on what it saw;
// only reading moves. A view is a read sent after the wait asked, so it is
// never older than what the wait acted on before asking, as far as the
// network keeps order; the waits act on a view as on any read, which may
// be stale (the simulation delivers them late).

// waitRound waits for a wait's next round on key, d as its pacing asks,
// capped as waitPoll caps it: in the watcher when d is long enough
// (watches), and then it returns the view a round read, if one did.
func (c *Client) waitRound(ctx context.Context, cfg *config, key string, d, limit time.Duration, w *watch, ew *entryWatch) (*view, error) {
	if c.watches(d, cfg) {
		return c.waitView(ctx, key, d, limit, w, ew)
	}
	return nil, c.waitPoll(ctx, d, limit, w, ew)
}

// watches reports whether a wait that is to sleep d before its next round
// sleeps in the watcher (waitView): when d is four minimum backoffs or
// more (20 ms by default), so that a wait takes part in at most fifty
// rounds a second: the rounds come as often as the most urgent wait
// needs. A
// wait that must poll sooner (a head during holds of less than about
// 80 ms, which polls every quarter of a hand-over) polls alone, as it
// would with no other wait: a round at its pace would read all the other
// keys as often, and its view then its attempt would cost a command more
// at each hand-over than its attempt alone.
func (c *Client) watches(d time.Duration, cfg *config) bool {
	return d >= 4*cfg.minBackoff && c.pacer.uses(ruleWatch)
}

// A watcher is the Client's table of the keys its waits want a view of,
// and its rounds. It has no goroutine: the waits run the rounds, one at a
// time.
type watcher struct {
	mu     sync.Mutex
	wants  map[string]int // guarded by mu: the keys the next round reads, by how many waits want a view of each
	next   *round         // guarded by mu: the round they go in, not begun
	flight *round         // guarded by mu: the round being read, or nil
	fails  *poller        // guarded by mu: the backoff after rounds that failed in a row, or nil after one that did not
}

// A round is one read of the keys its waits wanted: done is closed once
// views holds the view of each, or err the round's error and retry how
// long its waits wait before they go in the next round.
type round struct {
	done  chan struct{}
	views map[string]*view
	err   error
	retry time.Duration
}

// A view is what a round read of one key: the record (the zero record
// when there is none), when the read was sent.
type view struct {
	r    record
	sent time.Time
}

// want adds a want of a view of key to the next round, and returns it.
func (w *watcher) want(key string) *round {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.next == nil {
		w.next, w.wants = &round{done: make(chan struct{})}, map[string]int{}
	}
	w.wants[key]++
	return w.next
}

// drop takes back a want of key in round rd, if rd has not begun.
func (w *watcher) drop(key string, rd *round) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rd != w.next {
		return
	}
	if w.wants[key]--; w.wants[key] == 0 {
		delete(w.wants, key)
	}
}

// begin decides, for a wait whose sleep ended wanting a view of key in
// round rd, what it does: wait for rd, begun by another wait (wait is
// rd.done); wait for the round in flight to end, then decide again (wait
// is its done); or, with none in flight, read rd itself (keys: every key
// rd's waits want, key first), unless this wait alone wants one (then
// its want is taken back, and it runs its own round).
func (w *watcher) begin(key string, rd *round) (wait <-chan struct{}, keys []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case rd != w.next:
		return rd.done, nil
	case w.flight != nil:
		return w.flight.done, nil
	case len(w.wants) == 1 && w.wants[key] == 1:
		w.next, w.wants = nil, nil
		return nil, nil
	}
	keys = append(make([]string, 0, len(w.wants)), key)
	for k := range w.wants {
		if k != key {
			keys = append(keys, k)
		}
	}
	w.flight, w.next, w.wants = rd, nil, nil
	return nil, keys
}

// failed notes a round that failed and returns how long its waits wait
// before they go in the next one: a backoff that grows over rounds that
// fail in a row, so that a server in trouble gets one round a backoff,
// not every wait's own command at once.
func (w *watcher) failed(cfg *config) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fails == nil {
		p := newPoller(cfg.minBackoff, cfg.maxBackoff)
		w.fails = &p
	}
	return w.fails.next()
}

// succeeded notes a round that did not fail.
func (w *watcher) succeeded() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fails = nil
}

// end ends the round in flight.
func (w *watcher) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.flight.done)
	w.flight = nil
}

// waitView sleeps as waitPoll does, for the wait of key, but takes a view
// of key that another wait's round reads meanwhile; when it comes due
// while others want one, it reads the round for them all (after the round
// in flight, if one is: the waits that come due during a round go in the
// next). A round that fails is retried as a round by all its waits, after
// the watcher's backoff (watcher.failed): never more than a maximum
// backoff and its jitter, maxSleep, the least of the caps on a wait's
// sleep, so a failing server delays no watch by more than a sleep of the
// wait's own would. It returns the view, or nil when none came (the
// wait's next round then goes as planned, alone), or ctx's error, or
// ErrClosed.
func (c *Client) waitView(ctx context.Context, key string, d, limit time.Duration, w *watch, ew *entryWatch) (*view, error) {
	rd := c.watcher.want(key)
	t := c.clock.NewTimer(pollFor(c.clock.Now(), d, limit, w, ew))
	defer func() { t.Stop() }()
	var wait <-chan struct{}
	for {
		select {
		case <-rd.done:
		case <-t.C:
		case <-wait:
		case <-ctx.Done():
			c.watcher.drop(key, rd)
			return nil, ctx.Err()
		case <-c.closing:
			c.watcher.drop(key, rd)
			return nil, ErrClosed
		}
		if !isDone(rd.done) {
			var keys []string
			if wait, keys = c.watcher.begin(key, rd); wait != nil {
				continue // rd, or the round in flight, ends first
			}
			if keys == nil {
				return nil, nil // alone: the wait's own round
			}
			c.read(ctx, rd, keys)
			c.watcher.end()
		}
		if rd.err == nil {
			return rd.views[key], nil
		}
		t.Stop()
		t = c.clock.NewTimer(rd.retry)
		rd, wait = c.watcher.want(key), nil
	}
}

// isDone reports whether ch is closed.
func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A viewSource gives the watcher's rounds the records of keys, in order
// (the zero record for a key that has none): the seam for views pushed by
// the server. Polling (pollSource) is the only one today; docs/design.md
// ("One watcher per Client") has what a change stream would need.
type viewSource interface {
	views(ctx context.Context, keys []string) ([]record, error)
}

// pollSource reads the keys of a round: one find of them all, in batches
// (store.readMany).
type pollSource struct{ st store }

func (p pollSource) views(ctx context.Context, keys []string) ([]record, error) {
	return p.st.readMany(ctx, keys)
}

// read reads round rd's keys from the Client's view source.
func (c *Client) read(ctx context.Context, rd *round, keys []string) {
	sent := c.clock.Now()
	var rs []record
	if rs, rd.err = c.source.views(ctx, keys); rd.err != nil {
		if ctx.Err() == nil { // not the reading wait's own end: the server's failure
			rd.retry = c.watcher.failed(&c.cfg)
		}
		return
	}
	c.watcher.succeeded()
	rd.views = make(map[string]*view, len(keys))
	for i, k := range keys {
		rd.views[k] = &view{r: rs[c.viewOf(i, len(keys))], sent: sent}
	}
}

// viewOf is the index of the record read for the i-th of n keys: i, but
// for flawViewOfOtherKey, which hands a wait another key's view.
func (c *Client) viewOf(i, n int) int {
	if c.cfg.hooks.flawed(flawViewOfOtherKey) {
		return (i + 1) % n
	}
	return i
}
