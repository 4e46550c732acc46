package dlock

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// A process's tracing: its own tracer provider, whose ended spans an
// in-memory exporter keeps.
type tracedProcess struct {
	tp    *sdktrace.TracerProvider
	spans *tracetest.InMemoryExporter
}

func newTracedProcess(opts ...sdktrace.TracerProviderOption) tracedProcess {
	exp := tracetest.NewInMemoryExporter()
	return tracedProcess{tp: sdktrace.NewTracerProvider(append(opts, sdktrace.WithSyncer(exp))...), spans: exp}
}

// ended returns the ended spans named name.
func (p tracedProcess) ended(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range p.spans.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// sawHeld wraps a store and signals, without blocking, each read that
// shows the key held: the waiter has seen whom it waits for.
type sawHeld struct {
	store
	held chan struct{}
}

func (s *sawHeld) read(ctx context.Context, key string) (record, error) {
	r, err := s.store.read(ctx, key)
	if err == nil && !r.free() {
		select {
		case s.held <- struct{}{}:
		default:
		}
	}
	return r, err
}

// watchReads is a Client option that signals on held each read that
// shows the key held.
func watchReads(held chan struct{}) Option {
	return withStoreWrapper(func(s store) store { return &sawHeld{store: s, held: held} })
}

// linkAttrs returns a link's attributes by key.
func linkAttrs(l sdktrace.Link) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range l.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

// Two processes, each with its own tracer provider: the waiter's Lock
// span links to the span in which the holder took the key, in the
// holder's trace, naming the key, the holder and its token; and Holders
// shows the holder's trace and span ids meanwhile.
func TestTraceLinkToHolder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		hp, wp := newTracedProcess(), newTracedProcess()
		held := make(chan struct{}, 1)
		holder := sp.client(t, WithOwner("holder"), WithTracerProvider(hp.tp))
		waiter := sp.client(t, WithOwner("waiter"), WithTracerProvider(wp.tp), watchReads(held))

		jctx, job := hp.tp.Tracer("app").Start(ctx, "job")
		hm := holder.NewMutex("k")
		require.NoError(t, hm.Lock(jctx))
		took := hp.ended("dlock.Lock")
		require.Len(t, took, 1)
		lock := took[0].SpanContext
		assert.Equal(t, job.SpanContext().TraceID(), lock.TraceID())
		hs, err := holder.Holders(ctx, "k") // not the waiter's: its reads signal held
		require.NoError(t, err)
		require.Len(t, hs, 1)
		assert.Equal(t, lock.TraceID(), hs[0].TraceID, "Holders: the trace in which the holder took the key")
		assert.Equal(t, lock.SpanID(), hs[0].SpanID)

		rctx, request := wp.tp.Tracer("app").Start(ctx, "request")
		wm := waiter.NewMutex("k")
		done := make(chan error)
		go func() { done <- wm.Lock(rctx) }()
		select {
		case <-held:
		case err := <-done:
			t.Fatalf("the Lock returned (%v) before it saw the holder", err)
		}
		token := hm.Lease().Token()
		require.NoError(t, hm.Unlock(ctx))
		job.End()
		require.NoError(t, <-done)
		require.NoError(t, wm.Unlock(ctx))
		request.End()

		waits := wp.ended("dlock.Lock")
		require.Len(t, waits, 1)
		assert.NotEqual(t, lock.TraceID(), waits[0].SpanContext.TraceID(), "two processes, two traces")
		require.Len(t, waits[0].Links, 1, "one link: the one holder it waited behind")
		link := waits[0].Links[0]
		assert.Equal(t, lock.TraceID(), link.SpanContext.TraceID())
		assert.Equal(t, lock.SpanID(), link.SpanContext.SpanID())
		assert.True(t, link.SpanContext.IsSampled())
		assert.True(t, link.SpanContext.IsRemote())
		a := linkAttrs(link)
		assert.Equal(t, "k", a[attrKey].AsString())
		assert.Equal(t, holder.Owner(), a[attrHolderOwner].AsString())
		assert.Equal(t, int64(token), a[attrHolderToken].AsInt64())
	})
}

