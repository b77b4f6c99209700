"""`efo dev`: the `up` / `status` / `env` / `down` round trip of a stack of its own, from several
directories (separate processes, as a user runs them), and `stream` and `put` on the session's stack
(efo dev's main in this process: tests/integration/test_local_path.py runs them as processes)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from efo.devstack.cli import SHELL_VARIABLES, add_dev_commands, main
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


def test_up_status_env_down_round_trip_finds_the_stack_from_any_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``up`` and ``down`` are processes of their own started from two directories, as a user's
    shells run them; the commands between them run efo dev's main in this process, from other
    directories (the state is found by XDG_STATE_HOME alone, whatever the directory)."""
    home = tmp_path / "state-home"
    state_file = home / "efo" / "dev" / "stack.json"
    monkeypatch.delenv("EFO_DEV_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(home))

    def dev_in(directory: Path, *args: str) -> tuple[int, str, str]:
        directory.mkdir(parents=True, exist_ok=True)
        monkeypatch.chdir(directory)
        code = main(["dev", *args])
        out, err = capsys.readouterr()
        return code, out, err

    assert dev_in(tmp_path / "a", "up", "--shard-limit", "0")[0] == 2  # refused before anything starts
    code, out, _ = dev_in(tmp_path / "elsewhere", "status")
    assert code == 1 and f"no stack state in {state_file}" in out
    up = dev_from(tmp_path / "a", home, "up", "--shard-limit", "4")
    assert up.returncode == 0, up.stderr
    processes: list[ProcessRecord] = []
    try:
        assert f"state file:         {state_file}" in up.stdout and 'eval "$(efo dev env)"' in up.stdout
        state = read_state(state_file.parent)
        assert state is not None
        endpoints, processes = state
        assert endpoints.shard_limit == 4
        assert {p.name for p in processes} == {"kinesis-local", "efo-proxy", "moto-dynamodb"}
        assert all(is_running(p) for p in processes)
        code, _, err = dev_in(tmp_path / "b", "up")
        assert code == 2 and "already running" in err

        code, out, err = dev_in(tmp_path / "b", "env")
        assert code == 0, err
        assert up.stdout.rstrip().endswith(out.rstrip())  # up printed the same export lines
        exported = dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines())
        assert list(exported) == list(SHELL_VARIABLES)  # what env --unset takes away (tests/unit/test_dev_state.py)
        assert exported["AWS_DEFAULT_REGION"] == exported["EFO_REGION"] == "us-east-1"
        assert exported["AWS_ENDPOINT_URL_KINESIS"] == exported["EFO_KINESIS_ENDPOINT"]
        # What a shell with these lines reaches, with the region and endpoints the AWS SDKs (and CLI) read.
        with monkeypatch.context() as shell:
            for name in [name for name in os.environ if name.startswith("AWS_")]:
                shell.delenv(name)
            for name, value in exported.items():
                shell.setenv(name, value)
            sdk = boto3.session.Session()  # a session of its own reads this environment
            kinesis, dynamodb = sdk.client("kinesis"), sdk.client("dynamodb")
            assert kinesis.describe_limits()["ShardLimit"] == 4
            assert kinesis.list_streams()["StreamNames"] == [] and dynamodb.list_tables()["TableNames"] == []
        code, out, _ = dev_in(tmp_path / "c", "status")
        assert code == 0
        assert "shard limit:        4" in out and f"state file:         {state_file}" in out
    finally:
        down = dev_from(tmp_path / "d", home, "down")
    assert down.returncode == 0, down.stderr
    assert f"state was in {state_file}" in down.stdout and not state_file.exists()
    assert processes and not any(is_running(p) for p in processes)
    assert dev_in(tmp_path / "c", "status")[0] == 1
    assert dev_in(tmp_path / "c", "down")[0] == 0  # idempotent
    code, _, err = dev_in(tmp_path / "e", "env")
    assert code == 1 and "no local stack is running" in err and str(state_file) in err


def test_the_default_shard_limit_fits_the_benchmarks_and_is_what_kinesis_local_enforces(kinesis_client: Any) -> None:
    parser = argparse.ArgumentParser()
    add_dev_commands(parser.add_subparsers())
    assert parser.parse_args(["dev", "up"]).shard_limit == DEFAULT_SHARD_LIMIT >= 1024  # 256-shard benchmarks
    assert kinesis_client.describe_limits()["ShardLimit"] == DEFAULT_SHARD_LIMIT  # the session's stack: the default


def test_stream_create_put_and_list_on_the_stack(
    local_stack: StackEndpoints, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_dir = tmp_path / "state"
    write_state(state_dir, local_stack, [])  # the session's stack; no process of its own to stop

    def dev_here(*args: str) -> tuple[int, str, str]:
        code = main(["dev", *args, "--state-dir", str(state_dir)])
        out, err = capsys.readouterr()
        return code, out, err

    stream = f"dev-put-{uuid.uuid4().hex[:8]}"
    code, out, err = dev_here("stream", "create", stream, "--shards", "2")
    assert code == 0, err
    assert f"stream {stream!r} created with 2 shard(s), ACTIVE after" in out
    code, out, _ = dev_here("stream", "create", stream, "--shards", "2")
    assert code == 0 and "exists already (2 open shards); nothing done" in out
    code, out, err = dev_here(
        "put", stream, "--count", "120", "--size", "150", "--keys", "5", "--aggregate", "25", "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    assert (report["records"], report["kinesis_records"]) == (120, 5)
    code, out, _ = dev_here("put", stream, "--count", "30", "--first", "120", "--keys", "5", "--json")
    assert code == 0 and json.loads(out)["kinesis_records"] == 30
    code, out, _ = dev_here("put", stream, "--count", "10", "--first", "150", "--keys", "5")
    assert code == 0 and f"put 10 records of 100 bytes to stream {stream!r} over 5 partition keys" in out
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
    assert sorted(numbers) == list(range(160))
    code, out, _ = dev_here("stream", "list", "--json")
    assert {"stream": stream, "status": "ACTIVE", "open_shards": 2} in json.loads(out)
    code, _, err = dev_here("put", f"{stream}-nope", "--count", "1")
    assert code == 3
    assert f"efo dev stream create {stream}-nope" in err
    code, _, err = dev_here("put", stream, "--count", "0", "--size", "10")
    assert code == 2
    assert "--count 0: allowed: 1 or more" in err and "--size 10: allowed:" in err
    code, out, _ = dev_here("stream", "delete", stream)
    assert code == 0 and f"stream {stream!r} deleted" in out
    code, out, _ = dev_here("stream", "list", "--json")
    assert stream not in [row["stream"] for row in json.loads(out)]
