//go:build unix

package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// These tests set the export up in this process, as run does (newTraces),
// with the SDK's variables in the environment, export one span to a
// collector of the test's, and check what the collector got.

// The job's trace context, the parent of the span exported.
var (
	jobTrace = trace.TraceID{0x4b, 0xf9, 15: 0x36}
	jobSpan  = trace.SpanID{0x00, 0xf0, 7: 0xb7}
)

// exportEnv sets the test's environment to env alone, among the OTEL_
// variables: it clears those this process has (a traced CI job may set
// some).
func exportEnv(t *testing.T, env map[string]string) {
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "OTEL_") {
			t.Setenv(name, "")
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// A syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written.
func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// exportOne does what a run does with env in its environment: it sets up
// the export (newTraces), records a span as the dlock library records a
// Lock span (a CLIENT span of its scope, child of the job's span), and
// flushes the export. It returns the span's context and what went to
// stderr.
func exportOne(t *testing.T, env map[string]string) (trace.SpanContext, string) {
	t.Helper()
	exportEnv(t, env)
	var stderr syncBuffer
	tr := newTraces(context.Background(), "run", &stderr)
	require.NotNil(t, tr, "no export set up; stderr: %s", stderr.String())
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: jobTrace, SpanID: jobSpan, TraceFlags: trace.FlagsSampled, Remote: true})
	_, span := tr.provider.Tracer("github.com/dlock-go/dlock", trace.WithInstrumentationVersion("0.1.0")).Start(
		trace.ContextWithRemoteSpanContext(context.Background(), parent), "dlock.Lock",
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attribute.String("dlock.key", "k")))
	span.End()
	tr.flush()
	return span.SpanContext(), stderr.String()
}

// requireSpan checks that c got the span sc, as exportOne records it.
func requireSpan(t *testing.T, c *collector, sc trace.SpanContext) exportedSpan {
	t.Helper()
	spans := c.spans(t)
	s, ok := spans[sc.SpanID().String()]
	require.True(t, ok, "span %s not exported; got %v", sc.SpanID(), spans)
	assert.Equal(t, "dlock.Lock", s.Name)
	assert.Equal(t, tracepb.Span_SPAN_KIND_CLIENT, s.Kind)
	assert.Equal(t, jobTrace[:], s.TraceId)
	assert.Equal(t, jobSpan[:], s.ParentSpanId)
	assert.Equal(t, "k", attrs(s.Attributes)["dlock.key"].GetStringValue())
	assert.Equal(t, "github.com/dlock-go/dlock", s.scope.GetName())
	assert.Equal(t, "0.1.0", s.scope.GetVersion())
	return s
}

// OTLP/HTTP: where the request goes, its encoding and headers, and the
// resource, as the variables say.
func TestExportOTLPHTTP(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   func(url string) map[string]string
		check func(t *testing.T, req *exportRequest, s exportedSpan)
	}{
		{name: "protobuf, headers, resource", env: func(url string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": url + "/otlp/",
				"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20secret, x-team = ci", "OTEL_RESOURCE_ATTRIBUTES": "ci.job=42"}
		}, check: func(t *testing.T, req *exportRequest, s exportedSpan) {
			assert.Equal(t, "POST", req.method)
			assert.Equal(t, "/otlp/v1/traces", req.path)
			assert.Equal(t, "application/x-protobuf", req.header.Get("Content-Type"))
			assert.Empty(t, req.header.Get("Content-Encoding"))
			assert.Regexp(t, `^OTel OTLP Exporter Go/\d`, req.header.Get("User-Agent"))
			assert.Equal(t, "Bearer secret", req.header.Get("Authorization"))
			assert.Equal(t, "ci", req.header.Get("X-Team"))
			assertResource(t, s, "dlock", map[string]string{"ci.job": "42"})
		}},
		{name: "traces endpoint as is, traces headers win", env: func(url string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url + "/x/",
				"OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "b=2"}
		}, check: func(t *testing.T, req *exportRequest, s exportedSpan) {
			assert.Equal(t, "/x/", req.path)
			assert.Equal(t, "2", req.header.Get("B"))
			assert.Empty(t, req.header.Get("A"))
		}},
		{name: "service name wins", env: func(url string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": url,
				"OTEL_RESOURCE_ATTRIBUTES": "service.name=builder,team=a%20b", "OTEL_SERVICE_NAME": "ci"}
		}, check: func(t *testing.T, req *exportRequest, s exportedSpan) {
			assertResource(t, s, "ci", map[string]string{"team": "a b"})
		}},
		{name: "gzip", env: func(url string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
		}, check: func(t *testing.T, req *exportRequest, s exportedSpan) {
			assert.Equal(t, "gzip", req.header.Get("Content-Encoding"))
		}},
		{name: "traces gzip", env: func(url string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip"}
		}, check: func(t *testing.T, req *exportRequest, s exportedSpan) {
			assert.Equal(t, "gzip", req.header.Get("Content-Encoding"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCollector(t, nil)
			sc, stderr := exportOne(t, tc.env(c.URL))
			assert.Empty(t, stderr)
			s := requireSpan(t, c, sc)
			require.Len(t, c.all(), 1)
			tc.check(t, c.all()[0], s)
		})
	}
}

