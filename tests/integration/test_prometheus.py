"""A real Prometheus (Debian's package, on 127.0.0.1) scrapes ``efo run`` on the local stack while
records flow: the image's HEALTHCHECK passes on its /healthz, the exposition passes ``promtool
check metrics``, the chart's alert rules evaluate on the real series without error, every expression
of the Grafana dashboard returns data, and the dashboard's panels are drawn to a PNG (the README's
picture, with EFO_TEST_DASHBOARD_PNG=path)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from deploy import dashboard, dashboard_png
from efo.devstack.stack import StackEndpoints, die_with_parent_process, free_port
from tests.unit.test_alerts import ALERTS
from tests.unit.test_dockerfile import healthcheck

from .service import ServiceRun, arrow_env, create_stream, put_records, unique

pytestmark = pytest.mark.integration

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
ROOT = Path(__file__).resolve().parents[2]
JOB = "efo"  # what a ServiceMonitor names the job of release "efo": the chart's rules select it
TRAFFIC_S = 24.0
RATE_INTERVAL = "10s"


def alert_rules() -> str:
    values = helm.values_from_yaml(
        "config: {EFO_STREAM: s, EFO_APP: a, EFO_SINK: console}\nprometheusRule: {enabled: true}\n"
    )
    with helm.Chart.load(ROOT / "helm" / "efo") as chart:
        manifest = chart.render(values, name=JOB, namespace="streaming")["efo/templates/prometheusrule.yaml"]
    [rule] = [doc for doc in yaml.safe_load_all(manifest) if doc]
    return yaml.safe_dump(rule["spec"])


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: Any) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=30) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=expr)["result"]
        return result


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[Prometheus, Path]]:
    """A Prometheus on loopback scraping whatever is written into the returned targets file."""
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed (.ci/run installs Debian's prometheus package)")
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    (tmp_path / "rules.yaml").write_text(alert_rules())
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [{"job_name": JOB, "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=log,
        preexec_fn=die_with_parent_process,
    )
    server = Prometheus(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2):
                    break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()
                time.sleep(0.2)
        yield server, targets
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_prometheus_scrapes_a_running_service_and_every_dashboard_query_returns_data(
    prometheus: tuple[Prometheus, Path], local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    server, targets = prometheus
    stream, metrics_port = unique("prom"), free_port()
    create_stream(kinesis_client, stream, 2)
    env = arrow_env(
        local_stack,
        stream=stream,
        app=unique("app"),
        sink_dir=tmp_path / "sink",
        initial_position="TRIM_HORIZON",
        EFO_METRICS_PORT=str(metrics_port),
    )
    run = ServiceRun(env, tmp_path / "efo.log").start()
    try:
        run.wait_for_event("service.ready")
        assert healthcheck(metrics_port) == 0  # the image's HEALTHCHECK, against the real /healthz
        # The labels the Prometheus Operator gives a pod's target, so that by (pod) reads as on a cluster.
        targets.write_text(
            json.dumps([{"targets": [f"127.0.0.1:{metrics_port}"], "labels": {"pod": "efo-0", "namespace": "demo"}}])
        )
        started_s = time.time()
        second = 0
        while time.time() - started_s < TRAFFIC_S:  # a wave of traffic, so the panels have a shape
            put_records(kinesis_client, stream, int(150 + 120 * math.sin(second / 4)), tag=f"s{second}")
            second += 1
            time.sleep(max(0.0, started_s + second - time.time()))
        time.sleep(5)  # the last batches commit and are scraped
        ended_s = time.time()

        assert server.query(f'up{{job="{JOB}"}}')[0]["value"][1] == "1"
        if PROMTOOL is not None:
            checked = subprocess.run(
                [PROMTOOL, "check", "metrics"], input=scrape_text(metrics_port), capture_output=True, text=True
            )
            assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout + checked.stderr

        empty = []
        for expr in dashboard.expressions():
            query = dashboard_png.concrete(expr, JOB, RATE_INTERVAL)
            result = dashboard_png.query_range(server.url, query, started_s, ended_s, 1.0)
            values = [float(v) for series in result for _, v in series["values"] if not math.isnan(float(v))]
            if not values:
                empty.append(query)
        assert empty == [], f"dashboard expressions without data: {empty}"

        rules = [rule for group in server.get("/api/v1/rules")["groups"] for rule in group["rules"]]
        assert len(rules) == len(ALERTS) and all(rule["health"] == "ok" for rule in rules), rules
        firing = [alert["labels"]["alertname"] for alert in server.get("/api/v1/alerts")["alerts"]]
        assert not {"EfoShardsUnowned", "EfoCheckpointFailures", "EfoSinkFailures"} & set(firing), firing

        picture = Path(os.environ.get("EFO_TEST_DASHBOARD_PNG") or tmp_path / "dashboard.png")
        dashboard_png.render(server.url, picture, job=JOB, start_s=started_s - 5, end_s=ended_s)
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        run.stop()
