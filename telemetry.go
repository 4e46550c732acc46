package dlock

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Version is this release of dlock. Its spans and metrics carry it as the
// OpenTelemetry instrumentation scope version.
const Version = "0.1.0"

// scopeName is the OpenTelemetry instrumentation scope: the module path.
const scopeName = "github.com/dlock-go/dlock"

// Attribute keys; see the README for the full list of spans and metrics.
const (
	attrKey      = attribute.Key("dlock.key")
	attrOwner    = attribute.Key("dlock.owner")
	attrToken    = attribute.Key("dlock.token")
	attrAttempts = attribute.Key("dlock.attempts")
	attrOutcome  = attribute.Key("dlock.outcome")
	attrCause    = attribute.Key("dlock.lost.cause")

	attrIdle    = attribute.Key("dlock.prune.idle")
	attrDeleted = attribute.Key("dlock.prune.deleted")

	attrKeys   = attribute.Key("dlock.keys")   // a MultiMutex's keys, in the order it locks them
	attrTokens = attribute.Key("dlock.tokens") // their tokens, in the same order

	attrHolderOwner = attribute.Key("dlock.holder.owner")
	attrHolderToken = attribute.Key("dlock.holder.token")
)

// maxHeldEvents bounds the dlock.held events on one Lock span: a wait
// under heavy contention sees many holders, and a trace should stay small.
const maxHeldEvents = 3

// Outcomes of a Lock or TryLock call.
const (
	outcomeAcquired  = "acquired"
	outcomeLocked    = "locked"
	outcomeCancelled = "cancelled"
	outcomeError     = "error"
)

// Causes of a lost lease.
const (
	causeExpired = "expired"  // extensions failed until the local deadline
	causeStolen  = "stolen"   // the store showed another owner
	causeMaxHold = "max_hold" // the hold reached its cap (WithMaxHold)
)

// WithTracerProvider sets where the Client's spans go. The default is the
// global provider ([otel.GetTracerProvider]) at the time of [NewClient].
// Client only.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return clientOnly("WithTracerProvider", func(c *config) { c.tracerProvider = tp })
}

// WithMeterProvider sets where the Client's metrics go. The default is the
// global provider ([otel.GetMeterProvider]) at the time of [NewClient].
// Client only.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return clientOnly("WithMeterProvider", func(c *config) { c.meterProvider = mp })
}

// telemetry holds one Client's tracer and instruments, made once.
type telemetry struct {
	tracer   trace.Tracer
	wait     metric.Float64Histogram
	hold     metric.Float64Histogram
	acquired metric.Int64Counter
	lost     metric.Int64Counter
	held     metric.Int64UpDownCounter
	commands metric.Int64Counter

	byOutcome map[string]metric.MeasurementOption
	byCause   map[string]metric.MeasurementOption
}

func newTelemetry(cfg *config) (*telemetry, error) {
	tp, mp := cfg.tracerProvider, cfg.meterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &telemetry{tracer: tp.Tracer(scopeName, trace.WithInstrumentationVersion(Version))}
	m := mp.Meter(scopeName, metric.WithInstrumentationVersion(Version))
	var errs [6]error
	t.wait, errs[0] = m.Float64Histogram("dlock.lock.wait.duration", metric.WithUnit("s"),
		metric.WithDescription("Time spent in Lock and TryLock, by outcome."))
	t.hold, errs[1] = m.Float64Histogram("dlock.lease.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from acquiring a lease to its end."))
	t.acquired, errs[2] = m.Int64Counter("dlock.lock.acquisitions", metric.WithUnit("{acquisition}"),
		metric.WithDescription("Leases acquired."))
	t.lost, errs[3] = m.Int64Counter("dlock.lease.lost", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases lost, by cause."))
	t.held, errs[4] = m.Int64UpDownCounter("dlock.leases.held", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases held now."))
	t.commands, errs[5] = m.Int64Counter("dlock.commands", metric.WithUnit("{command}"),
		metric.WithDescription("Commands sent to the server."))
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	t.byOutcome = map[string]metric.MeasurementOption{}
	for _, o := range []string{outcomeAcquired, outcomeLocked, outcomeCancelled, outcomeError} {
		t.byOutcome[o] = metric.WithAttributeSet(attribute.NewSet(attrOutcome.String(o)))
	}
	t.byCause = map[string]metric.MeasurementOption{}
	for _, c := range []string{causeExpired, causeStolen, causeMaxHold} {
		t.byCause[c] = metric.WithAttributeSet(attribute.NewSet(attrCause.String(c)))
	}
	return t, nil
}

func (t *telemetry) countCommands(ctx context.Context, n int) { t.commands.Add(ctx, int64(n)) }

// lockSpan starts the span of one Lock or TryLock call.
func (t *telemetry) lockSpan(ctx context.Context, name, key, owner string) (context.Context, trace.Span) {
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attrKey.String(key), attrOwner.String(owner))
	}
	return ctx, span
}

