package dlock

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A nil Option, as left by `var opt Option; if cond { opt = ... }`, is an
// invalid option wherever options are taken, never a panic.
func TestOptionNil(t *testing.T) {
	coll := newColl(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"alone", []Option{nil}},
		{"after a valid one", []Option{WithTTL(time.Second), nil}},
		{"before a valid one", []Option{nil, WithTTL(time.Second)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			assert.NotPanics(t, func() { _, err = NewClient(coll, tc.opts...) }, "NewClient")
			if assert.ErrorIs(t, err, ErrInvalidOption, "NewClient") {
				assert.Contains(t, err.Error(), "nil")
			}

			c := newClient(t, coll)
			for _, p := range []struct {
				name string
				call func() error
			}{
				{"Mutex.Lock", func() error { return c.NewMutex("k", tc.opts...).Lock(ctx) }},
				{"Mutex.TryLock", func() error { return c.NewMutex("k", tc.opts...).TryLock(ctx) }},
				{"RWMutex.Lock", func() error { return c.NewRWMutex("k", tc.opts...).Lock(ctx) }},
				{"RWMutex.RLock", func() error { return c.NewRWMutex("k", tc.opts...).RLock(ctx) }},
				{"Semaphore.Acquire", func() error { _, err := c.NewSemaphore("k", 2, tc.opts...).Acquire(ctx); return err }},
				{"Election.Campaign", func() error { _, err := c.NewElection("k", tc.opts...).Campaign(ctx, "v"); return err }},
			} {
				var err error
				assert.NotPanics(t, func() { err = p.call() }, p.name)
				assert.ErrorIs(t, err, ErrInvalidOption, p.name)
			}
		})
	}
}

// WithOwner bounds and checks the identity as keys are checked: an owner
// the server would refuse is an invalid option at once, not a Lock that
// retries until its ctx ends.
func TestWithOwnerValidation(t *testing.T) {
	coll := newColl(t)
	for _, tc := range []struct {
		name  string
		owner string
		ok    bool
	}{
		{"empty", "", false},
		{"invalid UTF-8", "host\xff/1", false},
		{"NUL", "host\x00/1", false},
		{"one byte too long", strings.Repeat("o", MaxOwnerLen+1), false},
		{"200 KB", strings.Repeat("o", 200<<10), false},
		{"longest", strings.Repeat("o", MaxOwnerLen), true},
		{"longest, multibyte", strings.Repeat("é", MaxOwnerLen/2), true},
		{"host/pid/random", "web3/4242/9f86d081884c7d65a2b0e1f7c4d3a9b8", true},
		{"dots and dollars", "$a.b", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClient(coll, WithOwner(tc.owner))
			if !tc.ok {
				require.ErrorIs(t, err, ErrInvalidOption)
				assert.Nil(t, c)
				return
			}
			require.NoError(t, err)
			assert.True(t, strings.HasPrefix(c.Owner(), tc.owner), "Owner %q", c.Owner())
			require.NoError(t, c.Close(context.Background()))
		})
	}
}

// The background pruner and Election.Observe poll the server once per the
// interval given: one too short would send commands back to back.
func TestWithPollIntervalMinimums(t *testing.T) {
	coll := newColl(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		opt  Option
		ok   bool
		msg  string // in the error
	}{
		{"prune off", WithPruneIdle(0), true, ""},
		{"prune 1ns", WithPruneIdle(time.Nanosecond), false, "shorter than the minimum 1s"},
		{"prune just short", WithPruneIdle(MinPruneIdle - 1), false, "shorter than the minimum"},
		{"prune minimum", WithPruneIdle(MinPruneIdle), true, ""},
		{"prune negative", WithPruneIdle(-time.Second), false, "negative"},
		{"observe 1ns", WithObserveInterval(time.Nanosecond), false, "shorter than the minimum 1ms"},
		{"observe just short", WithObserveInterval(MinObserveInterval - 1), false, "shorter than the minimum"},
		{"observe minimum", WithObserveInterval(MinObserveInterval), true, ""},
		{"observe zero", WithObserveInterval(0), false, "not positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClient(coll, tc.opt)
			if !tc.ok {
				require.ErrorIs(t, err, ErrInvalidOption)
				assert.Contains(t, err.Error(), tc.msg)
				return
			}
			require.NoError(t, err)
			require.NoError(t, c.Close(ctx))
		})
	}
	c := newClient(t, coll)
	_, err := c.NewElection("e", WithObserveInterval(time.Nanosecond)).Leader(ctx)
	require.ErrorIs(t, err, ErrInvalidOption, "on one Election")
	ch := c.NewElection("e", WithObserveInterval(time.Nanosecond)).Observe(ctx)
	_, ok := <-ch
	assert.False(t, ok, "an invalid Election's Observe is closed at once")
}

