package dlock

import (
	"math"
	"time"
)

// A clock is where the lease logic reads time. Only differences between its
// readings matter (dlock never compares wall clocks of two machines), so a
// clock may be offset from true time by any amount; its rate must stay within
// [MaxClockDrift] of true time for the safety argument in docs/design.md to hold.
// Tests inject skewed and drifting clocks through withClock.
type clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires after d has passed on this clock.
	NewTimer(d time.Duration) *time.Timer
}

type systemClock struct{}

func (systemClock) Now() time.Time                       { return time.Now() }
func (systemClock) NewTimer(d time.Duration) *time.Timer { return time.NewTimer(d) }

// skewedClock runs at rate times real time, offset by a constant: what a
// machine with a wrong and drifting clock sees. Readings keep Go's monotonic
// component, so differences are immune to wall-clock steps.
type skewedClock struct {
	origin time.Time
	offset time.Duration
	rate   float64
}

func newSkewedClock(offset time.Duration, rate float64) *skewedClock {
	return &skewedClock{origin: time.Now(), offset: offset, rate: rate}
}

func (c *skewedClock) Now() time.Time {
	return c.origin.Add(c.offset + time.Duration(float64(time.Since(c.origin))*c.rate))
}

// NewTimer fires once d has passed on c: rounded up, and a nanosecond
// late, so that Now read when it fires is never short of the target (a
// caller that finds it short would set a timer of 0 and, under
// testing/synctest, spin with the bubble's clock stopped).
func (c *skewedClock) NewTimer(d time.Duration) *time.Timer {
	return time.NewTimer(time.Duration(math.Ceil(float64(d)/c.rate)) + time.Nanosecond)
}
