package dlock

import (
	"context"
	"time"
)

// This file is the liveness watches: how a wait learns, on its own clock,
// that a holder or a waiter ahead of it stopped extending (an epoch or a
// revision unchanged for its TTL), and the cap on every sleep of a wait
// (pollFor) that wakes it in time to act on them. Every bound of
// docs/fairness.md on the dead rests on these: no pacing rule can skip
// them, since every sleep of a wait passes through pollFor.

// waitPoll waits d, what the wait's pacing asked for, before the next
// poll of a held key; or less when the watch of the record (w) or of an
// entry (ew) is due sooner; and never longer than limit (maxSleep, or
// schedule.limit). These caps, not the pacing, keep the liveness bounds
// (pacer.go). It returns ctx's error or ErrClosed when those come first.
func (c *Client) waitPoll(ctx context.Context, d, limit time.Duration, w *watch, ew *entryWatch) error {
	t := c.clock.NewTimer(pollFor(c.clock.Now(), d, limit, w, ew))
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	case <-c.closing:
		t.Stop()
		return ErrClosed
	}
}

// pollFor is how long a wait sleeps at now before its next poll (waitPoll,
// waitView): d, or less when a watch is due sooner, never longer than
// limit. It wakes when a watch comes due, not again and again once it is:
// an attempt that could not act on it (the server out of reach) waits for
// the poll, rather than spinning.
func pollFor(now time.Time, d, limit time.Duration, w *watch, ew *entryWatch) time.Duration {
	if due := w.wait(now); w.rev != 0 && due > 0 {
		d = min(d, due)
	}
	if due := ew.wait(now); due > 0 {
		d = min(d, due)
	}
	return min(d, limit)
}

// An entryWatch is a waiter's view of the entries (shared holds and
// writers' registrations) of a record: each entry's epoch and, on the
// waiter's clock, when it may be cleared if its epoch has not changed.
// That is the rule of watch, applied per entry: an owner's extension
// changes its entry's epoch, so an epoch unchanged for the entry's TTL
// since the waiter's read arrived means its owner relies on it no more.
type entryWatch struct {
	seen     map[string]watchedEntry
	reapLive bool // flawReapLive: entries are due at once
}

type watchedEntry struct {
	role     role
	key      string
	epoch    int64
	token    Token
	stored   string
	deadline time.Time
}

// observe records r's entries of the given roles (those that block the
// waiter), read at now; it forgets every other entry.
func (ew *entryWatch) observe(r record, now time.Time, roles ...role) {
	next := make(map[string]watchedEntry, len(r.Shared)+len(r.Waiters))
	for _, ro := range roles {
		for k, e := range r.entries(ro) {
			id := string(rune('0'+ro)) + k
			old, ok := ew.seen[id]
			if !ok || old.epoch != e.Epoch || old.token != e.Token || old.stored != e.Stored {
				old = watchedEntry{role: ro, key: k, epoch: e.Epoch, token: e.Token, stored: e.Stored, deadline: now.Add(e.TTL)}
				if ew.reapLive {
					old.deadline = now
				}
			}
			next[id] = old
		}
	}
	ew.seen = next
}

// dueAt makes the watched entry hk of role ro clearable from at.
func (ew *entryWatch) dueAt(ro role, hk string, at time.Time) {
	id := string(rune('0'+ro)) + hk
	if e, ok := ew.seen[id]; ok {
		e.deadline = at
		ew.seen[id] = e
	}
}

// due returns the watched entries that may be cleared at now.
func (ew *entryWatch) due(now time.Time) []staleEntry {
	var stale []staleEntry
	for _, e := range ew.seen {
		if !now.Before(e.deadline) {
			stale = append(stale, staleEntry{role: e.role, key: e.key, epoch: e.epoch, token: e.token, stored: e.stored})
		}
	}
	return stale
}

// wait is how long from now until the first watched entry may be cleared,
// or -1 when none is watched.
func (ew *entryWatch) wait(now time.Time) time.Duration {
	d := time.Duration(-1)
	for _, e := range ew.seen {
		if left := max(e.deadline.Sub(now), 0); d < 0 || left < d {
			d = left
		}
	}
	return d
}

// watchHolder brings w up to date with r, a record just read (or
// returned by a registration). A hold of this Client's that no call of it
// uses (an earlier attempt's, whose Lock gave up before its reply came,
// or a lease that was lost) may be taken over at once: this call holds
// the Client's slot for the key, so no other call of it relies on that
// hold. With [WithServerClockTakeover], when the record's revision is new
// to w, it also estimates the server's clock (reading it when the last
// reading is over a TTL old), so that a record written long ago by the
// server's clock can be taken over without waiting a further TTL.
func (c *Client) watchHolder(ctx context.Context, r record, w *watch) {
	if r.free() {
		return
	}
	if r.Owner == c.owner {
		w.orphan(r, c.clock.Now())
		return
	}
	elapsed := time.Duration(-1)
	if c.cfg.hooks.flawed(flawWallClockExpiry) {
		elapsed = c.clock.Now().Sub(r.At) // our wall clock against the server's: unsound
	}
	if r.Rev != w.rev && c.serverClock.reported() {
		now, ok := c.serverClock.estimate(c.clock.Now(), r.TTL)
		if !ok {
			sent := c.clock.Now()
			switch t, reported, err := c.store.serverTime(ctx); {
			case err != nil:
				// Not fatal: wait a full TTL on our own clock instead.
			case !reported:
				c.serverClock.markUnsupported()
			default:
				now, ok = c.serverClock.record(t, sent, c.clock.Now())
			}
		}
		if ok {
			elapsed = now.Sub(r.At)
		}
	}
	w.observe(r, c.clock.Now(), elapsed)
}
