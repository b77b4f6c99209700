"""``efo run`` fails fast and clearly: a missing stream or consumer, an unreachable endpoint, a bad
setting, a sink that cannot be imported, a recreated stream. Each case is the real CLI in a
subprocess: the exit code, one ``efo: ...`` line on standard error that says what and what to do,
no traceback, and (for everything the pre-flight catches) no Spark start-up."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from efo.devstack.faults import FaultClient
from efo.devstack.stack import StackEndpoints, die_with_parent_process
from efo.errors import EXIT_CONFIG, EXIT_NOT_FOUND, EXIT_OK, EXIT_RUNTIME

from .service import (
    Result,
    ServiceRun,
    arrow_env,
    closed_port_url,
    create_stream,
    efo,
    service_env,
    trap_endpoint,
    unique,
)

pytestmark = pytest.mark.integration

# Well under the ~8-10 s a local SparkSession takes to start.
PREFLIGHT_BUDGET_S = 20.0
# efo/aws.py's control-plane clients use botocore's standard retries with max_attempts=5: a refused
# connection is tried 6 times with full-jitter exponential back-off, up to ~31 s per call.
UNREACHABLE_BUDGET_S = 60.0


def _env(stack: StackEndpoints, tmp_path: Path, stream: str, app: str | None = None, **extra: str) -> dict[str, str]:
    return service_env(
        stack,
        stream=stream,
        app=app or unique("app"),
        output=tmp_path / "out",
        initial_position="TRIM_HORIZON",
        **extra,
    )


def test_missing_stream_exits_3_with_one_line_before_spark_starts(local_stack: StackEndpoints, tmp_path: Path) -> None:
    stream = unique("missing")
    result = efo(_env(local_stack, tmp_path, stream), "run")
    assert result.code == EXIT_NOT_FOUND, result.stderr
    line = result.one_error_line()
    assert repr(stream) in line
    assert "not found" in line
    assert "EFO_STREAM" in line and "create the stream" in line
    assert result.seconds < PREFLIGHT_BUDGET_S


def test_consumer_arn_of_an_unregistered_consumer_exits_3_and_registers_nothing(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream = unique("arn")
    create_stream(kinesis_client, stream, 1)
    stream_arn = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    consumer_arn = f"{stream_arn}/consumer/{unique('ghost')}:1700000000"
    result = efo(_env(local_stack, tmp_path, stream, EFO_CONSUMER_ARN=consumer_arn), "run")
    assert result.code == EXIT_NOT_FOUND, result.stderr
    line = result.one_error_line()
    assert repr(consumer_arn) in line and "not registered" in line
    assert "efo consumers register" in line
    assert result.seconds < PREFLIGHT_BUDGET_S
    assert kinesis_client.list_stream_consumers(StreamARN=stream_arn)["Consumers"] == []


@dataclass
class Background:
    """An ``efo`` process started early and left to fail on its own while other tests run: an
    unreachable endpoint costs botocore's retries (5 retries, up to ~31 s of back-off per call)."""

    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    started: float
    finished: float | None = None

    @classmethod
    def start(cls, env: dict[str, str], directory: Path, *args: str) -> Background:
        directory.mkdir(parents=True, exist_ok=True)
        stdout, stderr = directory / "stdout", directory / "stderr"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-m", "efo.cli", *args],
                env=env,
                stdout=out,
                stderr=err,
                preexec_fn=die_with_parent_process,
            )
        background = cls(process, stdout, stderr, time.monotonic())
        threading.Thread(target=background._watch, daemon=True).start()
        return background

    def _watch(self) -> None:
        self.process.wait()
        self.finished = time.monotonic()

    def result(self, timeout_s: float) -> Result:
        try:
            code = self.process.wait(max(0.0, self.started + timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"efo still running {timeout_s} s after it started") from None
        while self.finished is None:
            time.sleep(0.01)
        return Result(code, self.stdout.read_text(), self.stderr.read_text(), self.finished - self.started)


@dataclass(frozen=True)
class Unreachable:
    kinesis: Background
    kinesis_endpoint: str
    kinesis_stream: str
    dynamodb: Background
    dynamodb_endpoint: str
    dynamodb_app: str
    dynamodb_stream: str


@pytest.fixture(scope="module", autouse=True)
def unreachable(local_stack: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Unreachable]:
    """Both unreachable-endpoint runs, started when this module starts so their retries overlap
    the other tests instead of adding up to a minute of waiting."""
    tmp = tmp_path_factory.mktemp("unreachable")
    kinesis = boto3.client(
        "kinesis",
        endpoint_url=local_stack.kinesis_endpoint,
        region_name=local_stack.region,
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    kinesis_stream, kinesis_endpoint = unique("nokinesis"), closed_port_url()
    dynamodb_stream, dynamodb_app, dynamodb_endpoint = unique("noddb"), unique("app"), closed_port_url()
    create_stream(kinesis, dynamodb_stream, 1)
    runs = Unreachable(
        Background.start(
            _env(local_stack, tmp, kinesis_stream, EFO_KINESIS_ENDPOINT=kinesis_endpoint), tmp / "kinesis", "run"
        ),
        kinesis_endpoint,
        kinesis_stream,
        Background.start(
            _env(local_stack, tmp, dynamodb_stream, dynamodb_app, EFO_DYNAMODB_ENDPOINT=dynamodb_endpoint),
            tmp / "dynamodb",
            "run",
        ),
        dynamodb_endpoint,
        dynamodb_app,
        dynamodb_stream,
    )
    yield runs
    for background in (runs.kinesis, runs.dynamodb):
        if background.process.poll() is None:
            background.process.kill()
            background.process.wait()


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        (
            "EFO_INITIAL_POSITION",
            "SOMETIMES",
            ["initial_position", "'SOMETIMES'", "LATEST, TRIM_HORIZON, AT_TIMESTAMP:<ISO-8601>"],
        ),
        (
            "EFO_POOL__MAX_PENDING_BYTES",
            "-1",
            ["pool.max_pending_bytes", "'-1'", "greater than or equal to 1024"],
        ),
        (
            "EFO_SINK",
            "kafka:x",
            [
                "sink",
                "'kafka:x'",
                "parquet:<path or URI>, handler:<module>:<function>, arrow:<module>:<function>, console",
            ],
        ),
    ],
)
def test_invalid_setting_exits_2_naming_field_value_and_allowed_values_without_aws_calls(
    local_stack: StackEndpoints, tmp_path: Path, variable: str, value: str, expected: list[str]
) -> None:
    with trap_endpoint() as (endpoint, connections):
        env = _env(
            local_stack,
            tmp_path,
            unique("cfg"),
            EFO_KINESIS_ENDPOINT=endpoint,
            EFO_DYNAMODB_ENDPOINT=endpoint,
            **{variable: value},
        )
        result = efo(env, "run", timeout_s=30)
        assert connections() == 0, "an AWS call was made before the configuration was checked"
    assert result.code == EXIT_CONFIG, result.stderr
    line = result.one_error_line()
    assert line.startswith("efo: invalid configuration: ")
    assert variable in line
    for text in expected:
        assert text in line
    assert result.seconds < 10


