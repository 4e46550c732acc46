package dlock

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"
	"unicode/utf8"

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
	// DefaultObserveInterval is how often [Election.Observe] reads the
	// election's key.
	DefaultObserveInterval = time.Second
)

// MaxExtendInterval is the longest extension interval, as a share of the
// TTL, that [WithExtendInterval] accepts: half the holder's local deadline.
const MaxExtendInterval = (1-MaxClockDrift)/(1+MaxClockDrift)/2 - lostGuard/2

// MaxKeyLen is the longest key, in bytes.
const MaxKeyLen = 1024

// An Option configures a [Client] (through [NewClient]) or one lock
// ([Client.NewMutex], [Client.NewRWMutex], [Client.NewSemaphore],
// [Client.NewElection], where it overrides the Client's setting).
//
// A nil Option is invalid: [NewClient] returns, and the lock's first call
// reports, an error matching [ErrInvalidOption], as for an option out of
// range.
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
	data        []byte        // WithData
	maxHold     time.Duration // 0: no cap
	observe     time.Duration // WithObserveInterval

	// Client-wide.
	serverClock    bool          // WithServerClockTakeover
	pruneIdle      time.Duration // WithPruneIdle; 0: off
	owner          string
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	hooks          *hooks // the package's tests only (hooks.go); nil otherwise

	forLock bool // applying options for one lock (Mutex, RWMutex, Semaphore, Election)
	err     error
}

func defaultConfig() config {
	return config{ttl: DefaultTTL, minBackoff: DefaultMinBackoff, maxBackoff: DefaultMaxBackoff, observe: DefaultObserveInterval}
}

// applyAll applies opts in order; a nil one is an invalid option.
func (c *config) applyAll(opts []Option) {
	for i, o := range opts {
		if o == nil {
			c.fail("the option at index %d is nil", i)
			continue
		}
		o.apply(c)
	}
}

func (c *config) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
	}
}

// clientOnly wraps an option that applies to a whole Client.
func clientOnly(name string, f func(*config)) Option {
	return optionFunc(func(c *config) {
		if c.forLock {
			c.fail("%s applies to a Client, not to one lock", name)
			return
		}
		f(c)
	})
}

// MaxTTL is the longest TTL that [WithTTL] accepts: a crashed holder's key
// stays held for a TTL, and no key should stand held for nobody longer
// than a day (Consul caps the TTLs of its locks at a day too).
const MaxTTL = 24 * time.Hour

// WithTTL sets the lease duration: a key whose holder stops extending it
// (crash, partition, pause) is free again this long after the holder's last
// successful write, and the holder itself gives it up a little before, at
// the local deadline described in the package documentation. It must be at
// least a millisecond and at most [MaxTTL] (otherwise [NewClient] returns,
// and the lock's first call reports, an error matching
// [ErrInvalidOption]), and longer than the server's round trip: a Lock
// whose acquires are answered after their lease's local deadline, three
// times in a row, returns [ErrTTLTooShort]. The default is [DefaultTTL].
func WithTTL(d time.Duration) Option {
	return optionFunc(func(c *config) { c.ttl = d })
}

// WithExtendInterval sets how often a held lease is extended in the
// background; the default is a third of the TTL. A failed extension is
// retried after a quarter of the interval, and a hung one is given up after
// half the time left before the lease's local deadline, so that a retry
// still fits. So the interval must be positive and at most half the
// holder's local deadline, which is just under the TTL (see the package
// documentation): at most [MaxExtendInterval] of the TTL. Then a first
// extension that fails still leaves half the lease for retries.
func WithExtendInterval(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d <= 0 {
			c.fail("extend interval %v is not positive", d)
			return
		}
		c.extendEvery = d
	})
}

// WithMaxHold caps each hold at d: a hold ends, as lost, d after it was
// acquired (counted, on the Client's clock, from when the acquire that
// made it was sent), however often it was extended. It is for work that
// must not hold a key forever, a hung job say: the job finds its lease
// lost, and the key goes to others, without anyone having to notice.
//
// The holder sends its last extension d−TTL after the acquire, and no
// write after that ([Election.Proclaim] then fails with [ErrMaxHold]). Its
// lease then ends at the local deadline that extension gives, a little
// before d (by the margin every lease keeps under its TTL, about 3% of
// the TTL: see the package documentation), or at the deadline
// of an earlier write if that extension fails: [Lease.Lost] closes,
// [Lease.Context] is cancelled, and [Lease.Err] returns a
// [*LeaseLostError] whose Cause matches [ErrMaxHold]. As the holder writes
// nothing after d−TTL, a Client already waiting for the key when the cap
// comes takes it at most one TTL after the cap (plus a poll interval); one
// that starts waiting after the cap takes it at most one TTL after its
// first look at the key, as after any holder that stopped extending.
//
// d must be 0, the default, which sets no cap, or at least the TTL: a hold
// capped at the TTL is never extended. A hold handed over by [Mutex.Unlock]
// to another goroutine of the same Client is a new hold, with a cap of its
// own. Given to [NewClient] it caps every hold of the Client; given to
// [Client.NewMutex], the holds of that Mutex.
func WithMaxHold(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.fail("maximum hold %v is negative", d)
			return
		}
		c.maxHold = d
	})
}

