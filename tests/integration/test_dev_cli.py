"""`efo dev up --json` / `status` / `down` round trip (run as a separate process, like the real CLI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

from efo.devstack.stack import DEFAULT_SHARD_LIMIT, ProcessRecord, is_running, read_state

pytestmark = pytest.mark.integration

DUMMY = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}


def dev(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "efo.devstack.cli", "dev", *args, "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


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


def test_up_shard_limit_reaches_kinesis_local_and_is_shown(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    refused = dev(state_dir, "up", "--shard-limit", "0")
    assert refused.returncode == 2
    assert "--shard-limit must be >= 1" in refused.stderr
    up = dev(state_dir, "up", "--json", "--shard-limit", "4")
    assert up.returncode == 0, up.stderr
    try:
        endpoints: dict[str, Any] = json.loads(up.stdout)
        assert endpoints["shard_limit"] == 4
        kinesis = boto3.client(
            "kinesis", endpoint_url=endpoints["kinesis_endpoint"], region_name=endpoints["region"], **DUMMY
        )
        assert kinesis.describe_limits()["ShardLimit"] == 4
        status = dev(state_dir, "status")
        assert status.returncode == 0
        assert "shard limit:        4" in status.stdout
    finally:
        down = dev(state_dir, "down")
    assert down.returncode == 0, down.stderr
