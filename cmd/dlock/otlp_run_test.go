//go:build unix

package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// These tests run dlock with the SDK's variables in its environment, and
// check what the collector (collector_test.go) got.

// The trace context of the job the runs of these tests are in.
const (
	runTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	runSpanID  = "00f067aa0ba902b7"
	runParent  = "00-" + runTraceID + "-" + runSpanID + "-01"
)

// exportTo returns the environment of a run in a traced job that exports
// to col.
func exportTo(col *collector) []string {
	return []string{"TRACEPARENT=" + runParent, "TRACESTATE=vendor=opaque",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.URL + "/",
		"OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20secret,x-team=ci",
		"OTEL_RESOURCE_ATTRIBUTES=ci.job=42"}
}

// A run or elect with OTEL_EXPORTER_OTLP_ENDPOINT set exports its spans
// as it exits: the Lock span, child of TRACEPARENT, is the span the hold
// names; the Release span is in the job's trace too. A run exports over
// OTLP/HTTP (protobuf), an elect here over gRPC.
func TestRunExportsTraces(t *testing.T) {
	coll := collection(t)
	status := func(key string) []string {
		return []string{"sh", "-c", `exec "$@"`, "sh", binary, "status", "-uri", testURI, "-db", testDB, "-collection", coll, "-json", key}
	}
	for _, tc := range []struct {
		name        string
		key         string
		args        []string // then COMMAND, which runs dlock status -json key
		collector   func(t *testing.T, status func(int) int) *collector
		env         []string // added to env
		span        string
		contentType string // of the requests
	}{
		{name: "run", key: "k", args: runArgs(coll, "k", "--"), span: "dlock.TryLock",
			collector: newCollector, contentType: "application/x-protobuf"},
		{name: "elect", key: "leader", args: electArgs(coll, "leader", "db1", "--"), span: "dlock.Campaign",
			collector: newGRPCCollector, env: []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc"}, contentType: "application/grpc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			col := tc.collector(t, nil)
			code, stdout, stderr := dlockRun(t, append(exportTo(col), tc.env...), append(tc.args, status(tc.key)...)...)
			require.Equal(t, 0, code, "stderr: %q", stderr)
			assert.Empty(t, stderr)
			var report statusReport
			require.NoError(t, json.Unmarshal([]byte(strings.Join(stdout, "\n")), &report))
			require.Len(t, report.Holders, 1)
			hold := report.Holders[0]
			assert.Equal(t, runTraceID, hold.TraceID, "the hold's trace")

			require.NotEmpty(t, col.all(), "export requests")
			for _, req := range col.all() {
				assert.Equal(t, tc.contentType, req.header.Get("Content-Type"))
				assert.Equal(t, "Bearer secret", req.header.Get("Authorization"))
				assert.Equal(t, "ci", req.header.Get("X-Team"))
			}
			checkRunSpans(t, col.spans(t), hold, tc.span, tc.key)
		})
	}
}

// checkRunSpans checks the spans of a run that held key: the span that
// hold names, called name, and the Release span.
func checkRunSpans(t *testing.T, spans map[string]exportedSpan, hold statusHolder, name, key string) {
	t.Helper()
	lock, ok := spans[hold.SpanID]
	require.True(t, ok, "no span %s, the hold's, in %v", hold.SpanID, spans)
	assertResource(t, lock, "dlock", map[string]string{"ci.job": "42"})
	assert.Equal(t, "github.com/dlock-go/dlock", lock.scope.GetName())
	assert.NotEmpty(t, lock.scope.GetVersion())
	assert.Equal(t, name, lock.Name)
	assert.Equal(t, runTraceID, hex.EncodeToString(lock.TraceId))
	assert.Equal(t, runSpanID, hex.EncodeToString(lock.ParentSpanId))
	assert.Equal(t, "vendor=opaque", lock.TraceState)
	assert.Equal(t, tracepb.Span_SPAN_KIND_CLIENT, lock.Kind)
	assert.Equal(t, key, attrs(lock.Attributes)["dlock.key"].GetStringValue())
	assert.Equal(t, "acquired", attrs(lock.Attributes)["dlock.outcome"].GetStringValue())
	assert.Positive(t, lock.StartTimeUnixNano)
	assert.LessOrEqual(t, lock.StartTimeUnixNano, lock.EndTimeUnixNano)
	release := named(spans, "dlock.Release")
	require.Len(t, release, 1, "spans: %v", spans)
	assert.Equal(t, runTraceID, hex.EncodeToString(release[0].TraceId))
	assert.Equal(t, runSpanID, hex.EncodeToString(release[0].ParentSpanId))
}

