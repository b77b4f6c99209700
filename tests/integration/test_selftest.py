"""``efo selftest`` on the local stack: the whole path verified, and nothing left behind, whether it
succeeds, is interrupted (by its test hook at the start of each of its seven steps, three of them in
make test; by SIGTERM from outside while the worker reads), or fails (its worker refused CreateTable).

A stream or table not yet deletable when interrupted is tests/unit/test_selftest.py's, on a fake
account."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.faults import FaultClient
from efo.devstack.stack import StackEndpoints, die_with_parent_process
from efo.errors import EXIT_OK, EXIT_RUNTIME
from efo.selftest.run import PREFIX, STEPS, TEST_INTERRUPT_VARIABLE

from .service import Result, efo

pytestmark = pytest.mark.integration


def env_of(stack: StackEndpoints, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EFO_", "AWS_"))}
    env.update(
        {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "EFO_REGION": stack.region,
            "EFO_KINESIS_ENDPOINT": stack.kinesis_endpoint,
            "EFO_DYNAMODB_ENDPOINT": stack.dynamodb_endpoint,
            "TMPDIR": str(tmp_path),  # its local files, to see that they are gone too
            **extra,
        }
    )
    return env


def name_of(output: str) -> str:
    found = re.search(rf"Kinesis stream\s+({PREFIX}[0-9a-f]{{8}})", output)
    assert found, output
    return found.group(1)


def left_behind(kinesis: Any, dynamodb: Any, name: str) -> list[str]:
    """What of this run is still there (a stream or table being deleted, or gone between the listing
    and the description, counts as gone: kinesis-local deletes a while after DeleteStream answers)."""
    left = []
    if name in kinesis.list_streams()["StreamNames"]:
        try:
            status = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]["StreamStatus"]
        except kinesis.exceptions.ResourceNotFoundException:
            status = "DELETING"
        if status != "DELETING":
            left.append(f"stream {name} ({status})")
    if name in dynamodb.list_tables()["TableNames"]:
        try:
            status = dynamodb.describe_table(TableName=name)["Table"]["TableStatus"]
        except dynamodb.exceptions.ResourceNotFoundException:
            status = "DELETING"
        if status != "DELETING":
            left.append(f"table {name} ({status})")
    return left


def assert_nothing_left(result: Result, kinesis: Any, dynamodb: Any, tmp_path: Path) -> str:
    name = name_of(result.stdout)
    assert left_behind(kinesis, dynamodb, name) == [], result.stdout + result.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(name)], "its local files are left"
    worker = re.search(r"the worker \(pid (\d+)\)", result.stdout)
    if worker:
        assert (
            not Path(f"/proc/{worker.group(1)}").exists()
            or "zombie" in Path(f"/proc/{worker.group(1)}/status").read_text().lower()
        ), "the worker still runs"
    return name


def test_the_whole_path_is_verified_and_everything_it_made_is_deleted(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    result = efo(env_of(local_stack, tmp_path), "selftest", "--yes", "--records", "400", timeout_s=240)
    assert result.code == EXIT_OK, result.stdout + result.stderr
    assert "efo selftest creates, in region us-east-1 of these credentials, and deletes again:" in result.stdout
    assert "Cost at us-east-1 list prices" in result.stdout
    assert re.search(r"verified: 400 records put, \d+ delivered .*in order per key", result.stdout)
    assert "split shardId-" in result.stdout
    name = assert_nothing_left(result, kinesis_client, dynamodb_client, tmp_path)
    assert f"deleted stream {name} (with its consumer), table {name}" in result.stdout


#: One step of each state the clean-up meets on the local stack (a stream; a stream, its consumer, the
#: worker and its table; all that and a split) runs in make test; the other steps are long tests (make
#: chaos). tests/unit/test_selftest.py interrupts every step on a fake account in make test.
IN_MAKE_TEST = ("put", "split", "verify")


@pytest.mark.parametrize(
    "step", [step if step in IN_MAKE_TEST else pytest.param(step, marks=pytest.mark.long) for step in STEPS]
)
def test_interrupted_at_each_step_it_deletes_everything_it_made(
    step: str, local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    """Its test hook raises a Ctrl-C at the start of ``step``: whatever the steps before it made (the
    stream, its consumer, the worker, its table, a split) is deleted, and the worker stopped."""
    env = env_of(local_stack, tmp_path, **{TEST_INTERRUPT_VARIABLE: step})
    result = efo(env, "selftest", "--yes", "--records", "200", timeout_s=240)
    assert result.code == EXIT_RUNTIME, result.stdout + result.stderr
    assert f"interrupted at step {step}" in result.stdout
    assert "everything it made is deleted" in result.stderr
    name = assert_nothing_left(result, kinesis_client, dynamodb_client, tmp_path)
    if step != STEPS[0]:
        assert f"deleted stream {name} (with its consumer)" in result.stdout


def test_sigterm_from_outside_while_the_worker_reads_deletes_everything(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    out = tmp_path / "selftest.out"
    with out.open("wb") as stdout:
        process = subprocess.Popen(
            [sys.executable, "-m", "efo.cli", "selftest", "--yes", "--records", "200"],
            env=env_of(local_stack, tmp_path),
            stdout=stdout,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent_process,
        )
    deadline = time.monotonic() + 120
    while "the worker (pid" not in out.read_text():
        assert process.poll() is None and time.monotonic() < deadline, out.read_text()
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    code = process.wait(120)
    text = out.read_text()
    assert code == EXIT_RUNTIME, text
    assert re.search(r"interrupted at step (split|put-more|caught-up)", text), text
    assert_nothing_left(Result(code, text, "", 0.0), kinesis_client, dynamodb_client, tmp_path)


def test_a_worker_that_fails_fails_the_selftest_naming_its_cause_and_nothing_is_left(
    local_stack: StackEndpoints, kinesis_client: Any, dynamodb_client: Any, tmp_path: Path
) -> None:
    faults = FaultClient(local_stack.dynamodb_endpoint)
    faults.add(operation="CreateTable", action="error", error_code="AccessDeniedException", count=1)
    try:
        result = efo(env_of(local_stack, tmp_path), "selftest", "--yes", "--records", "100", timeout_s=240)
    finally:
        faults.clear()
    assert result.code == EXIT_RUNTIME, result.stdout + result.stderr
    assert "step start-worker failed: the worker exited 1 before the worker's first records: efo: access to " in (
        result.stdout
    )
    assert_nothing_left(result, kinesis_client, dynamodb_client, tmp_path)
