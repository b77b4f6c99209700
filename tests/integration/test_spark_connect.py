"""Spark Connect mode (EFO_SPARK_REMOTE=sc://...): the batch path and ``efo run`` on a Connect server.

The batch test runs its Spark side in a child process (``python -m tests.integration.test_spark_connect``):
creating a Connect session sets ``SPARK_CONNECT_MODE_ENABLED`` in ``os.environ`` for good, after which
pyspark routes every ``functions``/``Column`` call of the process to Connect, and a classic session
(tests/spark) would already exist or could no longer be built. A child keeps test order irrelevant.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from efo.devstack.stack import StackEndpoints, repo_root

from .service import (
    ServiceRun,
    assert_exactly,
    create_stream,
    put_records,
    read_output,
    service_env,
    unique,
    wait_for_rows,
)
from .spark_connect import ConnectServer, spark_connect_server

pytestmark = pytest.mark.integration

JSON_SCHEMA = "id BIGINT, name STRING"
RESULT_PREFIX = "EFO-CONNECT-RESULT "


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    with spark_connect_server(tmp_path_factory.mktemp("spark-connect")) as server:
        yield server


def _payload(i: int) -> bytes:
    return b"{not json" if i % 7 == 3 else json.dumps({"id": i, "name": f"n{i}"}).encode()


def _invalid(first: int, count: int) -> int:
    return sum(1 for i in range(first, first + count) if i % 7 == 3)


def test_connect_server_listens_on_loopback_only(connect_server: ConnectServer) -> None:
    addresses = connect_server.listening_addresses()
    assert any(a.endswith(f":{connect_server.port}") for a in addresses), addresses
    assert all(a.rsplit(":", 1)[0] in ("127.0.0.1", "[::ffff:127.0.0.1]", "[::1]") for a in addresses), addresses


def test_batch_runner_on_a_connect_session_writes_parquet_and_counts_invalid_json(
    connect_server: ConnectServer, tmp_path: Path
) -> None:
    output = tmp_path / "out"
    child = subprocess.run(
        [sys.executable, "-m", "tests.integration.test_spark_connect", connect_server.url, str(output)],
        cwd=repo_root(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in child.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    assert child.returncode == 0 and lines, f"exit {child.returncode}:\n{child.stdout[-3000:]}\n{child.stderr[-3000:]}"
    result = json.loads(lines[-1].removeprefix(RESULT_PREFIX))
    assert result["session"].startswith("pyspark.sql.connect."), result
    first, again, no_action = result["batches"]
    assert (first["records"], first["duplicates"], first["invalid_json"]) == (50, 0, _invalid(0, 30) + _invalid(0, 20))
    # shard-1 10..39 again: 10..29 were delivered, 30..39 are new.
    assert (again["records"], again["duplicates"], again["invalid_json"]) == (10, 20, _invalid(30, 10))
    # The sink ran no Spark action: the count is unknown, not zero.
    assert no_action["invalid_json"] is None

    rows = read_output(output)
    assert sorted((r["efo_batch_id"], r["shard_id"], int(r["sequence_number"]) - 10**40) for r in rows) == sorted(
        [("b-1", "shard-1", i) for i in range(30)]
        + [("b-1", "shard-2", i) for i in range(20)]
        + [("b-2", "shard-1", i) for i in range(30, 40)]
    )
    for row in rows:
        i = int(row["sequence_number"]) - 10**40
        if i % 7 == 3:
            assert (row["error"], row["id"], row["name"]) == ("invalid_json", None, None)
        else:
            assert (row["error"], row["id"], row["name"]) == (None, i, f"n{i}")
        assert row["data"] == _payload(i)


def _java_children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return [c for c in children if Path(f"/proc/{c}/comm").exists() and "java" in Path(f"/proc/{c}/comm").read_text()]


def test_efo_run_with_spark_remote_delivers_exactly_once_through_the_connect_server(
    connect_server: ConnectServer, local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path
) -> None:
    stream = unique("connect")
    create_stream(kinesis_client, stream, 2)
    before = put_records(kinesis_client, stream, 200, tag="before")
    env = service_env(
        local_stack,
        stream=stream,
        app=unique("app"),
        output=tmp_path / "out",
        initial_position="TRIM_HORIZON",
        EFO_SPARK_REMOTE=connect_server.url,
    )
    run = ServiceRun(env, tmp_path / "efo-run.log").start()
    run.wait_for_event("service.ready")
    after = put_records(kinesis_client, stream, 100, tag="after")
    wait_for_rows(tmp_path / "out", 300, run)
    assert run.process is not None
    assert _java_children(run.process.pid) == [], "efo run started a local JVM despite EFO_SPARK_REMOTE"
    assert run.stop() == 0
    rows = read_output(tmp_path / "out")
    assert_exactly(rows, before + after)
    by_key = {(p.shard_id, p.sequence_number): p for p in before + after}
    for row in rows:
        put = by_key[(row["shard_id"], row["sequence_number"])]
        assert (row["data"], row["partition_key"], row["stream"]) == (put.data, put.partition_key, stream)
    assert any(e["event"] == "batch.committed" for e in run.events())


# ---- the child process of the batch test ---------------------------------------------------------


def _chunk(shard: str, first: int, count: int, serial: int) -> Any:
    from efo.pipeline.records import RecordChunk, Row

    rows = (
        Row(str(10**40 + i), _payload(i), f"pk-{i % 3}", 1_700_000_000_000 + i) for i in range(first, first + count)
    )
    return RecordChunk.of_rows("orders", shard, serial, rows)


class _NoActionSink:
    def write(self, df: Any, batch: Any) -> None:
        pass


def _batches_over_connect(url: str, output: str) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from sparkbridge.batches import BatchRunner, ValueDecoder
    from sparkbridge.sinks import ParquetSink

    spark = SparkSession.builder.remote(url).create()
    try:
        runner = BatchRunner(
            spark, ParquetSink(output), max_attempts=1, retry_backoff_s=0, decoder=ValueDecoder("json", JSON_SCHEMA)
        )
        results = [
            runner.run("b-1", [_chunk("shard-1", 0, 30, 1), _chunk("shard-2", 0, 20, 1)]),
            runner.run("b-2", [_chunk("shard-1", 10, 30, 2)]),
            BatchRunner(
                spark, _NoActionSink(), max_attempts=1, retry_backoff_s=0, decoder=ValueDecoder("json", JSON_SCHEMA)
            ).run("b-3", [_chunk("shard-3", 0, 10, 1)]),
        ]
        batches = [
            {"records": r.info.records, "duplicates": r.duplicates, "invalid_json": r.invalid_json} for r in results
        ]
        return {"session": type(spark).__module__, "batches": batches}
    finally:
        spark.stop()


if __name__ == "__main__":
    print(RESULT_PREFIX + json.dumps(_batches_over_connect(sys.argv[1], sys.argv[2])), flush=True)
