"""The chart's alerts through Prometheus' own tooling: the PrometheusRule rendered by Helm's engine
passes ``promtool check rules`` and the unit tests of alerts.promtool.yaml (``promtool test rules``),
and every alert has its runbook line in the README."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (.ci/run installs Debian's prometheus package)"
)
VALUES = """
config: {EFO_STREAM: orders, EFO_APP: orders-to-lake, EFO_SINK: "parquet:s3a://lake/orders"}
prometheusRule: {enabled: true}
"""


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's spec as release "efo" renders it: a Prometheus rule file's content."""
    with helm.Chart.load(ROOT / "helm" / "efo") as chart:
        manifests = chart.render(helm.values_from_yaml(VALUES), name="efo", namespace="streaming")
    [rule] = [doc for doc in yaml.safe_load_all(manifests["efo/templates/prometheusrule.yaml"]) if doc]
    spec: dict[str, Any] = rule["spec"]
    return spec


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, check=False)


#: The alerts the issue asks for, and EfoNotReady (a worker that reads nothing, e.g. DynamoDB down).
ALERTS = (
    "EfoShardLagHigh",
    "EfoShardsUnowned",
    "EfoNoRecordsWhileStreamHasTraffic",
    "EfoStreamNotRead",
    "EfoSubscriptionErrors",
    "EfoSinkFailures",
    "EfoBackpressurePersistent",
    "EfoCheckpointFailures",
    "EfoNotReady",
    "EfoWorkerRestarting",
)


@needs_promtool
def test_the_rendered_rules_pass_promtool_check_and_their_unit_tests(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups()))
    checked = promtool("check", "rules", str(tmp_path / "rules.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout
    tests = tmp_path / "alerts.promtool.yaml"
    shutil.copy(Path(__file__).with_name("alerts.promtool.yaml"), tests)
    tested = promtool("test", "rules", str(tests))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test_and_a_runbook_line_in_the_readme() -> None:
    alerts = [rule["alert"] for group in rule_groups()["groups"] for rule in group["rules"]]
    assert alerts == list(ALERTS)
    tested = {
        case["alertname"]
        for test in yaml.safe_load(Path(__file__).with_name("alerts.promtool.yaml").read_text())["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert tested == set(alerts)
    readme = (ROOT / "README.md").read_text()
    monitoring = readme[readme.index("## Monitoring") :]
    for alert in alerts:
        assert re.search(rf"^- \*\*`{alert}`\*\* .+", monitoring, re.MULTILINE), f"no runbook line for {alert}"
