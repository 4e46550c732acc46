package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// This file sets run and elect up to export their spans, as the
// OpenTelemetry SDK's environment variables ask, with the SDK and its
// exporters: OTLP over HTTP (protobuf, or JSON) or gRPC, and the console.
// The exporters read their own settings (endpoint, headers, TLS
// certificates, compression, protocol, timeout) from the environment;
// this file decides whether to export at all, and with which exporters.

// The SDK's environment variables that decide whether run and elect export
// their spans, and how; see
// https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/.
// Each setting of envOTLP is read as envOTLP+"TRACES_"+setting first, which
// wins when set.
const (
	envSDKDisabled = "OTEL_SDK_DISABLED"
	envExporter    = "OTEL_TRACES_EXPORTER"
	envOTLP        = "OTEL_EXPORTER_OTLP_"
)

// maxExportWait caps how long run waits for the collector at exit,
// retries included, whatever the timeout set: the export is a few small
// requests, which a collector that is up answers in milliseconds, and a CI
// step should not hang on one that is down for the SDK's default of 10 s.
const maxExportWait = 3 * time.Second

// flushSlack is how long run waits at exit, past the export's timeout,
// for the exporter to say why it failed.
const flushSlack = 500 * time.Millisecond

// An OTLP exporter sends a request that the collector could not take now
// (429, 502, 503, 504; over gRPC, UNAVAILABLE and the like) again after
// retryInitial, then at growing intervals up to retryMax, until the
// export's timeout. The SDK's own first wait, 5 s, would outlast
// maxExportWait.
const (
	retryInitial = 200 * time.Millisecond
	retryMax     = time.Second
)

// A traces is what a run that exports its spans records them with, and
// exports them with.
type traces struct {
	provider   *sdktrace.TracerProvider
	processors []sdktrace.SpanProcessor // a batch processor for each exporter
	wait       time.Duration            // how long one export may take (exportWait)
	warn       func(format string, args ...any)
}

// newTraces returns the traces of a run that exports its spans, as the
// environment asks (exporterNames), or nil when it asks for none, or when
// no exporter it asks for could be set up. It sets the SDK's global error
// handler and logger up to warn on stderr as "dlock VERB: ...", once for
// each message, and warns there of settings it ignores; the console
// exporter writes to stderr too, not to the stdout that COMMAND shares.
func newTraces(ctx context.Context, verb string, stderr io.Writer) *traces {
	names := exporterNames()
	if len(names) == 0 {
		return nil
	}
	w := &warner{prefix: "dlock " + verb + ": ", out: stderr, seen: map[string]bool{}}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { w.warn("OpenTelemetry: %v", err) }))
	otel.SetLogger(logr.New(errorSink{w}))
	t := &traces{wait: exportWait(), warn: w.warn}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(newResource(ctx))}
	for _, name := range names {
		exp, err := newExporter(ctx, name, t.wait, stderr, w.warn)
		if err != nil {
			w.warn("traces not exported: %v", err)
			continue
		}
		if exp == nil {
			continue
		}
		p := sdktrace.NewBatchSpanProcessor(exp, sdktrace.WithExportTimeout(t.wait))
		t.processors = append(t.processors, p)
		opts = append(opts, sdktrace.WithSpanProcessor(p))
	}
	if len(t.processors) == 0 {
		return nil
	}
	t.provider = sdktrace.NewTracerProvider(opts...)
	return t
}

