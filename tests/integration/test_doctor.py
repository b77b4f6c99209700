"""``efo doctor`` against the local stack, each check both ways: holding on an application that ran
once, failing where the conformance proxy and the local DynamoDB refuse chosen actions on chosen
resources with AccessDeniedException (as a role without them would), and where a stream,
consumer, table, sink or credential is missing or wrong: the exit code, and the finding that
names the action and the resource.

Each case runs efo's CLI (its ``main``: parsing, settings, exit code, last line) in this process,
with the case's environment alone; one runs it as a process, as a pod does. The parquet sink's
checks (Spark, the file system, the test write) are tests/spark/test_filesystems.py's, on the
session of the Spark tests: they call no AWS, and a JVM of their own here would cost 10 s or more."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import structlog

from efo.cli import main
from efo.devstack.faults import FaultClient
from efo.devstack.producer import wait_active
from efo.devstack.stack import StackEndpoints
from efo.doctor.table import DOCTOR_PARTITION
from efo.errors import EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME

from .service import Result, arrow_env, create_stream, efo, unique

pytestmark = pytest.mark.integration

DUMMY = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}


@dataclass(frozen=True)
class Ran:
    env: dict[str, str]
    stream: str
    stream_arn: str
    app: str
    consumer_arn: str


@pytest.fixture(scope="module")
def ran(local_stack: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Ran:
    """A 2-shard stream that efo run read once to its end (consumer, table and rows made)."""
    kinesis = boto3.client(
        "kinesis", endpoint_url=local_stack.kinesis_endpoint, region_name=local_stack.region, **DUMMY
    )
    stream, app = unique("doctor"), unique("app")
    create_stream(kinesis, stream, 2)
    env = arrow_env(
        local_stack, stream=stream, app=app, sink_dir=tmp_path_factory.mktemp("doctor"), initial_position="LATEST"
    )
    first = efo(env, "run", "--until", "caught-up")
    assert first.code == EXIT_OK, first.stderr
    stream_arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    [consumer] = kinesis.list_stream_consumers(StreamARN=stream_arn)["Consumers"]
    return Ran(env, stream, stream_arn, app, consumer["ConsumerARN"])


@pytest.fixture
def faults(local_stack: StackEndpoints) -> Iterator[tuple[FaultClient, FaultClient]]:
    """The proxy's and the local DynamoDB's fault rules, cleared after the test."""
    kinesis, dynamodb = FaultClient(local_stack.kinesis_endpoint), FaultClient(local_stack.dynamodb_endpoint)
    try:
        yield kinesis, dynamodb
    finally:
        kinesis.clear()
        dynamodb.clear()


Doctor = Callable[..., tuple[Result, dict[str, Any]]]


@pytest.fixture
def doctor(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Doctor:
    """``doctor(env, *args)``: ``efo doctor --json *args`` in this process, in the environment
    ``env`` alone (as a process would have it); its exit code, output and report. The logging it
    configures for an operator (efo.cli.common.operator_logging) is put back afterwards."""

    def run(env: dict[str, str], *args: str) -> tuple[Result, dict[str, Any]]:
        logging_config, handlers = structlog.get_config(), logging.root.handlers[:]
        started = time.monotonic()
        with monkeypatch.context() as patch:
            for name in set(os.environ) - set(env):
                patch.delenv(name)
            for name, value in env.items():
                patch.setenv(name, value)
            try:
                code = main(["doctor", "--json", *args])
            finally:
                structlog.configure(**logging_config)
                logging.root.handlers[:] = handlers
        out, err = capsys.readouterr()
        assert "Traceback" not in err, err
        return Result(code, out, err, time.monotonic() - started), json.loads(out) if out else {}

    return run


def found(report: dict[str, Any], check: str, resource: str | None = None) -> list[dict[str, str]]:
    return [c for c in report["checks"] if c["check"] == check and (resource is None or c["resource"] == resource)]


def status(report: dict[str, Any], check: str, resource: str | None = None) -> str:
    statuses = {c["status"] for c in found(report, check, resource)}
    assert len(statuses) == 1, (check, resource, report["checks"])
    return statuses.pop()


HOLDING = (
    "settings",
    "credentials",
    "region",
    "kinesis:DescribeStreamSummary",
    "kinesis:ListShards",
    "stream.status",
    "stream.shards",
    "kinesis:DescribeStreamConsumer",
    "consumer",
    "kinesis:SubscribeToShard",
    "kms:Decrypt",
    "dynamodb:DescribeTable",
    "table.keys",
    "table.capacity",
    "dynamodb:GetItem",
    "dynamodb:Query",
    "table.layout",
    "stream.retention",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "sink.module",
)


def test_everything_a_deployment_needs_holds_for_an_application_that_ran(
    ran: Ran, dynamodb_client: Any, doctor: Doctor
) -> None:
    result, report = doctor(ran.env, "--workers", "2")
    assert result.code == EXIT_OK, result.stdout + result.stderr
    assert report["ok"] is True
    for check in HOLDING:
        assert status(report, check) == "ok", found(report, check)
    assert status(report, "kinesis:SubscribeToShard", ran.consumer_arn) == "ok"
    [layout] = found(report, "table.layout")
    assert "written for this stream, 8 lease partitions" in layout["detail"]
    assert "1 per worker over 2 worker(s)" in found(report, "stream.shards")[0]["detail"]
    settings = {r["setting"]: r for r in report["settings"] if r["stream"] is None}
    assert settings["app"]["value"] == ran.app and settings["app"]["source"] == "environment"
    # Its own probe item is gone again: the doctor leaves nothing in the table.
    probe = dynamodb_client.query(
        TableName=ran.app,
        KeyConditionExpression="pk = :p",
        ExpressionAttributeValues={":p": {"S": DOCTOR_PARTITION}},
    )
    assert probe["Items"] == []
    # As a pod runs it: a process of its own, and the table.
    table = efo(ran.env, "doctor", timeout_s=180)
    assert table.code == EXIT_OK and table.stdout.splitlines()[0].split() == ["CHECK", "RESOURCE", "RESULT", "DETAIL"]


#: Groups of actions refused at once (each group one run), each on the resource IAM would refuse it
#: on; none refuses what another check of its group needs to run (a refused DescribeStreamConsumer
#: leaves no consumer to subscribe through: SubscribeToShard is refused in another group).
REFUSALS = {
    "list-consumer-get-put-delete": [
        ("kinesis", "ListShards", "stream_arn"),
        ("kinesis", "DescribeStreamConsumer", "stream_arn"),
        ("dynamodb", "GetItem", "table"),
        ("dynamodb", "PutItem", "table"),
        ("dynamodb", "DeleteItem", "table"),
    ],
    "subscribe-query-update": [
        ("kinesis", "SubscribeToShard", "consumer_arn"),
        ("dynamodb", "Query", "table"),
        ("dynamodb", "UpdateItem", "table"),
    ],
    "describe": [("kinesis", "DescribeStreamSummary", "stream"), ("dynamodb", "DescribeTable", "table")],
}


@pytest.mark.parametrize("group", list(REFUSALS))
def test_each_refused_action_is_found_naming_the_action_and_its_resource(
    ran: Ran, faults: tuple[FaultClient, FaultClient], doctor: Doctor, group: str
) -> None:
    names = {"stream": ran.stream, "stream_arn": ran.stream_arn, "consumer_arn": ran.consumer_arn, "table": ran.app}
    kinesis, dynamodb = faults
    for service, operation, resource in REFUSALS[group]:
        (kinesis if service == "kinesis" else dynamodb).add(
            operation=operation,
            action="error",
            error_code="AccessDeniedException",
            message=f"not authorized to perform: {service}:{operation}",
            resource=names[resource],
            count=100,
        )
    result, report = doctor(ran.env)
    assert result.code == EXIT_RUNTIME, result.stdout + result.stderr
    assert report["ok"] is False
    for service, operation, _ in REFUSALS[group]:
        action = f"{service}:{operation}"
        refused = [c for c in found(report, action) if c["status"] == "fail"]
        assert refused, (action, report["checks"])
        assert f"refused (AccessDeniedException): grant {action} on " in refused[0]["detail"]
        assert refused[0]["detail"].endswith("the IAM policy in the README's 'Pointing it at AWS'")
    assert result.stderr.strip().splitlines()[-1].startswith("efo: ")
    if group == "describe":  # nothing to stand on: the checks that need the stream or the table say so
        assert status(report, "stream") == "skip" and status(report, "table") == "skip"
    else:
        assert status(report, "kinesis:DescribeStreamSummary") == "ok" and status(report, "table.keys") == "ok"
    if group == "list-consumer-get-put-delete":  # the consumer unknown: what needs it says so
        assert status(report, "consumer") == "skip" and status(report, "kinesis:SubscribeToShard") == "skip"
        assert status(report, "table.layout") == "skip"  # its rows could not be read


def test_what_is_missing_is_found_and_what_the_first_start_makes_is_named(
    ran: Ran, local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, doctor: Doctor, tmp_path: Path
) -> None:
    stream, app = unique("fresh"), unique("fresh-app")
    create_stream(kinesis_client, stream, 2)
    kinesis_client.start_stream_encryption(StreamName=stream, EncryptionType="KMS", KeyId="alias/aws/kinesis")
    wait_active(kinesis_client, stream)
    env = arrow_env(local_stack, stream=stream, app=app, sink_dir=tmp_path / "out", initial_position="LATEST")
    result, report = doctor({**env, "EFO_LEASE__MAX_LEASES_PER_WORKER": "1"})
    assert result.code == EXIT_RUNTIME  # two shards, one worker of at most one lease
    assert "leaves 1 shard(s) unread" in found(report, "stream.shards")[0]["detail"]
    [kms] = found(report, "kms:Decrypt", "alias/aws/kinesis")
    assert kms["status"] == "warn" and "the role needs kms:Decrypt on it" in kms["detail"]
    assert (
        status(report, "consumer") == "warn" and "the first start registers" in found(report, "consumer")[0]["detail"]
    )
    assert status(report, "kinesis:SubscribeToShard") == "skip"
    assert status(report, "table") == "warn" and "the first start creates it" in found(report, "table")[0]["detail"]
    assert app not in dynamodb_client.list_tables()["TableNames"]  # the doctor made nothing
    stream_arn = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    assert kinesis_client.list_stream_consumers(StreamARN=stream_arn)["Consumers"] == []

    ghost = f"{ran.stream_arn}/consumer/ghost:1700000000"
    unregistered, report = doctor({**ran.env, "EFO_CONSUMER_ARN": ghost})
    assert unregistered.code == EXIT_RUNTIME and status(report, "consumer", ghost) == "fail"

    # A stream that does not exist, a table keyed for something else and a sink module that does not
    # import, found in one run: none of these checks needs what another finds missing.
    other = unique("kcl")
    dynamodb_client.create_table(
        TableName=other,
        BillingMode="PROVISIONED",
        ProvisionedThroughput={"ReadCapacityUnits": 1, "WriteCapacityUnits": 1},
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
    )
    wrong = {"EFO_STREAM": f"{stream}-gone", "EFO_TABLE": other, "EFO_SINK": "handler:no_such_module:write"}
    missing, report = doctor({**env, **wrong})
    assert missing.code == EXIT_RUNTIME
    assert (
        status(report, "kinesis:DescribeStreamSummary") == "fail"
        and "not found" in found(report, "kinesis:DescribeStreamSummary")[0]["detail"]
    )
    assert status(report, "table.keys") == "fail"
    assert "keyed leaseKey (HASH, S)" in found(report, "table.keys")[0]["detail"]
    assert status(report, "sink.module") == "fail" and "no_such_module" in found(report, "sink.module")[0]["detail"]
    assert missing.stderr.strip().splitlines()[-1].startswith("efo: 3 of ")


def test_without_credentials_or_region_no_aws_check_runs_and_it_says_why(
    ran: Ran, doctor: Doctor, tmp_path: Path
) -> None:
    env = {k: v for k, v in ran.env.items() if not k.startswith("AWS_")}
    env.update(
        {
            "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_EC2_METADATA_DISABLED": "true",  # nothing beyond loopback is asked
        }
    )
    env.pop("EFO_REGION")
    result, report = doctor(env)
    assert result.code == EXIT_RUNTIME
    assert status(report, "credentials") == "fail" and status(report, "region") == "fail"
    assert "set EFO_REGION (or AWS_DEFAULT_REGION)" in found(report, "region")[0]["detail"]
    assert status(report, "aws") == "skip"
    assert not found(report, "kinesis:DescribeStreamSummary")


def test_settings_that_do_not_validate_are_refused_before_any_check(ran: Ran, doctor: Doctor) -> None:
    result, _ = doctor({**ran.env, "EFO_BATCH__MAX_WAIT_S": "soon"})
    assert result.code == EXIT_CONFIG
    assert result.stdout == "" and "batch.max_wait_s (EFO_BATCH__MAX_WAIT_S) = 'soon'" in result.stderr
