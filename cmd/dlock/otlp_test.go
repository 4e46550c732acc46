package main

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// The export's settings, as the SDK's variables give them.
func TestOTLPFromEnv(t *testing.T) {
	const endpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"
	service := func(name string) attribute.KeyValue { return attribute.String("service.name", name) }
	for _, tc := range []struct {
		name         string
		env          map[string]string
		wantURL      string // "" for no export
		wantHeader   http.Header
		wantTimeout  time.Duration
		wantResource []attribute.KeyValue
		wantWarns    []string
	}{
		{name: "nothing set"},
		{name: "headers without an endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a=1"}},
		{name: "endpoint", env: map[string]string{endpoint: "http://c:4318"},
			wantURL: "http://c:4318/v1/traces", wantTimeout: maxExportWait},
		{name: "endpoint with a path and a slash", env: map[string]string{endpoint: "https://c/otlp/"},
			wantURL: "https://c/otlp/v1/traces"},
		{name: "traces endpoint, as is, wins", env: map[string]string{endpoint: "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9/x/"},
			wantURL: "http://t:9/x/"},
		{name: "exporter none", env: map[string]string{endpoint: "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}},
		{name: "exporter otlp", env: map[string]string{endpoint: "http://c:4318", "OTEL_TRACES_EXPORTER": "otlp"},
			wantURL: "http://c:4318/v1/traces"},
		{name: "SDK disabled", env: map[string]string{endpoint: "http://c:4318", "OTEL_SDK_DISABLED": "true"}},
		{name: "headers, percent-decoded", env: map[string]string{endpoint: "http://c",
			"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20tok%3D%3D, x-team = ci+cd ,"},
			wantURL: "http://c/v1/traces", wantHeader: http.Header{"Authorization": {"Bearer tok=="}, "X-Team": {"ci+cd"}}},
		{name: "traces headers win", env: map[string]string{endpoint: "http://c",
			"OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "b=2"},
			wantURL: "http://c/v1/traces", wantHeader: http.Header{"B": {"2"}}},
		{name: "bad headers, skipped without their values", env: map[string]string{endpoint: "http://c",
			"OTEL_EXPORTER_OTLP_HEADERS": "a=1,secret1,=secret2,b=secret3%zz"},
			wantURL: "http://c/v1/traces", wantHeader: http.Header{"A": {"1"}},
			wantWarns: []string{"ignoring entries of OTEL_EXPORTER_OTLP_HEADERS that are not key=value (percent-encoded)"}},
		{name: "timeout", env: map[string]string{endpoint: "http://c", "OTEL_EXPORTER_OTLP_TIMEOUT": "500"},
			wantURL: "http://c/v1/traces", wantTimeout: 500 * time.Millisecond},
		{name: "traces timeout wins", env: map[string]string{endpoint: "http://c",
			"OTEL_EXPORTER_OTLP_TIMEOUT": "500", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "100"},
			wantURL: "http://c/v1/traces", wantTimeout: 100 * time.Millisecond},
		{name: "timeout capped", env: map[string]string{endpoint: "http://c", "OTEL_EXPORTER_OTLP_TIMEOUT": "60000"},
			wantURL: "http://c/v1/traces", wantTimeout: maxExportWait},
		{name: "bad timeout", env: map[string]string{endpoint: "http://c", "OTEL_EXPORTER_OTLP_TIMEOUT": "5s"},
			wantURL: "http://c/v1/traces", wantTimeout: maxExportWait,
			wantWarns: []string{`ignoring OTEL_EXPORTER_OTLP_TIMEOUT "5s": not a number of milliseconds`}},
		{name: "protocol http/json", env: map[string]string{endpoint: "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
			wantURL: "http://c/v1/traces"},
		{name: "protocol grpc", env: map[string]string{endpoint: "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			wantURL:   "http://c/v1/traces",
			wantWarns: []string{`OTEL_EXPORTER_OTLP_PROTOCOL is "grpc", but dlock sends traces as http/json (OTLP/HTTP, on port 4318 by default)`}},
		{name: "traces protocol http/protobuf", env: map[string]string{endpoint: "http://c",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
			wantURL:   "http://c/v1/traces",
			wantWarns: []string{`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is "http/protobuf", but dlock sends traces as http/json (OTLP/HTTP, on port 4318 by default)`}},
		{name: "resource", env: map[string]string{endpoint: "http://c", "OTEL_RESOURCE_ATTRIBUTES": "ci.job=42,service.name=builder,team=a%20b"},
			wantURL:      "http://c/v1/traces",
			wantResource: []attribute.KeyValue{service("builder"), attribute.String("ci.job", "42"), attribute.String("team", "a b")}},
		{name: "service name wins", env: map[string]string{endpoint: "http://c", "OTEL_RESOURCE_ATTRIBUTES": "service.name=builder", "OTEL_SERVICE_NAME": "ci"},
			wantURL: "http://c/v1/traces", wantResource: []attribute.KeyValue{service("ci")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, warns := otlpFromEnv(func(name string) string { return tc.env[name] })
			assert.Equal(t, tc.wantWarns, warns)
			if tc.wantURL == "" {
				assert.Nil(t, e)
				return
			}
			require.NotNil(t, e)
			assert.Equal(t, tc.wantURL, e.url)
			if tc.wantHeader == nil {
				tc.wantHeader = http.Header{}
			}
			assert.Equal(t, tc.wantHeader, e.header)
			if tc.wantTimeout != 0 {
				assert.Equal(t, tc.wantTimeout, e.timeout)
			}
			if tc.wantResource == nil {
				tc.wantResource = []attribute.KeyValue{service("dlock")}
			}
			assert.Equal(t, tc.wantResource, e.resource)
		})
	}
}

// The recorder's spans: ids, parents, what they record, and their queue.
func TestRecorder(t *testing.T) {
	p := &recorder{}
	tr := p.Tracer("scope", trace.WithInstrumentationVersion("1.2"))
	ts, err := trace.ParseTraceState("vendor=x")
	require.NoError(t, err)
	remote := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2},
		TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true})
	ctx, a := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), remote), "a",
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attribute.Int("n", 1)))
	assert.True(t, a.IsRecording())
	assert.Same(t, p, a.TracerProvider())
	sc := a.SpanContext()
	assert.Equal(t, remote.TraceID(), sc.TraceID(), "in the parent's trace")
	assert.True(t, sc.SpanID().IsValid())
	assert.NotEqual(t, remote.SpanID(), sc.SpanID())
	assert.True(t, sc.IsSampled())
	assert.Equal(t, "vendor=x", sc.TraceState().String())

	_, b := tr.Start(ctx, "b")
	_, r1 := tr.Start(ctx, "r1", trace.WithNewRoot())
	_, r2 := tr.Start(context.Background(), "r2")
	assert.Equal(t, sc.TraceID(), b.SpanContext().TraceID())
	assert.True(t, r1.SpanContext().TraceID().IsValid())
	assert.NotEqual(t, sc.TraceID(), r1.SpanContext().TraceID(), "a new root")
	assert.NotEqual(t, r1.SpanContext().TraceID(), r2.SpanContext().TraceID(), "random trace ids")
	assert.NotEqual(t, b.SpanContext().SpanID(), r1.SpanContext().SpanID(), "random span ids")

	unsampled := remote.WithTraceFlags(0)
	_, u := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), unsampled), "u")
	assert.False(t, u.IsRecording(), "the parent is not sampled")
	assert.Equal(t, unsampled, u.SpanContext())

	a.SetAttributes(attribute.Int("n", 2), attribute.Bool("b", true))
	a.SetStatus(codes.Error, "failed")
	a.SetStatus(codes.Unset, "")
	a.RecordError(errors.New("boom"))
	a.RecordError(nil)
	a.SetName("a2")
	assert.Empty(t, p.take(), "nothing ended yet")
	b.SetStatus(codes.Ok, "ignored")
	b.SetStatus(codes.Error, "after Ok")
	b.End()
	a.End()
	a.End()
	b.SetName("after End")
	assert.False(t, a.IsRecording())
	r1.End()
	r2.End()

	spans := p.take()
	require.Len(t, spans, 4, "each ended once, in order")
	assert.Equal(t, []string{"b", "a2", "r1", "r2"}, []string{spans[0].name, spans[1].name, spans[2].name, spans[3].name})
	assert.Empty(t, p.take())
	ra, rb := spans[1], spans[0]
	assert.Equal(t, remote, ra.parent)
	assert.Equal(t, sc, rb.parent, "b's parent is a")
	assert.Equal(t, trace.SpanKindClient, ra.kind)
	assert.Equal(t, trace.SpanKindInternal, rb.kind)
	assert.Equal(t, otlpScope{Name: "scope", Version: "1.2"}, ra.tracer.scope)
	assert.Equal(t, []attribute.KeyValue{attribute.Int("n", 2), attribute.Bool("b", true)}, ra.attrs)
	assert.Equal(t, codes.Error, ra.status)
	assert.Equal(t, "failed", ra.statusMessage)
	require.Len(t, ra.events, 1)
	assert.Equal(t, "exception", ra.events[0].name)
	assert.Equal(t, []attribute.KeyValue{attribute.String("exception.type", "*errors.errorString"),
		attribute.String("exception.message", "boom")}, ra.events[0].attrs)
	assert.False(t, ra.start.IsZero())
	assert.False(t, ra.end.Before(ra.start))
	assert.Equal(t, codes.Ok, rb.status, "Ok is final")
	assert.Empty(t, rb.statusMessage)
}

