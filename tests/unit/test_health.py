"""The HTTP server of /metrics, /healthz and /readyz (a real server on loopback), and the metrics
that are not plain prometheus-client objects."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from efo.config import load_settings
from efo.health import Health, HealthServer, loop_answers
from efo.leases.model import Lease
from efo.observability import LONG_BUCKETS_S, METRICS, BulkHistogram, Metrics, metrics_table
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import Position
from efo.service import Service
from efo.worker.owned import OwnedLeases


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def served() -> Iterator[tuple[Health, HealthServer]]:
    health = Health()
    server = HealthServer(health, Metrics.create(), host="127.0.0.1", port=0).start()
    try:
        yield health, server
    finally:
        server.close()


def test_readyz_fails_naming_every_check_not_started_then_passes_when_all_pass(
    served: tuple[Health, HealthServer],
) -> None:
    health, server = served
    health.ready_check("consumer", lambda: None)
    status, body = get(server.port, "/readyz")
    answer = json.loads(body)
    assert status == 503 and answer["status"] == "failing"
    assert answer["checks"]["consumer"] == {"ok": True, "detail": "ok"}
    assert answer["checks"]["spark"] == {"ok": False, "detail": "not started"}

    problem: list[str | None] = ["the lease table has not been read yet"]
    health.ready_check("table", lambda: problem[0])
    health.ready_check("spark", lambda: None)
    health.ready_check("shards", lambda: None)
    status, body = get(server.port, "/readyz")
    assert status == 503 and json.loads(body)["checks"]["table"]["detail"] == problem[0]
    assert _sample(server, "efo_ready") == 0.0

    problem[0] = None
    status, body = get(server.port, "/readyz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    assert _sample(server, "efo_ready") == 1.0


def test_a_check_that_raises_fails_with_its_error_and_the_server_keeps_answering(
    served: tuple[Health, HealthServer],
) -> None:
    health, server = served

    def broken() -> str | None:
        raise RuntimeError("boom")

    health.live_check("service", broken)
    status, body = get(server.port, "/healthz")
    assert status == 503 and json.loads(body)["checks"]["service"]["detail"] == "RuntimeError: boom"
    assert get(server.port, "/metrics")[0] == 200


def test_every_other_path_is_404_and_metrics_are_the_prometheus_text_format(
    served: tuple[Health, HealthServer],
) -> None:
    _, server = served
    for path in ("/", "/health", "/metrics/x", "/readyz/"):
        assert get(server.port, path)[0] == 404, path
    status, text = get(server.port, "/metrics?name[]=x")
    names = {family.name for family in text_string_to_metric_families(text)}
    assert status == 200 and {"efo_build_info", "efo_shard_lag_seconds", "process_cpu_seconds"} <= names


def test_healthz_fails_within_its_bound_while_the_event_loop_is_blocked_and_recovers() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    check = loop_answers(lambda: loop, timeout_s=0.5)
    try:
        assert check() is None
        loop.call_soon_threadsafe(time.sleep, 2.0)  # something blocks the loop
        time.sleep(0.1)
        started = time.monotonic()
        assert check() == "the event loop did not answer within 0.5 s"
        assert time.monotonic() - started < 1.5
        time.sleep(2.0)
        assert check() is None
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
    assert check() == "the event loop is closed"
    assert loop_answers(lambda: None)() is None  # not started yet: the process is starting


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1000, allow_nan=False), max_size=200))
def test_the_bulk_histogram_counts_as_prometheus_client_would_one_value_at_a_time(values: list[float]) -> None:
    bulk_registry, reference_registry = CollectorRegistry(), CollectorRegistry()
    bulk = BulkHistogram("latency_seconds", "x", LONG_BUCKETS_S, bulk_registry)
    reference = Histogram("latency_seconds", "x", buckets=LONG_BUCKETS_S, registry=reference_registry)
    half = len(values) // 2
    bulk.observe_many(pa.array(values[:half], pa.float64()))
    bulk.observe_many(pa.array(values[half:], pa.float64()))
    for value in values:
        reference.observe(value)
    assert _histogram(bulk_registry) == pytest.approx(_histogram(reference_registry))


def test_a_released_shard_leaves_no_series_behind() -> None:
    metrics = Metrics.create()
    series = metrics.shard("orders", "shardId-000000000001")
    assert "efo_shard_lag_seconds{" not in generate_latest(metrics.registry).decode(), "a lag before any event"
    series.event(1500)
    series.received(3, 30)
    series.committed(3, 30)
    assert series.lag_ms == 1500
    assert "shardId-000000000001" in generate_latest(metrics.registry).decode()
    metrics.forget_shard("orders", "shardId-000000000001")
    metrics.forget_shard("orders", "shardId-000000000001")  # twice: nothing to remove, no error
    assert "shardId-000000000001" not in generate_latest(metrics.registry).decode()


def test_shards_of_the_same_id_in_two_streams_have_series_of_their_own() -> None:
    metrics = Metrics.create()
    orders, payments = (
        metrics.shard("orders", "shardId-000000000000"),
        metrics.shard("payments", "shardId-000000000000"),
    )
    orders.event(1000)
    orders.received(3, 30)
    payments.event(250)
    payments.received(5, 50)
    sample = metrics.registry.get_sample_value
    for stream, lag, received in (("orders", 1.0, 3), ("payments", 0.25, 5)):
        labels = {"stream": stream, "shard_id": "shardId-000000000000"}
        assert sample("efo_shard_lag_seconds", labels) == lag
        assert sample("efo_records_received_total", labels) == received
    metrics.forget_shard("orders", "shardId-000000000000")
    assert sample("efo_records_received_total", {"stream": "orders", "shard_id": "shardId-000000000000"}) is None
    assert sample("efo_records_received_total", {"stream": "payments", "shard_id": "shardId-000000000000"}) == 5
    payments.stop_lag()
    assert sample("efo_shard_lag_seconds", {"stream": "payments", "shard_id": "shardId-000000000000"}) is None


def test_a_stream_s_series_start_at_0_apart_from_the_other_stream_s() -> None:
    metrics = Metrics.create()
    text = generate_latest(metrics.registry).decode()
    assert "efo_leases_held{" not in text and "efo_lease_changes_total{" not in text, "no stream yet, no series"
    metrics.add_stream("orders")
    metrics.add_stream("payments")
    sample = metrics.registry.get_sample_value
    for stream in ("orders", "payments"):
        for name, labels in (
            ("efo_leases_held", {}),
            ("efo_workers_live", {}),
            ("efo_shards_unowned", {}),
            ("efo_run_shards_remaining", {}),
            ("efo_subscriptions_started_total", {}),
            ("efo_subscriptions_ended_total", {"outcome": "shard_end"}),
            ("efo_lease_changes_total", {"reason": "taken"}),
            ("efo_lease_table_reads_total", {"rows": "control"}),
            ("efo_checkpoint_writes_total", {"outcome": "error"}),
        ):
            assert sample(name, {"stream": stream, **labels}) == 0, (name, stream)
    metrics.leases_held.labels(stream="orders").set(4)
    metrics.leases_held.labels(stream="payments").set(2)
    assert sample("efo_leases_held", {"stream": "orders"}) == 4  # one stream's gauge leaves the other's be
    assert sample("efo_leases_held", {"stream": "payments"}) == 2


def test_the_leases_of_two_streams_at_one_worker_are_counted_and_forgotten_apart() -> None:
    """One worker, two streams (a coordinator each), shards of the same id in both: each stream's
    leases gauge and shard series are its own, and releasing a shard of one leaves the other's."""
    pool = PendingPool(1000, 1 << 20)
    clicks, views = OwnedLeases("me", pool, stream="t-clicks"), OwnedLeases("me", pool, stream="t-views")
    shard = "shardId-000000000000"
    owned = {
        name: leases.own(Lease(shard, (), "me", 1, Position("TRIM_HORIZON")))
        for name, leases in (("t-clicks", clicks), ("t-views", views))
    }
    views.own(Lease("shardId-000000000001", (), "me", 1, Position("TRIM_HORIZON")))
    owned["t-clicks"].series.received(2, 20)
    owned["t-views"].series.received(7, 70)
    sample = METRICS.registry.get_sample_value
    assert sample("efo_leases_held", {"stream": "t-clicks"}) == 1
    assert sample("efo_leases_held", {"stream": "t-views"}) == 2
    assert sample("efo_records_received_total", {"stream": "t-clicks", "shard_id": shard}) == 2
    assert sample("efo_records_received_total", {"stream": "t-views", "shard_id": shard}) == 7
    clicks.lose(owned["t-clicks"], "another worker took it")
    assert sample("efo_lease_changes_total", {"stream": "t-clicks", "reason": "lost"}) == 1
    assert sample("efo_lease_changes_total", {"stream": "t-views", "reason": "lost"}) in (None, 0)
    assert sample("efo_leases_held", {"stream": "t-clicks"}) == 0
    assert sample("efo_records_received_total", {"stream": "t-clicks", "shard_id": shard}) is None
    assert sample("efo_records_received_total", {"stream": "t-views", "shard_id": shard}) == 7
    assert sample("efo_leases_held", {"stream": "t-views"}) == 2


