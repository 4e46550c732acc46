package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
)

// This file holds what run and elect need to export their spans as the
// OpenTelemetry SDK's environment variables ask: a TracerProvider that
// records every span in memory, and an OTLP/HTTP exporter that sends them,
// JSON-encoded, in one request at exit. The SDK's OTLP exporter would do
// it too, but it adds 7.7 MB (71%) and 12 modules to the binary.

// The SDK's environment variables that run and elect read; see
// https://opentelemetry.io/docs/specs/otel/protocol/exporter/. Each
// setting of envOTLP (ENDPOINT, HEADERS, TIMEOUT, PROTOCOL) is read as
// envOTLP+"TRACES_"+setting first, which wins when set.
const (
	envSDKDisabled = "OTEL_SDK_DISABLED"
	envExporter    = "OTEL_TRACES_EXPORTER"
	envServiceName = "OTEL_SERVICE_NAME"
	envResource    = "OTEL_RESOURCE_ATTRIBUTES"
	envOTLP        = "OTEL_EXPORTER_OTLP_"
)

// maxExportWait caps how long run waits for the collector at exit, whatever
// the timeout set: the export is one small request, which a collector that
// is up answers in milliseconds, and a CI step should not hang on one that
// is down for the SDK's default of 10 s.
const maxExportWait = 3 * time.Second

// An otlpExport is where and how to export spans, as the environment says
// (otlpFromEnv).
type otlpExport struct {
	url      string
	header   http.Header
	timeout  time.Duration
	resource []attribute.KeyValue // service.name first
}

// otlpFromEnv reads the export's settings with getenv (os.Getenv), and
// returns nil when nothing is to be exported: no endpoint is set, or
// OTEL_TRACES_EXPORTER is "none", or OTEL_SDK_DISABLED is "true". It
// returns the warnings to print for settings it ignored (a bad timeout or
// header, a protocol other than http/json); a warning never quotes a
// header's value, which may be a secret.
func otlpFromEnv(getenv func(string) string) (*otlpExport, []string) {
	if strings.EqualFold(strings.TrimSpace(getenv(envSDKDisabled)), "true") ||
		strings.EqualFold(strings.TrimSpace(getenv(envExporter)), "none") {
		return nil, nil
	}
	e := &otlpExport{header: http.Header{}, timeout: 10 * time.Second}
	if u := getenv(envOTLP + "TRACES_ENDPOINT"); u != "" {
		e.url = u // as is, as the specification asks
	} else if u := getenv(envOTLP + "ENDPOINT"); u != "" {
		e.url = strings.TrimSuffix(u, "/") + "/v1/traces"
	} else {
		return nil, nil
	}
	var warns []string
	if name, p := otlpSetting(getenv, "PROTOCOL"); p != "" && p != "http/json" {
		warns = append(warns, fmt.Sprintf("%s is %q, but dlock sends traces as http/json (OTLP/HTTP, on port 4318 by default)", name, p))
	}
	if name, t := otlpSetting(getenv, "TIMEOUT"); t != "" {
		if ms, err := strconv.Atoi(strings.TrimSpace(t)); err == nil && ms >= 0 {
			e.timeout = time.Duration(ms) * time.Millisecond
		} else {
			warns = append(warns, fmt.Sprintf("ignoring %s %q: not a number of milliseconds", name, t))
		}
	}
	if e.timeout <= 0 || e.timeout > maxExportWait {
		e.timeout = maxExportWait
	}
	name, headers := otlpSetting(getenv, "HEADERS")
	if !keyValues(headers, e.header.Set) {
		warns = append(warns, fmt.Sprintf("ignoring entries of %s that are not key=value (percent-encoded)", name))
	}
	service := ""
	ok := keyValues(getenv(envResource), func(k, v string) {
		if k == "service.name" {
			service = v
		} else {
			e.resource = append(e.resource, attribute.String(k, v))
		}
	})
	if !ok {
		warns = append(warns, fmt.Sprintf("ignoring entries of %s that are not key=value (percent-encoded)", envResource))
	}
	service = cmp.Or(getenv(envServiceName), service, "dlock")
	e.resource = slices.Insert(e.resource, 0, attribute.String("service.name", service))
	return e, warns
}

// otlpSetting returns the variable that gives the exporter's setting for
// traces, and its value: envOTLP+"TRACES_"+setting if set, else
// envOTLP+setting.
func otlpSetting(getenv func(string) string, setting string) (name, value string) {
	if v := getenv(envOTLP + "TRACES_" + setting); v != "" {
		return envOTLP + "TRACES_" + setting, v
	}
	return envOTLP + setting, getenv(envOTLP + setting)
}

