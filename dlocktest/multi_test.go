package dlocktest

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A MultiMutex on the in-memory server: all or nothing against another
// Client, and its hold lost, at its deadline, when its Client is cut off.
func TestMultiMutex(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		srv := NewServer()
		a, b := srv.Client(dlock.WithTTL(time.Hour)), srv.Client(dlock.WithTTL(time.Hour))
		defer a.Close(ctx)
		defer b.Close(ctx)
		mb := b.NewMutex("b")
		require.NoError(t, mb.Lock(ctx))
		m := a.NewMultiMutex([]string{"b", "a"})
		require.ErrorIs(t, m.TryLock(ctx), dlock.ErrLocked)
		hs, err := b.Holders(ctx, "a")
		require.NoError(t, err)
		assert.Empty(t, hs, "a was given back")
		require.NoError(t, mb.Unlock(ctx))

		require.NoError(t, m.Lock(ctx))
		hold := m.Lease()
		start := time.Now()
		srv.Partition(a)
		<-hold.Lost()
		assert.Less(t, time.Since(start), time.Hour, "before another Client could take a key")
		assert.ErrorIs(t, hold.Err(), dlock.ErrLeaseLost)
		srv.Heal(a)
		assert.ErrorIs(t, m.Unlock(ctx), dlock.ErrLeaseLost)
	})
}
