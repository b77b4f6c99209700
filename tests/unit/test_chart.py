"""The Helm chart, rendered by Helm's own engine (helm-python-sdk embeds it) as ``helm install`` would:
values from YAML through Helm's parser, values.schema.json, the templates, ``helm lint --strict``,
and every manifest validated against Kubernetes' schemas (kubernetes-validate). What the pod would
receive (its environment, its settings file) is loaded by efo's own settings loader."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from deploy.values_schema import SCHEMA_PATH
from deploy.values_schema import render as render_schema
from efo.config import Settings, load_settings
from efo.sim.phases import MIN_READY_S

CHART = Path(__file__).resolve().parents[2] / "helm" / "efo"
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
#: Custom resources: their bodies are checked by the monitoring tests (promtool), not here.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}

MINIMAL = """
config:
  EFO_STREAM: orders
  EFO_APP: orders-to-lake
  EFO_SINK: parquet:s3a://lake/orders
"""

EVERY_OPTION = """
global: {imageRegistry: registry.example}  # as a subchart: Helm passes the parent's globals
replicaCount: 3
image: {repository: registry.example/efo, tag: "1.2.3", pullPolicy: Always}
imagePullSecrets: [{name: registry}]
config:
  EFO_STREAM: arn:aws:kinesis:eu-west-1:123456789012:stream/orders
  EFO_APP: orders-to-lake
  EFO_SINK: parquet:s3a://lake/orders
  EFO_REGION: eu-west-1
  EFO_INITIAL_POSITION: TRIM_HORIZON
  EFO_POOL__MAX_PENDING_BYTES: 268435456
  EFO_POOL__RESERVED_RECORDS_PER_SHARD: 0
  EFO_BATCH__MAX_WAIT_S: 2.5
  EFO_LEASE__MAX_LEASES_PER_WORKER: 0
  EFO_SHUTDOWN_TIMEOUT_S: 45
  EFO_LOG__FORMAT: json
  EFO_SPARK__CONF: {spark.sql.shuffle.partitions: 4, spark.driver.memory: 3g, spark.sql.adaptive.enabled: false}
  EFO_DYNAMODB_ENDPOINT: ""
settings:
  checkpoint: {interval_s: 10}
  batch: {max_records: 100000}
  spark: {conf: {spark.executor.cores: 2}}
extraEnv: [{name: AWS_MAX_ATTEMPTS, value: "10"}]
serviceAccount:
  create: false
  name: data-platform
  annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::123456789012:role/efo"}
metrics:
  port: 9500
  serviceMonitor: {enabled: true, interval: 15s, labels: {release: kube-prometheus}}
