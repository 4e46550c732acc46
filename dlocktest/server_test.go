package dlocktest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// panicMessage runs f and returns what it panicked with, or fails the test.
func panicMessage(t *testing.T, f func()) (msg string) {
	t.Helper()
	defer func() {
		r := recover()
		require.NotNil(t, r, "no panic")
		s, ok := r.(string)
		require.True(t, ok, "panicked with %T %v, not a string", r, r)
		msg = s
	}()
	f()
	return ""
}

func TestInvalidOptions(t *testing.T) {
	tests := []struct {
		name string
		opts []dlock.Option
	}{
		{name: "TTL too short", opts: []dlock.Option{dlock.WithTTL(time.Microsecond)}},
		{name: "backoff bounds reversed", opts: []dlock.Option{dlock.WithBackoff(time.Second, time.Millisecond)}},
		{name: "nil option", opts: []dlock.Option{nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewServer()
			c, err := s.NewClient(tt.opts...)
			assert.Nil(t, c)
			require.ErrorIs(t, err, dlock.ErrInvalidOption)

			msg := panicMessage(t, func() { s.Client(tt.opts...) })
			assert.True(t, strings.HasPrefix(msg, "dlocktest: "), "message %q", msg)
			assert.Contains(t, msg, err.Error())
			assert.Empty(t, s.links, "a Client that was not made is remembered")
		})
	}
}

// Partition and Heal fail loudly on a Client the Server did not make: a
// fault injection that silently did nothing would let a test pass that
// tests nothing.
func TestPartitionForeignClientPanics(t *testing.T) {
	s, other := NewServer(), NewServer()
	foreign := other.Client()
	defer foreign.Close(context.Background())
	tests := []struct {
		name   string
		call   func()
		substr string
	}{
		{name: "Partition nil", call: func() { s.Partition(nil) }, substr: "Server.Partition of a nil Client"},
		{name: "Heal nil", call: func() { s.Heal(nil) }, substr: "Server.Heal of a nil Client"},
		{name: "Partition other Server's", call: func() { s.Partition(foreign) }, substr: "Server.Partition of a Client that this Server did not make"},
		{name: "Heal other Server's", call: func() { s.Heal(foreign) }, substr: "Server.Heal of a Client that this Server did not make"},
		{name: "zero Server", call: func() { new(Server).Partition(foreign) }, substr: "did not make"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := panicMessage(t, tt.call)
			assert.True(t, strings.HasPrefix(msg, "dlocktest: "), "message %q", msg)
			assert.Contains(t, msg, tt.substr)
		})
	}
	// The foreign Client was not cut off by the attempts.
	require.NoError(t, foreign.NewMutex("k").TryLock(context.Background()))
}

// The zero Server works, and Partition, Heal and Close of a closed Client
// are allowed.
func TestZeroServer(t *testing.T) {
	ctx := context.Background()
	var s Server
	c := s.Client()
	m := c.NewMutex("k")
	require.NoError(t, m.Lock(ctx))
	assert.EqualValues(t, 1, m.Lease().Token())
	require.NoError(t, c.Close(ctx))
	s.Partition(c)
	s.Heal(c)
	assert.Len(t, s.links, 1, "Clients are remembered for the Server's life")

	d := s.Client()
	defer d.Close(ctx)
	m = d.NewMutex("k")
	require.NoError(t, m.TryLock(ctx), "Close released the key")
	assert.EqualValues(t, 2, m.Lease().Token())
}

// A partitioned Client's TryLock cannot tell whether the key is held: its
// error is the network fault's, not ErrLocked, and nothing is applied.
// Partition cuts off that Client only.
func TestPartitionIsPerClient(t *testing.T) {
	ctx := context.Background()
	s := NewServer()
	a, b := s.Client(), s.Client()
	defer a.Close(ctx)
	defer b.Close(ctx)

	s.Partition(a)
	err := a.NewMutex("k").TryLock(ctx)
	require.Error(t, err)
	assert.False(t, errors.Is(err, dlock.ErrLocked), "a partitioned TryLock said ErrLocked: %v", err)
	assert.Contains(t, err.Error(), "unreachable")

	mb := b.NewMutex("k")
	require.NoError(t, mb.TryLock(ctx), "B was cut off too, or A's attempt applied")
	assert.EqualValues(t, 1, mb.Lease().Token(), "A's failed attempt used a token")
	require.NoError(t, mb.Unlock(ctx))

	s.Heal(a)
	ma := a.NewMutex("k")
	require.NoError(t, ma.TryLock(ctx))
	assert.EqualValues(t, 2, ma.Lease().Token())
}
