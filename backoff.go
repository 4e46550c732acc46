package dlock

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// A poller spaces the polls of one wait for a held key with backoff's
// [backoff.ExponentialBackOff]: each wait is the current interval jittered
// by ±50%, and the interval doubles up to max. The caller's context decides
// how long to wait in all (v5's ExponentialBackOff never gives up by
// itself). A poller is used by one goroutine.
type poller struct {
	b    backoff.ExponentialBackOff
	last time.Duration // the interval of the last wait, before jitter; set by next
}

// newPoller returns a poller whose first interval is initial.
func newPoller(initial, max time.Duration) poller {
	return poller{b: backoff.ExponentialBackOff{
		InitialInterval:     initial,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         max,
	}}
}

// next returns the wait before the next poll and doubles the interval.
//
// ExponentialBackOff keeps its interval to itself and returns it jittered,
// so last is read from a copy of it asked without jitter: the interval the
// real one is about to jitter, whatever rule it grows by.
func (p *poller) next() time.Duration {
	probe := p.b
	probe.RandomizationFactor = 0
	p.last = probe.NextBackOff()
	return p.b.NextBackOff()
}

// lastOrZero is p's last interval, or 0 for no poller.
func (p *poller) lastOrZero() time.Duration {
	if p == nil {
		return 0
	}
	return p.last
}

// A lastWait is what a primitive remembers of its last wait for its key: the
// interval its polls had reached, and when it ended. A wait that starts
// within a TTL of the last one resumes at that interval instead of the
// minimum: under steady contention each waiter polls about as often as the
// key changes hands, rather than relearning it with a burst of fast polls
// on every Lock.
type lastWait struct {
	interval time.Duration
	at       time.Time
}

// start returns the poller for a wait that begins at now.
func (p lastWait) start(now time.Time, cfg *config) poller {
	interval := cfg.minBackoff
	if !p.at.IsZero() && now.Sub(p.at) < cfg.ttl {
		interval = min(max(p.interval, interval), cfg.maxBackoff)
	}
	return newPoller(interval, cfg.maxBackoff)
}