// One span, encoded as OTLP/JSON has it: ids in hex, enums as integers,
// 64-bit integers as strings.
func TestOTLPJSON(t *testing.T) {
	at := func(ns int64) time.Time { return time.Unix(0, ns) }
	ts, err := trace.ParseTraceState("vendor=x")
	require.NoError(t, err)
	link := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0xab, 15: 0xcd}, SpanID: trace.SpanID{0xef, 7: 0x01}})
	tr := &recTracer{scope: otlpScope{Name: "github.com/dlock-go/dlock", Version: "0.1.0"}}
	lock := &recSpan{
		tracer: tr,
		sc: trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0x4b, 15: 0x36}, SpanID: trace.SpanID{0x0a, 7: 0xb7},
			TraceFlags: trace.FlagsSampled, TraceState: ts}),
		parent: trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0x4b, 15: 0x36}, SpanID: trace.SpanID{0x00, 7: 0x07}}),
		kind:   trace.SpanKindClient, name: "dlock.Lock",
		start: at(1700000000000000001), end: at(1700000000123456789),
		attrs: []attribute.KeyValue{attribute.String("dlock.key", "k"), attribute.Int64("dlock.token", 1<<62),
			attribute.Bool("ok", false), attribute.Float64("f", 0.5), attribute.StringSlice("s", []string{"a", ""}),
			attribute.Int64Slice("i", []int64{-1}), attribute.Float64("nan", math.NaN())},
		events: []recEvent{{name: "dlock.held", time: at(1700000000000000002), attrs: []attribute.KeyValue{attribute.Int64("dlock.holder.token", 7)}}},
		links:  []trace.Link{{SpanContext: link, Attributes: []attribute.KeyValue{attribute.String("dlock.key", "k")}}},
		status: codes.Error, statusMessage: "failed",
	}
	release := &recSpan{tracer: &recTracer{scope: otlpScope{Name: "other"}},
		sc:   trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}}),
		kind: trace.SpanKindInternal, name: "r", start: at(1), end: at(2), status: codes.Ok}
	got, err := json.Marshal(otlpRequestOf([]attribute.KeyValue{attribute.String("service.name", "dlock")}, []*recSpan{lock, release}))
	require.NoError(t, err)
	assert.JSONEq(t, `{"resourceSpans": [{
		"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "dlock"}}]},
		"scopeSpans": [
		{"scope": {"name": "github.com/dlock-go/dlock", "version": "0.1.0"}, "spans": [{
			"traceId": "4b000000000000000000000000000036",
			"spanId": "0a000000000000b7",
			"traceState": "vendor=x",
			"parentSpanId": "0000000000000007",
			"name": "dlock.Lock",
			"kind": 3,
			"startTimeUnixNano": "1700000000000000001",
			"endTimeUnixNano": "1700000000123456789",
			"attributes": [
				{"key": "dlock.key", "value": {"stringValue": "k"}},
				{"key": "dlock.token", "value": {"intValue": "4611686018427387904"}},
				{"key": "ok", "value": {"boolValue": false}},
				{"key": "f", "value": {"doubleValue": 0.5}},
				{"key": "s", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"stringValue": ""}]}}},
				{"key": "i", "value": {"arrayValue": {"values": [{"intValue": "-1"}]}}},
				{"key": "nan", "value": {"stringValue": "NaN"}}
			],
			"events": [{"timeUnixNano": "1700000000000000002", "name": "dlock.held",
				"attributes": [{"key": "dlock.holder.token", "value": {"intValue": "7"}}]}],
			"links": [{"traceId": "ab0000000000000000000000000000cd", "spanId": "ef00000000000001",
				"attributes": [{"key": "dlock.key", "value": {"stringValue": "k"}}]}],
			"status": {"code": 2, "message": "failed"}
		}]},
		{"scope": {"name": "other"}, "spans": [{
			"traceId": "01000000000000000000000000000000",
			"spanId": "0200000000000000",
			"name": "r",
			"kind": 1,
			"startTimeUnixNano": "1",
			"endTimeUnixNano": "2",
			"status": {"code": 1}
		}]}]
	}]}`, string(got))
}
