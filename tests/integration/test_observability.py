"""What an operator sees of running workers: /metrics, /healthz and /readyz of real ``efo run``
processes on the local stack, and the lag each owner writes to its lease rows."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from efo.devstack.stack import StackEndpoints, free_port

from .workers import Workers

pytestmark = pytest.mark.integration

FAST_LEASES = {
    "EFO_LEASE__FAILOVER_S": "6",
    "EFO_LEASE__HEARTBEAT_INTERVAL_S": "1",
    "EFO_LEASE__SYNC_INTERVAL_S": "0.5",
    "EFO_CHECKPOINT__INTERVAL_S": "1",
}


class Scrape:
    """One worker's /metrics: samples by name, each a list of (labels, value)."""

    def __init__(self, port: int) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.samples[sample.name].append((sample.labels, sample.value))

    def value(self, name: str, **labels: str) -> float:
        return sum(value for found, value in self.samples[name] if labels.items() <= found.items())

    def shards(self, name: str) -> set[str]:
        return {labels["shard_id"] for labels, _ in self.samples[name]}

    def streams(self, name: str) -> set[str]:
        """The ``stream`` label of every sample of ``name``."""
        return {labels["stream"] for labels, _ in self.samples[name]}


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()) if path != "/nothing" else {}
    except urllib.error.URLError:
        return 0, {}  # not serving yet


def test_metrics_health_and_lag_of_two_workers_follow_the_leases_they_hold(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    w = Workers(local_stack, kinesis_client, dynamodb_client, tmp_path, shards=4, **FAST_LEASES)
    ports = {"w1": free_port(), "w2": free_port()}
    w.producer.put(400)
    w.start("w1", EFO_METRICS_PORT=str(ports["w1"]))
    w.wait_until(lambda: probe(ports["w1"], "/readyz")[0] == 200, 60, "w1 ready")
    _, ready = probe(ports["w1"], "/readyz")
    assert set(ready["checks"]) == {"consumer", "table", "spark", "shards"}
    assert probe(ports["w1"], "/healthz") == (
        200,
        {
            "status": "ok",
            "checks": {"event_loop": {"ok": True, "detail": "ok"}, "service": {"ok": True, "detail": "ok"}},
        },
    )
    assert probe(ports["w1"], "/nothing")[0] == 404
    assert not w.wait_for_everything().lost
    w.wait_until(lambda: Scrape(ports["w1"]).value("efo_records_committed_total") >= 400, 30, "400 committed")

    # Each owner writes the lag of its last event with its checkpoints.
    w.wait_until(lambda: all("lag_ms" in item for item in w.leases().values()), 30, "lag on every lease row")
    one = Scrape(ports["w1"])
    shard_ids = set(w.owners())
    assert one.shards("efo_shard_lag_seconds") == shard_ids
    assert one.shards("efo_shard_last_event_timestamp_seconds") == shard_ids
    # Each stream's series carry its name (an application may read several streams).
    for name in (
        "efo_shard_lag_seconds",
        "efo_records_committed_total",
        "efo_leases_held",
        "efo_workers_live",
        "efo_shards_unowned",
        "efo_lease_changes_total",
        "efo_subscriptions_started_total",
        "efo_checkpoint_writes_total",
    ):
        assert one.streams(name) == {w.stream}, name
    assert "stream" not in one.samples["efo_pool_capacity_records"][0][0]  # shared by every stream
    assert one.value("efo_leases_held", stream=w.stream) == 4
    assert one.value("efo_records_received_total") == one.value("efo_records_committed_total") == 400
    assert one.value("efo_bytes_committed_total") == one.value("efo_bytes_received_total") > 0
    assert one.value("efo_end_to_end_latency_seconds_count") == 400
    assert one.value("efo_batch_records_sum") == 400
    assert one.value("efo_leases_held") == 4 and one.value("efo_workers_live") == 1
    assert one.value("efo_lease_changes_total", reason="taken") == 4
    assert one.value("efo_checkpoint_writes_total", outcome="ok") >= 4
    assert one.value("efo_subscriptions_started_total") >= 4
    assert one.value("efo_pool_capacity_records") > 0 and one.value("efo_ready") == 1
    assert one.value("efo_build_info", version=one.samples["efo_build_info"][0][0]["version"]) == 1
    assert one.value("process_resident_memory_bytes") > 0

    w.start("w2", EFO_METRICS_PORT=str(ports["w2"]))
    w.wait_until(lambda: sorted(w.holdings().values()) == [2, 2], 60, "2 and 2")
    w.producer.put(200)
    assert not w.wait_for_everything().lost

    def series_follow_leases() -> bool:
        owners = w.owners()
        return all(
            Scrape(ports[name]).shards("efo_shard_lag_seconds") == {s for s, o in owners.items() if o == name}
            for name in ports
        )

    w.wait_until(series_follow_leases, 30, "each worker's shard series = the shards it holds")
    one, two = Scrape(ports["w1"]), Scrape(ports["w2"])
    assert one.value("efo_lease_changes_total", reason="handed_over") == 2
    # Shed by w1 (then free) or asked for by w2 (stolen): two moves either way.
    assert (
        two.value("efo_lease_changes_total", reason="taken") + two.value("efo_lease_changes_total", reason="stolen")
        == 2
    )
    assert one.value("efo_workers_live") == two.value("efo_workers_live") == 2
    assert one.value("efo_leases_held", stream=w.stream) == two.value("efo_leases_held", stream=w.stream) == 2
    assert w.stop("w2", signal.SIGTERM) == 0
    assert w.stop("w1", signal.SIGTERM) == 0
