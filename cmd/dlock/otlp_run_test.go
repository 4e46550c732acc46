//go:build unix

package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
)

// A collector is an OTLP/HTTP endpoint for one test: it answers each
// request with status and keeps it.
type collector struct {
	*httptest.Server
	requests chan *exportRequest
}

// An exportRequest is a request a collector got.
type exportRequest struct {
	method, path string
	header       http.Header
	body         exported
}

// exported is the part of an OTLP/JSON ExportTraceServiceRequest that the
// tests read, decoded apart from otlp.go's types.
type exported struct {
	ResourceSpans []struct {
		Resource struct {
			Attributes []testKeyValue `json:"attributes"`
		} `json:"resource"`
		ScopeSpans []struct {
			Scope struct {
				Name    string `json:"name"`
				Version string `json:"version"`
			} `json:"scope"`
			Spans []exportedSpan `json:"spans"`
		} `json:"scopeSpans"`
	} `json:"resourceSpans"`
}

type exportedSpan struct {
	TraceID      string         `json:"traceId"`
	SpanID       string         `json:"spanId"`
	ParentSpanID string         `json:"parentSpanId"`
	TraceState   string         `json:"traceState"`
	Name         string         `json:"name"`
	Kind         int            `json:"kind"`
	Start        string         `json:"startTimeUnixNano"`
	End          string         `json:"endTimeUnixNano"`
	Attributes   []testKeyValue `json:"attributes"`
	Events       []struct {
		Name       string         `json:"name"`
		Attributes []testKeyValue `json:"attributes"`
	} `json:"events"`
	Links []struct {
		TraceID    string         `json:"traceId"`
		SpanID     string         `json:"spanId"`
		Attributes []testKeyValue `json:"attributes"`
	} `json:"links"`
}

type testKeyValue struct {
	Key   string         `json:"key"`
	Value map[string]any `json:"value"` // {"stringValue": "k"}
}

// attrs returns kvs as a map from key to value, as JSON has it.
func attrs(kvs []testKeyValue) map[string]map[string]any {
	m := map[string]map[string]any{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func newCollector(t *testing.T, status int) *collector {
	c := &collector{requests: make(chan *exportRequest, 10)}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := &exportRequest{method: r.Method, path: r.URL.Path, header: r.Header}
		body, err := io.ReadAll(r.Body)
		assert.NoError(t, err)
		assert.NoError(t, json.Unmarshal(body, &req.body), "body: %s", body)
		c.requests <- req
		w.WriteHeader(status)
	}))
	t.Cleanup(c.Close)
	return c
}

// one returns the one request c got, failing the test if it got another
// number of them. Call it after dlock exited.
func (c *collector) one(t *testing.T) *exportRequest {
	t.Helper()
	require.Len(t, c.requests, 1, "export requests")
	return <-c.requests
}

// spans returns the spans of r, each with its scope's name, and checks
// its resource.
func (r *exportRequest) spans(t *testing.T) map[string]exportedSpan {
	t.Helper()
	require.Len(t, r.body.ResourceSpans, 1)
	rs := r.body.ResourceSpans[0]
	assert.Equal(t, map[string]map[string]any{"service.name": {"stringValue": "dlock"}, "ci.job": {"stringValue": "42"}},
		attrs(rs.Resource.Attributes))
	spans := map[string]exportedSpan{} // by span id
	for _, ss := range rs.ScopeSpans {
		assert.Equal(t, "github.com/dlock-go/dlock", ss.Scope.Name)
		assert.NotEmpty(t, ss.Scope.Version)
		for _, s := range ss.Spans {
			spans[s.SpanID] = s
		}
	}
	return spans
}

