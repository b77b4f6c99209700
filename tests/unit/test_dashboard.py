"""The Grafana dashboard (deploy/dashboard.py): the committed JSON is what the generator writes, and
its queries select the streams of ``$stream`` wherever a metric carries the ``stream`` label."""

from __future__ import annotations

import dataclasses
import json
import re

from prometheus_client import CollectorRegistry

from deploy.dashboard import DASHBOARD_PATH, render
from efo.observability import Metrics

BOARD = json.loads(DASHBOARD_PATH.read_text())
SELECTOR = re.compile(r"\b(efo_\w+)\{([^}]*)\}")


def _labels_by_series_name() -> dict[str, tuple[str, ...]]:
    """Every efo series name a query may name (``_total``, ``_bucket`` ...) -> its family's labels."""
    metrics = Metrics.create()
    found: dict[str, tuple[str, ...]] = {}
    for field in dataclasses.fields(metrics):
        metric = getattr(metrics, field.name)
        if isinstance(metric, CollectorRegistry):
            continue
        labels = tuple(getattr(metric, "_labelnames", ()))
        for family in metric.describe():
            for suffix in ("", "_total", "_bucket", "_count", "_sum", "_info"):
                found[family.name + suffix] = labels
    return found


LABELS = _labels_by_series_name()


def _targets() -> list[dict[str, str]]:
    return [target for panel in BOARD["panels"] for target in panel["targets"]]


def test_the_committed_dashboard_is_what_the_generator_writes() -> None:
    assert DASHBOARD_PATH.read_text() == render(), "run: .venv/bin/python deploy/dashboard.py"


def test_a_stream_variable_selects_several_streams_or_all_of_them() -> None:
    [variable] = [v for v in BOARD["templating"]["list"] if v["name"] == "stream"]
    assert variable["multi"] and variable["includeAll"] and variable["allValue"] == ".*"
    metric, label = re.fullmatch(r"label_values\((efo_\w+)\{[^}]*\}, (\w+)\)", variable["query"]).groups()  # type: ignore[union-attr]
    assert label == "stream" and "stream" in LABELS[metric], variable["query"]


def test_every_query_of_a_metric_labelled_by_stream_filters_by_the_stream_variable() -> None:
    per_stream = 0
    for target in _targets():
        selectors = SELECTOR.findall(target["expr"])
        assert selectors, target["expr"]
        for name, matchers in selectors:
            assert name in LABELS, f"{name} is no metric of efo/observability.py"
            filters = 'stream=~"$stream"' in matchers
            assert filters == ("stream" in LABELS[name]), target["expr"]
            per_stream += filters
    assert per_stream >= 8  # lag, throughput in and out (records, bytes), leases, errors


def test_per_shard_and_per_stream_legends_name_the_stream() -> None:
    for target in _targets():
        expr, legend = target["expr"], target["legendFormat"]
        if "shard_id" in expr:
            assert "{{stream}}/{{shard_id}}" in legend, (expr, legend)
        by = re.search(r"by \(([^)]*)\)", expr)
        if by is not None and "stream" in by.group(1).split(", "):
            assert "{{stream}}" in legend, (expr, legend)
