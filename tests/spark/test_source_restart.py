"""The driver of an efo source query killed (SIGKILL) with a batch written but not committed, then the
query restarted from its checkpoint: nothing lost, each key's records in order, the uncommitted batch
read again (by GetRecords, on the executor) with exactly the same rows, so that a sink idempotent per
batch id writes nothing twice and any other sink duplicates only that batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.stack import StackEndpoints, die_with_parent_process
from tests.integration.service import create_stream, put_records, unique
from tests.integration.source import Row, verdict

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DRIVER = Path(__file__).with_name("source_driver.py")
WITHIN_S = 120.0


def start_driver(stack: StackEndpoints, stream: str, tmp: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    places = [str(tmp / "checkpoint"), str(tmp / "out")]
    args = [str(DRIVER), stack.kinesis_endpoint, stack.region, stream, *places, *extra]
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, *args],
            stdout=sink,
            stderr=sink,
            start_new_session=True,  # its JVM in its group: the kill below reaches both, and nothing else
            preexec_fn=die_with_parent_process,
        )


def written(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Each attempt's file of each batch: ``<batch id>-<attempt>`` -> its rows."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(out.glob("*.json"))}


def wait_for(check: Any, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + WITHIN_S
    while not check():
        if process.poll() is not None:
            raise AssertionError(f"the driver exited {process.returncode} before {what}:\n{log.read_text()[-4000:]}")
        assert time.monotonic() < deadline, f"no {what} within {WITHIN_S} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.3)


def test_a_driver_killed_with_a_batch_uncommitted_restarts_from_the_checkpoint_with_that_batch_replayed_exactly(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream = unique("spark-kill")
    create_stream(kinesis_client, stream, 2)
    puts = put_records(kinesis_client, stream, 90, tag="a", keys=8)
    out = tmp_path / "out"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    held = 3  # batch 0 pins nothing (TRIM_HORIZON starts with records): 1, 2, 3 hold 15 rows each
    first = start_driver(local_stack, stream, tmp_path, first_log, "--hold", str(held))
    try:
        wait_for(lambda: (out / "held").exists(), "the held batch", first, first_log)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    committed = {int(p.name) for p in (tmp_path / "checkpoint" / "commits").iterdir() if p.name.isdigit()}
    assert held not in committed and held - 1 in committed, f"commits at the kill: {sorted(committed)}"
    puts += put_records(kinesis_client, stream, 60, tag="b", keys=8)  # while the query is down

    second = start_driver(local_stack, stream, tmp_path, second_log)
    try:
        wanted = {(p.shard_id, p.sequence_number) for p in puts}
        wait_for(
            lambda: wanted <= {(r["shard"], r["seq"]) for rows in written(out).values() for r in rows},
            "every record after the restart",
            second,
            second_log,
        )
    finally:
        os.killpg(second.pid, signal.SIGTERM)
        second.wait(30)

    files = written(out)
    attempts: dict[int, list[str]] = defaultdict(list)
    for name in files:
        attempts[int(name.split("-")[0])].append(name)
    # Any sink: every write, in batch order; duplicates come from the held batch alone.
    every = [
        Row("", r["shard"], r["seq"], None, r["key"], r["data"].encode(), batch)
        for batch in sorted(attempts)
        for name in attempts[batch]
        for r in files[name]
    ]
    result = verdict(puts, every)
    assert not result.lost and not result.out_of_order and not result.unexpected, result
    assert [batch for batch, names in attempts.items() if len(names) > 1] == [held]
    assert result.duplicates == len(files[attempts[held][0]]) > 0
    # The held batch read again after the restart holds exactly the rows it held before the kill.
    again = [files[name] for name in attempts[held]]
    assert all(rows == again[0] for rows in again), "the replayed batch differs from the killed one"
    assert '"event": "source.replayed"' in second_log.read_text(), "the batch was not read again by GetRecords"
    # A sink idempotent per batch id (the last attempt of each batch wins): nothing twice.
    idempotent = [
        Row("", r["shard"], r["seq"], None, r["key"], r["data"].encode(), batch)
        for batch in sorted(attempts)
        for r in files[attempts[batch][-1]]
    ]
    assert verdict(puts, idempotent).ok
