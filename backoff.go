package dlock

import (
	"math/rand/v2"
	"time"
)

// A poller spaces the polls of one wait for a held key: each wait is the
// current interval jittered by ±50%, and the interval doubles up to max.
// The caller's context decides how long to wait in all.
type poller struct {
	interval, max time.Duration
	last          time.Duration // the interval of the last wait, before jitter
}

// next returns the wait before the next poll and doubles the interval.
func (p *poller) next() time.Duration {
	p.last = p.interval
	p.interval = min(2*p.interval, p.max)
	return p.last/2 + rand.N(p.last+1)
}

// A pace is what a Mutex remembers of its last wait for its key: the
// interval its polls had reached, and when it ended. A wait that starts
// within a TTL of the last one resumes at that interval instead of the
// minimum: under steady contention each waiter polls about as often as the
// key changes hands, rather than relearning it with a burst of fast polls
// on every Lock.
type pace struct {
	interval time.Duration
	at       time.Time
}

// start returns the poller for a wait that begins at now.
func (p pace) start(now time.Time, cfg *config) poller {
	interval := cfg.minBackoff
	if !p.at.IsZero() && now.Sub(p.at) < cfg.ttl {
		interval = min(max(p.interval, interval), cfg.maxBackoff)
	}
	return poller{interval: interval, max: cfg.maxBackoff}
}
