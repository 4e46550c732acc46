package dlock

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The estimate of the server's clock never runs ahead of the server's
// clock, whatever the two clocks' rates within MaxClockDrift, and it is
// not used past its age limit.
func TestServerClockEstimateIsALowerBound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rate := func(name string) float64 {
			return 1 + rapid.Float64Range(-MaxClockDrift, MaxClockDrift).Draw(t, name)
		}
		localRate, serverRate := rate("localRate"), rate("serverRate")
		// True time 0: the server reads S; the reply arrives lag later.
		lag := time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(t, "lag"))
		s0 := time.Unix(rapid.Int64Range(0, 1<<40).Draw(t, "serverOffset"), 0)
		l0 := time.Unix(rapid.Int64Range(0, 1<<40).Draw(t, "localOffset"), 0)
		var c serverClock
		c.record(s0, l0, l0.Add(time.Duration(float64(lag)*localRate)))
		after := time.Duration(rapid.Int64Range(0, int64(time.Minute)).Draw(t, "after")) // true time after arrival
		local := l0.Add(time.Duration(float64(lag+after) * localRate))
		server := s0.Add(time.Duration(float64(lag+after) * serverRate))
		maxAge := time.Duration(rapid.Int64Range(1, int64(2*time.Minute)).Draw(t, "maxAge"))
		est, ok := c.estimate(local, maxAge)
		if age := local.Sub(l0.Add(time.Duration(float64(lag) * localRate))); ok != (age <= maxAge) {
			t.Fatalf("ok=%v for a reading %v old, limit %v", ok, age, maxAge)
		}
		if ok && est.After(server) {
			t.Fatalf("estimate %v is ahead of the server's clock %v by %v", est, server, est.Sub(server))
		}
	})
}

// Two readings of a clock that runs within MaxClockDrift agree, whatever
// the lags; a reading after a step of the server's clock by more than the
// round trips allow does not, and the server's clock is then no longer
// used.
func TestServerClockCrossCheck(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rate := func(name string) float64 {
			return 1 + rapid.Float64Range(-MaxClockDrift, MaxClockDrift).Draw(t, name)
		}
		localRate, serverRate := rate("localRate"), rate("serverRate")
		s0 := time.Unix(rapid.Int64Range(0, 1<<40).Draw(t, "serverOffset"), 0)
		l0 := time.Unix(rapid.Int64Range(0, 1<<40).Draw(t, "localOffset"), 0)
		at := func(base time.Time, rate float64, trueT time.Duration) time.Time {
			return base.Add(time.Duration(float64(trueT) * rate))
		}
		// A reading: asked at true time a, read by the server at a+up,
		// arriving at a+up+down.
		read := func(c *serverClock, a time.Duration, step time.Duration) bool {
			up := time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(t, "up"))
			down := time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(t, "down"))
			_, ok := c.record(at(s0, serverRate, a+up).Add(step).Truncate(time.Millisecond), at(l0, localRate, a), at(l0, localRate, a+up+down))
			return ok
		}
		var c serverClock
		first := time.Duration(rapid.Int64Range(0, int64(time.Hour)).Draw(t, "first"))
		second := first + 2*time.Second + time.Duration(rapid.Int64Range(0, int64(time.Hour)).Draw(t, "gap"))
		if !read(&c, first, 0) || !read(&c, second, 0) {
			t.Fatal("two readings of a clock within the drift bound disagreed")
		}
		// A step bigger than the round trips and the drift over the gap.
		step := 3*time.Second + time.Duration(float64(second)*4*MaxClockDrift)
		if rapid.Bool().Draw(t, "back") {
			step = -step
		}
		third := second + 2*time.Second
		if read(&c, third, step) {
			t.Fatalf("a step of %v went unnoticed", step)
		}
		if _, ok := c.estimate(at(l0, localRate, third+3*time.Second), time.Hour); ok || c.reported() {
			t.Fatal("the server's clock is still used after a step")
		}
	})
}
