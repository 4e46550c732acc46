package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The W3C trace context in the environment, as CI systems and otel-cli
// set it for the processes of a traced job.
const (
	envTraceParent = "TRACEPARENT"
	envTraceState  = "TRACESTATE"
)

// traceParent returns the span context that TRACEPARENT (with TRACESTATE,
// if set) in the environment names: the parent of this process's wait for
// its key, so that the hold stores the job's trace. It returns no span
// context when TRACEPARENT is unset or empty; when it is not a valid W3C
// traceparent, it warns on stderr and returns none, so that a bad value
// costs the trace, never the run. A TRACESTATE that does not parse is
// dropped, and the TRACEPARENT kept, as the W3C specification asks.
func traceParent(verb string) trace.SpanContext {
	tp := os.Getenv(envTraceParent)
	if tp == "" {
		return trace.SpanContext{}
	}
	carrier := propagation.MapCarrier{"traceparent": tp}
	if ts := os.Getenv(envTraceState); ts != "" {
		carrier["tracestate"] = ts
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
	if !sc.IsValid() {
		fmt.Fprintf(os.Stderr, "dlock %s: ignoring %s %q: not a W3C traceparent (00-TRACEID-SPANID-FLAGS, in lower-case hex)\n", verb, envTraceParent, tp)
	}
	return sc
}

// withTraceContext returns env, COMMAND's environment, with sc as its
// TRACEPARENT and TRACESTATE (none when sc has no trace state), in the
// place of those env had; or env as it is when sc is not valid.
//
// COMMAND gets the span context run got, the job's own parent, rather than
// a span of run's: run records spans only when it exports them
// (startTraces), so the id of one would otherwise name a span that no
// backend ever receives, and COMMAND's steps would hang from a parent
// missing from the trace. The wait for the key (a Lock span, when
// exported) and COMMAND's steps are then siblings under the job's span.
func withTraceContext(env []string, sc trace.SpanContext) []string {
	if !sc.IsValid() {
		return env
	}
	env = slices.DeleteFunc(env, func(kv string) bool {
		return strings.HasPrefix(kv, envTraceParent+"=") || strings.HasPrefix(kv, envTraceState+"=")
	})
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithRemoteSpanContext(context.Background(), sc), carrier)
	env = append(env, envTraceParent+"="+carrier.Get("traceparent"))
	if ts := carrier.Get("tracestate"); ts != "" {
		env = append(env, envTraceState+"="+ts)
	}
	return env
}

// inJob returns ctx in the job's trace context (TRACEPARENT), if run has
// one: its calls to dlock are then spans of the job's trace, or, with no
// recording span, holds that store the job's trace context.
func (r *runner) inJob(ctx context.Context) context.Context {
	if !r.parent.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, r.parent)
}
