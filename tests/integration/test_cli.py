"""The operator commands of the ``efo`` CLI as a subprocess: ``config validate|show``, and ``shards``,
``leases``, ``consumer show|deregister`` against a stream the service has run on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from efo.devstack.stack import StackEndpoints
from efo.errors import EXIT_CONFIG, EXIT_NOT_FOUND, EXIT_OK

from .service import ServiceRun, arrow_env, create_stream, efo, service_env, unique

pytestmark = pytest.mark.integration

DUMMY_CREDENTIALS = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}


def table_rows(stdout: str) -> tuple[list[str], list[list[str]]]:
    """The header and the rows of a printed table (columns are separated by two or more spaces)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    header = lines[0].split()
    return header, [line.split() for line in lines[1:]]


@dataclass(frozen=True)
class RanOnce:
    env: dict[str, str]
    stream: str
    stream_arn: str
    app: str
    shard_ids: list[str]


@pytest.fixture(scope="module")
def ran_once(local_stack: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RanOnce]:
    """A 2-shard stream that ``efo run`` consumed once (started, ready, stopped with SIGTERM)."""
    kinesis = boto3.client(
        "kinesis", endpoint_url=local_stack.kinesis_endpoint, region_name=local_stack.region, **DUMMY_CREDENTIALS
    )
    stream, app = unique("cli"), unique("app")
    create_stream(kinesis, stream, 2)
    tmp = tmp_path_factory.mktemp("cli")
    env = arrow_env(local_stack, stream=stream, app=app, sink_dir=tmp / "out", initial_position="TRIM_HORIZON")
    run = ServiceRun(env, tmp / "efo-run.log").start()
    run.wait_for_event("service.ready")
    assert run.stop() == EXIT_OK, run.tail()
    summary = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    shard_ids = sorted(s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"])
    yield RanOnce(env, stream, summary["StreamARN"], app, shard_ids)


@pytest.fixture
def offline_env(local_stack: StackEndpoints, tmp_path: Path) -> dict[str, str]:
    """Settings for commands that make no AWS call."""
    return service_env(
        local_stack, stream=unique("offline"), app="orders", output=tmp_path / "out", initial_position="LATEST"
    )


# ---- config -------------------------------------------------------------------------------------


def test_config_validate_exits_0_with_valid_settings(offline_env: dict[str, str], tmp_path: Path) -> None:
    result = efo(offline_env, "config", "validate")
    assert result.code == EXIT_OK, result.stderr
    assert result.stdout.strip() == (
        f"configuration is valid: stream={offline_env['EFO_STREAM']} app=orders sink=parquet:{tmp_path / 'out'}"
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"EFO_BATCH__MAX_WAIT_S": "0"}, "batch.max_wait_s (EFO_BATCH__MAX_WAIT_S) = '0'"),
        ({"EFO_STREAM": None}, "stream (EFO_STREAM) is required"),
        ({"EFO_VALUE_FORMAT": "xml"}, "value_format (EFO_VALUE_FORMAT) = 'xml'"),
    ],
)
def test_config_validate_exits_2_naming_the_bad_setting(
    offline_env: dict[str, str], change: dict[str, str | None], expected: str
) -> None:
    env = dict(offline_env)
    for name, value in change.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = value
    result = efo(env, "config", "validate")
    assert result.code == EXIT_CONFIG
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("efo: invalid configuration: ")
    assert expected in result.stderr


