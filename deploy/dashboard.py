"""The Grafana dashboard of efo, as code (Grafana's grafana-foundation-sdk), written to
helm/efo/dashboards/efo.json, which the chart ships in a ConfigMap for Grafana's sidecar.

Every panel reads the metrics of efo/observability.py; ``$job`` selects the release (the job label a
ServiceMonitor gives it), ``$stream`` the streams it reads (the ``stream`` label of what each stream
does apart: shards, leases, subscriptions, checkpoints) and ``$datasource`` the Prometheus. Run
after changing a panel; a test checks that the committed JSON is what this writes
(tests/unit/test_dashboard.py), and that every expression returns data from a real Prometheus
scraping a running service.

    .venv/bin/python deploy/dashboard.py
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef, VariableRefresh

DASHBOARD_PATH = Path(__file__).resolve().parents[1] / "helm" / "efo" / "dashboards" / "efo.json"
UID = "efo-overview"
JOB = 'job=~"$job"'
#: The series of the streams selected (a metric with the ``stream`` label).
STREAM = f'{JOB},stream=~"$stream"'
RATE = "[$__rate_interval]"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    unit: str
    description: str
    queries: tuple[Query, ...]


def _quantiles(histogram: str, *quantiles: float) -> tuple[Query, ...]:
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket{{{JOB}}}{RATE})))",
            f"p{round(q * 100)}",
        )
        for q in quantiles
    )


#: The panels, in reading order (two a row). Labelled counters that may have no series yet end in
#: "or vector(0)", so that a quiet service shows 0 rather than "No data".
PANELS = (
    PanelSpec(
        "Lag per shard",
        "s",
        "MillisBehindLatest of each shard's last event: how far behind the stream's tip it reads.",
        (Query(f"max by (stream, shard_id) (efo_shard_lag_seconds{{{STREAM}}})", "{{stream}}/{{shard_id}}"),),
    ),
    PanelSpec(
        "Throughput (records/s)",
        "rps",
        "Records read from Kinesis (after deaggregation) and committed by the sink, per stream.",
        (
            Query(f"sum by (stream) (rate(efo_records_received_total{{{STREAM}}}{RATE}))", "in: {{stream}} received"),
            Query(
                f"sum by (stream) (rate(efo_records_committed_total{{{STREAM}}}{RATE}))", "out: {{stream}} committed"
            ),
        ),
    ),
    PanelSpec(
        "End-to-end latency",
        "s",
        "From Kinesis' ApproximateArrivalTimestamp to the sink's commit, per record.",
        _quantiles("efo_end_to_end_latency_seconds", 0.5, 0.9, 0.99),
    ),
    PanelSpec(
        "Throughput (bytes/s)",
        "Bps",
        "Payload bytes read and committed, per stream.",
        (
            Query(f"sum by (stream) (rate(efo_bytes_received_total{{{STREAM}}}{RATE}))", "in: {{stream}} received"),
            Query(f"sum by (stream) (rate(efo_bytes_committed_total{{{STREAM}}}{RATE}))", "out: {{stream}} committed"),
        ),
    ),
    PanelSpec(
        "Pool fill",
        "percentunit",
        "Budget held in the pending pool of each worker; near 100 % the subscriptions wait (backpressure).",
        (
            Query(
                f"max by (pod) (efo_pool_pending_bytes{{{JOB}}} / efo_pool_capacity_bytes{{{JOB}}})",
                "bytes {{pod}}",
            ),
            Query(
                f"max by (pod) (efo_pool_pending_records{{{JOB}}} / efo_pool_capacity_records{{{JOB}}})",
                "records {{pod}}",
            ),
        ),
    ),
    PanelSpec(
        "Batch duration",
        "s",
        "From taking a batch to its commit (Arrow, DataFrame, sink).",
        _quantiles("efo_batch_duration_seconds", 0.5, 0.99),
    ),
    PanelSpec(
        "Leases per worker",
        "short",
        "Shards of each stream each worker holds; live workers and shards nobody owns, per stream, as the "
        "workers see the table.",
        (
            Query(f"sum by (pod, stream) (efo_leases_held{{{STREAM}}})", "{{pod}} {{stream}}"),
            Query(f"max by (stream) (efo_workers_live{{{STREAM}}})", "live workers {{stream}}"),
            Query(f"max by (stream) (efo_shards_unowned{{{STREAM}}})", "unowned shards {{stream}}"),
        ),
    ),
    PanelSpec(
        "Errors",
        "short",
        "Per second: failed subscriptions by stream and AWS code, sink failures, checkpoint writes that did "
        "not succeed (by stream), backpressure timeouts.",
        (
            Query(
                f"sum by (stream, code) (rate(efo_subscription_errors_total{{{STREAM}}}{RATE})) or vector(0)",
                "subscription {{stream}} {{code}}",
            ),
            Query(f"sum(rate(efo_sink_failures_total{{{JOB}}}{RATE}))", "sink failures"),
            Query(
                f'sum by (stream, outcome) (rate(efo_checkpoint_writes_total{{{STREAM},outcome!="ok"}}{RATE}))'
                " or vector(0)",
                "checkpoint {{stream}} {{outcome}}",
            ),
            Query(f"sum(rate(efo_backpressure_timeouts_total{{{JOB}}}{RATE}))", "backpressure timeouts"),
        ),
    ),
)


def _panel(spec: PanelSpec) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(spec.title)
        .description(spec.description)
        .unit(spec.unit)
        .min(0)
        .height(8)
        .span(12)
        .datasource(DATASOURCE)
    )
    for ref_id, query in zip("ABCDEFGH", spec.queries, strict=False):
        panel = panel.with_target(
            prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(ref_id).datasource(DATASOURCE)
        )
    return panel


def build() -> dashboard.Dashboard:
    board = (
        dashboard.Dashboard("efo: Kinesis Enhanced Fan-Out to Spark")
        .uid(UID)
        .tags(["efo", "kinesis", "spark"])
        .description("Lag, throughput, latency, backpressure, leases and errors of efo workers.")
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("utc")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            dashboard.QueryVariable("job")
            .label("Release (job)")
            .datasource(DATASOURCE)
            .query("label_values(efo_build_info, job)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
        )
        .with_variable(
            dashboard.QueryVariable("stream")
            .label("Stream")
            .datasource(DATASOURCE)
            .query('label_values(efo_leases_held{job=~"$job"}, stream)')
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")  # every stream, also one that is not in the list yet
        )
    )
    for spec in PANELS:
        board = board.with_panel(_panel(spec))
    return board


def render() -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(build().build()) + "\n"


def expressions() -> list[str]:
    """Every PromQL expression of the committed dashboard, in panel order."""
    board = json.loads(DASHBOARD_PATH.read_text())
    return [target["expr"] for panel in board["panels"] for target in panel["targets"]]


if __name__ == "__main__":
    DASHBOARD_PATH.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD_PATH.write_text(render())
    print(f"wrote {DASHBOARD_PATH}")
