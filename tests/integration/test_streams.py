"""Several streams in one application (``streams``), as real ``efo run`` processes on the local
stack (kinesis-local behind the conformance proxy, the local DynamoDB) with the Spark-free sink of
ledger_check.py: one lease table, one pool and one driver per process for every stream; each
stream's own starting position, parent-before-child order and checkpoints; workers sharing every
shard of every stream; a stream removed from the list and added back; a stream that does not exist."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from efo.devstack.faults import FaultClient
from efo.devstack.leases import shard_leases
from efo.devstack.stack import StackEndpoints, free_port
from efo.errors import EXIT_NOT_FOUND, EXIT_OK

from .ledger_check import Checkpoint, Disruption, Produced, Producer, check, committed_rows
from .service import ServiceRun, arrow_env, create_stream, split_first_shard, unique
from .test_observability import Scrape, probe

pytestmark = pytest.mark.integration


class Streams:
    """Streams of one application, their producers, a config file per list, and the workers."""

    def __init__(
        self,
        stack: StackEndpoints,
        kinesis: Any,
        dynamodb: Any,
        tmp_path: Path,
        names: list[str],
        shards: int | dict[str, int],
    ) -> None:
        self.kinesis, self.dynamodb, self.tmp_path = kinesis, dynamodb, tmp_path
        self.app = unique("app")
        self.names = {name: unique(name) for name in names}  # short name -> the stream's real name
        self.producers: dict[str, Producer] = {}
        self.arns: dict[str, str] = {}
        for name, stream in self.names.items():
            create_stream(kinesis, stream, shards if isinstance(shards, int) else shards[name])
            producer = Producer(kinesis, stream)
            producer.keys = [f"{name}-{i:03d}" for i in range(24)]  # a row's key says its stream
            self.producers[name] = producer
            summary = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
            self.arns[name] = summary["StreamARN"]
        self.sink = tmp_path / "sink"
        self.env = arrow_env(stack, stream="", app=self.app, sink_dir=self.sink, initial_position="LATEST")
        del self.env["EFO_STREAM"]
        self.runs: dict[str, ServiceRun] = {}

    def config(self, entries: list[Any]) -> Path:
        """A YAML file listing ``entries`` (short names, or mappings with a short ``stream``); a
        short name written ``arn:<name>`` stands for the stream's ARN."""

        def real(short: str) -> str:
            return self.arns[short.removeprefix("arn:")] if short.startswith("arn:") else self.names[short]

        resolved = [
            real(entry) if isinstance(entry, str) else {**entry, "stream": real(entry["stream"])} for entry in entries
        ]
        path = self.tmp_path / f"efo-{len(list(self.tmp_path.glob('efo-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump({"streams": resolved}))
        return path

    def start(self, worker: str, config: Path, **env: str) -> ServiceRun:
        log = self.tmp_path / f"{worker}-{len(self.runs)}.log"
        run = ServiceRun({**self.env, "EFO_WORKER_ID": worker, **env}, log, args=("--config", str(config))).start()
        self.runs[worker] = run
        return run

    def leases(self, name: str) -> dict[str, dict[str, Any]]:
        return shard_leases(self.dynamodb, self.app, self.app, self.arns[name])

    def holdings(self) -> Counter[str]:
        """Leases held, by worker, over every stream."""
        return Counter(
            item["lease_owner"]["S"]
            for name in self.names
            for item in self.leases(name).values()
            if item.get("lease_owner") and item.get("position_kind", {}).get("S") != "SHARD_END"
        )

    def rows(self, name: str) -> list[dict[str, Any]]:
        return committed_rows(self.sink, self.names[name])

    def delivered(self, name: str) -> set[tuple[str, str]]:
        return {(row["shard"], row["seq"]) for row in self.rows(name)}

    def wait_until(self, condition: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            for worker, run in self.runs.items():
                if run.process is not None and run.process.poll() not in (None, 0, -9):
                    raise AssertionError(f"worker {worker} exited {run.process.returncode}:\n{run.tail()}")
            assert time.monotonic() < deadline, f"no {what} within {timeout_s} s: {dict(self.holdings())}"
            time.sleep(0.3)

    def wait_delivered(self, name: str, produced: list[Produced], timeout_s: float = 90.0) -> None:
        wanted = {(p.shard_id, p.sequence_number) for p in produced}
        self.wait_until(lambda: wanted <= self.delivered(name), timeout_s, f"every record of {name}")

    def checkpoints(self, name: str, worker: str) -> dict[str, Checkpoint]:
        return {
            shard_id: Checkpoint.of(lease)
            for shard_id, lease in self.leases(name).items()
            if lease.get("lease_owner", {}).get("S") == worker
        }


def test_three_streams_two_workers_positions_per_stream_a_split_and_a_kill_lose_nothing(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    s = Streams(local_stack, kinesis_client, dynamodb_client, tmp_path, ["orders", "payments", "clicks"], shards=3)
    before = {name: s.producers[name].put(60) for name in s.names}  # orders reads them (TRIM_HORIZON), not the others
    # payments by its ARN: its rows still name the stream by its name.
    config = s.config([{"stream": "orders", "initial_position": "TRIM_HORIZON"}, "arn:payments", "clicks"])
    s.start("w1", config)
    s.start("w2", config)
    # The share counts every stream: 9 shards on 2 workers end 5 and 4 (each stream alone: 6 and 3).
    s.wait_until(lambda: sorted(s.holdings().values()) == [4, 5], 60, "9 shards held 5 and 4 over 3 streams")
    after = {name: s.producers[name].put(90) for name in s.names}
    split_first_shard(kinesis_client, s.names["payments"])
    for name in s.names:
        after[name] += s.producers[name].put(90)  # into payments' children too
    for name in s.names:
        s.wait_delivered(name, after[name][:30])

    victim = s.runs["w2"]
    assert victim.process is not None
    pid = victim.process.pid
    checkpoints = {name: s.checkpoints(name, "w2") for name in s.names}
    victim.stop(signal.SIGKILL)
    for name in s.names:
        checkpoints[name] |= s.checkpoints(name, "w2")  # a claim may have landed in between
        after[name] += s.producers[name].put(60)
    for name in s.names:
        s.wait_delivered(name, after[name])
    assert s.runs["w1"].stop() == EXIT_OK

    for name in s.names:
        kill = Disruption("SIGKILL w2", checkpoints[name], frozenset({("w2", pid)}))
        wanted = [*before[name], *after[name]] if name == "orders" else after[name]
        verdict = check(wanted, s.sink, [kill], stream=s.names[name])
        assert not verdict.lost and not verdict.out_of_order and not verdict.undue, (name, verdict)
        rows = s.rows(name)  # the rows whose stream column is this stream's name
        assert rows and all(row["key"].startswith(f"{name}-") for row in rows), f"rows of {name}: {rows[:3]}"
        if name != "orders":
            skipped = {(p.shard_id, p.sequence_number) for p in before[name]}
            assert not s.delivered(name) & skipped, f"{name} starts at LATEST, yet read what was there before"
    parent = next(iter(sorted(s.leases("payments"))))
    assert s.leases("payments")[parent]["position_kind"]["S"] == "SHARD_END", "payments' split parent not ended"


def test_a_stream_removed_from_the_list_is_left_alone_then_resumes_where_it_stopped(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    s = Streams(local_stack, kinesis_client, dynamodb_client, tmp_path, ["orders", "payments"], shards=2)
    both = s.config([{"stream": name, "initial_position": "TRIM_HORIZON"} for name in s.names])
    orders_only = s.config([{"stream": "orders", "initial_position": "TRIM_HORIZON"}])
    first = {name: s.producers[name].put(60) for name in s.names}
    s.start("w1", both)
    for name in s.names:
        s.wait_delivered(name, first[name])

    # A rolling restart to the shorter list: the new worker runs beside the old one. Both share
    # orders; payments stays with the worker that still lists it, and nothing fights over it.
    s.start("w2", orders_only)
    s.wait_until(
        lambda: {o.get("lease_owner", {}).get("S") for o in s.leases("orders").values()} == {"w1", "w2"},
        60,
        "orders shared by both workers",
    )
    assert {o.get("lease_owner", {}).get("S") for o in s.leases("payments").values()} == {"w1"}
    assert s.runs["w1"].stop() == EXIT_OK  # the old worker leaves: payments' leases released, checkpoints kept
    assert not any(item.get("lease_owner") for item in s.leases("payments").values())

    second = {name: s.producers[name].put(60) for name in s.names}
    s.wait_delivered("orders", second["orders"])
    assert not s.delivered("payments") & {(p.shard_id, p.sequence_number) for p in second["payments"]}
    assert not any(item.get("lease_owner") for item in s.leases("payments").values()), "a worker took payments"

    s.start("w1", both)  # listed again: payments resumes at its checkpoints
    s.wait_delivered("payments", second["payments"])
    assert s.runs["w1"].stop() == EXIT_OK and s.runs["w2"].stop() == EXIT_OK
    for name in s.names:
        verdict = check([*first[name], *second[name]], s.sink, stream=s.names[name])
        assert not verdict.lost and not verdict.out_of_order and verdict.duplicates == 0, (name, verdict)


def test_a_stream_that_does_not_exist_at_start_exits_3_naming_it(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    s = Streams(local_stack, kinesis_client, dynamodb_client, tmp_path, ["orders"], shards=1)
    missing = unique("missing")
    path = tmp_path / "efo-missing.yaml"
    path.write_text(yaml.safe_dump({"streams": [s.names["orders"], missing]}))
    run = s.start("w1", path)
    assert run.process is not None
    assert run.process.wait(60) == EXIT_NOT_FOUND, run.tail()
    assert missing in run.tail()


def test_a_stream_deleted_while_running_stops_being_read_and_the_others_go_on(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    s = Streams(local_stack, kinesis_client, dynamodb_client, tmp_path, ["orders", "clicks"], shards=2)
    port = free_port()
    run = s.start(
        "w1",
        s.config([{"stream": name, "initial_position": "TRIM_HORIZON"} for name in s.names]),
        EFO_METRICS_PORT=str(port),
    )
    first = {name: s.producers[name].put(40) for name in s.names}
    for name in s.names:
        s.wait_delivered(name, first[name])
    kinesis_client.delete_stream(StreamName=s.names["clicks"], EnforceConsumerDeletion=True)
    deleted = run.wait_for_event("stream.deleted", timeout_s=60)
    assert deleted["stream"] == s.names["clicks"], deleted
    later = s.producers["orders"].put(40)
    s.wait_delivered("orders", later)
    assert run.process is not None and run.process.poll() is None, run.tail()
    metrics = Scrape(port)
    assert metrics.value("efo_stream_reading", stream=s.names["clicks"]) == 0  # what EfoStreamNotRead fires on
    assert metrics.value("efo_stream_reading", stream=s.names["orders"]) == 1
    assert s.names["clicks"] not in metrics.streams("efo_shards_unowned"), "a deleted stream's gauges stayed"
    time.sleep(4)  # past failover_s (2 s here) and three lease cycles: the deleted stream's table view is stale
    status, body = probe(port, "/readyz")
    assert status == 200, body
    assert run.stop() == EXIT_OK
    verdict = check([*first["orders"], *later], s.sink, stream=s.names["orders"])
    assert not verdict.lost and not verdict.out_of_order and verdict.duplicates == 0, verdict


def test_a_stream_added_to_a_running_application_starts_at_its_own_initial_position(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    """initial_position applies at a stream's own first start, also when it joins an application that
    has run for a while: the new stream at LATEST skips what was written before it joined, while the
    old one reads on from its checkpoints."""
    s = Streams(local_stack, kinesis_client, dynamodb_client, tmp_path, ["orders", "payments"], shards=2)
    first = s.producers["orders"].put(40)
    s.start("w1", s.config([{"stream": "orders", "initial_position": "TRIM_HORIZON"}]))
    s.wait_delivered("orders", first)
    assert s.runs["w1"].stop() == EXIT_OK
    old_payments = s.producers["payments"].put(40)  # before payments joins: LATEST skips them
    while_stopped = s.producers["orders"].put(40)
    s.start("w1", s.config([{"stream": "orders", "initial_position": "TRIM_HORIZON"}, "payments"]))
    s.wait_until(lambda: len(s.leases("payments")) == 2 and s.holdings()["w1"] == 4, 60, "payments leased")
    new_payments = s.producers["payments"].put(40)
    s.wait_delivered("payments", new_payments)
    s.wait_delivered("orders", while_stopped)
    assert s.runs["w1"].stop() == EXIT_OK
    assert not s.delivered("payments") & {(p.shard_id, p.sequence_number) for p in old_payments}
    for name, produced in (("orders", [*first, *while_stopped]), ("payments", new_payments)):
        verdict = check(produced, s.sink, stream=s.names[name])
        assert not verdict.lost and not verdict.out_of_order and verdict.duplicates == 0, (name, verdict)


def test_a_bounded_run_over_several_streams_reads_each_to_its_end_and_exits_0(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    s = Streams(local_stack, kinesis_client, dynamodb_client, tmp_path, ["orders", "payments"], shards=2)
    backlog = {"orders": s.producers["orders"].put(80), "payments": s.producers["payments"].put(20)}
    run = s.start(
        "w1",
        s.config([{"stream": name, "initial_position": "TRIM_HORIZON"} for name in s.names]),
        EFO_RUN__UNTIL="caught-up",
    )
    assert run.process is not None
    assert run.process.wait(120) == EXIT_OK, run.tail()
    for name in s.names:
        verdict = check(backlog[name], s.sink, stream=s.names[name])
        assert not verdict.lost and not verdict.out_of_order and verdict.duplicates == 0, (name, verdict)
        assert not any(item.get("lease_owner") for item in s.leases(name).values()), f"a lease of {name} held"


def test_workers_reading_different_lists_leave_no_shard_unread_across_a_split(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    """A rolling restart that adds a stream sorting first: the old worker reads [sss], the new one
    [aaa, sss]. They count sss's extra shard from different places (aaa's one shard moves the new
    one's offset), so each could leave a free lease of sss to the other; after a split of sss (three
    readable shards), every record of every child is still delivered, and no lease keeps moving."""
    s = Streams(local_stack, kinesis_client, dynamodb_client, tmp_path, ["aaa", "sss"], shards={"aaa": 1, "sss": 2})
    s.start("w1", s.config([{"stream": "sss", "initial_position": "TRIM_HORIZON"}]))
    s.start("w2", s.config([{"stream": name, "initial_position": "TRIM_HORIZON"} for name in ("aaa", "sss")]))
    s.wait_until(lambda: sum(s.holdings().values()) == 3, 60, "both streams' shards held")
    split_first_shard(kinesis_client, s.names["sss"])  # three readable shards once the parent ends
    produced = s.producers["sss"].put(120)
    s.wait_delivered("sss", produced, timeout_s=90)
    moves = sum(
        len([e for e in run.events() if e.get("event") in ("lease.taken", "lease.handed_over")])
        for run in s.runs.values()
    )
    assert s.runs["w1"].stop() == EXIT_OK and s.runs["w2"].stop() == EXIT_OK
    verdict = check(produced, s.sink, stream=s.names["sss"])
    assert not verdict.lost and not verdict.out_of_order and verdict.duplicates == 0, verdict
    assert moves < 30, f"{moves} lease moves: the workers keep moving leases"


def test_a_fatal_error_of_one_stream_stops_every_stream_at_once_with_its_exit_code(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    """One stream's consumer deregistered (fatal, the stream is still there): every stream stops as
    after a SIGTERM, the driver too, and the process exits 3 naming the consumer, well within
    shutdown_timeout_s (60 s here: the others must not wait that long for the driver)."""
    faults = FaultClient(local_stack.kinesis_endpoint)
    faults.clear()
    # kinesis-local keeps feeding open subscriptions of a deregistered consumer (AWS ends them):
    # every subscription is cut after a few events, so the renewal meets the deregistration.
    faults.add(
        operation="SubscribeToShard",
        action="exception_frame",
        error_code="InternalFailureException",
        after_events=2,
        count=10_000,
    )
    try:
        s = Streams(local_stack, kinesis_client, dynamodb_client, tmp_path, ["orders", "clicks"], shards=1)
        run = s.start(
            "w1",
            s.config([{"stream": name, "initial_position": "TRIM_HORIZON"} for name in s.names]),
            EFO_SHUTDOWN_TIMEOUT_S="60",
        )
        first = {name: s.producers[name].put(20) for name in s.names}
        for name in s.names:
            s.wait_delivered(name, first[name])
        (consumer,) = kinesis_client.list_stream_consumers(StreamARN=s.arns["clicks"])["Consumers"]
        kinesis_client.deregister_stream_consumer(ConsumerARN=consumer["ConsumerARN"])
        assert run.process is not None
        assert run.process.wait(45) == EXIT_NOT_FOUND, run.tail()
        assert "no longer registered" in run.tail(), run.tail()
        assert not any(item.get("lease_owner") for item in s.leases("orders").values()), "orders' leases kept"
    finally:
        faults.clear()