// MinBackoff and MaxBackoff bound the bounds that [WithBackoff] accepts.
// A min under a millisecond would have a waiter poll a held key about as
// fast as the server answers (a millisecond is also the resolution of the
// TTLs and of the time stamps in the lock documents). A max over an hour
// would leave waiters blind to a free key for longer than that, and keeps
// 1.5·max, the longest sleep of a wait, far from overflowing a Duration.
const (
	MinBackoff = time.Millisecond
	MaxBackoff = time.Hour
)

// WithBackoff bounds the jittered exponential backoff between a wait's
// polls of a held key: it starts near min and doubles up to max, or starts
// from the interval the primitive's last wait reached, if that wait ended
// less than a TTL ago. A Lock queued in the key's document under
// contention follows a schedule of its own instead (docs/fairness.md), and
// no wait sleeps longer than 1.5·max at a time, or an eighth of how long
// the key has stood still if that is longer, at most a quarter TTL: a wait
// pays for latency in proportion to the hold it waits behind. A Lock asleep
// (eight or more awake waiters ahead: docs/fairness.md) sleeps twice as
// long as the key stood still, at most half a TTL at a time. min is also
// how long an Unlock under contention leaves a kept hold or a registration
// for its Mutex's next Lock. Defaults: [DefaultMinBackoff] and [DefaultMaxBackoff].
// It needs [MinBackoff] <= min <= max <= [MaxBackoff]; otherwise
// [NewClient] returns, and the lock's first call reports, an error
// matching [ErrInvalidOption].
func WithBackoff(min, max time.Duration) Option {
	return optionFunc(func(c *config) {
		switch {
		case min < MinBackoff:
			c.fail("backoff min %v is under the minimum %v", min, MinBackoff)
		case max > MaxBackoff:
			c.fail("backoff max %v is over the maximum %v", max, MaxBackoff)
		case min > max:
			c.fail("backoff bounds: min %v is above max %v", min, max)
		default:
			c.minBackoff, c.maxBackoff = min, max
		}
	})
}

// MaxOwnerLen is the longest owner label, in bytes, that [WithOwner]
// accepts. The owner identity (the label and 33 bytes more) is written
// with every hold and registration the Client makes, so it is bounded as
// a key is, and tighter: a host name and a process id take about 70.
const MaxOwnerLen = 256

// WithOwner sets a label for the Client's owner identity, shown wherever
// the holder of a key is shown ([Client.Holders], the dlock command's
// status, telemetry): a host name or a service's name, say. The identity
// stored in every lock the Client holds is the label, "#", and 128 random
// bits in hex ([Client.Owner]), so two Clients given the same label are
// still two owners: neither takes, extends or releases the other's holds.
// The default is the random bits alone. Client only.
//
// id must not be empty, must be valid UTF-8 without NUL bytes (as a key),
// and at most [MaxOwnerLen] bytes long; otherwise [NewClient] returns an
// error matching [ErrInvalidOption].
func WithOwner(id string) Option {
	return clientOnly("WithOwner", func(c *config) {
		switch {
		case id == "":
			c.fail("owner identity is empty")
		case len(id) > MaxOwnerLen:
			c.fail("owner identity of %d bytes, longer than %d", len(id), MaxOwnerLen)
		case !utf8.ValidString(id):
			c.fail("owner identity is not valid UTF-8")
		case containsNUL(id):
			c.fail("owner identity contains NUL")
		default:
			c.owner = id
		}
	})
}

// WithServerClockTakeover lets waiters count the server's clock towards
// taking over a key whose holder stopped extending it: a key abandoned more
// than a TTL ago by the server's clock is then taken at once, instead of
// after a TTL of watching it unchanged on the waiter's own clock. Client
// only; off by default.
//
// It assumes what dlock otherwise never does: that one clock, the server's,
// stamps every lock document and answers every hello, and that this clock
// is not stepped while a lock is held. That holds for a standalone server
// with a clock that is only slewed, never stepped. It does not hold for a
// sharded cluster (mongos answers hello; the shard stamps the document),
// nor across a replica-set failover to a member whose clock differs by more
// than 1% of the TTL, nor when the server's clock is stepped by NTP, a
// virtual machine's resume or a person: a step forward of D between a
// holder's write and a waiter's reading lets the waiter take the key up to
// D early, while the holder still believes it holds it. dlock compares
// successive readings of the server's clock with its own and stops counting
// the server's clock when they disagree, but it cannot see a step that came
// before its first reading.
func WithServerClockTakeover(on bool) Option {
	return clientOnly("WithServerClockTakeover", func(c *config) { c.serverClock = on })
}

// MaxQueue is the most waiters that may be registered in one key's queue:
// a Lock or Acquire that would register past it fails with [ErrQueueFull]. The queue
// lives in the key's document, which MongoDB caps at 16 MiB, and every
// write of the key carries it whole. A registration takes at most about
// 470 bytes ([MaxOwnerLen], in base64, and a hold id name it; its value is
// its queue number, TTL and epoch), about 130 with a host name and process
// id as the owner's label: 10,000 of them take at most 4.7 MB, and leave
// room for the rest of the document (a key, data and shared holds of at
// most a few KiB each). Clients that register at the same instant may
// pass it by as many as they are, for as long as their replies take.
const MaxQueue = 10000