// keyValues calls set with each key=value of list, a comma-separated list
// as the SDK's variables hold, with the key and value trimmed of spaces and
// the value percent-decoded. It reports false if an entry was not a
// key=value (or did not decode); it skipped those.
func keyValues(list string, set func(k, v string)) (ok bool) {
	ok = true
	for entry := range strings.SplitSeq(list, ",") {
		if strings.TrimSpace(entry) == "" {
			continue
		}
		k, v, found := strings.Cut(entry, "=")
		v, err := url.PathUnescape(v)
		if k = strings.TrimSpace(k); !found || k == "" || err != nil {
			ok = false
			continue
		}
		set(k, strings.TrimSpace(v))
	}
	return ok
}

// export sends spans to e.url, as an OTLP/HTTP request in JSON, and waits
// at most e.timeout for the answer. The connection is closed at return.
func (e *otlpExport) export(spans []*recSpan) error {
	body, err := json.Marshal(otlpRequestOf(e.resource, spans))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header = e.header.Clone()
	req.Header.Set("Content-Type", "application/json")
	tr := http.DefaultTransport.(*http.Transport).Clone() // with its proxy from the environment
	tr.DisableKeepAlives = true                           // no connection, nor its goroutines, outlives the export
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s", e.url, resp.Status)
	}
	return nil
}

// The OTLP/JSON messages, as the OTLP specification's "JSON Protobuf
// Encoding" has them: field names in lowerCamelCase, trace and span ids in
// lower-case hex (not base64), enums as integers, and 64-bit integers as
// decimal strings. Empty fields are left out, as their defaults.
type (
	otlpRequest struct {
		ResourceSpans []otlpResourceSpans `json:"resourceSpans"`
	}
	otlpResourceSpans struct {
		Resource   otlpResource     `json:"resource"`
		ScopeSpans []otlpScopeSpans `json:"scopeSpans"`
	}
	otlpResource struct {
		Attributes []otlpKeyValue `json:"attributes,omitempty"`
	}
	otlpScopeSpans struct {
		Scope otlpScope  `json:"scope"`
		Spans []otlpSpan `json:"spans"`
	}
	otlpScope struct {
		Name    string `json:"name"`
		Version string `json:"version,omitempty"`
	}
	otlpSpan struct {
		TraceID      string         `json:"traceId"`
		SpanID       string         `json:"spanId"`
		TraceState   string         `json:"traceState,omitempty"`
		ParentSpanID string         `json:"parentSpanId,omitempty"`
		Name         string         `json:"name"`
		Kind         int            `json:"kind"`
		Start        int64          `json:"startTimeUnixNano,string"`
		End          int64          `json:"endTimeUnixNano,string"`
		Attributes   []otlpKeyValue `json:"attributes,omitempty"`
		Events       []otlpEvent    `json:"events,omitempty"`
		Links        []otlpLink     `json:"links,omitempty"`
		Status       otlpStatus     `json:"status"`
	}
	otlpEvent struct {
		Time       int64          `json:"timeUnixNano,string"`
		Name       string         `json:"name"`
		Attributes []otlpKeyValue `json:"attributes,omitempty"`
	}
	otlpLink struct {
		TraceID    string         `json:"traceId"`
		SpanID     string         `json:"spanId"`
		TraceState string         `json:"traceState,omitempty"`
		Attributes []otlpKeyValue `json:"attributes,omitempty"`
	}
	otlpStatus struct {
		Message string `json:"message,omitempty"`
		Code    int    `json:"code"` // UNSET 0, OK 1, ERROR 2: not the values of codes.Code
	}
	otlpKeyValue struct {
		Key   string    `json:"key"`
		Value otlpValue `json:"value"`
	}
	otlpValue struct { // one field set; none for an empty value
		String *string        `json:"stringValue,omitempty"`
		Bool   *bool          `json:"boolValue,omitempty"`
		Int    *int64         `json:"intValue,omitempty,string"`
		Double *float64       `json:"doubleValue,omitempty"`
		Bytes  []byte         `json:"bytesValue,omitempty"` // base64, as protobuf's JSON has bytes
		Array  *otlpValues    `json:"arrayValue,omitempty"`
		KVList *otlpKeyValues `json:"kvlistValue,omitempty"`
	}
	otlpValues struct {
		Values []otlpValue `json:"values"`
	}
	otlpKeyValues struct {
		Values []otlpKeyValue `json:"values"`
	}
)