// A run or elect with OTEL_EXPORTER_OTLP_ENDPOINT set exports its spans
// in one request at exit: the Lock span, child of TRACEPARENT, is the
// span the hold names; the Release span is in the job's trace too. A run
// that fails (-try on a held key) exports its TryLock span, which names
// the holder and links to its trace.
func TestRunExportsTraces(t *testing.T) {
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		spanID  = "00f067aa0ba902b7"
		parent  = "00-" + traceID + "-" + spanID + "-01"
	)
	coll := collection(t)
	// exportTo returns the environment of a run in a traced job that
	// exports to col.
	exportTo := func(col *collector) []string {
		return []string{"TRACEPARENT=" + parent, "TRACESTATE=vendor=opaque",
			"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.URL + "/",
			"OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20secret,x-team=ci",
			"OTEL_RESOURCE_ATTRIBUTES=ci.job=42"}
	}
	status := func(key string) []string {
		return []string{"sh", "-c", `exec "$@"`, "sh", binary, "status", "-uri", testURI, "-db", testDB, "-collection", coll, "-json", key}
	}
	for _, tc := range []struct {
		name     string
		key      string
		args     []string // then COMMAND, which runs dlock status -json key
		env      []string // added to env
		span     string
		wantWarn string // on stderr
	}{
		{name: "run", key: "k", args: runArgs(coll, "k", "--"), span: "dlock.TryLock"},
		{name: "elect", key: "leader", args: electArgs(coll, "leader", "db1", "--"), span: "dlock.Campaign",
			env:      []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc"},
			wantWarn: `dlock elect: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is "grpc", but dlock sends traces as http/json`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			col := newCollector(t, http.StatusOK)
			code, stdout, stderr := dlockRun(t, append(exportTo(col), tc.env...), append(tc.args, status(tc.key)...)...)
			require.Equal(t, 0, code, "stderr: %q", stderr)
			if tc.wantWarn == "" {
				assert.Empty(t, stderr)
			} else {
				requireOneLine(t, stderr, tc.wantWarn)
			}
			var report statusReport
			require.NoError(t, json.Unmarshal([]byte(strings.Join(stdout, "\n")), &report))
			require.Len(t, report.Holders, 1)
			hold := report.Holders[0]
			assert.Equal(t, traceID, hold.TraceID, "the hold's trace")

			req := col.one(t)
			assert.Equal(t, "POST", req.method)
			assert.Equal(t, "/v1/traces", req.path)
			assert.Equal(t, "application/json", req.header.Get("Content-Type"))
			assert.Equal(t, "Bearer secret", req.header.Get("Authorization"))
			assert.Equal(t, "ci", req.header.Get("X-Team"))
			spans := req.spans(t)
			lock, ok := spans[hold.SpanID]
			require.True(t, ok, "no span %s, the hold's, in %v", hold.SpanID, spans)
			assert.Equal(t, tc.span, lock.Name)
			assert.Equal(t, traceID, lock.TraceID)
			assert.Equal(t, spanID, lock.ParentSpanID)
			assert.Equal(t, "vendor=opaque", lock.TraceState)
			assert.Equal(t, 3, lock.Kind, "CLIENT")
			assert.Equal(t, map[string]any{"stringValue": tc.key}, attrs(lock.Attributes)["dlock.key"])
			assert.Equal(t, map[string]any{"stringValue": "acquired"}, attrs(lock.Attributes)["dlock.outcome"])
			start, err := strconv.ParseInt(lock.Start, 10, 64)
			require.NoError(t, err)
			end, err := strconv.ParseInt(lock.End, 10, 64)
			require.NoError(t, err)
			assert.Positive(t, start)
			assert.LessOrEqual(t, start, end)
			var release []exportedSpan
			for _, s := range spans {
				if s.Name == "dlock.Release" {
					release = append(release, s)
				}
			}
			require.Len(t, release, 1, "spans: %v", spans)
			assert.Equal(t, traceID, release[0].TraceID)
			assert.Equal(t, spanID, release[0].ParentSpanID)
		})
	}

	t.Run("-try, held", func(t *testing.T) {
		holderTrace := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
		other := newClient(t, coll)
		require.NoError(t, other.NewMutex("held").Lock(trace.ContextWithRemoteSpanContext(context.Background(), holderTrace)))
		col := newCollector(t, http.StatusOK)
		code, _, stderr := dlockRun(t, exportTo(col), runArgs(coll, "-try", "held", "--", "true")...)
		require.Equal(t, exitHeld, code, "stderr: %q", stderr)
		spans := col.one(t).spans(t)
		require.Len(t, spans, 1)
		for _, s := range spans {
			assert.Equal(t, "dlock.TryLock", s.Name)
			assert.Equal(t, traceID, s.TraceID)
			assert.Equal(t, map[string]any{"stringValue": "locked"}, attrs(s.Attributes)["dlock.outcome"])
			require.Len(t, s.Events, 1)
			assert.Equal(t, "dlock.held", s.Events[0].Name)
			assert.Equal(t, map[string]any{"stringValue": other.Owner()}, attrs(s.Events[0].Attributes)["dlock.holder.owner"])
			require.Len(t, s.Links, 1)
			assert.Equal(t, holderTrace.TraceID().String(), s.Links[0].TraceID)
			assert.Equal(t, holderTrace.SpanID().String(), s.Links[0].SpanID)
			assert.Equal(t, map[string]any{"intValue": "1"}, attrs(s.Links[0].Attributes)["dlock.holder.token"])
		}
	})
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
	col := newCollector(t, http.StatusOK)
	for _, tc := range []struct {
		name  string
		flags string // TRACEPARENT's
		env   []string
	}{
		{name: "no endpoint", flags: "01", env: []string{"OTEL_EXPORTER_OTLP_HEADERS=a=1", "OTEL_SERVICE_NAME=ci"}},
		{name: "exporter none", flags: "01", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.URL, "OTEL_TRACES_EXPORTER=none"}},
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
			assert.Empty(t, col.requests, "export requests")
		})
	}
}

// An export that fails (refused, answered with an error, or not answered
// within OTEL_EXPORTER_OTLP_TIMEOUT) is one warning line, and the run
// exits with COMMAND's status.
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
	for _, tc := range []struct {
		name, endpoint, want string
	}{
		{name: "refused", endpoint: refused, want: "connection refused"},
		{name: "error status", endpoint: newCollector(t, http.StatusServiceUnavailable).URL, want: "503 Service Unavailable"},
		{name: "timeout", endpoint: slow.URL, want: "deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + tc.endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT=300"}
			code, _, stderr := dlockRun(t, env, runArgs(coll, "k", "--", "sh", "-c", "exit 3")...)
			assert.Equal(t, 3, code, "COMMAND's status")
			requireOneLine(t, stderr, "dlock run: traces not exported: ")
			assert.Contains(t, stderr[0], tc.want)
		})
	}
}
