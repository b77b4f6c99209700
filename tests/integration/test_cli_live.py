"""The ``efo`` CLI while real ``efo run`` workers read the stream (tests/integration/workers.py):
who reads through a consumer, the refusal to deregister it under them and ``--force``, live and
dead workers, resets applied by the owner, and the confirmation prompts on a pseudo-terminal."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.stack import StackEndpoints
from efo.errors import EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME

from .service import efo, unique
from .terminal import ANSI_ESCAPE, efo_on_terminal
from .workers import Workers

pytestmark = pytest.mark.integration


def consumer_status(kinesis: Any, stream_arn: str, name: str) -> str | None:
    try:
        description = kinesis.describe_stream_consumer(StreamARN=stream_arn, ConsumerName=name)
    except kinesis.exceptions.ResourceNotFoundException:
        return None
    return str(description["ConsumerDescription"]["ConsumerStatus"])


def register(kinesis: Any, stream_arn: str, name: str) -> str:
    arn = str(kinesis.register_stream_consumer(StreamARN=stream_arn, ConsumerName=name)["Consumer"]["ConsumerARN"])
    deadline = time.monotonic() + 30
    while consumer_status(kinesis, stream_arn, name) != "ACTIVE":
        assert time.monotonic() < deadline, f"consumer {name} not ACTIVE"
        time.sleep(0.2)
    return arn


@pytest.fixture(scope="module")
def live(local_stack: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Workers, Any, str]]:
    """Worker ``w1`` reading a 2-shard stream with records on it; yields (workers, kinesis, stream ARN)."""
    import boto3

    credentials = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
    kinesis = boto3.client(
        "kinesis", endpoint_url=local_stack.kinesis_endpoint, region_name=local_stack.region, **credentials
    )
    dynamodb = boto3.client(
        "dynamodb", endpoint_url=local_stack.dynamodb_endpoint, region_name=local_stack.region, **credentials
    )
    w = Workers(local_stack, kinesis, dynamodb, tmp_path_factory.mktemp("live"), shards=2)
    w.producer.put(40)
    w.start("w1").wait_for_event("service.ready")
    w.wait_until(lambda: not w.verdict().lost, 60, "every record read")
    arn = kinesis.describe_stream_summary(StreamName=w.stream)["StreamDescriptionSummary"]["StreamARN"]
    yield w, kinesis, arn
    w.stop("w1")


def test_consumers_list_names_the_live_worker_reading_through_the_consumer(live: tuple[Workers, Any, str]) -> None:
    w, _, _ = live
    result = efo(w.env, "consumers", "list", "--json")
    assert result.code == EXIT_OK, result.stderr
    [consumer] = json.loads(result.stdout)
    assert consumer["name"] == w.app and consumer["in_use"] is True
    [reader] = consumer["readers"]
    assert reader["table"] == w.app and reader["app"] == w.app and reader["worker_id"] == "w1"
    assert 0 <= reader["heartbeat_age_s"] < 2  # EFO_LEASE__FAILOVER_S of the tests

    table = efo(w.env, "consumers", "list", "--table", w.app)  # the same, naming the table
    assert table.code == EXIT_OK, table.stderr
    assert f" yes: {w.app}/w1 " in table.stdout
    assert ANSI_ESCAPE not in table.stdout  # no colour in a pipe


def test_workers_shows_the_live_worker_with_its_leases_version_and_consumer(live: tuple[Workers, Any, str]) -> None:
    w, _, _ = live
    result = efo(w.env, "workers", "--json")
    assert result.code == EXIT_OK, result.stderr
    [worker] = json.loads(result.stdout)
    assert worker["worker_id"] == "w1" and worker["live"] is True
    assert worker["leases"] == 2 and len(worker["shard_ids"]) == 2
    assert worker["version"] and worker["started_at"] and worker["heartbeat_at"]
    assert f"/consumer/{w.app}:" in worker["consumer_arn"]

    header, *rows = efo(w.env, "workers").stdout.splitlines()
    assert header.split() == ["STREAM", "WORKER", "STATE", "HEARTBEAT", "LEASES", "VERSION", "STARTED", "CONSUMER"]
    [row] = rows
    assert worker["stream"] == w.stream
    assert row.split()[:3] == [w.stream, "w1", "live"] and row.split()[5:7] == ["2", worker["version"]]
    assert row.split()[-1] == w.app


def test_shards_shows_the_owner_reading_each_shard(live: tuple[Workers, Any, str]) -> None:
    w, _, _ = live
    result = efo(w.env, "shards", "--json")
    assert result.code == EXIT_OK, result.stderr
    shards = json.loads(result.stdout)
    assert [(s["owner"], s["lease_state"]) for s in shards] == [("w1", "reading")] * 2
    assert all(s["checkpoint"].startswith("AFTER_SEQUENCE_NUMBER:") for s in shards)  # records were read


def test_consumers_deregister_is_refused_while_a_live_worker_reads_through_it(live: tuple[Workers, Any, str]) -> None:
    w, kinesis, stream_arn = live
    result = efo(w.env, "consumers", "deregister", "--yes")
    assert result.code == EXIT_RUNTIME
    assert result.stdout == ""
    line = result.one_error_line()
    assert line.startswith(f"efo: consumer {w.app!r} is named by the heartbeat of 1 worker(s): {w.app}/w1 (heartbeat ")
    assert line.endswith("or pass --force if they are gone (running ones fail and stop)")
    assert consumer_status(kinesis, stream_arn, w.app) == "ACTIVE"


def test_consumers_deregister_asks_on_a_terminal_and_does_nothing_on_no(live: tuple[Workers, Any, str]) -> None:
    w, kinesis, stream_arn = live
    spare = unique("spare")
    arn = register(kinesis, stream_arn, spare)

    declined = efo_on_terminal(w.env, "consumers", "deregister", "--name", spare, answer="n")
    assert declined.prompted, declined.output
    assert f"Deregister consumer {spare!r} ({arn}) from stream {w.stream!r}? [y/N]" in declined.output
    assert declined.code == EXIT_RUNTIME
    assert "efo: nothing done: not confirmed" in declined.output
    assert consumer_status(kinesis, stream_arn, spare) == "ACTIVE"

    confirmed = efo_on_terminal(w.env, "consumers", "deregister", "--name", spare, answer="y")
    assert confirmed.prompted and confirmed.code == EXIT_OK, confirmed.output
    assert f"deregistered consumer {spare!r} from stream {w.stream!r} in " in confirmed.output
    assert "; no worker read through it (lease tables checked: " in confirmed.output
    assert consumer_status(kinesis, stream_arn, spare) is None


def test_consumers_list_on_a_terminal_is_in_colour(live: tuple[Workers, Any, str]) -> None:
    w, _, _ = live
    shown = efo_on_terminal(w.env, "consumers", "list")
    assert shown.code == EXIT_OK and not shown.prompted, shown.output
    assert ANSI_ESCAPE in shown.output and w.app in shown.output


def test_checkpoints_reset_asks_on_a_terminal_and_waits_until_the_owner_applied_it(
    live: tuple[Workers, Any, str],
) -> None:
    w, _, _ = live
    shard = sorted(w.owners())[0]
    reset = efo_on_terminal(
        w.env, "checkpoints", "reset", "--shard", shard, "--to", "TRIM_HORIZON", "--wait", "--json", answer="y"
    )
    assert reset.prompted and reset.code == EXIT_OK, reset.output
    assert (
        f"Reset 1 shard(s) of application {w.app!r} on stream {w.stream!r} to TRIM_HORIZON? 1 worker(s) hold them"
        in reset.output
    )
    applied = json.loads(reset.output[reset.output.index("{") :])
    assert applied["shard_ids"] == [shard] and applied["position"] == "TRIM_HORIZON" and applied["stream"] == w.stream
    assert applied["applied"] is True and len(applied["reset_id"]) == 32
    [lease] = [s for s in json.loads(efo(w.env, "checkpoints", "show", "--json").stdout) if s["shard_id"] == shard]
    assert lease["reset_pending"] is None and lease["owner"] == "w1"


def test_force_deregisters_under_a_live_worker_which_once_killed_is_listed_dead_with_its_leases(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    w = Workers(local_stack, kinesis_client, dynamodb_client, tmp_path, shards=2)
    w.start("w1").wait_for_event("service.ready")
    stream_arn = kinesis_client.describe_stream_summary(StreamName=w.stream)["StreamDescriptionSummary"]["StreamARN"]

    forced = efo(w.env, "consumers", "deregister", "--yes", "--force", "--json")
    assert forced.code == EXIT_OK, forced.stderr
    record = json.loads(forced.stdout)
    assert record["name"] == w.app and record["deregistered"] is True and record["forced"] is True
    assert [(r["app"], r["worker_id"]) for r in record["readers"]] == [(w.app, "w1")]
    assert consumer_status(kinesis_client, stream_arn, w.app) is None

    w.stop("w1", signal.SIGKILL)  # its heartbeat row and its leases stay behind
    time.sleep(2)  # EFO_LEASE__FAILOVER_S of the tests
    [worker] = json.loads(efo(w.env, "workers", "--json").stdout)
    assert worker["worker_id"] == "w1" and worker["live"] is False
    assert worker["leases"] == 2 and worker["heartbeat_age_s"] >= 2
    shards = json.loads(efo(w.env, "shards", "--json").stdout)
    assert [(s["owner"], s["lease_state"]) for s in shards] == [("w1", "owner-dead")] * 2


def test_commands_that_would_need_a_prompt_refuse_without_a_terminal(live: tuple[Workers, Any, str]) -> None:
    w, _, _ = live
    result = efo(w.env, "checkpoints", "reset", "--delete-all")
    assert result.code == EXIT_CONFIG
    assert result.one_error_line() == (
        "efo: refusing to delete every lease and checkpoint without --yes (there is no terminal to ask on)"
    )
    assert w.holdings() == {"w1": 2}
