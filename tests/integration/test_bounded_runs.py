"""Bounded runs (``efo run --until``) as real ``efo run`` processes on the local stack (kinesis-local
behind the conformance proxy, the local DynamoDB), with the Spark-free sink of ledger_check.py so
that two workers fit on this machine: every record before the bound delivered once, in per-key
order, none after it; exit 0 at the end, 75 when stopped before it, 1 when a shard never answers,
2 for a bad bound; and a continuous run afterwards reads only what the bounded one left."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.faults import FaultClient
from efo.devstack.stack import StackEndpoints
from efo.errors import EXIT_CONFIG, EXIT_INCOMPLETE, EXIT_OK, EXIT_RUNTIME

from .ledger_check import check, committed_rows
from .service import efo, split_first_shard
from .terminal import efo_on_terminal
from .workers import Workers

pytestmark = pytest.mark.integration

#: Every wait of these tests has this deadline: a hang guard, not a measurement.
EXIT_WITHIN_S = 120.0


@pytest.fixture
def faults(local_stack: StackEndpoints) -> Iterator[FaultClient]:
    client = FaultClient(local_stack.kinesis_endpoint)
    client.clear()
    yield client
    client.clear()


def wait_exit(w: Workers, name: str, timeout_s: float = EXIT_WITHIN_S) -> int:
    """The worker's exit code, once it exits on its own."""
    process = w.runs[name].process
    assert process is not None
    try:
        code = process.wait(timeout_s)
    except Exception:
        process.kill()
        raise AssertionError(f"worker {name} did not exit within {timeout_s} s:\n{w.runs[name].tail()}") from None
    w.stopped.add(name)
    return code


