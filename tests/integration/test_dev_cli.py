"""`efo dev`: `up --json` / `status` / `down` round trips (a separate process, like the real CLI), the
stack found from any directory, `env`'s lines, and `stream` and `put` on the session's stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from efo.devstack.stack import (
    DEFAULT_SHARD_LIMIT,
    ProcessRecord,
    StackEndpoints,
    is_running,
    read_state,
    write_state,
)
from efo.kinesis.kpl import deaggregate, is_aggregate

pytestmark = pytest.mark.integration

DUMMY = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
REPO = Path(__file__).resolve().parents[2]


def dev(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "efo.devstack.cli", "dev", *args, "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def dev_from(directory: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``efo dev`` as a user runs it: from ``directory``, with no --state-dir nor EFO_DEV_STATE_DIR
    (its state is per user: under XDG_STATE_HOME, here ``home``)."""
    directory.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("EFO_DEV_STATE_DIR", "XDG_STATE_HOME")}
    env.update({"XDG_STATE_HOME": str(home), "PYTHONPATH": str(REPO)})
    return subprocess.run(
        [sys.executable, "-m", "efo.devstack.cli", "dev", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_stack_is_found_from_any_directory_its_shard_limit_applies_and_its_env_lines_reach_it(
    tmp_path: Path,
) -> None:
    home = tmp_path / "state-home"
    state_file = home / "efo" / "dev" / "stack.json"
    refused = dev_from(tmp_path / "a", home, "up", "--shard-limit", "0")
    assert refused.returncode == 2
    assert "--shard-limit must be >= 1" in refused.stderr
    absent = dev_from(tmp_path / "elsewhere", home, "status")
    assert absent.returncode == 1 and f"no stack state in {state_file}" in absent.stdout
    up = dev_from(tmp_path / "a", home, "up", "--shard-limit", "4")
    assert up.returncode == 0, up.stderr
    try:
        assert f"state file:         {state_file}" in up.stdout
        assert 'eval "$(efo dev env)"' in up.stdout
        env = dev_from(tmp_path / "b", home, "env")
        assert env.returncode == 0, env.stderr
        assert up.stdout.rstrip().endswith(env.stdout.rstrip())  # up printed the same export lines
        exported = dict(line.removeprefix("export ").split("=", 1) for line in env.stdout.splitlines())
        assert exported["AWS_DEFAULT_REGION"] == exported["EFO_REGION"] == "us-east-1"
        assert exported["AWS_ENDPOINT_URL_KINESIS"] == exported["EFO_KINESIS_ENDPOINT"]
        # What a shell with these lines reaches, with the region and endpoint the AWS SDKs (and CLI) read.
        shell = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **exported}
        limit = subprocess.run(
            [sys.executable, "-c", "import boto3; print(boto3.client('kinesis').describe_limits()['ShardLimit'])"],
            env=shell,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert limit.returncode == 0 and limit.stdout.strip() == "4", limit.stderr
        status = dev_from(tmp_path / "c", home, "status")
        assert status.returncode == 0
        assert "shard limit:        4" in status.stdout
        unset = dev_from(tmp_path / "c", home, "env", "--unset")
        assert unset.stdout.split() == ["unset", *exported]
    finally:
        down = dev_from(tmp_path / "d", home, "down")
    assert down.returncode == 0, down.stderr
    assert f"state was in {state_file}" in down.stdout and not state_file.exists()
    gone = dev_from(tmp_path / "d", home, "env")
    assert gone.returncode == 1 and "no local stack is running" in gone.stderr and str(state_file) in gone.stderr


def test_stream_create_put_and_list_on_the_stack(local_stack: StackEndpoints, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    write_state(state_dir, local_stack, [])  # the session's stack; no process of its own to stop
    stream = f"dev-put-{uuid.uuid4().hex[:8]}"
    created = dev(state_dir, "stream", "create", stream, "--shards", "2")
    assert created.returncode == 0, created.stderr
    assert f"stream {stream!r} created with 2 shard(s), ACTIVE after" in created.stdout
    again = dev(state_dir, "stream", "create", stream, "--shards", "2")
    assert again.returncode == 0 and "exists already (2 open shards); nothing done" in again.stdout
    put = dev(state_dir, "put", stream, "--count", "120", "--size", "150", "--keys", "5", "--aggregate", "25", "--json")
    assert put.returncode == 0, put.stderr
    report = json.loads(put.stdout)
    assert (report["records"], report["kinesis_records"]) == (120, 5)
    plain = dev(state_dir, "put", stream, "--count", "30", "--first", "120", "--keys", "5", "--json")
    assert json.loads(plain.stdout)["kinesis_records"] == 30
    kinesis = boto3.client(
        "kinesis", endpoint_url=local_stack.kinesis_endpoint, region_name=local_stack.region, **DUMMY
    )
    numbers = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for record in kinesis.get_records(ShardIterator=iterator, Limit=1000)["Records"]:
            data = record["Data"]
            subs = [sub.data for sub in deaggregate(data)] if is_aggregate(data) else [data]
            numbers += [json.loads(sub)["n"] for sub in subs]
            assert all(len(sub) == (150 if json.loads(sub)["n"] < 120 else 100) for sub in subs)
    assert sorted(numbers) == list(range(150))
    listed = dev(state_dir, "stream", "list", "--json")
    assert {"stream": stream, "status": "ACTIVE", "open_shards": 2} in json.loads(listed.stdout)
    missing = dev(state_dir, "put", f"{stream}-nope", "--count", "1")
    assert missing.returncode == 3
    assert f"efo dev stream create {stream}-nope" in missing.stderr
    refused = dev(state_dir, "put", stream, "--count", "0", "--size", "10")
    assert refused.returncode == 2
    assert "--count 0: allowed: 1 or more" in refused.stderr and "--size 10: allowed:" in refused.stderr
    assert dev(state_dir, "stream", "delete", stream).returncode == 0


def test_up_status_down_round_trip(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    up = dev(state_dir, "up", "--json")
    assert up.returncode == 0, up.stderr
    processes: list[ProcessRecord] = []
    try:
        endpoints: dict[str, Any] = json.loads(up.stdout)
        state = read_state(state_dir)
        assert state is not None
        processes = state[1]
        assert {p.name for p in processes} == {"kinesis-local", "efo-proxy", "moto-dynamodb"}
        assert all(is_running(p) for p in processes)

        kinesis = boto3.client(
            "kinesis", endpoint_url=endpoints["kinesis_endpoint"], region_name=endpoints["region"], **DUMMY
        )
        assert kinesis.list_streams()["StreamNames"] == []
        # The default fits the benchmarks' 256-shard streams, and it is what kinesis-local enforces.
        assert endpoints["shard_limit"] == DEFAULT_SHARD_LIMIT >= 1024
        assert kinesis.describe_limits()["ShardLimit"] == DEFAULT_SHARD_LIMIT
        dynamodb = boto3.client(
            "dynamodb", endpoint_url=endpoints["dynamodb_endpoint"], region_name=endpoints["region"], **DUMMY
        )
        assert dynamodb.list_tables()["TableNames"] == []

        again = dev(state_dir, "up", "--json")
        assert again.returncode == 2
        assert "already running" in again.stderr

        status = dev(state_dir, "status", "--json")
        assert status.returncode == 0
        assert json.loads(status.stdout)["running"] is True
        assert json.loads(status.stdout)["shard_limit"] == DEFAULT_SHARD_LIMIT
    finally:
        down = dev(state_dir, "down")
    assert down.returncode == 0, down.stderr
    assert processes and not any(is_running(p) for p in processes)
    assert dev(state_dir, "status").returncode == 1
    assert dev(state_dir, "down").returncode == 0  # idempotent
