package dlock

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stepClock is a clock that moves only when the test advances it; its
// timers fire when it passes their deadline. The duration of every timer
// no longer than pollsUpTo is sent on polls, so that a test sees each wait
// of a polling Lock (the extender's timers are longer).
type stepClock struct {
	mu        sync.Mutex
	now       time.Time
	pending   []stepTimer
	pollsUpTo time.Duration
	polls     chan time.Duration
}

type stepTimer struct {
	at time.Time
	t  *time.Timer
}

func newStepClock(pollsUpTo time.Duration) *stepClock {
	return &stepClock{now: time.Unix(1e9, 0), pollsUpTo: pollsUpTo, polls: make(chan time.Duration, 100)}
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) NewTimer(d time.Duration) *time.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := time.NewTimer(time.Hour)
	t.Stop()
	c.pending = append(c.pending, stepTimer{c.now.Add(d), t})
	if d <= c.pollsUpTo {
		c.polls <- d
	}
	return t
}

func (c *stepClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	left := c.pending[:0]
	for _, p := range c.pending {
		if p.at.After(c.now) {
			left = append(left, p)
		} else {
			p.t.Reset(0)
		}
	}
	c.pending = left
}

// nextPoll returns the wait a polling Lock has just started.
func (c *stepClock) nextPoll(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-c.polls:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no poll")
		return 0
	}
}

// A waiter's polls are acquire attempts: the poll that finds the key freed
// takes it, in one command. The waiter registers in the queue after its
// first attempt fails, and the registration's reply starts its watch of
// the holder, so it reads no record. A Lock that starts soon after a long wait
// resumes polling at the pace that wait reached; one that starts over a
// TTL later starts at the minimum again.
func TestWaiterPolls(t *testing.T) {
	coll := newColl(t)
	ctx := context.Background()
	const minBackoff, ttl = 10 * time.Millisecond, time.Minute
	clk := newStepClock(time.Second)
	a := newClient(t, coll, withPacer(withoutRule{ruleKeep})) // its Unlocks free the key
	b := newClient(t, coll, WithTTL(ttl), WithBackoff(minBackoff, time.Second), withClock(clk), WithServerClockTakeover(true))
	ma, mb := a.NewMutex("k"), b.NewMutex("k")
	require.NoError(t, ma.Lock(ctx))

	locked := make(chan error, 1)
	go func() { locked <- mb.Lock(ctx) }()
	first := clk.nextPoll(t)
	assert.InDelta(t, minBackoff, first, float64(minBackoff/2), "first wait")
	mark := commands.total.Load()
	clk.advance(first)
	second := clk.nextPoll(t)
	assert.EqualValues(t, 1, commands.since(mark), "a second failed poll: the attempt alone (the registration's reply started the watch of the holder's revision)")
	for d := second; d < 200*time.Millisecond; d = clk.nextPoll(t) {
		clk.advance(d) // still held: the polls slow down
	}
	mark = commands.total.Load()
	require.NoError(t, ma.Unlock(ctx))
	clk.advance(time.Second)
	require.NoError(t, <-locked)
	assert.EqualValues(t, 2, commands.since(mark), "the holder's release and the poll that takes the key")

	// Soon after: the next wait starts where the last one left off.
	require.NoError(t, mb.Unlock(ctx))
	require.NoError(t, ma.Lock(ctx))
	ctx2, cancel := context.WithCancel(ctx)
	go func() { locked <- mb.Lock(ctx2) }()
	// The last wait was at least 200 ms, so its interval at least 160 ms
	// (10 ms doubled, jittered by ±50%): the first wait now is at least
	// 80 ms, where a fresh start is at most 15 ms.
	assert.GreaterOrEqual(t, clk.nextPoll(t), 80*time.Millisecond, "first wait of a Lock soon after a long wait")
	cancel()
	require.ErrorIs(t, <-locked, context.Canceled)

	// A TTL later, behind a new hold: from the minimum again. (Behind the
	// same hold, which stood still a TTL, the wait would read as the
	// hold's age allows: schedule.age.)
	clk.advance(ttl)
	require.NoError(t, ma.Unlock(ctx))
	require.NoError(t, ma.Lock(ctx))
	go func() { locked <- mb.Lock(ctx) }()
	assert.InDelta(t, minBackoff, clk.nextPoll(t), float64(minBackoff/2), "first wait a TTL later")
	require.NoError(t, ma.Unlock(ctx))
	clk.advance(time.Second)
	require.NoError(t, <-locked)
}

// A poller's waits: the interval starts where it is told, doubles up to
// max, and each wait is that interval jittered by ±50%, spread over the
// whole range; last is the interval before jitter.
func TestPollerBackoff(t *testing.T) {
	const min, max = 10 * time.Millisecond, 100 * time.Millisecond
	want := []time.Duration{min, 2 * min, 4 * min, 8 * min, max, max, max}
	var low, high bool // some wait below 0.55 and some above 1.45 of its interval
	for range 200 {
		p := newPoller(min, max)
		for i, w := range want {
			d := p.next()
			require.Equal(t, w, p.last, "interval of wait %d", i)
			require.GreaterOrEqual(t, d, w/2, "wait %d", i)
			require.LessOrEqual(t, d, w+w/2+1, "wait %d", i) // +1: rounding to a nanosecond
			low = low || d < w*11/20
			high = high || d > w*29/20
		}
	}
	assert.True(t, low && high, "waits are jittered across ±50%")
}

// A wait that starts within a TTL of the last one resumes at the interval
// that wait reached, within the bounds; otherwise at the minimum.
func TestPaceStart(t *testing.T) {
	cfg := defaultConfig()
	cfg.minBackoff, cfg.maxBackoff, cfg.ttl = 10*time.Millisecond, time.Second, time.Minute
	now := time.Unix(1e9, 0)
	for _, tc := range []struct {
		name string
		pace lastWait
		want time.Duration
	}{
		{"no wait before", lastWait{}, cfg.minBackoff},
		{"soon after", lastWait{interval: 160 * time.Millisecond, at: now.Add(-time.Second)}, 160 * time.Millisecond},
		{"a TTL after", lastWait{interval: 160 * time.Millisecond, at: now.Add(-cfg.ttl)}, cfg.minBackoff},
		{"below the minimum", lastWait{interval: time.Millisecond, at: now}, cfg.minBackoff},
		{"above the maximum", lastWait{interval: time.Hour, at: now}, cfg.maxBackoff},
	} {
		p := tc.pace.start(now, &cfg)
		p.next()
		assert.Equal(t, tc.want, p.last, tc.name)
	}

	// Carried from one wait to the next as mutex.go does it: the next wait
	// goes on doubling from where the last one stopped.
	p := lastWait{}.start(now, &cfg)
	for range 5 {
		p.next()
	}
	require.Equal(t, 160*time.Millisecond, p.last)
	q := lastWait{interval: p.last, at: now}.start(now.Add(time.Second), &cfg)
	q.next()
	assert.Equal(t, 160*time.Millisecond, q.last, "first interval of the next wait")
	q.next()
	assert.Equal(t, 320*time.Millisecond, q.last)
}