// With OTEL_EXPORTER_OTLP_PROTOCOL=http/json, the span goes as OTLP/JSON,
// ids in hex.
func TestExportHTTPJSON(t *testing.T) {
	c := newCollector(t, nil)
	sc, stderr := exportOne(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": c.URL, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
	assert.Empty(t, stderr)
	reqs := c.all()
	require.Len(t, reqs, 1)
	assert.Equal(t, "application/json", reqs[0].header.Get("Content-Type"))
	var body struct {
		ResourceSpans []struct {
			ScopeSpans []struct {
				Spans []struct{ TraceID, SpanID, ParentSpanID, Name string }
			}
		}
	}
	require.NoError(t, json.Unmarshal(reqs[0].raw, &body), "body: %s", reqs[0].raw)
	require.Len(t, body.ResourceSpans, 1)
	require.Len(t, body.ResourceSpans[0].ScopeSpans, 1)
	require.Len(t, body.ResourceSpans[0].ScopeSpans[0].Spans, 1)
	s := body.ResourceSpans[0].ScopeSpans[0].Spans[0]
	assert.Equal(t, "dlock.Lock", s.Name)
	// In hex, of either case as the specification allows (the SDK's is upper).
	assert.Equal(t, hex.EncodeToString(jobTrace[:]), strings.ToLower(s.TraceID))
	assert.Equal(t, sc.SpanID().String(), strings.ToLower(s.SpanID))
	assert.Equal(t, jobSpan.String(), strings.ToLower(s.ParentSpanID))
}

// writePEM writes blocks to a new file of the test's, and returns its path.
func writePEM(t *testing.T, name string, blocks ...*pem.Block) string {
	var b bytes.Buffer
	for _, block := range blocks {
		require.NoError(t, pem.Encode(&b, block))
	}
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o600))
	return path
}