// MaxDataLen is the most data, in bytes, that [WithData] stores with a hold.
const MaxDataLen = 1024

// WithData stores data with each hold that the Mutex, RWMutex or
// Semaphore (or every one of the Client's, when given to [NewClient])
// makes: [Lease.Data] returns it, and [Client.Holders] shows it to anyone
// who reads the key, waiters included. At most [MaxDataLen] bytes; nil,
// the default, stores none. It is stored in the lock document in the
// clear, readable by anyone who can read the collection: not a place for
// secrets. WithData keeps its own copy of data.
func WithData(data []byte) Option {
	data = bytes.Clone(data)
	return optionFunc(func(c *config) {
		if len(data) > MaxDataLen {
			c.fail("data of %d bytes, more than %d", len(data), MaxDataLen)
			return
		}
		c.data = data
	})
}

// MinObserveInterval is the shortest interval [WithObserveInterval]
// accepts: a shorter one would have the Client read the election's key
// back to back, as fast as the server answers. A millisecond is also the
// resolution of the TTLs and of the time stamps in the lock documents.
const MinObserveInterval = time.Millisecond

// WithObserveInterval sets how often [Election.Observe] reads the
// election's key, at least [MinObserveInterval]; the default is
// [DefaultObserveInterval]. An observer learns of a change at most about
// d after the document shows it (plus a read's round trip). However many
// goroutines observe one election through one Client, the Client reads it
// once per interval, at the shortest interval any of them asked for.
// Other primitives ignore it.
func WithObserveInterval(d time.Duration) Option {
	return optionFunc(func(c *config) {
		switch {
		case d <= 0:
			c.fail("observe interval %v is not positive", d)
		case d < MinObserveInterval:
			c.fail("observe interval %v is shorter than the minimum %v", d, MinObserveInterval)
		default:
			c.observe = d
		}
	})
}

// MinPruneIdle is the shortest period [WithPruneIdle] accepts, other than
// 0 (off). Each period costs a scan of at least two commands and gives the
// scan that long to finish, and the first Lock of a key pruned costs two
// commands where one of a key kept costs one (a first RLock, Semaphore
// Acquire or Campaign, three; see [Client.Prune]): a shorter period would
// spend commands without end, and cut scans short, to prune keys that are
// wanted again a moment later.
const MinPruneIdle = time.Second

// WithPruneIdle makes the Client prune in the background: every d (less
// up to a tenth, at random, so that Clients started together spread out),
// it calls [Client.Prune] with idle d, until Close, which stops it and
// waits for it. So each Client scans at most once per d, and a free key is
// deleted between d and about 2d after its last write. Client only; off
// (0) by default; d must be 0 or at least [MinPruneIdle]. Its errors are
// recorded on its dlock.Prune spans, and it tries again after d. A MongoDB
// TTL index is no substitute: it would delete documents without raising
// the floor, and the tokens of a key re-created after it would start
// again from 1.
func WithPruneIdle(d time.Duration) Option {
	return clientOnly("WithPruneIdle", func(c *config) {
		switch {
		case d < 0:
			c.fail("prune idle %v is negative", d)
		case d > 0 && d < MinPruneIdle:
			c.fail("prune idle %v is shorter than the minimum %v (0 turns pruning off)", d, MinPruneIdle)
		default:
			c.pruneIdle = d
		}
	})
}

func (c *config) validate() error {
	if c.err != nil {
		return c.err
	}
	switch {
	case c.ttl <= 0:
		return fmt.Errorf("%w: TTL %v is not positive", ErrInvalidOption, c.ttl)
	case c.ttl < time.Millisecond:
		return fmt.Errorf("%w: TTL %v is shorter than a millisecond", ErrInvalidOption, c.ttl)
	case c.ttl > MaxTTL:
		return fmt.Errorf("%w: TTL %v is longer than the maximum %v", ErrInvalidOption, c.ttl, MaxTTL)
	}
	if c.maxHold != 0 && c.maxHold < c.ttl {
		return fmt.Errorf("%w: maximum hold %v is shorter than the TTL %v: it must be 0 (no cap) or at least the TTL",
			ErrInvalidOption, c.maxHold, c.ttl)
	}
	if c.extendEvery > holdFor(c.ttl)/2 {
		return fmt.Errorf("%w: extend interval %v leaves no room to retry a failed extension within the TTL %v: at most %v (half the holder's local deadline)",
			ErrInvalidOption, c.extendEvery, c.ttl, holdFor(c.ttl)/2)
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

// identity returns the owner identity of a Client given label ("" for
// none): unique to the Client, whatever the label (see WithOwner).
func identity(label string) string {
	if label == "" {
		return randomOwner()
	}
	return label + "#" + randomOwner()
}

func randomOwner() string {
	var b [16]byte
	rand.Read(b[:]) // never fails; see crypto/rand.Read
	return hex.EncodeToString(b[:])
}