// multiLockSpan starts the span of one MultiMutex's Lock or TryLock call:
// its waits for each key note their holders on it (heldBy).
func (t *telemetry) multiLockSpan(ctx context.Context, name string, keys []string, owner string) (context.Context, trace.Span) {
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attrKeys.StringSlice(keys), attrOwner.String(owner))
	}
	return ctx, span
}

// endMultiLock records the end of a MultiMutex's Lock or TryLock call:
// as endLock, with a lease acquired per key.
func (t *telemetry) endMultiLock(ctx context.Context, span trace.Span, start time.Time, attempts int, ml *MultiLease, err error) {
	outcome := outcomeOf(ctx, err)
	t.wait.Record(ctx, time.Since(start).Seconds(), t.byOutcome[outcome])
	if ml != nil {
		t.acquired.Add(ctx, int64(len(ml.keys)))
	}
	if span.IsRecording() {
		span.SetAttributes(attrAttempts.Int(attempts), attrOutcome.String(outcome))
		if ml != nil {
			tokens := make([]int64, len(ml.leases))
			for i, tok := range ml.Tokens() {
				tokens[i] = int64(tok)
			}
			span.SetAttributes(attrTokens.Int64Slice(tokens))
		}
		if outcome == outcomeError {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

// multiReleaseSpan starts the span of one MultiMutex's Unlock or
// MultiLease's Release.
func (t *telemetry) multiReleaseSpan(ctx context.Context, keys []string, owner string) (context.Context, trace.Span) {
	ctx, span := t.tracer.Start(ctx, "dlock.MultiRelease", trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attrKeys.StringSlice(keys), attrOwner.String(owner))
	}
	return ctx, span
}

// A holdTrace is the trace context stored with a hold, so that a waiter's
// Lock span, in another process, can link to the trace in which the hold
// began: the W3C trace id and span id of the Lock span that made the hold
// (or of the caller's span, when the Lock span is not recorded) and the
// trace flags. The zero holdTrace is none. It is data: written with the
// hold, dropped with it, and named by no write's filter, so it never
// decides exclusion, order or tokens.
type holdTrace struct {
	traceID trace.TraceID
	spanID  trace.SpanID
	flags   trace.TraceFlags
}

// traceOf is the trace context to store with a hold made under the Lock
// span span, started in parent: the span's own when it is recorded, or
// else the caller's span's, if parent has a valid one; none otherwise.
func traceOf(span trace.Span, parent context.Context) holdTrace {
	sc := span.SpanContext()
	if !span.IsRecording() {
		sc = trace.SpanContextFromContext(parent)
	}
	if !sc.IsValid() {
		return holdTrace{}
	}
	return holdTrace{traceID: sc.TraceID(), spanID: sc.SpanID(), flags: sc.TraceFlags()}
}

// valid reports whether t is a trace context rather than none.
func (t holdTrace) valid() bool { return t.traceID.IsValid() && t.spanID.IsValid() }

// spanContext is t as the remote span context a link points to.
func (t holdTrace) spanContext() trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: t.traceID, SpanID: t.spanID, TraceFlags: t.flags, Remote: true})
}

