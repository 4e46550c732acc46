package dlock

import (
	"sync"
	"time"
)

// serverClock estimates the server's clock from its last reading, so that a
// waiter need not read it again for every new record it sees. The server's
// clock showed S at some instant before its reply arrived at local time L;
// a further Δ later on the local clock, with both clocks' rates within
// [MaxClockDrift] of true time, it shows at least S + Δ·(1-ρ)/(1+ρ). The
// estimate is that lower bound: it can only make a record look younger
// than it is, so a waiter relying on it waits longer, never less. A reading
// serves for at most one TTL, which keeps the bound within 2% of a TTL of
// the truth and lets a server whose clock was reset be noticed in time.
type serverClock struct {
	mu          sync.Mutex
	unsupported bool      // the server does not report its clock
	server      time.Time // the last reading
	local       time.Time // the local clock when it arrived
}

// estimate returns a lower bound of the server's clock at local time now,
// from a reading at most maxAge old; ok=false when there is none.
func (s *serverClock) estimate(now time.Time, maxAge time.Duration) (t time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := now.Sub(s.local)
	if s.server.IsZero() || d < 0 || d > maxAge {
		return time.Time{}, false
	}
	return s.server.Add(time.Duration(float64(d) * (1 - MaxClockDrift) / (1 + MaxClockDrift))), true
}

// record keeps a reading of the server's clock that arrived at local time
// now.
func (s *serverClock) record(server, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.server, s.local = server, now
}

// markUnsupported notes that the server does not report its clock.
func (s *serverClock) markUnsupported() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unsupported = true
}

// reported says whether the server reports its clock, as far as known.
func (s *serverClock) reported() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.unsupported
}
