package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// traceToStdout returns a tracer provider that prints each span as it
// ends, one line per span, so that a lock wait shows as a span with its
// duration, attempts, outcome and the holders it waited for; and a function
// that flushes and stops it. The demo hands it to dlock's Clients only
// (dlock.WithTracerProvider), not to the global provider, which the embedded
// server's own spans would also go to.
func traceToStdout() (*sdktrace.TracerProvider, func(context.Context) error) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(lineExporter{}))
	return tp, tp.Shutdown
}

// lineExporter writes spans to stdout, one line each.
type lineExporter struct{}

func (lineExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	for _, s := range spans {
		var b strings.Builder
		fmt.Fprintf(&b, "   [span] %s %v", s.Name(), s.EndTime().Sub(s.StartTime()).Round(time.Millisecond))
		for _, kv := range s.Attributes() {
			v := kv.Value.Emit()
			if kv.Key == "dlock.owner" && len(v) > 8 {
				v = v[:8] + "…" // the worker's name
			}
			fmt.Fprintf(&b, " %s=%s", kv.Key, v)
		}
		for _, e := range s.Events() {
			fmt.Fprintf(&b, " {event %s", e.Name)
			for _, kv := range e.Attributes {
				v := kv.Value.Emit()
				if kv.Key == "dlock.holder.owner" && len(v) > 8 {
					v = v[:8] + "…"
				}
				fmt.Fprintf(&b, " %s=%s", kv.Key, v)
			}
			b.WriteString("}")
		}
		fmt.Println(b.String())
	}
	return nil
}

func (lineExporter) Shutdown(context.Context) error { return nil }
