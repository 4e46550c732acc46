package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// A recorder is a TracerProvider that records every span, as the SDK's
// default sampler (parent-based, always on) would, and keeps those that
// ended for export (see otlp.go). A span whose parent is not sampled is
// not recorded: Start returns the parent span. Its zero value is ready to
// use; it is safe for concurrent use.
type recorder struct {
	embedded.TracerProvider

	mu    sync.Mutex
	ended []*recSpan // guarded by mu; appended as spans end
}

// Tracer returns a tracer whose spans carry the instrumentation scope name
// and its version.
func (p *recorder) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	c := trace.NewTracerConfig(opts...)
	return &recTracer{p: p, scope: otlpScope{Name: name, Version: c.InstrumentationVersion()}}
}

// take returns the spans that ended since the last take, in the order they
// ended.
func (p *recorder) take() []*recSpan {
	p.mu.Lock()
	defer p.mu.Unlock()
	spans := p.ended
	p.ended = nil
	return spans
}

// A recTracer starts a recorder's spans of one instrumentation scope.
type recTracer struct {
	embedded.Tracer
	p     *recorder
	scope otlpScope
}

// Start starts a span as a child of ctx's span, or of none with
// [trace.WithNewRoot]: with a new random span id, in the parent's trace
// (and trace state), or a new random trace.
func (t *recTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	parent := trace.SpanContextFromContext(ctx)
	if cfg.NewRoot() {
		parent = trace.SpanContext{}
	}
	if parent.IsValid() && !parent.IsSampled() {
		return ctx, trace.SpanFromContext(ctx) // not recorded: the parent is not sampled
	}
	scc := trace.SpanContextConfig{TraceFlags: trace.FlagsSampled}
	if parent.IsValid() {
		scc.TraceID, scc.TraceState = parent.TraceID(), parent.TraceState()
	} else {
		rand.Read(scc.TraceID[:])
	}
	rand.Read(scc.SpanID[:])
	s := &recSpan{tracer: t, sc: trace.NewSpanContext(scc), parent: parent, kind: trace.ValidateSpanKind(cfg.SpanKind()),
		name: name, start: cfg.Timestamp(), links: slices.Clone(cfg.Links())}
	if s.start.IsZero() {
		s.start = time.Now()
	}
	s.SetAttributes(cfg.Attributes()...)
	return trace.ContextWithSpan(ctx, s), s
}

// A recSpan is a span of a recorder: recording until it ends, then queued
// for export and unchanged.
type recSpan struct {
	embedded.Span
	tracer *recTracer
	sc     trace.SpanContext // this span's
	parent trace.SpanContext // the parent's, or none for a root
	kind   trace.SpanKind
	start  time.Time

	mu            sync.Mutex // guards what follows; set until the span ends
	name          string
	end           time.Time // zero until the span ends
	attrs         []attribute.KeyValue
	events        []recEvent
	links         []trace.Link
	status        codes.Code
	statusMessage string
}

// A recEvent is an event of a recSpan.
type recEvent struct {
	name  string
	time  time.Time
	attrs []attribute.KeyValue
}

// update runs f under s.mu, if s has not ended.
func (s *recSpan) update(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.end.IsZero() {
		f()
	}
}

// End ends s, at the time given or now, and queues it for export. Later
// calls do nothing.
func (s *recSpan) End(opts ...trace.SpanEndOption) {
	cfg := trace.NewSpanEndConfig(opts...)
	ended := false
	s.update(func() {
		if s.end = cfg.Timestamp(); s.end.IsZero() {
			s.end = time.Now()
		}
		ended = true
	})
	if ended {
		s.tracer.p.mu.Lock()
		s.tracer.p.ended = append(s.tracer.p.ended, s)
		s.tracer.p.mu.Unlock()
	}
}

// AddEvent adds an event, with the attributes and time given (else now).
func (s *recSpan) AddEvent(name string, opts ...trace.EventOption) {
	cfg := trace.NewEventConfig(opts...)
	s.update(func() {
		s.events = append(s.events, recEvent{name: name, time: cfg.Timestamp(), attrs: cfg.Attributes()})
	})
}

// AddLink adds a link to another span.
func (s *recSpan) AddLink(link trace.Link) {
	s.update(func() { s.links = append(s.links, link) })
}

// IsRecording reports whether s has not ended.
func (s *recSpan) IsRecording() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.end.IsZero()
}

// RecordError adds an "exception" event for err, as the SDK does: with
// its type and message (and the attributes and time given).
func (s *recSpan) RecordError(err error, opts ...trace.EventOption) {
	if err == nil {
		return
	}
	opts = append(opts, trace.WithAttributes(
		attribute.String("exception.type", fmt.Sprintf("%T", err)),
		attribute.String("exception.message", err.Error())))
	s.AddEvent("exception", opts...)
}

// SpanContext returns s's span context.
func (s *recSpan) SpanContext() trace.SpanContext { return s.sc }

// SetStatus sets s's status, as the SDK does: Ok is final, Error replaces
// Unset, and Unset changes nothing; the description is kept for Error only.
func (s *recSpan) SetStatus(code codes.Code, description string) {
	s.update(func() {
		if code == codes.Unset || s.status == codes.Ok {
			return
		}
		s.status, s.statusMessage = code, ""
		if code == codes.Error {
			s.statusMessage = description
		}
	})
}

// SetName renames s.
func (s *recSpan) SetName(name string) { s.update(func() { s.name = name }) }

// SetAttributes sets attributes of s, each replacing one of the same key.
func (s *recSpan) SetAttributes(kvs ...attribute.KeyValue) {
	s.update(func() {
		for _, kv := range kvs {
			if kv.Key == "" {
				continue
			}
			i := slices.IndexFunc(s.attrs, func(a attribute.KeyValue) bool { return a.Key == kv.Key })
			if i < 0 {
				s.attrs = append(s.attrs, kv)
			} else {
				s.attrs[i] = kv
			}
		}
	})
}

// TracerProvider returns the recorder that made s.
func (s *recSpan) TracerProvider() trace.TracerProvider { return s.tracer.p }