prometheusRule: {enabled: true, labels: {release: kube-prometheus}, lagThresholdSeconds: 120}
grafanaDashboard: {enabled: true, annotations: {grafana_folder: Streaming}}
terminationGracePeriodSeconds: 90
resources: {requests: {cpu: "2", memory: 4Gi}, limits: {memory: 6Gi}}
readinessProbe: {enabled: false}
podDisruptionBudget: {maxUnavailable: 1}
nodeSelector: {kubernetes.io/arch: arm64}
tolerations: [{key: dedicated, operator: Equal, value: streaming, effect: NoSchedule}]
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector: {matchLabels: {app.kubernetes.io/name: efo}}
podAnnotations: {team: data}
"""


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def values(text: str) -> dict[str, Any]:
    """A values file as Helm reads it (numbers become float64 there, as with -f)."""
    return helm.values_from_yaml(text)


@functools.cache
def _rendered(text: str) -> tuple[dict[str, Any], ...]:
    with helm.Chart.load(CHART) as loaded:
        manifests = loaded.render(values(text), name="efo", namespace="streaming", is_install=True)
    return tuple(doc for body in manifests.values() for doc in yaml.safe_load_all(body) if doc)


def rendered(text: str) -> list[dict[str, Any]]:
    return list(_rendered(text))


def one(docs: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return found


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [efo] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return efo


def env_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(docs)["env"] if "value" in e}


def minimal_with(extra: str) -> str:
    """MINIMAL with the top-level keys of ``extra`` merged in (one level deep)."""
    merged = yaml.safe_load(MINIMAL)
    for key, value in yaml.safe_load(extra).items():
        merged[key] = {**merged[key], **value} if isinstance(value, dict) and key in merged else value
    return yaml.safe_dump(merged)


def render_error(chart: helm.Chart, text: str) -> str:
    with pytest.raises(helm.HelmError) as failed:
        chart.render(values(text), name="efo", namespace="streaming", is_install=True)
    return str(failed.value)


def test_the_committed_schema_is_what_the_generator_writes_from_efos_settings() -> None:
    assert SCHEMA_PATH.read_text() == render_schema(), "run: .venv/bin/python deploy/values_schema.py"


def test_default_values_fail_at_render_naming_the_required_settings(chart: helm.Chart) -> None:
    message = render_error(chart, "{}")
    for name in ("config.EFO_STREAM", "config.EFO_APP", "config.EFO_SINK"):
        assert name in message, message
    assert "Deploying with Helm" in message


@pytest.mark.parametrize("text", [MINIMAL, EVERY_OPTION], ids=["minimal", "every-option"])
def test_lint_strict_passes_and_every_manifest_is_valid_kubernetes(text: str) -> None:
    report = helm.lint(CHART, values(text), strict=True, namespace="streaming")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report
    docs = rendered(text)
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{doc['kind']} {doc['metadata']['name']} on Kubernetes {version}: {error.message}")


def test_minimal_values_give_probes_for_a_spark_start_and_the_chart_owned_variables() -> None:
    docs = rendered(MINIMAL)
    efo = container(docs)
    assert efo["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert efo["startupProbe"]["periodSeconds"] * efo["startupProbe"]["failureThreshold"] >= 60
    assert efo["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert efo["readinessProbe"]["httpGet"]["path"] == "/readyz"
    names = [e["name"] for e in efo["env"]]
    assert len(names) == len(set(names)), names
    assert env_of(docs)["EFO_METRICS_PORT"] == "9400"
    assert efo["args"] == ["run"]
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "ServiceAccount", "Job"}  # the Job: doctor


def test_values_of_every_yaml_type_reach_efo_as_it_reads_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = rendered(EVERY_OPTION)
    env = env_of(docs)
    assert env["EFO_POOL__MAX_PENDING_BYTES"] == "268435456"  # not 2.68435456e+08
    assert env["EFO_POOL__RESERVED_RECORDS_PER_SHARD"] == "0" and env["EFO_LEASE__MAX_LEASES_PER_WORKER"] == "0"
    assert env["EFO_BATCH__MAX_WAIT_S"] == "2.5"
    assert json.loads(env["EFO_SPARK__CONF"])["spark.sql.shuffle.partitions"] == "4"
    assert "EFO_DYNAMODB_ENDPOINT" not in env  # "" means not set
    assert container(docs)["args"] == ["run", "--config", "/etc/efo/settings.yaml"]
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text(one(docs, "ConfigMap", "-settings")["data"]["settings.yaml"])
    for name in [n for n in os.environ if n.startswith("EFO_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("EFO_WORKER_ID", "efo-7d9f-abcde")  # the pod name, from the downward API
    settings: Settings = load_settings(settings_file)
    assert settings.pool.max_pending_bytes == 268_435_456 and settings.pool.reserved_records_per_shard == 0
    assert settings.lease.max_leases_per_worker == 0 and settings.batch.max_wait_s == 2.5
    assert settings.spark.conf == {
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.memory": "3g",
        "spark.sql.adaptive.enabled": "false",
        "spark.executor.cores": "2",  # from the file, where the chart quoted the YAML integer
    }
    assert settings.checkpoint.interval_s == 10 and settings.batch.max_records == 100_000  # from the file
    assert settings.metrics_port == 9500 and settings.shutdown_timeout_s == 45


def test_irsa_with_an_existing_service_account_projects_the_web_identity_token() -> None:
    docs = rendered(EVERY_OPTION)
    assert not [d for d in docs if d["kind"] == "ServiceAccount"]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "data-platform"
    env = env_of(docs)
    assert env["AWS_ROLE_ARN"] == "arn:aws:iam::123456789012:role/efo"
    token_file = env["AWS_WEB_IDENTITY_TOKEN_FILE"]
    [mount] = [m for m in container(docs)["volumeMounts"] if token_file.startswith(m["mountPath"] + "/")]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    [source] = volume["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "sts.amazonaws.com"
    assert token_file.endswith("/" + source["serviceAccountToken"]["path"])


def test_irsa_with_a_created_service_account_annotates_it_and_leaves_the_pod_to_eks() -> None:
    docs = rendered(
        minimal_with('serviceAccount: {annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::1:role/x"}}')
    )
    account = one(docs, "ServiceAccount")
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    assert "AWS_ROLE_ARN" not in env_of(docs)


def test_monitoring_objects_select_this_release_and_embed_the_generated_dashboard() -> None:
    docs = rendered(EVERY_OPTION)
    rule = one(docs, "PrometheusRule")
    expressions = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    assert expressions and all('job="efo"' in e for e in expressions)
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    dashboard = one(docs, "ConfigMap", "-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["efo.json"]) == json.loads((CHART / "dashboards" / "efo.json").read_text())
    monitor = one(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "interval": "15s"}]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("terminationGracePeriodSeconds: 35", "terminationGracePeriodSeconds = 35 must be at least"),
        ("config: {EFO_SHUTDOWN_TIMEOUT_S: 120}", "shutdown_timeout_s + 10 = 130"),
        ("settings: {shutdown_timeout_s: 55}", "shutdown_timeout_s + 10 = 65"),
        # A duration with its unit, as efo reads it (efo.config.duration_s).
        ("config: {EFO_SHUTDOWN_TIMEOUT_S: 2m}", "shutdown_timeout_s + 10 = 130"),
        ("settings: {shutdown_timeout_s: 1.5m}", "shutdown_timeout_s + 10 = 100"),
        ("extraEnv: [{name: EFO_METRICS_PORT, value: '1'}]", "EFO_METRICS_PORT is set by the chart from metrics.port"),
    ],
)
def test_render_refuses_what_the_schema_cannot_see(chart: helm.Chart, extra: str, expected: str) -> None:
    assert expected in render_error(chart, minimal_with(extra))


def test_an_upgrade_replaces_one_pod_at_a_time_as_the_simulated_rolling_deploy_does(chart: helm.Chart) -> None:
    """Kubernetes' own default (25 % surge, 25 % unavailable) stops a quarter of the pods at once;
    efo.sim.phases' rolling deploy, which shows no shard unread longer than 5 s, is one at a time with
    the chart's minReadySeconds between stops."""
    spec = one(rendered(MINIMAL), "Deployment")["spec"]
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert spec["minReadySeconds"] == MIN_READY_S
    faster = one(rendered(minimal_with("{strategy: {rollingUpdate: {maxSurge: 2}}, minReadySeconds: 0}")), "Deployment")
    assert faster["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 2, "maxUnavailable": 0}
    assert faster["spec"]["minReadySeconds"] == 0
    # Recreate takes no rollingUpdate (Kubernetes refuses one); Helm merges the chart's in, the chart drops it.
    recreate = one(rendered(minimal_with("{strategy: {type: Recreate}}")), "Deployment")
    assert recreate["spec"]["strategy"] == {"type": "Recreate"}
    kubernetes_validate.validate(recreate, KUBERNETES_VERSIONS[0], strict=True)
    assert "minReadySeconds" in render_error(chart, minimal_with("{minReadySeconds: -1}"))
    for wrong in ("abc", -3, "25"):
        message = render_error(chart, minimal_with(f"{{strategy: {{rollingUpdate: {{maxSurge: {wrong!r}}}}}}}"))
        assert "/strategy/rollingUpdate/maxSurge" in message, message
    percent = one(rendered(minimal_with("{strategy: {rollingUpdate: {maxSurge: '25%'}}}")), "Deployment")
    assert percent["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == "25%"
    # null: Helm drops the key, and Kubernetes' own default applies.
    assert "strategy" not in one(rendered(minimal_with("{strategy: null}")), "Deployment")["spec"]
    assert "'/strategy/type': value must be one of 'RollingUpdate', 'Recreate'" in render_error(
        chart, minimal_with("{strategy: {type: Rolling}}")
    )


def test_a_long_enough_grace_period_for_a_longer_shutdown_renders() -> None:
    docs = rendered(minimal_with("{terminationGracePeriodSeconds: 130, settings: {shutdown_timeout_s: 120}}"))
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 130
    docs = rendered(minimal_with("{terminationGracePeriodSeconds: 130, config: {EFO_SHUTDOWN_TIMEOUT_S: 2m}}"))
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 130


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ("replicaCount: two", "/replicaCount"),
        ("image: {repository: efo, pullPolicy: Sometimes}", "/image/pullPolicy"),
        ("metrics: {port: 70000}", "/metrics/port"),
        ("confg: {EFO_STREAM: orders}", "'confg' not allowed"),
        ("config: {EFO_STREEM: orders}", "'EFO_STREEM' not allowed"),
        ("config: {EFO_METRICS_PORT: 9400}", "'EFO_METRICS_PORT' not allowed"),
        ("config: {EFO_LOG__LEVEL: verbose}", "/config/EFO_LOG__LEVEL"),
        ("config: {EFO_POOL__MAX_PENDING_RECORDS: -5}", "/config/EFO_POOL__MAX_PENDING_RECORDS"),
        ("config: {EFO_POOL__MAX_PENDING_RECORDS: 'many'}", "/config/EFO_POOL__MAX_PENDING_RECORDS"),
        ("settings: {pool: {max_pending_records: 0}}", "/settings/pool/max_pending_records"),
        ("settings: {worker_id: me}", "'worker_id' not allowed"),
        ("settings: {log: {format: xml}}", "/settings/log/format"),
        ("prometheusRule: {poolFillRatio: 1.5}", "/prometheusRule/poolFillRatio"),
        ("startupProbe: {enabled: 'yes'}", "/startupProbe/enabled"),
    ],
)
def test_the_schema_refuses_bad_values_naming_where(chart: helm.Chart, extra: str, path: str) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.validate_schema(values(minimal_with(extra)))
    assert path in str(refused.value)


