package dlock

import "time"

// MaxClockDrift is the largest difference in rate, as a fraction, between any
// participant's clock (clients and server) and true time that dlock's
// exclusion guarantee tolerates: 0.01 means each clock may gain or lose up
// to 1% (36 s an hour). Wall-clock offsets of any size are harmless.
const MaxClockDrift = 0.01

// lostGuard is the share of the TTL a holder gives up on top of the drift
// allowance, so that the lease is declared lost a little before the drift
// bound would allow: it absorbs the lateness of timers and of the caller
// between checking the lease and acting on it.
const lostGuard = 0.01

// serverClockResolution is the granularity of BSON dates: the server's
// timestamps are truncated to it.
const serverClockResolution = time.Millisecond

// holdFor is how long, on the holder's own clock, a holder may rely on a
// write it SENT: the key is then held until send time + holdFor(ttl).
//
// A waiter takes the key over only after it has seen the holder's last write
// unchanged for ttl on its own clock (see takeoverWait). With each clock's
// rate within [1-ρ, 1+ρ] of true time, the holder's reliance lasts at most
// holdFor/(1-ρ) of true time after it sent the write, and the waiter's wait at
// least ttl/(1+ρ) after the write was applied, which is later than it was
// sent. holdFor = ttl·(1-ρ)/(1+ρ) makes the first no longer than the second.
func holdFor(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*(1-MaxClockDrift)/(1+MaxClockDrift) - float64(ttl)*lostGuard)
}

// takeoverWait is how long a waiter waits, on its own clock, from receiving
// an observation of a held record until it may take the record over if it is
// still unchanged. serverElapsed is how long before the observation, on the
// server's clock, the record was last written (negative when unknown). The
// server's clock drifts like any other, so elapsed server time counts as
// true time at the same 1/(1+ρ) discount as the waiter's own wait: together
// they must reach ttl.
func takeoverWait(ttl, serverElapsed time.Duration) time.Duration {
	if serverElapsed -= serverClockResolution; serverElapsed <= 0 {
		return ttl
	}
	return max(ttl-serverElapsed, 0)
}

// A watch is a waiter's view of a key held by someone else: the revision it
// saw and, on its own clock, when that revision may be taken over.
type watch struct {
	at       stamp // the state watched (see stamp)
	rev      int64 // at.rev: 0 when nothing is watched
	deadline time.Time
}

// observe records an observation of rec received at now. serverElapsed is
// the server's time since rec was written, or negative when unknown.
func (w *watch) observe(rec record, now time.Time, serverElapsed time.Duration) {
	d := now.Add(takeoverWait(rec.maxTTL(), serverElapsed))
	if s := stampOf(rec); s != w.at || d.Before(w.deadline) {
		w.at, w.rev, w.deadline = s, rec.Rev, d
	}
}

// orphan records an observation, received at now, of a hold of this
// Client's that no call of it relies on: it may be taken over at once.
func (w *watch) orphan(rec record, now time.Time) {
	w.at, w.rev, w.deadline = stampOf(rec), rec.Rev, now
}

// takeover is the state that may be taken over at now, or the zero stamp.
func (w *watch) takeover(now time.Time) stamp {
	if w.rev == 0 || now.Before(w.deadline) {
		return stamp{}
	}
	return w.at
}

// wait is how long from now until the watched revision may be taken over.
func (w *watch) wait(now time.Time) time.Duration {
	return w.deadline.Sub(now)
}