def shard_ids(kinesis: Any, stream: str) -> list[str]:
    return sorted(s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"])


def test_two_workers_read_a_backlog_to_caught_up_across_a_split_and_both_exit_0(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path, faults: FaultClient
) -> None:
    w = Workers(local_stack, kinesis_client, dynamodb_client, tmp_path, shards=4, EFO_RUN__UNTIL="caught-up")
    backlog = w.producer.put(400)
    parent = shard_ids(kinesis_client, w.stream)[0]
    # No shard listing until both workers are alive (each retried its bootstrap, after its first
    # heartbeat): the first lease cycle of each sees two live workers, so each claims its share and
    # neither can take every lease before the other is seen, however slowly either one starts.
    faults.add(operation="ListShards", action="error", status=500, error_code="InternalFailure", count=1_000_000)
    w.start("w1")
    w.start("w2")
    w.wait_until(
        lambda: all(w.events(name, "leases.bootstrap_failed") for name in ("w1", "w2")), 60, "both workers alive"
    )
    faults.clear()
    # The parent answers nothing for its first 8 s, so the split below lands while the run reads it.
    faults.add(operation="SubscribeToShard", action="stall", shard_id=parent, stall_s=8.0, count=1)
    w.wait_until(lambda: len(w.holdings()) == 2, 60, "both workers holding leases")
    assert split_first_shard(kinesis_client, w.stream) == parent
    after_split = w.producer.put(200)  # into the children and the other shards, during the run
    assert wait_exit(w, "w1") == EXIT_OK and wait_exit(w, "w2") == EXIT_OK, w.runs["w1"].tail() + w.runs["w2"].tail()

    verdict = check(backlog, w.sink)
    assert not verdict.lost and not verdict.out_of_order and verdict.duplicates == 0, verdict
    leases = w.leases()
    assert leases[parent]["position_kind"]["S"] == "SHARD_END", "the split parent was not read to its end"
    assert set(shard_ids(kinesis_client, w.stream)) <= set(leases), "a child of the split has no lease"
    assert not any(item.get("lease_owner") for item in leases.values()), "a lease was left held"
    rows = committed_rows(w.sink)
    for name in ("w1", "w2"):
        assert w.events(name, "run.reached_end"), f"{name} did not say it reached the end"
        assert w.events(name, "shard.started"), f"{name} claimed no shard: the test proves nothing of two workers"
        assert any(row["worker"] == name for row in rows), f"{name} read no record"

    # A continuous run afterwards reads on from the final checkpoints: only what was not committed yet.
    delivered = {(row["shard"], row["seq"]) for row in committed_rows(w.sink)}
    later = w.producer.put(200)
    w.start("w3", EFO_RUN__UNTIL="")
    expected = {(p.shard_id, p.sequence_number) for p in [*backlog, *after_split, *later]}
    w.wait_until(lambda: expected <= {(r["shard"], r["seq"]) for r in committed_rows(w.sink)}, 90, "every record")
    assert w.stop("w3") == EXIT_OK
    final = check([*backlog, *after_split, *later], w.sink)
    assert not final.lost and not final.out_of_order and final.duplicates == 0, final
    continuous = {(row["shard"], row["seq"]) for row in committed_rows(w.sink) if row["worker"] == "w3"}
    assert not continuous & delivered, "the continuous run read again what the bounded run had committed"


def test_until_a_time_delivers_everything_before_it_and_nothing_at_or_after_it_across_a_split(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    w = Workers(local_stack, kinesis_client, dynamodb_client, tmp_path, shards=2)
    before = w.producer.put(120)
    split_first_shard(kinesis_client, w.stream)
    before += w.producer.put(120)  # into the children and the other shard
    time.sleep(1.5)
    until = datetime.now(UTC)
    time.sleep(1.5)
    after = w.producer.put(120)
    w.start("w1", EFO_RUN__UNTIL=until.isoformat())
    assert wait_exit(w, "w1") == EXIT_OK, w.runs["w1"].tail()

    rows = committed_rows(w.sink)
    delivered = {(row["shard"], row["seq"]) for row in rows}
    assert not delivered & {(p.shard_id, p.sequence_number) for p in after}, "a record at or after TIME delivered"
    verdict = check(before, w.sink)
    assert not verdict.lost and not verdict.out_of_order and verdict.duplicates == 0, verdict
    assert len(rows) == len(before)
    assert any(e["state"] == "cut" for e in w.events("w1", "run.shard_at_bound")), "no shard was cut at TIME"

    # The checkpoints stand at the first record at or after TIME: a continuous run reads exactly those on.
    w.start("w2", EFO_RUN__UNTIL="")
    expected = {(p.shard_id, p.sequence_number) for p in [*before, *after]}
    w.wait_until(lambda: expected <= {(r["shard"], r["seq"]) for r in committed_rows(w.sink)}, 90, "every record")
    assert w.stop("w2") == EXIT_OK
    final = check([*before, *after], w.sink)
    assert not final.lost and not final.out_of_order and final.duplicates == 0, final


def test_until_a_time_before_a_split_cuts_the_parent_and_a_later_run_reads_it_on_then_its_children(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    """The split comes after TIME: the parent's last event holds its records at and after TIME and
    its end (children). It is cut, not ended: its checkpoint stays at the cut (never SHARD_END, which
    would lose the records from the cut on for good), its children are not read, the run exits 0;
    a continuous run afterwards reads the parent from the cut, then the children: nothing lost."""
    w = Workers(local_stack, kinesis_client, dynamodb_client, tmp_path, shards=2)
    before = w.producer.put(120)
    time.sleep(1.5)
    until = datetime.now(UTC)
    time.sleep(1.5)
    after = w.producer.put(120)
    parent = split_first_shard(kinesis_client, w.stream)
    after += w.producer.put(120)  # into the children and the other shard
    children = set(shard_ids(kinesis_client, w.stream)) - {parent} - {p.shard_id for p in before}
    w.start("w1", EFO_RUN__UNTIL=until.isoformat())
    assert wait_exit(w, "w1") == EXIT_OK, w.runs["w1"].tail()

    delivered = {(row["shard"], row["seq"]) for row in committed_rows(w.sink)}
    assert not delivered & {(p.shard_id, p.sequence_number) for p in after}, "a record at or after TIME delivered"
    verdict = check(before, w.sink)
    assert not verdict.lost and not verdict.out_of_order and verdict.duplicates == 0, verdict
    leases = w.leases()
    assert any(p.shard_id == parent for p in after), "the test wrote nothing after TIME into the parent"
    assert leases[parent]["position_kind"]["S"] == "AT_SEQUENCE_NUMBER", leases[parent]
    assert not any(item.get("lease_owner") for item in leases.values()), "a lease was left held"
    assert not any(row["shard"] in children for row in committed_rows(w.sink)), "a child of the cut parent was read"

    w.start("w2", EFO_RUN__UNTIL="")
    expected = {(p.shard_id, p.sequence_number) for p in [*before, *after]}
    w.wait_until(lambda: expected <= {(r["shard"], r["seq"]) for r in committed_rows(w.sink)}, 90, "every record")
    assert w.stop("w2") == EXIT_OK
    final = check([*before, *after], w.sink)
    assert not final.lost and not final.out_of_order and final.duplicates == 0, final


def test_a_caught_up_run_on_an_idle_stream_exits_0_with_nothing_delivered_and_its_leases_released(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    w = Workers(local_stack, kinesis_client, dynamodb_client, tmp_path, shards=3)
    w.start("w1", EFO_RUN__UNTIL="caught-up")
    assert wait_exit(w, "w1", timeout_s=60) == EXIT_OK, w.runs["w1"].tail()
    assert committed_rows(w.sink) == []
    assert not any(item.get("lease_owner") for item in w.leases().values())
    [progress] = w.events("w1", "run.progress")[-1:]
    assert (progress["shards_done"], progress["shards_total"], progress["records"]) == (3, 3, 0), progress


def test_on_a_terminal_the_run_shows_its_progress_with_the_log_lines_above_it(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    w = Workers(local_stack, kinesis_client, dynamodb_client, tmp_path, shards=2)
    w.producer.put(60)
    env = {**w.env, "EFO_LOG__FORMAT": "auto", "EFO_WORKER_ID": "tty"}
    run = efo_on_terminal(env, "run", "--until", "caught-up", timeout_s=EXIT_WITHIN_S)
    assert run.code == EXIT_OK, run.output
    assert "efo run --until caught-up" in run.output and "2/2 shards" in run.output, run.output
    assert "60 records" in run.output, run.output
    assert "run.reached_end" in run.output and "leases.released" in run.output, "a log line was swallowed"
    assert len(committed_rows(w.sink)) == 60
    assert not any(item.get("lease_owner") for item in w.leases().values()), "a lease was left held"


def test_a_shard_that_never_answers_ends_the_run_with_exit_1_naming_it_and_the_timeout(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path, faults: FaultClient
) -> None:
    w = Workers(
        local_stack, kinesis_client, dynamodb_client, tmp_path, shards=2, EFO_RUN__SHARD_TIMEOUT_S="6",
        EFO_SUBSCRIPTION__READ_TIMEOUT_S="3",
    )  # fmt: skip
    silent = shard_ids(kinesis_client, w.stream)[1]
    faults.add(operation="SubscribeToShard", action="stall", shard_id=silent, count=1000)
    w.producer.put(50)
    w.start("w1", EFO_RUN__UNTIL="caught-up")
    assert wait_exit(w, "w1") == EXIT_RUNTIME, w.runs["w1"].tail()
    log = w.runs["w1"].log_path.read_text()
    assert "run.shard_timeout_s" in log and silent in log, w.runs["w1"].tail()
    assert not any(item.get("lease_owner") for item in w.leases().values()), "the leases were not released"


def test_sigterm_before_the_end_exits_75_with_what_was_read_checkpointed(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path, faults: FaultClient
) -> None:
    w = Workers(local_stack, kinesis_client, dynamodb_client, tmp_path, shards=2)
    silent = shard_ids(kinesis_client, w.stream)[1]
    faults.add(operation="SubscribeToShard", action="stall", shard_id=silent, count=1000)
    puts = w.producer.put(100)
    w.start("w1", EFO_RUN__UNTIL="caught-up")
    readable = {(p.shard_id, p.sequence_number) for p in puts if p.shard_id != silent}
    w.wait_until(lambda: readable <= {(r["shard"], r["seq"]) for r in committed_rows(w.sink)}, 60, "one shard read")
    assert w.stop("w1", signal.SIGTERM) == EXIT_INCOMPLETE, w.runs["w1"].tail()
    assert "stopped before the end of the run" in w.runs["w1"].log_path.read_text()
    faults.clear()
    # Run again: it finishes, from the checkpoints (nothing read twice).
    w.start("w2", EFO_RUN__UNTIL="caught-up")
    assert wait_exit(w, "w2") == EXIT_OK, w.runs["w2"].tail()
    verdict = check(puts, w.sink)
    assert not verdict.lost and not verdict.out_of_order and verdict.duplicates == 0, verdict


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--until", "next tuesday"], {}, "run.until (EFO_RUN__UNTIL) = 'next tuesday'"),
        (["--until", "2999-01-01T00:00:00Z"], {}, "is in the future"),
        (["--until", "2h"], {"EFO_SKIP_OLDER_THAN": "1h"}, "skip_older_than (EFO_SKIP_OLDER_THAN)"),
        ([], {"EFO_RUN__UNTIL": "soon"}, "run.until (EFO_RUN__UNTIL) = 'soon'"),
    ],
)
def test_a_bad_bound_exits_2_naming_the_field_before_anything_starts(
    local_stack: StackEndpoints,
    kinesis_client: Any,
    dynamodb_client: Any,
    tmp_path: Path,
    args: list[str],
    env: dict[str, str],
    named: str,
) -> None:
    w = Workers(local_stack, kinesis_client, dynamodb_client, tmp_path, shards=1)
    result = efo({**w.env, **env}, "run", *args, timeout_s=60)
    assert result.code == EXIT_CONFIG, result
    line = result.one_error_line()
    assert line.startswith("efo: invalid configuration:") and named in line, line