# ---- a bounded run on a schedule (cronJob.enabled) ------------------------------------------------

CRON = minimal_with("cronJob: {enabled: true, schedule: '15 * * * *', until: caught-up, activeDeadlineSeconds: 3000}")


def test_a_cron_job_replaces_the_deployment_and_lints_as_valid_kubernetes() -> None:
    report = helm.lint(CHART, values(CRON), strict=True, namespace="streaming")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report
    docs = rendered(CRON)
    assert {d["kind"] for d in docs} == {"CronJob", "Service", "ServiceAccount", "Job"}  # the Job: doctor
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(one(docs, "CronJob"), version, strict=True)
    cron = one(docs, "CronJob")["spec"]
    assert cron["concurrencyPolicy"] == "Forbid" and cron["schedule"] == "15 * * * *"
    job = cron["jobTemplate"]["spec"]
    assert job["parallelism"] == job["completions"] == 1 and job["activeDeadlineSeconds"] == 3000


def test_the_cron_job_s_pod_is_the_deployment_s_with_the_bound_and_no_restart_in_place() -> None:
    deployment = one(rendered(EVERY_OPTION), "Deployment")["spec"]["template"]
    cron_docs = rendered(EVERY_OPTION + "cronJob: {enabled: true}\n")
    job = one(cron_docs, "CronJob")["spec"]["jobTemplate"]["spec"]
    assert job["parallelism"] == job["completions"] == 3  # replicaCount workers share each run
    pod = job["template"]
    assert pod["spec"].pop("restartPolicy") == "Never"
    [container] = pod["spec"]["containers"]
    until = [e for e in container["env"] if e["name"] == "EFO_RUN__UNTIL"]
    assert until == [{"name": "EFO_RUN__UNTIL", "value": "caught-up"}]
    container["env"].remove(until[0])
    assert pod == deployment, "probes, metrics, security contexts or volumes differ from the Deployment's"
    assert pod["metadata"]["labels"] == one(cron_docs, "Service")["spec"]["selector"], "the metrics Service misses it"