// heldBy notes on the Lock span in ctx, a wait for key, who held the key
// when the wait found it taken, as r shows it: the waiter's question in a
// trace is "waiting for whom, doing what?". Each holder not noted before
// (the exclusive holder, unless last, the record last noted, showed the
// same owner and token; or each shared hold that last did not show) gets
// a dlock.held event and, when its hold stored a trace context, a link to
// the span of the Lock that made the hold, in whatever process: up to
// room of them, shared holds in the order of their tokens. It returns how
// many it noted, and sets last to r when that is any.
func (t *telemetry) heldBy(ctx context.Context, key string, r record, last *record, room int) int {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() || room <= 0 {
		return 0
	}
	n := 0
	note := func(owner string, token Token, tr holdTrace) {
		who := []attribute.KeyValue{attrHolderOwner.String(owner), attrHolderToken.Int64(int64(token))}
		span.AddEvent("dlock.held", trace.WithAttributes(who...))
		if tr.valid() {
			span.AddLink(trace.Link{SpanContext: tr.spanContext(), Attributes: append(who, attrKey.String(key))})
		}
		n++
	}
	if r.Owner != "" && (r.Owner != last.Owner || r.Token != last.Token) {
		note(r.Owner, r.Token, r.Trace)
	}
	byToken := func(a, b string) int { return cmp.Compare(r.Shared[a].Token, r.Shared[b].Token) }
	for _, hk := range slices.SortedFunc(maps.Keys(r.Shared), byToken) {
		if _, seen := last.Shared[hk]; !seen && n < room {
			e := r.Shared[hk]
			note(e.Owner, e.Token, e.Trace)
		}
	}
	if n > 0 {
		*last = r
	}
	return n
}

// endLock records the end of a Lock or TryLock call.
func (t *telemetry) endLock(ctx context.Context, span trace.Span, start time.Time, attempts int, l *Lease, err error) {
	outcome := outcomeOf(ctx, err)
	t.wait.Record(ctx, time.Since(start).Seconds(), t.byOutcome[outcome])
	if l != nil {
		t.acquired.Add(ctx, 1)
	}
	if span.IsRecording() {
		span.SetAttributes(attrAttempts.Int(attempts), attrOutcome.String(outcome))
		if l != nil {
			span.SetAttributes(attrToken.Int64(int64(l.token)))
		}
		if outcome == outcomeError {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

func outcomeOf(ctx context.Context, err error) string {
	switch {
	case err == nil:
		return outcomeAcquired
	case errors.Is(err, ErrLocked):
		return outcomeLocked
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return outcomeCancelled
	default:
		return outcomeError
	}
}

// endLease records the end of a live lease: its hold time, and a span when
// lost, in the trace of the Lock that made the hold, as its child. (The
// extender counts leases in and out of dlock.leases.held.)
func (t *telemetry) endLease(l *Lease, held time.Duration, lostCause string, err error) {
	ctx := context.Background()
	if l.trace.valid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, l.trace.spanContext())
	}
	t.hold.Record(ctx, held.Seconds())
	t.held.Add(ctx, -1)
	if lostCause == "" {
		return
	}
	t.lost.Add(ctx, 1, t.byCause[lostCause])
	_, span := t.tracer.Start(ctx, "dlock.LeaseLost")
	if span.IsRecording() {
		span.SetAttributes(attrKey.String(l.key), attrOwner.String(l.c.owner),
			attrToken.Int64(int64(l.token)), attrCause.String(lostCause))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// releaseSpan starts the span of one Unlock or Release call.
func (t *telemetry) releaseSpan(ctx context.Context, l *Lease) (context.Context, trace.Span) {
	ctx, span := t.tracer.Start(ctx, "dlock.Release", trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attrKey.String(l.key), attrOwner.String(l.c.owner), attrToken.Int64(int64(l.token)))
	}
	return ctx, span
}

// pruneSpan starts the span of one Prune call.
func (t *telemetry) pruneSpan(ctx context.Context, idle time.Duration) (context.Context, trace.Span) {
	ctx, span := t.tracer.Start(ctx, "dlock.Prune", trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attrIdle.Float64(idle.Seconds()))
	}
	return ctx, span
}

// endPrune records the end of a Prune call: how many documents it deleted.
func (t *telemetry) endPrune(span trace.Span, deleted int, err error) {
	if span.IsRecording() {
		span.SetAttributes(attrDeleted.Int(deleted))
	}
	endSpan(span, err)
}

func endSpan(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
