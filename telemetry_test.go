package dlock

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

type telemetryRig struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	opts   []Option
}

func newTelemetryRig() *telemetryRig {
	r := &telemetryRig{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	r.opts = []Option{
		WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))),
		WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))),
	}
	return r
}

func (r *telemetryRig) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// metrics collects the metrics, by name.
func (r *telemetryRig) metrics(t *testing.T) map[string]metricdata.Metrics {
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		assert.Equal(t, scopeName, sm.Scope.Name)
		assert.Equal(t, Version, sm.Scope.Version)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func sum(t *testing.T, m metricdata.Metrics, want attribute.KeyValue) int64 {
	t.Helper()
	var n int64
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if v, ok := p.Attributes.Value(want.Key); want.Key == "" || ok && v == want.Value {
				n += p.Value
			}
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if v, ok := p.Attributes.Value(want.Key); want.Key == "" || ok && v == want.Value {
				n += int64(p.Count)
			}
		}
	default:
		t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
	}
	return n
}

func TestTelemetryLockSpans(t *testing.T) {
	rig := newTelemetryRig()
	coll := newColl(t)
	ctx := context.Background()
	holder := newClient(t, coll, WithOwner("holder"))
	var observed <-chan struct{} // a read by the waiter: it has seen the holder
	c := newClient(t, coll, append(rig.opts, WithBackoff(time.Millisecond, 5*time.Millisecond),
		withStoreWrapper(func(s store) store {
			h := &hooked{store: s, hooks: map[string]hook{}, calls: map[string]int{}}
			observed = h.answered("read")
			return h
		}))...)
	require.NoError(t, holder.NewMutex("k").Lock(ctx))

	tracer := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rig.spans)).Tracer("test")
	pctx, parent := tracer.Start(ctx, "request")

	// Locked: TryLock's outcome is "locked", not an error.
	require.ErrorIs(t, c.NewMutex("k").TryLock(pctx), ErrLocked)
	// Cancelled: a wait that ends with its context is not an error either.
	cctx, cancel := context.WithTimeout(pctx, 30*time.Millisecond)
	require.ErrorIs(t, c.NewMutex("k").Lock(cctx), context.DeadlineExceeded)
	cancel()
	// Acquired after waiting: the holder lets go while we wait.
	m := c.NewMutex("k")
	done := make(chan error)
	for len(observed) > 0 { // reads of the calls above
		<-observed
	}
	go func() { done <- m.Lock(pctx) }()
	select {
	case <-observed:
	case err := <-done: // waiting for a read would hang the test
		t.Fatalf("the Lock returned (%v) before reading the key", err)
	}
	require.NoError(t, holder.Close(ctx))
	require.NoError(t, <-done)
	require.NoError(t, m.Unlock(pctx))
	parent.End()

	try := rig.ended("dlock.TryLock")
	require.Len(t, try, 1)
	assert.Equal(t, "locked", attrs(try[0])[attrOutcome].AsString())
	assert.Equal(t, codes.Unset, try[0].Status().Code)

	locks := rig.ended("dlock.Lock")
	require.Len(t, locks, 2)
	cancelled, acquired := attrs(locks[0]), attrs(locks[1])
	assert.Equal(t, "cancelled", cancelled[attrOutcome].AsString())
	assert.Equal(t, codes.Unset, locks[0].Status().Code, "cancellation is not an error")
	assert.Equal(t, "acquired", acquired[attrOutcome].AsString())
	assert.Equal(t, "k", acquired[attrKey].AsString())
	assert.Equal(t, c.Owner(), acquired[attrOwner].AsString())
	assert.Greater(t, acquired[attrAttempts].AsInt64(), int64(1), "attempts counted, not a span each")
	assert.Positive(t, acquired[attrToken].AsInt64())
	held := locks[1].Events()
	require.NotEmpty(t, held, "the wait names the holder")
	assert.LessOrEqual(t, len(held), maxHeldEvents)
	assert.Equal(t, "dlock.held", held[0].Name)
	holderAttrs := map[attribute.Key]attribute.Value{}
	for _, kv := range held[0].Attributes {
		holderAttrs[kv.Key] = kv.Value
	}
	assert.Equal(t, holder.Owner(), holderAttrs[attrHolderOwner].AsString())
	assert.Equal(t, acquired[attrToken].AsInt64()-1, holderAttrs[attrHolderToken].AsInt64(), "the holder's token, just before ours")
	for _, s := range append(append(try, locks...), rig.ended("dlock.Release")...) {
		assert.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID(), "%s is a child of the caller's span", s.Name())
		assert.Equal(t, parent.SpanContext().TraceID(), s.SpanContext().TraceID())
	}
	require.Len(t, rig.ended("dlock.Release"), 1)
	assert.Len(t, rig.spans.Ended(), 5, "one span per call, none per attempt (plus the parent)")

	ms := rig.metrics(t)
	wait := ms["dlock.lock.wait.duration"]
	assert.EqualValues(t, 1, sum(t, wait, attrOutcome.String("acquired")))
	assert.EqualValues(t, 1, sum(t, wait, attrOutcome.String("locked")))
	assert.EqualValues(t, 1, sum(t, wait, attrOutcome.String("cancelled")))
	assert.EqualValues(t, 1, sum(t, ms["dlock.lock.acquisitions"], attribute.KeyValue{}))
	assert.EqualValues(t, 0, sum(t, ms["dlock.leases.held"], attribute.KeyValue{}))
	assert.EqualValues(t, 1, sum(t, ms["dlock.lease.hold.duration"], attribute.KeyValue{}))
	assert.Positive(t, sum(t, ms["dlock.commands"], attribute.KeyValue{}))
}

