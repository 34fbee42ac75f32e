package monitoring

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/idemflow/idemflow/otelidemflow"
	"github.com/idemflow/idemflow/store"
	"github.com/idemflow/idemflow/testkit/pgtest"
	"github.com/idemflow/idemflow/testkit/testflow"
	"github.com/idemflow/idemflow/workflow"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

const (
	rulesFile     = "../../deploy/prometheus/idemflow-alerts.yml"
	rulesTests    = "../../deploy/prometheus/idemflow-alerts.test.yml"
	dashboardFile = "../../deploy/grafana/idemflow-dashboard.json"
	operations    = "../../docs/OPERATIONS.md"
	// runbookBase is where every rule's runbook_url points: a section of
	// docs/OPERATIONS.md.
	runbookBase = "https://github.com/idemflow/idemflow/blob/main/docs/OPERATIONS.md#"
)

// anchors are the anchors GitHub makes of a Markdown file's headings: lower case,
// spaces to hyphens, punctuation but hyphens and underscores dropped.
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	drop := regexp.MustCompile("[^a-z0-9 _-]")
	out := map[string]bool{}
	fenced := false
	for line := range strings.Lines(string(raw)) {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		slug := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(title), ""), " ", "-")
		out[slug] = true
	}
	return out
}

// exported scrapes a real engine observed by otelidemflow through the OpenTelemetry
// Prometheus exporter, after traffic that makes every series appear (a finished key,
// a replay, a mismatch, a transient failure, a dead letter), and returns each metric
// name it serves (a histogram's _bucket, _sum and _count) with its label names.
func exported(t *testing.T) map[string]map[string]bool {
	t.Helper()
	ctx := context.Background()
	db, provider := testflow.Start(t)
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { require.NoError(t, mp.Shutdown(context.Background())) })
	obs, err := otelidemflow.New(&otelidemflow.Config{MeterProvider: mp})
	require.NoError(t, err)
	engine := testflow.Engine(t, db.Pool, &workflow.Config{Hooks: obs.Hooks()}, provider, nil)
	gauges, err := obs.ObserveKeys(engine)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, gauges.Unregister()) })
	// The partitions' gauges come from an engine on a partitioned key table.
	pdb, pprovider := testflow.Start(t)
	require.NoError(t, store.New().SetupPartitioned(ctx, pdb.Pool, store.PartitionDay, 0))
	parts, err := obs.ObservePartitions(testflow.Engine(t, pdb.Pool, nil, pprovider, nil))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, parts.Unregister()) })

	req := func(key, body string) workflow.Request {
		return workflow.Request{Scope: "acct", Key: key, Flow: testflow.Name, Method: "POST", Route: "/charges", Body: []byte(body)}
	}
	for range 2 {
		_, err = engine.Do(ctx, req("done", `{"amount":1}`))
		require.NoError(t, err)
	}
	_, err = engine.Do(ctx, req("done", `{"amount":2}`))
	require.ErrorIs(t, err, workflow.ErrMismatch)
	provider.FailNext(1)
	_, err = engine.Do(ctx, req("dead", `{"amount":3}`))
	require.ErrorIs(t, err, workflow.ErrTransient)
	testflow.Sweepable(t, db.Pool)
	provider.FailNext(1)
	st, err := engine.Sweep(ctx, &workflow.SweeperConfig{Grace: -1, MaxAttempts: 1, Logger: slog.New(slog.DiscardHandler), Hooks: obs.SweeperHooks()})
	require.NoError(t, err)
	require.Equal(t, 1, st.DeadLettered)

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	dec := expfmt.NewDecoder(resp.Body, expfmt.ResponseFormat(resp.Header))
	out := map[string]map[string]bool{}
	for {
		var mf dto.MetricFamily
		if err := dec.Decode(&mf); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		names := []string{mf.GetName()}
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			names = []string{mf.GetName() + "_bucket", mf.GetName() + "_sum", mf.GetName() + "_count"}
		}
		for _, n := range names {
			out[n] = map[string]bool{}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					out[n][l.GetName()] = true
				}
			}
			if strings.HasSuffix(n, "_bucket") {
				out[n]["le"] = true
			}
		}
	}
	return out
}

// selector is a metric a PromQL expression selects, with the labels it matches on.
type selector struct {
	expr, metric string
	labels       []string
}

// selectors parses expr with the PromQL parser and returns what it selects.
func selectors(t *testing.T, p parser.Parser, expr string) []selector {
	t.Helper()
	node, err := p.ParseExpr(expr)
	require.NoError(t, err, expr)
	var out []selector
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := selector{expr: expr, metric: vs.Name}
		for _, m := range vs.LabelMatchers {
			if m.Name != model.MetricNameLabel {
				s.labels = append(s.labels, m.Name)
			}
		}
		out = append(out, s)
		return nil
	})
	require.NotEmpty(t, out, "%s selects no metric", expr)
	return out
}