// The trace context stored with a hold: the Lock span's when it is
// recorded, else the caller's span's, else none; Holders and Leader
// return it.
func TestTraceStoredWithHold(t *testing.T) {
	recorded := newTracedProcess()
	caller := newTracedProcess()
	unsampled := newTracedProcess(sdktrace.WithSampler(sdktrace.NeverSample()))
	tests := []struct {
		name   string
		opts   []Option // the holder Client's
		caller trace.TracerProvider
		// want is the span context stored by the call whose span is named
		// span, made under the caller's span callerSpan.
		want func(span string, callerSpan trace.SpanContext) trace.SpanContext
	}{
		{name: "Lock span recorded", opts: []Option{WithTracerProvider(recorded.tp)}, caller: caller.tp,
			want: func(span string, _ trace.SpanContext) trace.SpanContext { return recorded.ended(span)[0].SpanContext }},
		{name: "Lock span not recorded: the caller's", opts: []Option{WithTracerProvider(unsampled.tp)}, caller: caller.tp,
			want: func(_ string, sc trace.SpanContext) trace.SpanContext { return sc }},
		{name: "no-op tracer: the caller's", caller: caller.tp,
			want: func(_ string, sc trace.SpanContext) trace.SpanContext { return sc }},
		{name: "Lock span recorded, no caller span: the Lock span's own trace", opts: []Option{WithTracerProvider(recorded.tp)},
			want: func(span string, _ trace.SpanContext) trace.SpanContext { return recorded.ended(span)[0].SpanContext }},
		{name: "no span at all",
			want: func(string, trace.SpanContext) trace.SpanContext { return trace.SpanContext{} }},
	}
	for _, tt := range tests {
		forEachBackend(t, func(t *testing.T, sp space) {
			t.Run(tt.name, func(t *testing.T) {
				recorded.spans.Reset()
				ctx := context.Background()
				var span trace.Span
				if tt.caller != nil {
					ctx, span = tt.caller.Tracer("app").Start(ctx, "job")
					defer span.End()
				}
				c := sp.client(t, tt.opts...)
				m := c.NewMutex("k")
				require.NoError(t, m.Lock(ctx))
				var callerSpan trace.SpanContext
				if span != nil {
					callerSpan = span.SpanContext()
				}
				want := tt.want("dlock.Lock", callerSpan)
				hs, err := c.Holders(ctx, "k")
				require.NoError(t, err)
				require.Len(t, hs, 1)
				assert.Equal(t, want.TraceID(), hs[0].TraceID)
				assert.Equal(t, want.SpanID(), hs[0].SpanID)
				assert.Equal(t, want.IsSampled(), sp.read(t, "k").Trace.flags.IsSampled())

				e := c.NewElection("e")
				_, err = e.Campaign(ctx, "v")
				require.NoError(t, err)
				leader, err := e.Leader(ctx)
				require.NoError(t, err)
				want = tt.want("dlock.Campaign", callerSpan)
				assert.Equal(t, want.TraceID(), leader.TraceID)
				assert.Equal(t, want.SpanID(), leader.SpanID)
				require.NoError(t, m.Unlock(ctx))
				assert.Equal(t, holdTrace{}, sp.read(t, "k").Trace, "dropped with the hold")
			})
		})
	}
}

// A trace context lives exactly as long as its hold: a later hold without
// a span shows none, and a local handoff stores the next caller's.
func TestTraceFollowsTheHold(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		p := newTracedProcess()
		c := sp.client(t, WithTracerProvider(p.tp))
		tracer := p.tp.Tracer("app")
		ctx := context.Background()
		m := c.NewMutex("k")
		actx, a := tracer.Start(ctx, "a")
		require.NoError(t, m.Lock(actx))
		require.True(t, sp.read(t, "k").Trace.valid())
		require.NoError(t, m.Unlock(actx))
		a.End()
		require.NoError(t, m.Lock(ctx)) // no caller span: the Lock span's own
		lockSpan := p.ended("dlock.Lock")[1].SpanContext
		assert.Equal(t, lockSpan.SpanID(), sp.read(t, "k").Trace.spanID)

		// A second goroutine of the Client, under its own span, is handed
		// the hold: the handoff's write stores its Lock span.
		bctx, b := tracer.Start(ctx, "b")
		defer b.End()
		m2 := c.NewMutex("k")
		got := make(chan error)
		go func() { got <- m2.Lock(bctx) }()
		waitQueued(t, c, "k")
		require.NoError(t, m.Unlock(ctx))
		require.NoError(t, <-got)
		r := sp.read(t, "k")
		assert.Equal(t, b.SpanContext().TraceID(), r.Trace.traceID, "the handoff stores the next holder's trace")
		require.NoError(t, m2.Unlock(ctx))
	})
}

// A waiter behind shared holds links to each of them, up to the bound:
// a Semaphore's Acquire behind four permits of four traced processes
// links to three, in the order of their tokens, each in its own trace.
func TestTraceLinksToSharedHolders(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		var holders []*Lease
		var traces []trace.TraceID
		for range 4 {
			p := newTracedProcess()
			c := sp.client(t, WithTracerProvider(p.tp))
			l, err := c.NewSemaphore("s", 4).Acquire(ctx)
			require.NoError(t, err)
			holders = append(holders, l)
			traces = append(traces, p.ended("dlock.Acquire")[0].SpanContext.TraceID())
		}
		wp := newTracedProcess()
		held := make(chan struct{}, 1)
		w := sp.client(t, WithTracerProvider(wp.tp), watchReads(held))
		done := make(chan error)
		var permit *Lease
		go func() {
			var err error
			permit, err = w.NewSemaphore("s", 4).Acquire(ctx)
			done <- err
		}()
		<-held
		require.NoError(t, holders[0].Release(ctx))
		require.NoError(t, <-done)
		require.NoError(t, permit.Release(ctx))

		acq := wp.ended("dlock.Acquire")
		require.Len(t, acq, 1)
		require.Len(t, acq[0].Links, maxHeldEvents, "bounded")
		for i, l := range acq[0].Links {
			assert.Equal(t, traces[i], l.SpanContext.TraceID(), "link %d", i)
			assert.Equal(t, int64(holders[i].Token()), linkAttrs(l)[attrHolderToken].AsInt64())
		}
		assert.Len(t, acq[0].Events, maxHeldEvents, "an event per holder linked")
	})
}

