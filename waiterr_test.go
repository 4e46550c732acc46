package dlock

import (
	"context"
	"errors"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"
)

// A wait that its ctx ends says why it waited: its error matches ctx's
// error, and the last error it got from the server (errors.Is and
// errors.As), and names who held the key when it last saw it held, or says
// it never saw it held.
func TestWaitErrorSaysWhy(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T, st *memStore, c *Client, h *hooked) // before the wait
		wait    func(ctx context.Context, c *Client) error
		holder  string // the owner label named, or "" for none
		lastErr error  // matched, or nil for none
		says    string // in the message
	}{
		{"server out of reach", func(t *testing.T, _ *memStore, _ *Client, h *hooked) {
			for _, op := range []string{"acquire", "read", "register", "floor"} {
				h.on(op, func(context.Context, func() error) error { return errUnreachable })
			}
		}, func(ctx context.Context, c *Client) error { return c.NewMutex("k").Lock(ctx) },
			"", errUnreachable, "not seen held; last error: server unreachable"},
		{"held by another Client", func(t *testing.T, st *memStore, _ *Client, _ *hooked) {
			holdWith(t, st, "web3", func(c *Client) error { return c.NewMutex("k").Lock(ctx) })
		}, func(ctx context.Context, c *Client) error { return c.NewMutex("k").Lock(ctx) },
			"web3", nil, "last seen held by web3 with token 1"},
		{"Campaign, led by another Client", func(t *testing.T, st *memStore, _ *Client, _ *hooked) {
			holdWith(t, st, "web3", func(c *Client) error { _, err := c.NewElection("k").Campaign(ctx, "a"); return err })
		}, func(ctx context.Context, c *Client) error {
			_, err := c.NewElection("k").Campaign(ctx, "b")
			return err
		},
			"web3", nil, "last seen held by web3 with token 1"},
		{"Semaphore, every permit held", func(t *testing.T, st *memStore, _ *Client, _ *hooked) {
			holdWith(t, st, "web3", func(c *Client) error { _, err := c.NewSemaphore("k", 1).Acquire(ctx); return err })
		}, func(ctx context.Context, c *Client) error { _, err := c.NewSemaphore("k", 1).Acquire(ctx); return err },
			"web3", nil, "last seen held by web3 with token 1"},
		{"RWMutex.Lock, read-held", func(t *testing.T, st *memStore, _ *Client, _ *hooked) {
			holdWith(t, st, "web3", func(c *Client) error { return c.NewRWMutex("k").RLock(ctx) })
		}, func(ctx context.Context, c *Client) error { return c.NewRWMutex("k").Lock(ctx) },
			"web3", nil, "last seen held by web3 with token 1"},
		{"held by this Client", func(t *testing.T, _ *memStore, c *Client, _ *hooked) {
			require.NoError(t, c.NewMutex("k").Lock(ctx))
		}, func(ctx context.Context, c *Client) error { return c.NewMutex("k").Lock(ctx) },
			"me", nil, "held by this Client"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newMemStore()
				c, h := memClient(t, st, WithOwner("me"))
				tc.setup(t, st, c, h)
				wait, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				err := tc.wait(wait, c)
				require.ErrorIs(t, err, context.DeadlineExceeded)
				assert.Contains(t, err.Error(), tc.says)
				var we *WaitError
				require.ErrorAs(t, err, &we)
				assert.Equal(t, "k", we.Key)
				if tc.lastErr != nil {
					require.ErrorIs(t, err, tc.lastErr)
					require.ErrorIs(t, we.LastErr, tc.lastErr)
				} else {
					assert.NoError(t, we.LastErr)
				}
				if tc.holder == "" {
					assert.Empty(t, we.Holders)
				} else {
					require.NotEmpty(t, we.Holders)
					assert.Regexp(t, "^"+tc.holder+"#", we.Holders[0].Owner)
				}
			})
		})
	}
}

// holdWith has a new Client on st, labelled owner, take a hold by lock.
func holdWith(t *testing.T, st *memStore, owner string, lock func(c *Client) error) {
	t.Helper()
	c, _ := memClient(t, st, WithOwner(owner))
	require.NoError(t, lock(c))
}

// Against a server that cannot be reached, the driver's last word comes
// as ctx ends the command: a server selection error that names the fault.
// The Lock's error keeps it, beside ctx's error.
func TestWaitErrorUnreachableServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	l.Close()
	mc, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + closed + "/"))
	require.NoError(t, err)
	defer mc.Disconnect(context.Background())
	c := newClient(t, mc.Database("dlock").Collection("locks"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = c.NewMutex("k").Lock(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var sel topology.ServerSelectionError
	require.ErrorAs(t, err, &sel)
	assert.Contains(t, err.Error(), `dlock: lock "k": context deadline exceeded (not seen held; last error: `)
	assert.Contains(t, err.Error(), "connection refused")
	assert.Contains(t, err.Error(), "not seen held")
	assert.False(t, errors.Is(err, ErrLocked))
}