func TestTelemetryLostLease(t *testing.T) {
	rig := newTelemetryRig()
	coll := newColl(t)
	ctx := context.Background()
	f := &faultyStore{}
	c := newClient(t, coll, append(rig.opts, WithTTL(200*time.Millisecond), withFaults(f))...)
	m := c.NewMutex("k")
	require.NoError(t, m.Lock(ctx))
	assert.EqualValues(t, 1, sum(t, rig.metrics(t)["dlock.leases.held"], attribute.KeyValue{}))
	l := m.Lease()
	f.crash()
	<-l.Lost()
	// Lost closes first; the span follows (telling the holder comes first).
	require.Eventually(t, func() bool { return len(rig.ended("dlock.LeaseLost")) == 1 }, 5*time.Second, time.Millisecond)
	lost := rig.ended("dlock.LeaseLost")
	a := attrs(lost[0])
	assert.Equal(t, "expired", a[attrCause].AsString())
	assert.Equal(t, int64(l.Token()), a[attrToken].AsInt64())
	assert.Equal(t, codes.Error, lost[0].Status().Code)
	locks := rig.ended("dlock.Lock")
	require.Len(t, locks, 1)
	assert.Equal(t, locks[0].SpanContext().TraceID(), lost[0].Parent().TraceID(), "in the Lock's trace")
	assert.Equal(t, locks[0].SpanContext().SpanID(), lost[0].Parent().SpanID(), "a child of the Lock span")
	ms := rig.metrics(t)
	assert.EqualValues(t, 1, sum(t, ms["dlock.lease.lost"], attrCause.String("expired")))
	assert.EqualValues(t, 0, sum(t, ms["dlock.leases.held"], attribute.KeyValue{}))
	require.ErrorIs(t, m.Unlock(ctx), ErrLeaseLost)
}

// Commands counted by telemetry agree with the driver's command monitor.
func TestTelemetryCommands(t *testing.T) {
	rig := newTelemetryRig()
	c := newClient(t, newColl(t), rig.opts...)
	ctx := context.Background()
	mark := commands.total.Load()
	m := c.NewMutex("k")
	for range 3 {
		require.NoError(t, m.Lock(ctx))
		require.NoError(t, m.Unlock(ctx))
	}
	assert.EqualValues(t, commands.since(mark), sum(t, rig.metrics(t)["dlock.commands"], attribute.KeyValue{}))
}