def test_handler_sink_that_cannot_be_imported_exits_2_naming_the_module_without_aws_calls(
    local_stack: StackEndpoints, tmp_path: Path
) -> None:
    with trap_endpoint() as (endpoint, connections):
        env = _env(
            local_stack,
            tmp_path,
            unique("sink"),
            EFO_SINK="handler:no_such_module:fn",
            EFO_KINESIS_ENDPOINT=endpoint,
            EFO_DYNAMODB_ENDPOINT=endpoint,
        )
        result = efo(env, "run", timeout_s=30)
        assert connections() == 0, "an AWS call was made before the sink was checked"
    assert result.code == EXIT_CONFIG, result.stderr
    line = result.one_error_line()
    assert "EFO_SINK" in line and "'no_such_module'" in line and "cannot import" in line
    assert result.seconds < 10


def _delete_and_recreate(kinesis: Any, stream: str, shards: int, timeout_s: float = 30.0) -> None:
    kinesis.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            kinesis.describe_stream_summary(StreamName=stream)
        except kinesis.exceptions.ResourceNotFoundException:
            break
        assert time.monotonic() < deadline, f"stream {stream} still there {timeout_s} s after DeleteStream"
        time.sleep(0.1)
    create_stream(kinesis, stream, shards)


def test_recreated_stream_exits_2_until_checkpoints_are_reset(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("recreated"), unique("app")
    create_stream(kinesis_client, stream, 1)
    env = arrow_env(local_stack, stream=stream, app=app, sink_dir=tmp_path / "out", initial_position="TRIM_HORIZON")
    summary = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    meta_key = {"pk": {"S": f"{app}|{summary['StreamARN']}"}, "sk": {"S": "meta"}}

    # The application's first start: the pre-flight bootstraps the table (meta row + leases) before
    # Spark starts, so a run stopped right after that has "run once" as far as the table knows.
    first = ServiceRun(env, tmp_path / "efo-run-0.log").start()
    first.wait_for_event("leases.bootstrapped", timeout_s=30)
    first.stop()
    assert "Item" in dynamodb_client.get_item(TableName=app, Key=meta_key, ConsistentRead=True)

    _delete_and_recreate(kinesis_client, stream, 1)
    recreated = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    assert recreated["StreamARN"] == summary["StreamARN"]
    assert recreated["StreamCreationTimestamp"] != summary["StreamCreationTimestamp"]

    refused = efo(env, "run")
    assert refused.code == EXIT_CONFIG, refused.stderr
    line = refused.one_error_line()
    assert repr(stream) in line and repr(app) in line
    assert "deleted and recreated" in line and "efo checkpoints reset --delete-all --yes" in line
    assert refused.seconds < PREFLIGHT_BUDGET_S

    not_confirmed = efo(env, "checkpoints", "reset", "--delete-all")
    assert not_confirmed.code == EXIT_CONFIG
    assert "--yes" in not_confirmed.stderr
    assert "Item" in dynamodb_client.get_item(TableName=app, Key=meta_key, ConsistentRead=True)

    reset = efo(env, "checkpoints", "reset", "--delete-all", "--yes")
    assert reset.code == EXIT_OK, reset.stderr
    assert f"of application {app!r} on stream {stream!r}" in reset.stdout
    assert "Item" not in dynamodb_client.get_item(TableName=app, Key=meta_key, ConsistentRead=True)

    restarted = ServiceRun(env, tmp_path / "efo-run-1.log").start()
    restarted.wait_for_event("service.ready")
    assert restarted.stop() == EXIT_OK, restarted.tail()
    meta = dynamodb_client.get_item(TableName=app, Key=meta_key, ConsistentRead=True)["Item"]
    assert float(meta["stream_created_at"]["N"]) == pytest.approx(recreated["StreamCreationTimestamp"].timestamp())


def test_unreachable_kinesis_endpoint_exits_1_naming_the_endpoint_and_the_stream(unreachable: Unreachable) -> None:
    result = unreachable.kinesis.result(UNREACHABLE_BUDGET_S)
    assert result.code == EXIT_RUNTIME, result.stderr
    line = result.one_error_line()
    assert "cannot connect" in line
    assert unreachable.kinesis_endpoint in line and repr(unreachable.kinesis_stream) in line
    assert result.seconds < UNREACHABLE_BUDGET_S


def test_unreachable_dynamodb_endpoint_exits_1_naming_the_table_and_registers_no_consumer(
    unreachable: Unreachable, kinesis_client: Any
) -> None:
    result = unreachable.dynamodb.result(UNREACHABLE_BUDGET_S)
    assert result.code == EXIT_RUNTIME, result.stderr
    line = result.one_error_line()
    assert "cannot connect" in line
    assert f"DynamoDB table {unreachable.dynamodb_app!r}" in line and unreachable.dynamodb_endpoint in line
    assert result.seconds < UNREACHABLE_BUDGET_S
    # Checked before anything changes: no consumer (billed per shard-hour) was registered on the way.
    stream_arn = kinesis_client.describe_stream_summary(StreamName=unreachable.dynamodb_stream)[
        "StreamDescriptionSummary"
    ]["StreamARN"]
    assert kinesis_client.list_stream_consumers(StreamARN=stream_arn)["Consumers"] == []


def test_a_start_that_fails_after_registering_the_consumer_says_so_and_how_to_remove_it(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream, app = unique("halfway"), unique("app")
    create_stream(kinesis_client, stream, 1)
    dynamodb_faults = FaultClient(local_stack.dynamodb_endpoint)
    # A role without dynamodb:CreateTable: the only refusal the read-only checks cannot see.
    dynamodb_faults.add(operation="CreateTable", action="error", error_code="AccessDeniedException", count=1)
    try:
        env = arrow_env(local_stack, stream=stream, app=app, sink_dir=tmp_path / "out", initial_position="LATEST")
        result = efo(env, "run")
    finally:
        dynamodb_faults.clear()
    assert result.code == EXIT_RUNTIME, result.stderr
    line = result.one_error_line()
    assert f"access to DynamoDB table {app!r} denied (AccessDeniedException" in line
    assert f"this start registered consumer {app!r} on stream {stream!r}, which is billed per shard-hour" in line
    assert f"'efo consumers deregister --stream {stream} --name {app} --yes'" in line
    stream_arn = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    assert [c["ConsumerName"] for c in kinesis_client.list_stream_consumers(StreamARN=stream_arn)["Consumers"]] == [app]
