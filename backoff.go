package dlock

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// newBackoff returns the wait between polls of a held key: jittered by ±50%,
// doubling from min up to max, never giving up (the caller's context decides
// how long to wait).
func newBackoff(min, max time.Duration) *backoff.ExponentialBackOff {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     min,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         max,
	}
	b.Reset()
	return b
}