// A run that fails (-try on a held key) exports its TryLock span, which
// names the holder and links to its trace.
func TestRunExportsHeldTryLock(t *testing.T) {
	coll := collection(t)
	holderTrace := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	other := newClient(t, coll)
	require.NoError(t, other.NewMutex("held").Lock(trace.ContextWithRemoteSpanContext(context.Background(), holderTrace)))
	col := newCollector(t, nil)
	code, _, stderr := dlockRun(t, exportTo(col), runArgs(coll, "-try", "held", "--", "true")...)
	require.Equal(t, exitHeld, code, "stderr: %q", stderr)
	spans := col.spans(t)
	require.Len(t, spans, 1)
	for _, s := range spans {
		assert.Equal(t, "dlock.TryLock", s.Name)
		assert.Equal(t, runTraceID, hex.EncodeToString(s.TraceId))
		assert.Equal(t, "locked", attrs(s.Attributes)["dlock.outcome"].GetStringValue())
		require.Len(t, s.Events, 1)
		assert.Equal(t, "dlock.held", s.Events[0].Name)
		assert.Equal(t, other.Owner(), attrs(s.Events[0].Attributes)["dlock.holder.owner"].GetStringValue())
		require.Len(t, s.Links, 1)
		assert.Equal(t, holderTrace.TraceID().String(), hex.EncodeToString(s.Links[0].TraceId))
		assert.Equal(t, holderTrace.SpanID().String(), hex.EncodeToString(s.Links[0].SpanId))
		assert.Equal(t, int64(1), attrs(s.Links[0].Attributes)["dlock.holder.token"].GetIntValue())
	}
}

// With OTEL_TRACES_EXPORTER=console, run writes its spans to stderr, one
// JSON object a line, sends nothing, and leaves stdout to COMMAND.
func TestRunConsoleExport(t *testing.T) {
	coll := collection(t)
	col := newCollector(t, nil)
	env := []string{"OTEL_TRACES_EXPORTER=console", "OTEL_EXPORTER_OTLP_ENDPOINT=" + col.URL}
	code, stdout, stderr := dlockRun(t, env, runArgs(coll, "k", "--", "echo", "from COMMAND")...)
	require.Equal(t, 0, code, "stderr: %q", stderr)
	assert.Equal(t, []string{"from COMMAND"}, stdout)
	var names []string
	for _, line := range stderr {
		var span struct{ Name string }
		require.NoError(t, json.Unmarshal([]byte(line), &span), "stderr: %q", line)
		names = append(names, span.Name)
	}
	assert.ElementsMatch(t, []string{"dlock.TryLock", "dlock.Release"}, names)
	assert.Empty(t, col.all(), "export requests")
}

// Without an endpoint, or with OTEL_TRACES_EXPORTER=none, run sends
// nothing and sets up no tracer: the hold stores TRACEPARENT itself, as
// when nothing records the Lock span. Nor does it record, nor send, a
// span of a job whose TRACEPARENT is not sampled.
func TestRunNoExport(t *testing.T) {
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
	)
	coll := collection(t)
	col := newCollector(t, nil)
	for _, tc := range []struct {
		name  string
		flags string // TRACEPARENT's
		env   []string
	}{
		{name: "no endpoint", flags: "01", env: []string{"OTEL_EXPORTER_OTLP_HEADERS=a=1", "OTEL_SERVICE_NAME=ci"}},
		{name: "exporter none", flags: "01", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.URL, "OTEL_TRACES_EXPORTER=none"}},
		{name: "SDK disabled", flags: "01", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.URL, "OTEL_SDK_DISABLED=true"}},
		{name: "not sampled", flags: "00", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.URL}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := append([]string{"TRACEPARENT=00-" + traceID + "-" + spanID + "-" + tc.flags}, tc.env...)
			code, stdout, stderr := dlockRun(t, env, runArgs(coll, "k", "--", binary, "status", "-uri", testURI, "-db", testDB, "-collection", coll, "-json", "k")...)
			require.Equal(t, 0, code, "stderr: %q", stderr)
			assert.Empty(t, stderr)
			var report statusReport
			require.NoError(t, json.Unmarshal([]byte(strings.Join(stdout, "\n")), &report))
			require.Len(t, report.Holders, 1)
			assert.Equal(t, traceID, report.Holders[0].TraceID)
			assert.Equal(t, spanID, report.Holders[0].SpanID, "the job's span: no Lock span recorded")
			assert.Empty(t, col.all(), "export requests")
		})
	}
}

// An export that fails (refused, answered with an error, unavailable until
// the timeout, or not answered within OTEL_EXPORTER_OTLP_TIMEOUT) is one
// warning line, and the run exits with COMMAND's status.
func TestRunExportFails(t *testing.T) {
	coll := collection(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := "http://" + l.Addr().String()
	l.Close()
	unanswered := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-unanswered }))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(unanswered) }) // before slow.Close, which waits for its handlers
	always := func(code int) func(int) int { return func(int) int { return code } }
	for _, tc := range []struct {
		name, endpoint, want string
	}{
		{name: "refused", endpoint: refused, want: "connection refused"},
		{name: "error status", endpoint: newCollector(t, always(http.StatusBadRequest)).URL, want: "400 Bad Request"},
		{name: "unavailable", endpoint: newCollector(t, always(http.StatusServiceUnavailable)).URL, want: "collector says Service Unavailable"},
		{name: "timeout", endpoint: slow.URL, want: "export timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + tc.endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT=1000"}
			code, _, stderr := dlockRun(t, env, runArgs(coll, "k", "--", "sh", "-c", "exit 3")...)
			assert.Equal(t, 3, code, "COMMAND's status")
			requireOneLine(t, stderr, "dlock run: traces not exported: ")
			assert.Contains(t, stderr[0], tc.want)
		})
	}
}