// otlpRequestOf is the ExportTraceServiceRequest of spans, from one
// resource, grouped by their instrumentation scope.
func otlpRequestOf(resource []attribute.KeyValue, spans []*recSpan) otlpRequest {
	rs := otlpResourceSpans{Resource: otlpResource{Attributes: otlpAttributes(resource)}}
	byScope := map[otlpScope]int{} // index in rs.ScopeSpans
	for _, s := range spans {
		i, ok := byScope[s.tracer.scope]
		if !ok {
			i = len(rs.ScopeSpans)
			byScope[s.tracer.scope] = i
			rs.ScopeSpans = append(rs.ScopeSpans, otlpScopeSpans{Scope: s.tracer.scope})
		}
		rs.ScopeSpans[i].Spans = append(rs.ScopeSpans[i].Spans, s.otlp())
	}
	return otlpRequest{ResourceSpans: []otlpResourceSpans{rs}}
}

// otlp is s, ended, as OTLP has it.
func (s *recSpan) otlp() otlpSpan {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := otlpSpan{
		TraceID: s.sc.TraceID().String(), SpanID: s.sc.SpanID().String(), TraceState: s.sc.TraceState().String(),
		Name: s.name, Kind: int(s.kind), Start: s.start.UnixNano(), End: s.end.UnixNano(),
		Attributes: otlpAttributes(s.attrs),
		Status:     otlpStatus{Message: s.statusMessage, Code: map[codes.Code]int{codes.Ok: 1, codes.Error: 2}[s.status]},
	}
	if s.parent.IsValid() {
		o.ParentSpanID = s.parent.SpanID().String()
	}
	for _, e := range s.events {
		o.Events = append(o.Events, otlpEvent{Time: e.time.UnixNano(), Name: e.name, Attributes: otlpAttributes(e.attrs)})
	}
	for _, l := range s.links {
		o.Links = append(o.Links, otlpLink{TraceID: l.SpanContext.TraceID().String(), SpanID: l.SpanContext.SpanID().String(),
			TraceState: l.SpanContext.TraceState().String(), Attributes: otlpAttributes(l.Attributes)})
	}
	return o
}

func otlpAttributes(kvs []attribute.KeyValue) []otlpKeyValue {
	var out []otlpKeyValue
	for _, kv := range kvs {
		out = append(out, otlpKeyValue{Key: string(kv.Key), Value: otlpValueOf(kv.Value)})
	}
	return out
}

// otlpValueOf is v as an OTLP AnyValue. A double that JSON cannot hold
// (NaN, ±Inf) goes as its string.
func otlpValueOf(v attribute.Value) otlpValue {
	var slice []attribute.Value
	switch v.Type() {
	case attribute.BOOL:
		return otlpValue{Bool: ptr(v.AsBool())}
	case attribute.INT64:
		return otlpValue{Int: ptr(v.AsInt64())}
	case attribute.FLOAT64:
		if f := v.AsFloat64(); math.IsNaN(f) || math.IsInf(f, 0) {
			return otlpValue{String: ptr(v.String())}
		}
		return otlpValue{Double: ptr(v.AsFloat64())}
	case attribute.STRING:
		return otlpValue{String: ptr(v.AsString())}
	case attribute.BYTESLICE:
		return otlpValue{Bytes: v.AsByteSlice()}
	case attribute.MAP:
		return otlpValue{KVList: &otlpKeyValues{Values: otlpAttributes(v.AsMap())}}
	case attribute.SLICE:
		slice = v.AsSlice()
	case attribute.BOOLSLICE:
		slice = each(v.AsBoolSlice(), attribute.BoolValue)
	case attribute.INT64SLICE:
		slice = each(v.AsInt64Slice(), attribute.Int64Value)
	case attribute.FLOAT64SLICE:
		slice = each(v.AsFloat64Slice(), attribute.Float64Value)
	case attribute.STRINGSLICE:
		slice = each(v.AsStringSlice(), attribute.StringValue)
	default:
		return otlpValue{}
	}
	a := &otlpValues{Values: []otlpValue{}}
	for _, e := range slice {
		a.Values = append(a.Values, otlpValueOf(e))
	}
	return otlpValue{Array: a}
}

func each[T any](s []T, f func(T) attribute.Value) []attribute.Value {
	out := make([]attribute.Value, len(s))
	for i, e := range s {
		out[i] = f(e)
	}
	return out
}

func ptr[T any](v T) *T { return &v }