// requireExported checks that each selector names an exported metric, and matches only
// on labels that metric has.
func requireExported(t *testing.T, sels []selector, have map[string]map[string]bool) {
	t.Helper()
	for _, s := range sels {
		labels, ok := have[s.metric]
		require.True(t, ok, "%q names %s, which otelidemflow does not export; it exports %v", s.expr, s.metric, names(have))
		for _, l := range s.labels {
			require.True(t, labels[l], "%q matches %s on label %s, which it does not have (it has %v)", s.expr, s.metric, l, labels)
		}
	}
}

func names(m map[string]map[string]bool) []string {
	var out []string
	for n := range m {
		out = append(out, n)
	}
	return out
}

// TestMonitoringNamesExportedMetrics: the alerting rules parse with Prometheus's rules
// parser (and promtool accepts them), the dashboard is JSON whose queries parse as
// PromQL, and every metric and label either names is one a real engine exports.
func TestMonitoringNamesExportedMetrics(t *testing.T) {
	have := exported(t)
	for _, want := range []string{"idemflow_keys", "idemflow_keys_oldest_due_seconds", "idemflow_attempts_total", "idemflow_key_events_total",
		"idemflow_partitions_ahead", "idemflow_partitions_wanted", "idemflow_sweeper_last_pass_seconds"} {
		require.Contains(t, have, want, "the scrape serves %s", want)
	}
	p := parser.NewParser(parser.Options{})

	t.Run("Rules", func(t *testing.T) {
		groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
		require.Empty(t, errs)
		alerts := map[string]bool{}
		var sels []selector
		sections := anchors(t, operations)
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				alerts[r.Alert] = true
				sels = append(sels, selectors(t, p, r.Expr)...)
				anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookBase)
				require.True(t, ok, "%s: runbook_url %q is not a section of docs/OPERATIONS.md", r.Alert, r.Annotations["runbook_url"])
				require.True(t, sections[anchor], "%s: docs/OPERATIONS.md has no section #%s", r.Alert, anchor)
				require.True(t, strings.HasPrefix(anchor, "runbook-"), "%s: #%s is not a runbook section", r.Alert, anchor)
			}
		}
		for _, a := range []string{"IdemflowKeysStuck", "IdemflowDeadLetters", "IdemflowDrainLag", "IdemflowErrorRate", "IdemflowSweeperStalled"} {
			require.True(t, alerts[a], "the rules alert on %s", a)
		}
		requireExported(t, sels, have)
		if promtool, err := exec.LookPath("promtool"); err == nil {
			out, err := exec.Command(promtool, "check", "rules", rulesFile).CombinedOutput()
			require.NoError(t, err, "promtool check rules: %s", out)
			t.Logf("promtool: %s", out)
			// The unit tests: the sweeper's liveness alert fires for the process whose
			// gauge stopped moving, and only then; the rules carry their runbooks.
			test := exec.Command(promtool, "test", "rules", filepath.Base(rulesTests))
			test.Dir = filepath.Dir(rulesTests)
			out, err = test.CombinedOutput()
			require.NoError(t, err, "promtool test rules: %s", out)
			t.Logf("promtool: %s", out)
		} else {
			t.Log("no promtool on PATH: checked with rulefmt only")
		}
	})

	t.Run("Dashboard", func(t *testing.T) {
		raw, err := os.ReadFile(dashboardFile)
		require.NoError(t, err)
		var dash struct {
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
			Templating struct {
				List []struct {
					Definition string `json:"definition"`
				} `json:"list"`
			} `json:"templating"`
		}
		require.NoError(t, json.Unmarshal(raw, &dash))
		require.NotEmpty(t, dash.Panels)
		// Grafana's variables, as a query would see them.
		vars := strings.NewReplacer("$__rate_interval", "5m", "$flow", ".*")
		var sels []selector
		for _, panel := range dash.Panels {
			require.NotEmpty(t, panel.Targets, "panel %q has no query", panel.Title)
			for _, target := range panel.Targets {
				sels = append(sels, selectors(t, p, vars.Replace(target.Expr))...)
			}
		}
		labelValues := regexp.MustCompile(`^label_values\((\w+), (\w+)\)$`)
		for _, v := range dash.Templating.List {
			if v.Definition == "" {
				continue
			}
			m := labelValues.FindStringSubmatch(v.Definition)
			require.NotNil(t, m, "variable query %q", v.Definition)
			sels = append(sels, selector{expr: v.Definition, metric: m[1], labels: []string{m[2]}})
		}
		requireExported(t, sels, have)
	})
}