def test_the_bound_in_config_wins_over_cron_job_until_and_reaches_efo() -> None:
    docs = rendered(minimal_with("{cronJob: {enabled: true}, config: {EFO_RUN__UNTIL: 2h}}"))
    [container] = one(docs, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert [e["value"] for e in container["env"] if e["name"] == "EFO_RUN__UNTIL"] == ["2h"]


def test_a_cron_job_without_a_bound_is_refused_at_render(chart: helm.Chart) -> None:
    message = render_error(chart, minimal_with("cronJob: {enabled: true, until: ''}"))
    assert "cronJob.enabled needs a bounded run" in message


def test_the_schema_refuses_a_cron_job_value_that_is_not_one(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.validate_schema(values(minimal_with("cronJob: {enabled: true, concurrencyPolicy: Allow}")))
    assert "'concurrencyPolicy' not allowed" in str(refused.value)


@pytest.mark.parametrize(
    "extra",
    [
        "config: {EFO_RUN__UNTIL: caught-up}",
        "settings: {run: {until: 2h}}",
        "extraEnv: [{name: EFO_RUN__UNTIL, value: caught-up}]",
    ],
)
def test_a_bounded_run_without_the_cron_job_is_refused_at_render(chart: helm.Chart, extra: str) -> None:
    """A Deployment whose pod exits 0 at the run's end would be restarted forever."""
    message = render_error(chart, minimal_with(extra))
    assert "run.until" in message and "cronJob.enabled" in message, message


def test_the_cron_job_fails_at_once_on_bad_configuration_and_does_not_count_disruptions() -> None:
    """Exit 2 (configuration) and 3 (not found) fail the Job: a retry cannot help. An eviction or a
    preemption (DisruptionTarget) is not counted against backoffLimit."""
    job = one(rendered(CRON), "CronJob")["spec"]["jobTemplate"]["spec"]
    assert job["template"]["spec"]["restartPolicy"] == "Never", "podFailurePolicy needs restartPolicy: Never"
    rules = job["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"containerName": "efo", "operator": "In", "values": [2, 3]}} in rules
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules


def test_the_values_and_readme_say_a_deadline_fails_the_job_without_a_retry() -> None:
    values_text = (CHART / "values.yaml").read_text()
    readme = (CHART.parents[1] / "README.md").read_text()
    assert "DeadlineExceeded" in values_text and "DeadlineExceeded" in readme
    assert "activeDeadlineSeconds`, an eviction) or 1\n  fail it, and the Job retries it" not in readme


# ---- several streams in one application (streams) ------------------------------------------------

STREAMS = """
config:
  EFO_STREAM: ""
  EFO_APP: clicks-to-lake
  EFO_SINK: parquet:s3a://lake/clicks
  EFO_INITIAL_POSITION: LATEST
settings:
  streams:
    - clicks
    - arn:aws:kinesis:eu-west-1:123456789012:stream/views
    - {stream: orders, initial_position: TRIM_HORIZON, skip_older_than: 2d, consumer_name: orders-lake}
prometheusRule: {enabled: true}
grafanaDashboard: {enabled: true}
"""


def _pod_settings(docs: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """What efo in the pod reads: the rendered environment over the rendered settings file."""
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text(one(docs, "ConfigMap", "-settings")["data"]["settings.yaml"])
    for name in [n for n in os.environ if n.startswith("EFO_")]:
        monkeypatch.delenv(name)
    for name, value in env_of(docs).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("EFO_WORKER_ID", "efo-7d9f-abcde")
    return load_settings(settings_file)


def test_several_streams_lint_as_valid_kubernetes_and_reach_efo_each_with_its_own_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = helm.lint(CHART, values(STREAMS), strict=True, namespace="streaming")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report
    docs = rendered(STREAMS)
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)
    assert "EFO_STREAM" not in env_of(docs)  # "" is not set: efo would refuse stream and streams both
    assert container(docs)["args"] == ["run", "--config", "/etc/efo/settings.yaml"]
    settings = _pod_settings(docs, tmp_path, monkeypatch)
    assert settings.stream_names == ["clicks", "views", "orders"]
    clicks, views, orders = settings.per_stream()
    assert views.stream == "arn:aws:kinesis:eu-west-1:123456789012:stream/views"
    assert str(clicks.initial_position) == str(views.initial_position) == "LATEST"  # the top level's
    assert str(orders.initial_position) == "TRIM_HORIZON" and orders.consumer_name == "orders-lake"
    assert orders.skip_older_than_s == 2 * 86400 and clicks.skip_older_than_s is None


def test_streams_in_config_reach_efo_as_the_environment_s_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = rendered(minimal_with("config: {EFO_STREAM: '', EFO_STREAMS: 'clicks, views'}"))
    assert env_of(docs)["EFO_STREAMS"] == "clicks, views"
    for name in [n for n in os.environ if n.startswith("EFO_")]:
        monkeypatch.delenv(name)
    for name, value in env_of(docs).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("EFO_WORKER_ID", "efo-0")
    assert load_settings(None).stream_names == ["clicks", "views"]


@pytest.mark.parametrize(
    "extra",
    [
        "settings: {streams: [clicks, views]}",  # beside config.EFO_STREAM (orders)
        "config: {EFO_STREAMS: 'clicks,views'}",
        "{config: {EFO_STREAM: ''}, settings: {stream: orders, streams: [clicks]}}",
    ],
)
def test_stream_and_streams_both_set_are_refused_at_render(chart: helm.Chart, extra: str) -> None:
    message = render_error(chart, minimal_with(extra))
    assert "stream (config.EFO_STREAM or settings.stream) and streams" in message and "both set" in message


def test_neither_stream_nor_streams_is_refused_at_render_naming_both(chart: helm.Chart) -> None:
    message = render_error(chart, minimal_with("config: {EFO_STREAM: ''}"))
    assert "config.EFO_STREAM" in message and "settings.streams" in message, message


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ("settings: {streams: [{stream: clicks, shards: 4}]}", "/settings/streams"),
        ("settings: {streams: [{initial_position: LATEST}]}", "/settings/streams"),
        ("settings: {streams: [{stream: ''}]}", "/settings/streams"),
        ("settings: {streams: ['']}", "/settings/streams"),
        ("settings: {streams: []}", "/settings/streams"),
        ("settings: {streams: [{stream: clicks, initial_position: 3}]}", "/settings/streams"),
        ("config: {EFO_STREAMS: [clicks, views]}", "/config/EFO_STREAMS"),
    ],
)
def test_the_schema_refuses_a_bad_entry_of_streams(chart: helm.Chart, extra: str, path: str) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.validate_schema(values(minimal_with(extra)))
    assert path in str(refused.value)


def test_every_accepted_form_of_an_entry_of_streams_is_one_efo_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schema and efo agree: each form the schema lets through loads (no pod that exits 2)."""
    arn = "arn:aws:kinesis:eu-west-1:1:stream/orders/consumer/x:1"
    entries = f"[clicks, {{stream: views}}, {{stream: orders, consumer_arn: '{arn}'}}]"
    text = minimal_with(f"{{config: {{EFO_STREAM: ''}}, settings: {{streams: {entries}}}}}")
    with helm.Chart.load(CHART) as loaded:
        loaded.validate_schema(values(text))
    assert _pod_settings(rendered(text), tmp_path, monkeypatch).stream_names == ["clicks", "views", "orders"]


# ---- efo doctor as the chart's helm test ------------------------------------------------------------


def test_helm_test_runs_efo_doctor_in_the_pods_place_and_no_worker_selector_picks_it() -> None:
    docs = rendered(minimal_with("{replicaCount: 3, podDisruptionBudget: {maxUnavailable: 1}}"))
    job = one(docs, "Job", "-doctor")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 300
    pod = job["spec"]["template"]
    worker = one(docs, "Deployment")["spec"]["template"]
    [doctor] = pod["spec"]["containers"]
    [efo] = worker["spec"]["containers"]
    assert doctor["args"] == ["doctor", "--workers", "3"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert not {"startupProbe", "livenessProbe", "readinessProbe", "ports"} & set(doctor)
    # The pod's identity and settings: what the doctor checks is what the workers will have.
    assert pod["spec"]["serviceAccountName"] == worker["spec"]["serviceAccountName"]
    assert (doctor["image"], doctor["env"], doctor["volumeMounts"]) == (efo["image"], efo["env"], efo["volumeMounts"])
    assert doctor["securityContext"] == efo["securityContext"]
    labels = pod["metadata"]["labels"]
    for selector in (
        one(docs, "Service")["spec"]["selector"],
        one(docs, "Deployment")["spec"]["selector"]["matchLabels"],
        one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
    ):
        assert not selector.items() <= labels.items(), selector


def test_the_doctor_job_takes_the_settings_file_and_can_skip_the_test_write_or_be_left_out() -> None:
    docs = rendered(minimal_with("{settings: {lease: {failover_s: 20}}, doctor: {write: false}}"))
    [doctor] = one(docs, "Job", "-doctor")["spec"]["template"]["spec"]["containers"]
    assert doctor["args"] == ["doctor", "--workers", "1", "--config", "/etc/efo/settings.yaml", "--no-write"]
    assert not [d for d in rendered(minimal_with("{doctor: {enabled: false}}")) if d["kind"] == "Job"]
