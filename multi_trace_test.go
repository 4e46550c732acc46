package dlock

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
)

// A MultiMutex's Lock is one span naming its keys, in order, and their
// tokens; its wait for a held key links to the span in which each holder
// it waited behind took that key, as a Mutex's Lock does, the link naming
// the key. Each hold stores the trace context of that span; Unlock is one
// span too.
func TestMultiMutexTrace(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		hp, wp := newTracedProcess(), newTracedProcess()
		held := make(chan struct{}, 1)
		holder := sp.client(t, WithOwner("holder"), WithTracerProvider(hp.tp))
		waiter := sp.client(t, WithOwner("waiter"), WithTracerProvider(wp.tp), watchReads(held))
		hb, hd := holder.NewMutex("b"), holder.NewMutex("d")
		require.NoError(t, hb.Lock(ctx))
		require.NoError(t, hd.Lock(ctx))
		locks := hp.ended("dlock.Lock")
		require.Len(t, locks, 2)

		m := waiter.NewMultiMutex([]string{"d", "a", "b", "c"})
		done := make(chan error)
		go func() { done <- m.Lock(ctx) }()
		for _, mu := range []*Mutex{hb, hd} { // b, then d: the order it waits in
			select {
			case <-held:
			case err := <-done:
				t.Fatalf("the Lock returned (%v) before it saw the holder", err)
			}
			require.NoError(t, mu.Unlock(ctx))
		}
		require.NoError(t, <-done)
		tokens := m.Lease().Tokens()
		hs, err := holder.Holders(ctx, "c")
		require.NoError(t, err)
		require.NoError(t, m.Unlock(ctx))

		spans := wp.ended("dlock.MultiLock")
		require.Len(t, spans, 1)
		s := spans[0]
		attrs := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes {
			attrs[kv.Key] = kv.Value
		}
		assert.Equal(t, []string{"a", "b", "c", "d"}, attrs[attrKeys].AsStringSlice())
		want := make([]int64, len(tokens))
		for i, tok := range tokens {
			want[i] = int64(tok)
		}
		assert.Equal(t, want, attrs[attrTokens].AsInt64Slice())
		assert.Equal(t, outcomeAcquired, attrs[attrOutcome].AsString())
		require.Len(t, s.Links, 2, "a link to each holder it waited behind")
		for i, key := range []string{"b", "d"} {
			l := s.Links[i]
			assert.Equal(t, locks[i].SpanContext.SpanID(), l.SpanContext.SpanID(), "the span that took %q", key)
			assert.Equal(t, key, linkAttrs(l)[attrKey].AsString())
		}
		require.Len(t, hs, 1)
		assert.Equal(t, s.SpanContext.SpanID(), hs[0].SpanID, "the holds store the MultiLock's span")
		assert.Len(t, wp.ended("dlock.MultiRelease"), 1)
	})
}
