package dlock

import (
	"sync"
	"time"
)

// serverClock estimates the server's clock from its last reading, for
// [WithServerClockTakeover], so that a waiter need not read it again for
// every new record it sees. The server's clock showed S at some instant
// before its reply arrived at local time L; a further Δ later on the local
// clock, with both clocks' rates within [MaxClockDrift] of true time, it
// shows at least S + Δ·(1-ρ)/(1+ρ). The estimate is that lower bound: it can
// only make a record look younger than it is, so a waiter relying on it
// waits longer, never less. A reading serves for at most one TTL, which
// keeps the bound within 2% of a TTL of the truth.
//
// Each new reading is checked against the last: the server time between
// them must agree with the local time between them, within the drift
// allowance and the two round trips. When it does not, the server's clock
// was stepped, or two clocks answered (a failover, mongos and a shard), and
// the Client stops counting the server's clock for good. A step between a
// record's stamp and the first reading cannot be seen this way: that is
// what the option's documentation warns of.
type serverClock struct {
	mu          sync.Mutex
	unsupported bool      // not reported, not trusted, or disagreed with ours
	server      time.Time // the last reading
	sent, local time.Time // the local clock when it was asked for and when it arrived
}

// estimate returns a lower bound of the server's clock at local time now,
// from a reading at most maxAge old; ok=false when there is none.
func (s *serverClock) estimate(now time.Time, maxAge time.Duration) (t time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := now.Sub(s.local)
	if s.unsupported || s.server.IsZero() || d < 0 || d > maxAge {
		return time.Time{}, false
	}
	return s.server.Add(slow(d)), true
}

// slow is the least true time, and so the least time on another clock,
// that has passed when d has passed on one clock.
func slow(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (1 - MaxClockDrift) / (1 + MaxClockDrift))
}

// fast is the most time that has passed on another clock when d has
// passed on one.
func fast(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (1 + MaxClockDrift) / (1 - MaxClockDrift))
}

// record keeps a reading of the server's clock, asked for at local time
// sent and arriving at now, and returns it as the estimate for now. It
// returns ok=false, and stops trusting the server's clock, when the
// reading disagrees with the last one.
func (s *serverClock) record(server, sent, now time.Time) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unsupported {
		return time.Time{}, false
	}
	if !s.server.IsZero() {
		elapsed := server.Sub(s.server)
		least := slow(sent.Sub(s.local)) - serverClockResolution
		most := fast(now.Sub(s.sent)) + serverClockResolution
		if elapsed < least || elapsed > most {
			s.unsupported = true
			return time.Time{}, false
		}
	}
	s.server, s.sent, s.local = server, sent, now
	return server, true
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