// An RWMutex's writer behind two traced readers links to both.
func TestTraceLinksToReaders(t *testing.T) {
	forEachBackend(t, func(t *testing.T, sp space) {
		ctx := context.Background()
		var readers []*RWMutex
		var spans []trace.SpanContext
		for range 2 {
			p := newTracedProcess()
			rw := sp.client(t, WithTracerProvider(p.tp)).NewRWMutex("rw")
			require.NoError(t, rw.RLock(ctx))
			readers = append(readers, rw)
			spans = append(spans, p.ended("dlock.RLock")[0].SpanContext)
		}
		wp := newTracedProcess()
		held := make(chan struct{}, 1)
		w := sp.client(t, WithTracerProvider(wp.tp), watchReads(held))
		wm := w.NewRWMutex("rw")
		done := make(chan error)
		go func() { done <- wm.Lock(ctx) }()
		<-held
		for _, rw := range readers {
			require.NoError(t, rw.RUnlock(ctx))
		}
		require.NoError(t, <-done)
		require.NoError(t, wm.Unlock(ctx))
		locks := wp.ended("dlock.Lock")
		require.Len(t, locks, 1)
		var linked []trace.SpanContext
		for _, l := range locks[0].Links {
			linked = append(linked, l.SpanContext.WithRemote(false))
		}
		assert.ElementsMatch(t, spans, linked)
	})
}

// The stored trace context is read leniently: a field of another form, or
// one that an older dlock left from another hold, is no trace context,
// and no error; the lock works as ever.
func TestTraceFieldReadLeniently(t *testing.T) {
	good := holdTrace{traceID: trace.TraceID{1}, spanID: trace.SpanID{2}, flags: trace.FlagsSampled}
	bin := func(b []byte) bson.RawValue {
		typ, v, err := bson.MarshalValue(bson.Binary{Data: b})
		require.NoError(t, err)
		return bson.RawValue{Type: typ, Value: v}
	}
	str := func(s string) bson.RawValue {
		typ, v, err := bson.MarshalValue(s)
		require.NoError(t, err)
		return bson.RawValue{Type: typ, Value: v}
	}
	tests := []struct {
		name string
		v    bson.RawValue
		want holdTrace
	}{
		{name: "written for this hold", v: bin(traceValue(good, "o1", 7).Data), want: good},
		{name: "absent (an older dlock, or no span)", v: bson.RawValue{}},
		{name: "another hold's (left by an older dlock)", v: bin(traceValue(good, "o1", 6).Data)},
		{name: "another owner's", v: bin(traceValue(good, "o2", 7).Data)},
		{name: "a string", v: str("00-01000000000000000000000000000000-0200000000000000-01")},
		{name: "too short", v: bin(traceValue(good, "o1", 7).Data[:traceLen-1])},
		{name: "zero ids", v: bin(traceValue(holdTrace{}, "o1", 7).Data)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, traceFrom(tt.v, "o1", 7))
		})
	}

	// A document with a malformed field: Holders, Lock and Unlock work.
	coll := newColl(t)
	ctx := context.Background()
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: fOwner, Value: ""}, {Key: fToken, Value: int64(3)},
		{Key: fRev, Value: int64(5)}, {Key: fTrace, Value: "garbage"}, {Key: fH, Value: bson.D{}}})
	require.NoError(t, err)
	c := newClient(t, coll)
	hs, err := c.Holders(ctx, "k")
	require.NoError(t, err)
	assert.Empty(t, hs)
	m := c.NewMutex("k")
	require.NoError(t, m.Lock(ctx))
	assert.Nil(t, readDoc(t, coll, "k").TC.Value, "a Lock with no span leaves no trace field")
	require.NoError(t, m.Unlock(ctx))

	// The field as stored: binary of traceLen bytes while held, gone once
	// released.
	p := newTracedProcess()
	m = newClient(t, coll, WithTracerProvider(p.tp)).NewMutex("k")
	require.NoError(t, m.Lock(ctx))
	sub, b, ok := readDoc(t, coll, "k").TC.BinaryOK()
	require.True(t, ok)
	assert.Zero(t, sub)
	assert.Len(t, b, traceLen)
	require.NoError(t, m.Unlock(ctx))
	assert.Nil(t, readDoc(t, coll, "k").TC.Value, "dropped with the hold")
}
