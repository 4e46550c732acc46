package dlock

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Defaults for the options.
const (
	// DefaultTTL is the lease duration: how long a key stays held after its
	// holder's last successful write, if the holder stops extending it.
	DefaultTTL = 10 * time.Second
	// DefaultMinBackoff and DefaultMaxBackoff bound the jittered, doubling
	// wait between a waiter's polls of a held key.
	DefaultMinBackoff = 5 * time.Millisecond
	DefaultMaxBackoff = 250 * time.Millisecond
)

// MaxKeyLen is the longest key, in bytes.
const MaxKeyLen = 1024

// An Option configures a [Client] (through [NewClient]) or one [Mutex]
// (through [Client.NewMutex], where it overrides the Client's setting).
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	ttl         time.Duration
	extendEvery time.Duration // 0: ttl/3
	minBackoff  time.Duration
	maxBackoff  time.Duration

	// Client-wide.
	owner          string
	clock          clock
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	wrapStore      func(store) store // tests: inject faults

	forMutex bool // applying options for one Mutex
	err      error
}

func defaultConfig() config {
	return config{ttl: DefaultTTL, minBackoff: DefaultMinBackoff, maxBackoff: DefaultMaxBackoff, clock: systemClock{}}
}

func (c *config) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
	}
}

// clientOnly wraps an option that applies to a whole Client.
func clientOnly(name string, f func(*config)) Option {
	return optionFunc(func(c *config) {
		if c.forMutex {
			c.fail("%s applies to a Client, not to one Mutex", name)
			return
		}
		f(c)
	})
}

// WithTTL sets the lease duration: a key whose holder stops extending it
// (crash, partition, pause) is free again this long after the holder's last
// successful write, and the holder itself gives it up a little before, at
// the local deadline described in the package documentation. It must be at
// least a millisecond; the default is [DefaultTTL].
func WithTTL(d time.Duration) Option {
	return optionFunc(func(c *config) { c.ttl = d })
}

// WithExtendInterval sets how often a held lease is extended in the
// background. It must be positive and shorter than the TTL; the default is
// a third of the TTL. A failed extension is retried sooner.
func WithExtendInterval(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d <= 0 {
			c.fail("extend interval %v is not positive", d)
			return
		}
		c.extendEvery = d
	})
}

// WithBackoff bounds the jittered exponential backoff between a waiting
// Lock's polls of a held key: it starts near min and doubles up to max. A
// Mutex whose last wait ended less than a TTL ago starts from the interval
// that wait reached instead of min. Defaults: [DefaultMinBackoff] and
// [DefaultMaxBackoff].
func WithBackoff(min, max time.Duration) Option {
	return optionFunc(func(c *config) {
		if min <= 0 || max < min {
			c.fail("backoff bounds %v, %v: need 0 < min <= max", min, max)
			return
		}
		c.minBackoff, c.maxBackoff = min, max
	})
}

// WithOwner sets the Client's owner identity, stored in every lock it holds.
// The store treats all holds of one identity as one owner, so the identity
// must be unique to one live Client and hard to guess: release and extension
// are conditional on it. The default is 128 random bits in hex. Client only.
func WithOwner(id string) Option {
	return clientOnly("WithOwner", func(c *config) {
		if id == "" {
			c.fail("owner identity is empty")
			return
		}
		c.owner = id
	})
}

// withClock sets the clock the lease logic reads; tests use it to skew and
// drift clients' clocks. Client only.
func withClock(k clock) Option {
	return clientOnly("withClock", func(c *config) { c.clock = k })
}

// withStoreWrapper wraps the Client's store; tests use it to inject faults.
func withStoreWrapper(wrap func(store) store) Option {
	return clientOnly("withStoreWrapper", func(c *config) { c.wrapStore = wrap })
}

func (c *config) validate() error {
	if c.err != nil {
		return c.err
	}
	if c.ttl < time.Millisecond {
		return fmt.Errorf("%w: TTL %v is shorter than a millisecond", ErrInvalidOption, c.ttl)
	}
	if c.extendEvery >= c.ttl {
		return fmt.Errorf("%w: extend interval %v is not shorter than the TTL %v", ErrInvalidOption, c.extendEvery, c.ttl)
	}
	return nil
}

// every is the extension cadence.
func (c *config) every() time.Duration {
	if c.extendEvery > 0 {
		return c.extendEvery
	}
	return c.ttl / 3
}

func randomOwner() string {
	var b [16]byte
	rand.Read(b[:]) // never fails; see crypto/rand.Read
	return hex.EncodeToString(b[:])
}
