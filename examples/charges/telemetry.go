package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemflow/idemflow/otelidemflow"
	"github.com/idemflow/idemflow/workflow"
)

// telemetryFlags are serve's flags for OpenTelemetry through otelidemflow. Off by
// default; nothing else of serve changes when they are on.
type telemetryFlags struct {
	mode        string
	metricsAddr string
}

func registerTelemetry(fs *flag.FlagSet) *telemetryFlags {
	f := &telemetryFlags{}
	fs.StringVar(&f.mode, "telemetry", "off", "OpenTelemetry: off, stdout (spans printed to stdout) or prometheus (metrics at -metrics-addr)")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "127.0.0.1:9464", "address of the Prometheus /metrics endpoint (-telemetry prometheus)")
	return f
}

// telemetry is what -telemetry started.
type telemetry struct {
	obs  *otelidemflow.Observer
	tp   trace.TracerProvider // nil unless spans are made
	stop []func(context.Context) error
}

// start starts what f asks for; a telemetry of nothing when off.
func (f *telemetryFlags) start() (*telemetry, error) {
	t := &telemetry{}
	cfg := &otelidemflow.Config{}
	switch f.mode {
	case "off", "":
		return t, nil
	case "stdout":
		exp, err := stdouttrace.New(stdouttrace.WithWriter(os.Stdout), stdouttrace.WithPrettyPrint())
		if err != nil {
			return nil, err
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		t.stop = append(t.stop, tp.Shutdown)
		cfg.TracerProvider = tp
		t.tp = tp
	case "prometheus":
		reg := prometheus.NewRegistry()
		exp, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			return nil, err
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
		t.stop = append(t.stop, mp.Shutdown)
		cfg.MeterProvider = mp
		ln, err := net.Listen("tcp", f.metricsAddr)
		if err != nil {
			return nil, fmt.Errorf("metrics listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = hs.Serve(ln) }()
		t.stop = append(t.stop, hs.Shutdown)
		fmt.Printf("metrics: http://%s/metrics\n", ln.Addr())
	default:
		return nil, fmt.Errorf("-telemetry %q: want off, stdout or prometheus", f.mode)
	}
	obs, err := otelidemflow.New(cfg)
	if err != nil {
		return nil, errors.Join(err, t.close())
	}
	t.obs = obs
	return t, nil
}

// hooks are the engine hooks of t (none when off).
func (t *telemetry) hooks() workflow.Hooks {
	if t.obs == nil {
		return workflow.Hooks{}
	}
	return t.obs.Hooks()
}

// sweeperHooks are the sweeper's hooks of t (none when off): its liveness gauge,
// idemflow.sweeper.last_pass.
func (t *telemetry) sweeperHooks() workflow.SweeperHooks {
	if t.obs == nil {
		return workflow.SweeperHooks{}
	}
	return t.obs.SweeperHooks()
}

// handler is h with a server span per request (otelhttp), a child of the span of the
// request's traceparent header if it has one, when t makes spans; h itself otherwise.
// An attempt's span is then a child of its request's server span.
func (t *telemetry) handler(h http.Handler) http.Handler {
	if t.tp == nil {
		return h
	}
	return otelhttp.NewHandler(h, "charges", otelhttp.WithTracerProvider(t.tp),
		otelhttp.WithPropagators(propagation.TraceContext{}))
}

// observe reports engine's key gauges.
func (t *telemetry) observe(engine *workflow.Engine) error {
	if t.obs == nil {
		return nil
	}
	reg, err := t.obs.ObserveKeys(engine)
	if err != nil {
		return err
	}
	t.stop = append([]func(context.Context) error{func(context.Context) error { return reg.Unregister() }}, t.stop...)
	return nil
}

// close stops what start started.
func (t *telemetry) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	for _, stop := range t.stop {
		errs = append(errs, stop(ctx))
	}
	return errors.Join(errs...)
}
