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
		c.record(s0, l0.Add(time.Duration(float64(lag)*localRate)))
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