def test_config_show_prints_the_effective_settings_with_the_environment_winning_over_yaml(
    offline_env: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "efo.yaml"
    config.write_text(
        "pool:\n  max_pending_records: 5\n  reserved_records_per_shard: 3\nlog:\n  level: WARNING\ntable: from-yaml\n"
    )
    env = {**offline_env, "EFO_POOL__MAX_PENDING_RECORDS": "7"}
    result = efo(env, "config", "show", "--config", str(config))
    assert result.code == EXIT_OK, result.stderr
    shown = json.loads(result.stdout)
    assert shown["pool"]["max_pending_records"] == 7  # the environment wins
    assert shown["pool"]["reserved_records_per_shard"] == 3  # the rest of the YAML section stays
    assert shown["log"]["level"] == "WARNING"
    assert shown["table"] == "from-yaml"
    assert shown["stream"] == offline_env["EFO_STREAM"] and shown["app"] == "orders"
    assert shown["sink"] == f"parquet:{tmp_path / 'out'}"
    assert shown["batch"]["max_wait_s"] == 1.0  # FAST_SETTINGS in the environment
    assert shown["initial_position"] == "LATEST"


def test_config_show_reports_the_sink_of_the_yaml_file(offline_env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "efo.yaml"
    config.write_text(f"sink: parquet:{tmp_path / 'yaml-out'}\n")
    env = {k: v for k, v in offline_env.items() if k != "EFO_SINK"}
    validated = efo(env, "config", "validate", "--config", str(config))
    assert validated.code == EXIT_OK, validated.stderr
    assert f"sink=parquet:{tmp_path / 'yaml-out'}" in validated.stdout
    shown = efo(env, "config", "show", "--config", str(config))
    assert shown.code == EXIT_OK, shown.stderr
    assert json.loads(shown.stdout)["sink"] == f"parquet:{tmp_path / 'yaml-out'}"


def test_config_show_with_a_missing_file_exits_2_naming_it(offline_env: dict[str, str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = efo(offline_env, "config", "show", "--config", str(missing))
    assert result.code == EXIT_CONFIG
    assert result.stderr.strip() == f"efo: cannot read the configuration file {missing}: No such file or directory"


# ---- operator commands against a stream the service has run on ----------------------------------


def test_shards_prints_the_shard_tree_as_a_table_and_as_json(ran_once: RanOnce) -> None:
    table = efo(ran_once.env, "shards")
    assert table.code == EXIT_OK, table.stderr
    header, rows = table_rows(table.stdout)
    assert header == ["shard_id", "parents", "state", "children"]
    assert [row[0] for row in rows] == ran_once.shard_ids
    assert all(row[1:] == ["open"] for row in rows)  # no parents, open, no children

    as_json = efo(ran_once.env, "shards", "--json")
    assert as_json.code == EXIT_OK, as_json.stderr
    assert json.loads(as_json.stdout) == [
        {"shard_id": shard_id, "parents": "", "state": "open", "children": ""} for shard_id in ran_once.shard_ids
    ]


def test_leases_prints_released_leases_with_checkpoints_as_a_table_and_as_json(ran_once: RanOnce) -> None:
    as_json = efo(ran_once.env, "leases", "--json")
    assert as_json.code == EXIT_OK, as_json.stderr
    leases = json.loads(as_json.stdout)
    assert [lease["shard_id"] for lease in leases] == ran_once.shard_ids
    for lease in leases:
        assert set(lease) == {"shard_id", "owner", "counter", "checkpoint", "parents"}
        assert lease["owner"] == ""  # released at the clean stop
        assert lease["counter"] >= 2  # claimed, then released
        assert lease["checkpoint"] and lease["checkpoint"] != "SHARD_END"
        assert lease["parents"] == ""

    table = efo(ran_once.env, "leases")
    assert table.code == EXIT_OK, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["shard_id", "owner", "counter", "checkpoint", "parents"]
    assert len(lines) == 1 + len(ran_once.shard_ids)
    for line, lease in zip(lines[1:], leases, strict=True):
        assert line.split() == [lease["shard_id"], str(lease["counter"]), lease["checkpoint"]]


def test_consumer_show_prints_the_registered_consumer_as_a_table_and_as_json(ran_once: RanOnce) -> None:
    as_json = efo(ran_once.env, "consumer", "show", "--json")
    assert as_json.code == EXIT_OK, as_json.stderr
    [consumer] = json.loads(as_json.stdout)
    assert consumer["ConsumerName"] == ran_once.app
    assert consumer["ConsumerARN"].startswith(f"{ran_once.stream_arn}/consumer/{ran_once.app}:")
    assert consumer["ConsumerStatus"] == "ACTIVE"
    assert consumer["ConsumerCreationTimestamp"]

    table = efo(ran_once.env, "consumer", "show")
    assert table.code == EXIT_OK, table.stderr
    header, rows = table_rows(table.stdout)
    assert header == ["ConsumerName", "ConsumerARN", "ConsumerStatus", "ConsumerCreationTimestamp"]
    assert len(rows) == 1
    assert rows[0][:3] == [ran_once.app, consumer["ConsumerARN"], "ACTIVE"]


def test_consumer_deregister_without_yes_exits_2_and_leaves_the_consumer(
    ran_once: RanOnce, kinesis_client: Any
) -> None:
    result = efo(ran_once.env, "consumer", "deregister")
    assert result.code == EXIT_CONFIG
    assert result.stdout == ""
    assert "refusing to deregister without --yes" in result.stderr
    description = kinesis_client.describe_stream_consumer(StreamARN=ran_once.stream_arn, ConsumerName=ran_once.app)
    assert description["ConsumerDescription"]["ConsumerStatus"] == "ACTIVE"


def test_operator_commands_on_a_missing_stream_exit_3_naming_it(ran_once: RanOnce) -> None:
    stream = unique("missing")
    env = {**ran_once.env, "EFO_STREAM": stream}
    for command in (["shards"], ["leases", "--json"], ["consumer", "show"]):
        result = efo(env, *command)
        assert result.code == EXIT_NOT_FOUND, (command, result.stderr)
        assert "Traceback" not in result.stderr
        assert result.stdout == ""
        [line] = result.stderr.strip().splitlines()
        assert line.startswith(f"efo: stream {stream!r} not found")
        assert "check EFO_STREAM and EFO_REGION, or create the stream" in line
