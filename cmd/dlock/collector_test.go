//go:build unix

package main

import (
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/hex"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// A collector is an OTLP endpoint for one test, over HTTP or gRPC: it
// keeps each export request it gets, decoded, and answers it as status
// says.
type collector struct {
	URL string // for OTEL_EXPORTER_OTLP_ENDPOINT

	// status is the HTTP status of the nth request (from 1), or, over
	// gRPC, 503 for codes.Unavailable; nil for 200 (OK) to all.
	status func(n int) int

	mu       sync.Mutex
	requests []*exportRequest // guarded by mu
}

// An exportRequest is a request a collector got.
type exportRequest struct {
	method, path string      // HTTP's; gRPC: "grpc" and the RPC's method
	header       http.Header // HTTP's headers, or gRPC's metadata (with canonical keys)
	tls          *tls.ConnectionState
	raw          []byte                                // the HTTP body, decompressed
	body         *coltracepb.ExportTraceServiceRequest // decoded; nil for JSON
}

// newCollector returns an OTLP/HTTP collector on plain HTTP.
func newCollector(t *testing.T, status func(n int) int) *collector {
	c := &collector{status: status}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

// newTLSCollector returns an OTLP/HTTP collector on HTTPS, with its
// certificate and configured by config (nil for httptest's default), and
// the server, whose certificate tests name as the CA.
func newTLSCollector(t *testing.T, config func(*tls.Config)) (*collector, *httptest.Server) {
	c := &collector{}
	srv := httptest.NewUnstartedServer(c)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes that tests make fail
	if config != nil {
		srv.TLS = &tls.Config{}
		config(srv.TLS)
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c.URL = srv.URL
	return c, srv
}

// ServeHTTP keeps the request, and answers it.
func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req := &exportRequest{method: r.Method, path: r.URL.Path, header: r.Header, tls: r.TLS}
	body := io.Reader(r.Body)
	if r.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = gz
	}
	req.raw, _ = io.ReadAll(body)
	if r.Header.Get("Content-Type") == "application/x-protobuf" {
		req.body = &coltracepb.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(req.raw, req.body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	n := c.keep(req)
	code := http.StatusOK
	if c.status != nil {
		code = c.status(n)
	}
	if code != http.StatusOK {
		http.Error(w, "collector says "+http.StatusText(code), code)
		return
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Write(out)
}

// keep adds req to the requests, and returns how many there are.
func (c *collector) keep(req *exportRequest) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests = append(c.requests, req)
	return len(c.requests)
}

// all returns the requests that c got so far.
func (c *collector) all() []*exportRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*exportRequest(nil), c.requests...)
}

// A grpcCollector is a collector's gRPC service.
type grpcCollector struct {
	coltracepb.UnimplementedTraceServiceServer
	c *collector
}

// newGRPCCollector returns an OTLP/gRPC collector, without TLS.
func newGRPCCollector(t *testing.T, status func(n int) int) *collector {
	c := &collector{status: status}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, &grpcCollector{c: c})
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	c.URL = "http://" + l.Addr().String()
	return c
}

// Export keeps the request, and answers it.
func (g *grpcCollector) Export(ctx context.Context, body *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	header := http.Header{}
	for k, vs := range md {
		for _, v := range vs {
			header.Add(k, v)
		}
	}
	method, _ := grpc.Method(ctx)
	n := g.c.keep(&exportRequest{method: "grpc", path: method, header: header, body: body})
	if g.c.status != nil && g.c.status(n) != http.StatusOK {
		return nil, status.Error(codes.Unavailable, "collector busy")
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// An exportedSpan is a span that a collector got, with its resource's
// attributes and its scope.
type exportedSpan struct {
	*tracepb.Span
	resource map[string]*commonpb.AnyValue
	scope    *commonpb.InstrumentationScope
}

// spans returns the spans of every request c got, by their span id in hex.
// Each request must be protobuf.
func (c *collector) spans(t *testing.T) map[string]exportedSpan {
	t.Helper()
	spans := map[string]exportedSpan{}
	for _, req := range c.all() {
		require.NotNil(t, req.body, "a protobuf request")
		for _, rs := range req.body.ResourceSpans {
			res := attrs(rs.GetResource().GetAttributes())
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					spans[hex.EncodeToString(s.SpanId)] = exportedSpan{Span: s, resource: res, scope: ss.Scope}
				}
			}
		}
	}
	return spans
}

// named returns the spans called name.
func named(spans map[string]exportedSpan, name string) []exportedSpan {
	var out []exportedSpan
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// attrs returns kvs as a map from key to value.
func attrs(kvs []*commonpb.KeyValue) map[string]*commonpb.AnyValue {
	m := map[string]*commonpb.AnyValue{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

// assertResource checks that s comes from dlock's resource, with the
// attributes of OTEL_RESOURCE_ATTRIBUTES in want, and from the dlock
// library's instrumentation scope.
func assertResource(t *testing.T, s exportedSpan, service string, want map[string]string) {
	t.Helper()
	assert.Equal(t, service, s.resource["service.name"].GetStringValue(), "service.name")
	assert.Equal(t, "go", s.resource["telemetry.sdk.language"].GetStringValue(), "the SDK's attributes")
	for k, v := range want {
		assert.Equal(t, v, s.resource[k].GetStringValue(), "resource attribute %s", k)
	}
}
