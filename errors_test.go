package dlock

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"
)

// TestErrorMessages builds the errors a user sees and checks that each
// reads as one sentence: one "dlock: " prefix, the key, the cause, and no
// topology description from the driver; and that errors.Is and errors.As
// still reach what the message stands for.
func TestErrorMessages(t *testing.T) {
	ctx := t.Context()
	selection := func(err error) bool {
		var se topology.ServerSelectionError
		return errors.As(err, &se)
	}
	lost := func(err error) bool {
		var le *LeaseLostError
		return errors.As(err, &le)
	}
	closed := func(t *testing.T) *Client {
		c, err := NewClient(newColl(t))
		require.NoError(t, err)
		require.NoError(t, c.Close(ctx))
		return c
	}
	tests := []struct {
		name string
		err  func(t *testing.T) error
		is   []error                // errors.Is holds for each
		as   []func(err error) bool // errors.As holds for each
		says []string               // the message contains each
	}{
		{
			name: "Lock after Close",
			err:  func(t *testing.T) error { return closed(t).NewMutex("k8").Lock(ctx) },
			is:   []error{ErrClosed},
			says: []string{`"k8"`, "client closed"},
		},
		{
			name: "RLock after Close",
			err:  func(t *testing.T) error { return closed(t).NewRWMutex("k8").RLock(ctx) },
			is:   []error{ErrClosed},
			says: []string{`"k8"`, "client closed"},
		},
		{
			name: "Acquire after Close",
			err: func(t *testing.T) error {
				_, err := closed(t).NewSemaphore("k8", 2).Acquire(ctx)
				return err
			},
			is:   []error{ErrClosed},
			says: []string{`"k8"`, "client closed"},
		},
		{
			name: "Leader after Close",
			err: func(t *testing.T) error {
				_, err := closed(t).NewElection("x").Leader(ctx)
				return err
			},
			is:   []error{ErrClosed},
			says: []string{`"x"`, "client closed"},
		},
		{
			name: "Holders after Close",
			err: func(t *testing.T) error {
				_, err := closed(t).Holders(ctx, "k8")
				return err
			},
			is:   []error{ErrClosed},
			says: []string{`"k8"`, "client closed"},
		},
		{
			name: "Prune after Close",
			err: func(t *testing.T) error {
				_, err := closed(t).Prune(ctx, 0)
				return err
			},
			is:   []error{ErrClosed},
			says: []string{"prune", "client closed"},
		},
		{
			name: "Prune with a negative idle",
			err: func(t *testing.T) error {
				_, err := newClient(t, newColl(t)).Prune(ctx, -time.Second)
				return err
			},
			is:   []error{ErrInvalidOption},
			says: []string{"prune", "invalid option", "-1s", "negative"},
		},
		{
			name: "a negative TTL",
			err: func(t *testing.T) error {
				_, err := NewClient(newColl(t), WithTTL(-5*time.Second))
				return err
			},
			is:   []error{ErrInvalidOption},
			says: []string{"TTL -5s", "positive"},
		},
		{
			name: "Campaign with an invalid key",
			err: func(t *testing.T) error {
				_, err := newClient(t, newColl(t)).NewElection("").Campaign(ctx, "v")
				return err
			},
			is:   []error{ErrInvalidKey},
			says: []string{`campaign ""`, "empty"},
		},
		{
			name: "Lock on a key of another kind",
			err: func(t *testing.T) error {
				coll := newColl(t)
				require.NoError(t, newClient(t, coll).NewRWMutex("k").RLock(ctx))
				return newClient(t, coll).NewMutex("k").Lock(ctx)
			},
			is:   []error{ErrKindMismatch},
			says: []string{`"k"`, "another kind", "RWMutex"},
		},
		{
			name: "TryLock on a held key",
			err: func(t *testing.T) error {
				coll := newColl(t)
				require.NoError(t, newClient(t, coll).NewMutex("k").Lock(ctx))
				return newClient(t, coll).NewMutex("k").TryLock(ctx)
			},
			is:   []error{ErrLocked},
			says: []string{`"k"`, "locked by another owner"},
		},
		{
			name: "TryLock on a server that cannot be reached",
			err: func(t *testing.T) error {
				return newClient(t, unreachable(t)).NewMutex("k").TryLock(ctx)
			},
			as:   []func(error) bool{selection},
			says: []string{`"k"`, "server selection error", "connection refused"},
		},
		{
			name: "a lease lost to a server that went away",
			err: func(t *testing.T) error {
				s := &ackServer{}
				c := newClient(t, startAckServer(t, s, fastSelection), WithTTL(time.Second))
				m := c.NewMutex("k")
				require.NoError(t, m.Lock(ctx))
				l := m.Lease()
				s.close()
				select {
				case <-l.Lost():
				case <-time.After(10 * time.Second):
					t.Fatal("the lease outlived its server by 10s")
				}
				return l.Err()
			},
			is:   []error{ErrLeaseLost},
			as:   []func(error) bool{lost, selection},
			says: []string{`"k"`, "lost", "extend 1 lease:", "server selection error"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.err(t)
			require.Error(t, err)
			msg := err.Error()
			t.Log(msg)
			assert.Equal(t, 1, strings.Count(msg, "dlock:"), "one dlock: prefix")
			assert.True(t, strings.HasPrefix(msg, "dlock: "), "begins with dlock:")
			assert.NotContains(t, msg, "Topology")
			assert.NotContains(t, msg, "{ Type:")
			assert.Less(t, len(msg), 300, "one sentence") // a topology description makes it longer
			for _, s := range tt.says {
				assert.Contains(t, msg, s)
			}
			for _, target := range tt.is {
				assert.ErrorIs(t, err, target)
			}
			for i, as := range tt.as {
				assert.True(t, as(err), "errors.As #%d", i)
			}
		})
	}
}

// fastSelection gives up selecting a server after 100 ms.
func fastSelection(o *options.ClientOptions) {
	o.SetServerSelectionTimeout(100 * time.Millisecond).SetConnectTimeout(100 * time.Millisecond)
}

// unreachable returns a collection on a port where nothing listens.
func unreachable(t *testing.T) *mongo.Collection {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	o := options.Client().ApplyURI("mongodb://" + addr + "/?directConnection=true")
	fastSelection(o)
	mc, err := mongo.Connect(o)
	require.NoError(t, err)
	t.Cleanup(func() { mc.Disconnect(context.Background()) })
	return mc.Database("unreachable").Collection("locks")
}