// Each new holder a traced wait sees is named in a dlock.held event, up to
// the cap: a wait through holders A, B and C records all three, in order.
// (Before, only the holder of the first read was named.)
func TestTelemetryHeldNamesEachHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newTelemetryRig()
		st := newMemStore()
		var holders []*Client
		for _, name := range []string{"A", "B", "C"} {
			c, _ := memClient(t, st, WithOwner(name))
			holders = append(holders, c)
		}
		w, _ := memClient(t, st, append(rig.opts, WithBackoff(time.Millisecond, time.Millisecond))...)
		ctx := context.Background()
		m := []*Mutex{holders[0].NewMutex("k"), holders[1].NewMutex("k"), holders[2].NewMutex("k")}
		require.NoError(t, m[0].Lock(ctx))
		// B and C queue behind A, then the traced waiter behind them: the
		// key passes A, B, C, then to the waiter, which polls about every
		// millisecond meanwhile (reading, behind others in the queue).
		got := make(chan error, 2)
		for _, next := range m[1:] {
			go func() { got <- next.Lock(ctx) }()
			synctest.Wait() // registered, and polling
		}
		done := make(chan error)
		go func() { done <- w.NewMutex("k").Lock(ctx) }()
		for i := range 2 {
			time.Sleep(time.Duration(10+10*i) * time.Millisecond) // the waiter polls meanwhile
			require.NoError(t, m[i].Unlock(ctx))
			require.NoError(t, <-got) // B, then C
		}
		time.Sleep(40 * time.Millisecond)
		require.NoError(t, m[2].Unlock(ctx))
		require.NoError(t, <-done)
		locks := rig.ended("dlock.Lock")
		require.Len(t, locks, 1)
		seen := heldOwners(locks[0])
		assert.Equal(t, []string{holders[0].Owner(), holders[1].Owner(), holders[2].Owner()}, seen)
	})
}

// A traced wait's read that shows the holder names it, also when the same
// read finds a registration of this Client's that no call uses (a
// cancelled Lock's, whose removal is still on its way) and clears it: the
// holder may let go before the wait reads again.
func TestTelemetryHeldNamedByReapingRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rig := newTelemetryRig()
		st := newMemStore()
		ctx := context.Background()
		holder, _ := memClient(t, st, WithOwner("holder"))
		c, h := memClient(t, st, append(rig.opts, WithBackoff(time.Millisecond, 5*time.Millisecond))...)
		hm := holder.NewMutex("k")
		require.NoError(t, hm.Lock(ctx))

		// A wait that registers and gives up; its registration's removal
		// lands only after the next wait's read has cleared it.
		reaped, gone := make(chan struct{}), make(chan struct{})
		h.on("release", func(ctx context.Context, call func() error) error {
			select {
			case <-reaped:
			case <-ctx.Done():
			}
			return call()
		})
		cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		require.ErrorIs(t, c.NewMutex("k").Lock(cctx), context.DeadlineExceeded)
		cancel()
		var once sync.Once
		h.on("reap", func(_ context.Context, call func() error) error {
			err := call()
			once.Do(func() { close(reaped) })
			<-gone // the holder lets go before the wait's next command
			return err
		})

		done := make(chan error)
		go func() { done <- c.NewMutex("k").Lock(ctx) }()
		synctest.Wait() // in the reap
		require.NoError(t, hm.Unlock(ctx))
		close(gone)
		require.NoError(t, <-done)

		locks := rig.ended("dlock.Lock")
		require.Len(t, locks, 2)
		named := heldOwners(locks[1])
		assert.Equal(t, []string{holder.Owner()}, named, "the wait names the holder")
	})
}

// heldOwners returns the owners that a Lock span's held events name, in order.
func heldOwners(span sdktrace.ReadOnlySpan) []string {
	var owners []string
	for _, e := range span.Events() {
		for _, kv := range e.Attributes {
			if kv.Key == attrHolderOwner {
				owners = append(owners, kv.Value.AsString())
			}
		}
	}
	return owners
}