// exporterNames returns the exporters that the environment asks for:
// none when OTEL_SDK_DISABLED is true; else those OTEL_TRACES_EXPORTER
// lists (comma-separated), less "none"; or, when it is unset, "otlp" if an
// OTLP endpoint is set, else none. Unlike the SDK, run does not export to
// the default endpoint (localhost) unless OTEL_TRACES_EXPORTER asks for
// otlp: a machine with no collector would warn at every run.
func exporterNames() []string {
	if strings.EqualFold(strings.TrimSpace(os.Getenv(envSDKDisabled)), "true") {
		return nil
	}
	list := strings.TrimSpace(os.Getenv(envExporter))
	if list == "" {
		if os.Getenv(envOTLP+"TRACES_ENDPOINT") == "" && os.Getenv(envOTLP+"ENDPOINT") == "" {
			return nil
		}
		return []string{"otlp"}
	}
	var names []string
	for name := range strings.SplitSeq(list, ",") {
		name = strings.ToLower(strings.TrimSpace(name))
		if name != "" && name != "none" && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

// newExporter returns the exporter called name in OTEL_TRACES_EXPORTER, or
// nil, with a warning, for a name run does not know.
func newExporter(ctx context.Context, name string, wait time.Duration, stderr io.Writer,
	warn func(string, ...any)) (sdktrace.SpanExporter, error) {
	switch name {
	case "otlp":
		return newOTLPExporter(ctx, wait, warn)
	case "console":
		return stdouttrace.New(stdouttrace.WithWriter(stderr))
	}
	warn("ignoring %q in %s: dlock exports to otlp, console or none", name, envExporter)
	return nil, nil
}

// newOTLPExporter returns the OTLP exporter of the protocol that the
// environment names: grpc, or else OTLP/HTTP, which reads http/protobuf
// (the default) or http/json itself. It warns of another protocol, and
// sends http/protobuf: the OpenTelemetry Collector takes it on the same
// port as http/json.
func newOTLPExporter(ctx context.Context, wait time.Duration, warn func(string, ...any)) (sdktrace.SpanExporter, error) {
	switch name, protocol := otlpSetting("PROTOCOL"); protocol {
	case "grpc":
		return otlptracegrpc.New(ctx, otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{
			Enabled: true, InitialInterval: retryInitial, MaxInterval: retryMax, MaxElapsedTime: wait}))
	case "", "http/protobuf", "http/json":
	default:
		warn("%s is %q, not grpc, http/protobuf or http/json: dlock sends http/protobuf", name, protocol)
	}
	return otlptracehttp.New(ctx, otlptracehttp.WithRetry(otlptracehttp.RetryConfig{
		Enabled: true, InitialInterval: retryInitial, MaxInterval: retryMax, MaxElapsedTime: wait}))
}

// otlpSetting returns the variable that gives the OTLP exporter's setting
// for traces, and its value, trimmed: envOTLP+"TRACES_"+setting if set,
// else envOTLP+setting.
func otlpSetting(setting string) (name, value string) {
	if v := strings.TrimSpace(os.Getenv(envOTLP + "TRACES_" + setting)); v != "" {
		return envOTLP + "TRACES_" + setting, v
	}
	return envOTLP + setting, strings.TrimSpace(os.Getenv(envOTLP + setting))
}

// exportWait is how long one export may take, retries included: the OTLP
// timeout (OTEL_EXPORTER_OTLP_TIMEOUT, in milliseconds), at most
// maxExportWait, which is also the wait when the timeout is not set, or
// not a positive number of milliseconds (the exporter warns of one that is
// not a number).
func exportWait() time.Duration {
	_, v := otlpSetting("TIMEOUT")
	if ms, err := strconv.Atoi(v); err == nil && ms > 0 && ms < int(maxExportWait/time.Millisecond) {
		return time.Duration(ms) * time.Millisecond
	}
	return maxExportWait
}

// newResource returns the spans' resource: the SDK's attributes,
// service.name "dlock", and what OTEL_RESOURCE_ATTRIBUTES and
// OTEL_SERVICE_NAME say, which wins. The SDK reports entries it could not
// read to the global error handler.
func newResource(ctx context.Context) *resource.Resource {
	own, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithAttributes(attribute.String("service.name", "dlock")))
	if err != nil {
		otel.Handle(err)
	}
	res, err := resource.Merge(own, resource.Environment())
	if err != nil {
		otel.Handle(err)
		return own
	}
	return res
}

// flush exports the spans that ended and were not exported yet, and shuts
// the exporters down, waiting at most t.wait (and flushSlack) in all. A
// failure is a warning: it costs the trace, never the run.
func (t *traces) flush() {
	ctx, cancel := context.WithTimeout(context.Background(), t.wait+flushSlack)
	defer cancel()
	failed := false
	for _, p := range t.processors {
		if err := p.ForceFlush(ctx); err != nil {
			t.warn("traces not exported: %v", err)
			failed = true
		}
	}
	if err := t.provider.Shutdown(ctx); err != nil && !failed {
		t.warn("traces not exported: %v", err)
	}
}

// A warner writes warnings, each on one line after its prefix, and each
// message once.
type warner struct {
	prefix string
	out    io.Writer

	mu   sync.Mutex
	seen map[string]bool // guarded by mu
}

// warn writes the message, unless it did before.
func (w *warner) warn(format string, args ...any) {
	msg := w.prefix + strings.Join(strings.Fields(fmt.Sprintf(format, args...)), " ")
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.seen[msg] {
		w.seen[msg] = true
		fmt.Fprintln(w.out, msg)
	}
}

// An errorSink is the SDK's logger (a logr.LogSink): it warns of the
// SDK's errors, such as a setting it could not read, and drops the rest.
// Of the values the SDK logs with an error, it shows a header's key only:
// the others repeat the error's text, or may be secrets (an entry of
// OTEL_EXPORTER_OTLP_HEADERS).
type errorSink struct{ w *warner }

// Init does nothing.
func (errorSink) Init(logr.RuntimeInfo) {}

// Enabled reports that no Info message is shown, at any level.
func (errorSink) Enabled(int) bool { return false }

// Info drops the message.
func (errorSink) Info(int, string, ...any) {}

// WithValues returns s: the values are dropped.
func (s errorSink) WithValues(...any) logr.LogSink { return s }

// WithName returns s: errors are named "OpenTelemetry".
func (s errorSink) WithName(string) logr.LogSink { return s }

// Error warns of err, with msg and a header's key, if logged with one.
func (s errorSink) Error(err error, msg string, keysAndValues ...any) {
	for i := 0; i+1 < len(keysAndValues); i += 2 {
		if keysAndValues[i] == "key" {
			msg += fmt.Sprintf(" %q", fmt.Sprint(keysAndValues[i+1]))
		}
	}
	s.w.warn("OpenTelemetry: %s: %v", msg, err)
}

// startTraces sets run up to record its spans, and export them at exit,
// when the OpenTelemetry SDK's variables in the environment ask for it
// (newTraces). Otherwise run sets up no tracer: the Client's spans go to
// the global provider, which records nothing.
func (r *runner) startTraces() {
	r.traces = newTraces(context.Background(), r.verb, os.Stderr)
}

// exportTraces exports the spans that ended, if run records them.
func (r *runner) exportTraces() {
	if r.traces != nil {
		r.traces.flush()
	}
}