// A TTL that is not positive says so; a positive one under a millisecond
// is too short, and one over MaxTTL too long (the longest Duration, for
// "forever", would overflow the TTL rounded up to milliseconds that the
// store writes: a negative TTL, which others may take over at once).
func TestWithTTLMessages(t *testing.T) {
	coll := newColl(t)
	for _, tc := range []struct {
		name string
		ttl  time.Duration
		msg  string
	}{
		{"negative", -5 * time.Second, "TTL -5s is not positive"},
		{"zero", 0, "TTL 0s is not positive"},
		{"1ns", time.Nanosecond, "TTL 1ns is shorter than a millisecond"},
		{"just short", time.Millisecond - 1, "shorter than a millisecond"},
		{"just long", MaxTTL + 1, "TTL 24h0m0.000000001s is longer than the maximum 24h0m0s"},
		{"longest Duration", math.MaxInt64, "longer than the maximum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewClient(coll, WithTTL(tc.ttl))
			require.ErrorIs(t, err, ErrInvalidOption)
			assert.Contains(t, err.Error(), tc.msg)
			m := newClient(t, coll).NewMutex("k", WithTTL(tc.ttl))
			require.ErrorIs(t, m.Lock(context.Background()), ErrInvalidOption)
		})
	}
	for _, ttl := range []time.Duration{time.Millisecond, MaxTTL} {
		c, err := NewClient(coll, WithTTL(ttl))
		require.NoError(t, err, "TTL %v", ttl)
		require.NoError(t, c.Close(context.Background()))
	}
}

// WithBackoff's bounds: a min under MinBackoff would poll a held key back
// to back, as fast as the server answers; a max over MaxBackoff would
// leave waiters blind to a free key for hours, and 1.5·max, the cap of
// every sleep, would overflow a Duration. Given to a Mutex, the Mutex's
// first Lock reports them.
func TestWithBackoffBounds(t *testing.T) {
	coll := newColl(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		min, max time.Duration
		msg      string // in the error; "" for a valid pair
	}{
		{"1ns", time.Nanosecond, time.Millisecond, "backoff min 1ns is under the minimum 1ms"},
		{"min just short", MinBackoff - 1, DefaultMaxBackoff, "under the minimum"},
		{"min zero", 0, DefaultMaxBackoff, "under the minimum"},
		{"min negative", -time.Millisecond, DefaultMaxBackoff, "under the minimum"},
		{"both 1ns", time.Nanosecond, time.Nanosecond, "under the minimum"},
		{"reversed", time.Second, time.Millisecond, "min 1s is above max 1ms"},
		{"max just long", MinBackoff, MaxBackoff + 1, "backoff max 1h0m0.000000001s is over the maximum 1h0m0s"},
		{"max overflows 1.5·max", MinBackoff, math.MaxInt64, "over the maximum"},
		{"least", MinBackoff, MinBackoff, ""},
		{"greatest", MaxBackoff, MaxBackoff, ""},
		{"defaults", DefaultMinBackoff, DefaultMaxBackoff, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClient(coll, WithBackoff(tc.min, tc.max))
			if tc.msg == "" {
				require.NoError(t, err)
				require.NoError(t, c.Close(ctx))
				return
			}
			require.ErrorIs(t, err, ErrInvalidOption)
			assert.Contains(t, err.Error(), tc.msg)
			err = newClient(t, coll).NewMutex("k", WithBackoff(tc.min, tc.max)).TryLock(ctx)
			require.ErrorIs(t, err, ErrInvalidOption, "on one Mutex")
			assert.Contains(t, err.Error(), tc.msg, "on one Mutex")
		})
	}
}