// clientCert makes a self-signed client certificate, and returns it and
// the files of it and its key, in PEM.
func clientCert(t *testing.T) (cert *x509.Certificate, certFile, keyFile string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dlock-test-client"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err = x509.ParseCertificate(der)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return cert, writePEM(t, "client.pem", &pem.Block{Type: "CERTIFICATE", Bytes: der}),
		writePEM(t, "client-key.pem", &pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

// OTLP/HTTP over TLS: a collector whose certificate a private CA signed
// (OTEL_EXPORTER_OTLP_CERTIFICATE), and one that asks for the client's
// (OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and _CLIENT_KEY); and the
// _TRACES_ variants. Without them, the export fails, with a warning.
func TestExportTLS(t *testing.T) {
	client, certFile, keyFile := clientCert(t)
	clients := x509.NewCertPool()
	clients.AddCert(client)
	mutual := func(c *tls.Config) { c.ClientAuth, c.ClientCAs = tls.RequireAndVerifyClientCert, clients }
	for _, tc := range []struct {
		name     string
		config   func(*tls.Config) // the collector's
		env      func(ca string) map[string]string
		wantPeer bool   // the collector saw the client's certificate
		wantWarn string // the export failed, with this warning
	}{
		{name: "private CA", env: func(ca string) map[string]string { return map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": ca} }},
		{name: "traces CA", env: func(ca string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": ca}
		}},
		{name: "unknown CA", env: func(string) map[string]string { return nil },
			wantWarn: "dlock run: traces not exported: "},
		{name: "mutual", config: mutual, wantPeer: true, env: func(ca string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": ca,
				"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": certFile, "OTEL_EXPORTER_OTLP_CLIENT_KEY": keyFile}
		}},
		{name: "traces mutual", config: mutual, wantPeer: true, env: func(ca string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": ca,
				"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": certFile, "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": keyFile}
		}},
		{name: "mutual without the client's certificate", config: mutual,
			env:      func(ca string) map[string]string { return map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": ca} },
			wantWarn: "dlock run: traces not exported: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, srv := newTLSCollector(t, tc.config)
			ca := writePEM(t, "ca.pem", &pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
			env := tc.env(ca)
			if env == nil {
				env = map[string]string{}
			}
			env["OTEL_EXPORTER_OTLP_ENDPOINT"] = c.URL
			sc, stderr := exportOne(t, env)
			if tc.wantWarn != "" {
				assert.True(t, strings.HasPrefix(stderr, tc.wantWarn), "stderr: %q", stderr)
				assert.Empty(t, c.all(), "requests")
				return
			}
			assert.Empty(t, stderr)
			requireSpan(t, c, sc)
			req := c.all()[0]
			require.NotNil(t, req.tls, "over TLS")
			if tc.wantPeer {
				require.NotEmpty(t, req.tls.PeerCertificates)
				assert.Equal(t, "dlock-test-client", req.tls.PeerCertificates[0].Subject.CommonName)
			}
		})
	}
}

// A collector that answers 429, 502, 503 or 504 gets the request again,
// soon enough for run's wait at exit; one that answers 400 does not.
func TestExportRetries(t *testing.T) {
	for _, code := range []int{http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			c := newCollector(t, func(n int) int { return map[bool]int{true: code, false: http.StatusOK}[n == 1] })
			sc, stderr := exportOne(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": c.URL})
			assert.Empty(t, stderr)
			assert.Len(t, c.all(), 2, "requests")
			requireSpan(t, c, sc)
		})
	}
	t.Run("Bad Request", func(t *testing.T) {
		c := newCollector(t, func(int) int { return http.StatusBadRequest })
		_, stderr := exportOne(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": c.URL})
		assert.Regexp(t, `^dlock run: traces not exported: .*400 Bad Request.*\n$`, stderr)
		assert.Len(t, c.all(), 1, "requests")
	})
}

// OTLP/gRPC, chosen by OTEL_EXPORTER_OTLP_PROTOCOL (or _TRACES_PROTOCOL):
// with the headers as metadata, and a retry when the collector is
// unavailable.
func TestExportGRPC(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{name: "protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}},
		{name: "traces protocol wins", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := tc.env
			c := newGRPCCollector(t, func(n int) int {
				return map[bool]int{true: http.StatusServiceUnavailable, false: http.StatusOK}[n == 1]
			})
			env["OTEL_EXPORTER_OTLP_ENDPOINT"] = c.URL
			env["OTEL_EXPORTER_OTLP_HEADERS"] = "authorization=Bearer%20secret"
			env["OTEL_RESOURCE_ATTRIBUTES"] = "ci.job=42"
			sc, stderr := exportOne(t, env)
			assert.Empty(t, stderr)
			s := requireSpan(t, c, sc)
			assertResource(t, s, "dlock", map[string]string{"ci.job": "42"})
			reqs := c.all()
			require.Len(t, reqs, 2, "requests: one unavailable, then one OK")
			assert.Equal(t, "/opentelemetry.proto.collector.trace.v1.TraceService/Export", reqs[1].path)
			assert.Equal(t, "Bearer secret", reqs[1].header.Get("Authorization"))
			assert.Contains(t, reqs[1].header.Get("User-Agent"), "OTel OTLP Exporter Go/")
		})
	}
}

// OTEL_TRACES_EXPORTER=console writes the spans to stderr, and sends
// nothing; with otlp too, it does both.
func TestExportConsole(t *testing.T) {
	for _, tc := range []struct {
		exporters    string
		wantRequests int
	}{{"console", 0}, {"otlp, console", 1}} {
		t.Run(tc.exporters, func(t *testing.T) {
			c := newCollector(t, nil)
			sc, stderr := exportOne(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": c.URL, "OTEL_TRACES_EXPORTER": tc.exporters})
			var span struct {
				Name        string
				SpanContext struct{ TraceID, SpanID string }
				Parent      struct{ SpanID string }
			}
			require.NoError(t, json.Unmarshal([]byte(stderr), &span), "stderr: %s", stderr)
			assert.Equal(t, "dlock.Lock", span.Name)
			assert.Equal(t, sc.TraceID().String(), span.SpanContext.TraceID)
			assert.Equal(t, sc.SpanID().String(), span.SpanContext.SpanID)
			assert.Equal(t, jobSpan.String(), span.Parent.SpanID)
			assert.Len(t, c.all(), tc.wantRequests, "requests")
		})
	}
}

// Without an endpoint, or with OTEL_TRACES_EXPORTER=none, or the SDK
// disabled, run sets no export up, and says nothing.
func TestExportNone(t *testing.T) {
	const endpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{name: "nothing set"},
		{name: "headers without an endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_SERVICE_NAME": "ci"}},
		{name: "exporter none", env: map[string]string{endpoint: "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}},
		{name: "exporter none, listed", env: map[string]string{endpoint: "http://c:4318", "OTEL_TRACES_EXPORTER": " none , "}},
		{name: "SDK disabled", env: map[string]string{endpoint: "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}},
		{name: "SDK disabled, console", env: map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exportEnv(t, tc.env)
			var stderr syncBuffer
			assert.Nil(t, newTraces(context.Background(), "run", &stderr))
			assert.Empty(t, stderr.String())
		})
	}
}

// Settings run or the exporter cannot use are one warning each, which
// never quotes a header's value; the export goes on without them.
func TestExportWarnings(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string // the lines on stderr, as regular expressions
	}{
		{name: "unknown protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/xml"},
			want: []string{`^dlock run: OTEL_EXPORTER_OTLP_PROTOCOL is "http/xml", not grpc, http/protobuf or http/json: dlock sends http/protobuf$`}},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin,otlp"},
			want: []string{`^dlock run: ignoring "zipkin" in OTEL_TRACES_EXPORTER: dlock exports to otlp, console or none$`}},
		{name: "bad headers", env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "a=1,secret1,b=secret3%zz"},
			want: []string{`^dlock run: OpenTelemetry: parse headers: missing '=`, `^dlock run: OpenTelemetry: escape header value: invalid URL escape`}},
		{name: "bad header key", env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "bad key=secret"},
			want: []string{`^dlock run: OpenTelemetry: parse headers "bad key": invalid header key$`}},
		{name: "bad resource attributes, once", env: map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "ci.job=42,oops"},
			want: []string{`^dlock run: OpenTelemetry: .*\[oops\]$`}},
		{name: "bad timeout", env: map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "5s"},
			want: []string{`^dlock run: OpenTelemetry: parse duration: .*"5s"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCollector(t, nil)
			tc.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = c.URL
			sc, stderr := exportOne(t, tc.env)
			lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			require.Len(t, lines, len(tc.want), "stderr: %q", stderr)
			for i, want := range tc.want {
				assert.Regexp(t, want, lines[i])
			}
			assert.NotContains(t, stderr, "secret")
			requireSpan(t, c, sc)
			assert.Equal(t, "application/x-protobuf", c.all()[0].header.Get("Content-Type"))
		})
	}
}

// An exporter that cannot be set up (a certificate for a plain HTTP
// endpoint) is a warning, and no export: run sets no tracer up.
func TestExportSetUpFails(t *testing.T) {
	_, srv := newTLSCollector(t, nil)
	ca := writePEM(t, "ca.pem", &pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	exportEnv(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_CERTIFICATE": ca})
	var stderr syncBuffer
	assert.Nil(t, newTraces(context.Background(), "elect", &stderr))
	assert.Equal(t, "dlock elect: traces not exported: insecure HTTP endpoint cannot use TLS client configuration\n", stderr.String())
}

// How long the export may take: OTEL_EXPORTER_OTLP_TIMEOUT, at most
// maxExportWait.
func TestExportWait(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want time.Duration
	}{
		{want: maxExportWait},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "500"}, want: 500 * time.Millisecond},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "500", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": " 100 "}, want: 100 * time.Millisecond},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "60000"}, want: maxExportWait},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "99999999999999999999"}, want: maxExportWait},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "5s"}, want: maxExportWait},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "0"}, want: maxExportWait},
	} {
		exportEnv(t, tc.env)
		assert.Equal(t, tc.want, exportWait(), "%v", tc.env)
	}
}