def _histogram(registry: CollectorRegistry) -> dict[str, float]:
    text = generate_latest(registry).decode()
    return {
        f"{sample.name}{sample.labels}": sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def _sample(server: Any, name: str) -> float:
    text = get(server.port, "/metrics")[1]
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not exported")


def test_the_readme_metrics_table_is_the_generated_one_verbatim() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    match = re.search(r"<!-- metrics-table:start -->\n(.*?)\n<!-- metrics-table:end -->", readme, re.S)
    assert match is not None, "README.md lacks the metrics-table markers"
    assert match.group(1) == metrics_table()


def test_healthz_lets_a_finished_service_exit_on_its_own_before_it_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "EFO_STREAM": "s",
        "EFO_APP": "a",
        "EFO_SINK": "console",
        "EFO_SHUTDOWN_TIMEOUT_S": "30",
    }.items():
        monkeypatch.setenv(name, value)
    service = Service(load_settings())
    assert service.health.liveness() == {"event_loop": None, "service": None}  # not started yet
    service.finished.set()  # ended (a stop or a failure): the driver exits within 30 s + final writes
    service._finished_at = time.monotonic() - 35
    assert service.health.liveness() == {"event_loop": None, "service": None}
    service._finished_at = time.monotonic() - 45
    assert "the process has not exited" in str(service.health.liveness()["service"])
