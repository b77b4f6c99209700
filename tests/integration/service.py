"""Helpers for integration tests of ``efo run``: streams, producers, the service process, its output."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

from efo.devstack.producer import Put, put_all, wait_active
from efo.devstack.stack import StackEndpoints, die_with_parent_process

# Settings that make a test run quick without changing behaviour.
FAST_SETTINGS = {
    "EFO_BATCH__MAX_WAIT_S": "1",
    "EFO_CHECKPOINT__INTERVAL_S": "0.5",
    "EFO_SHARDS__SYNC_INTERVAL_S": "1",
    "EFO_LEASE__HEARTBEAT_INTERVAL_S": "0.5",
    "EFO_LEASE__FAILOVER_S": "2",
    "EFO_SPARK__MASTER": "local[1]",
    "EFO_SPARK__CONF": json.dumps(
        {"spark.driver.memory": "512m", "spark.sql.shuffle.partitions": "1", "spark.default.parallelism": "1"}
    ),
    "EFO_LOG__FORMAT": "json",
}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_stream(kinesis: Any, name: str, shards: int, timeout_s: float = 30.0) -> None:
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    wait_active(kinesis, name, timeout_s)


def put_records(kinesis: Any, stream: str, count: int, *, keys: int = 16, tag: str = "r") -> list[Put]:
    """Put ``count`` records; returns what Kinesis acknowledged, in the order it acknowledged them."""
    entries = ({"Data": f"{tag}-{i}".encode(), "PartitionKey": f"k{i % keys}"} for i in range(count))
    return put_all(kinesis, stream, entries)


def split_first_shard(kinesis: Any, stream: str) -> str:
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]
    low, high = int(shard["HashKeyRange"]["StartingHashKey"]), int(shard["HashKeyRange"]["EndingHashKey"])
    kinesis.split_shard(StreamName=stream, ShardToSplit=shard["ShardId"], NewStartingHashKey=str((low + high) // 2))
    wait_active(kinesis, stream)
    return str(shard["ShardId"])


@dataclass
class ServiceRun:
    """One ``efo run`` process with JSON logs captured to a file."""

    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    args: tuple[str, ...] = ()  # after ``efo run``, e.g. ("--config", path)

    def start(self) -> ServiceRun:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "efo.cli", "run", *self.args],
                env=self.env,
                stdout=log,
                stderr=log,
                preexec_fn=die_with_parent_process,
            )
        return self

    def events(self) -> Iterator[dict[str, Any]]:
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    yield json.loads(line)
                except ValueError:
                    continue

    def wait_for_event(self, name: str, timeout_s: float = 90.0, count: int = 1) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [e for e in self.events() if e.get("event") == name]
            if len(found) >= count:
                return found[count - 1]
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"efo run exited {self.process.returncode} before {name}:\n{self.tail()}")
            time.sleep(0.2)
        raise AssertionError(f"no {name} within {timeout_s} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)  # the process, never its group: the JVM must outlive the drain
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"efo run did not stop within {timeout_s} s:\n{self.tail()}") from None


def operator_lines(stderr: str) -> list[str]:
    """The ``efo: ...`` lines an operator reads: plain, or with JSON logs the event of a JSON line."""
    lines = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            try:
                line = str(json.loads(line).get("event", ""))
            except ValueError:
                pass
        if line.startswith("efo: "):
            lines.append(line)
    return lines


#: What Spark writes when it starts: a command that fails in its pre-flight must not show them.
SPARK_MARKERS = ("SparkContext", "log4j", "SparkSession")


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def error_lines(self) -> list[str]:
        return operator_lines(self.stderr)

    def one_error_line(self) -> str:
        """The operator's one line; no traceback, no Spark start-up on the way to it."""
        assert "Traceback" not in self.stderr, self.stderr
        assert len(self.error_lines) == 1, self.stderr
        output = self.stdout + self.stderr
        assert not [m for m in SPARK_MARKERS if m in output], f"Spark was started:\n{output}"
        return self.error_lines[0]


def _sigint_as_in_a_terminal() -> None:
    """A suite started in the background (``make test &``, nohup) hands its children SIGINT ignored, and
    Python then never turns it into KeyboardInterrupt: efo selftest's interrupt hook (a real SIGINT) did
    nothing. A command run from a terminal has SIGINT's default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def efo(env: dict[str, str], *args: str, timeout_s: float = 120.0) -> Result:
    """One ``efo`` command as a subprocess, its output captured."""
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "efo.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        preexec_fn=_sigint_as_in_a_terminal,
    )
    return Result(completed.returncode, completed.stdout, completed.stderr, time.monotonic() - started)


def closed_port_url() -> str:
    """A loopback URL nothing listens on: connections are refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@contextmanager
def trap_endpoint() -> Iterator[tuple[str, Any]]:
    """A loopback URL that accepts connections and never answers; ``count()`` says how many were made."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        sock.setblocking(False)

        def count() -> int:
            accepted = 0
            while True:
                try:
                    conn, _ = sock.accept()
                except BlockingIOError:
                    return accepted
                conn.close()
                accepted += 1

        yield f"http://127.0.0.1:{sock.getsockname()[1]}", count


def service_env(
    stack: StackEndpoints, *, stream: str, app: str, output: Path, initial_position: str, **extra: str
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFO_")}
    env.update(
        {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "EFO_STREAM": stream,
            "EFO_APP": app,
            "EFO_INITIAL_POSITION": initial_position,
            "EFO_SINK": f"parquet:{output}",
            "EFO_REGION": stack.region,
            "EFO_KINESIS_ENDPOINT": stack.kinesis_endpoint,
            "EFO_DYNAMODB_ENDPOINT": stack.dynamodb_endpoint,
            **FAST_SETTINGS,
            **extra,
        }
    )
    return env


REPO_ROOT = Path(__file__).resolve().parents[2]


def arrow_env(
    stack: StackEndpoints, *, stream: str, app: str, sink_dir: Path, initial_position: str, **extra: str
) -> dict[str, str]:
    """``service_env`` with the Spark-free sink of tests/integration/ledger_check.py: no JVM, so a
    process is ready in a second or two and several fit on this machine at once."""
    sink_dir.mkdir(parents=True, exist_ok=True)
    return service_env(
        stack,
        stream=stream,
        app=app,
        output=sink_dir,
        initial_position=initial_position,
        EFO_SINK="arrow:tests.integration.ledger_check:write",
        EFO_TEST_SINK_DIR=str(sink_dir),
        PYTHONPATH=str(REPO_ROOT),
        **extra,
    )


def raw_lease_table(dynamodb: Any, *, app: str, stream_arn: str, created: Any, **meta: Any) -> str:
    """A lease table made by hand, as an older (or a grown) efo left it: the table and its meta row
    (of a complete first start, with ``meta``'s DynamoDB attributes added). Returns the control
    partition's key."""
    dynamodb.create_table(
        TableName=app,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
    )
    control = f"{app}|{stream_arn}"
    dynamodb.put_item(
        TableName=app,
        Item={
            "pk": {"S": control},
            "sk": {"S": "meta"},
            "stream_created_at": {"N": repr(created.timestamp())},
            "initial_position": {"S": "TRIM_HORIZON"},
            "started_at": {"N": repr(time.time())},
            "complete": {"BOOL": True},
            **meta,
        },
    )
    return control


def read_output(path: Path) -> list[dict[str, Any]]:
    """What the sink committed: the Parquet output, or the JSON lines of the arrow sink in
    ledger_check.py (the same columns, batches in commit order)."""
    if not path.exists():
        return []
    if any(path.glob("*.jsonl")):
        from .ledger_check import committed_rows

        return [
            {
                "shard_id": row["shard"],
                "sequence_number": row["seq"],
                "partition_key": row["key"],
                "data": row["data"].encode(),
                "efo_batch_id": row["batch"],
            }
            for row in committed_rows(path)
        ]
    table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table()
    return table.to_pylist()


def wait_for_rows(
    path: Path, count: int, run: ServiceRun | None = None, timeout_s: float = 90.0
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        try:
            rows = read_output(path)
        except (OSError, ValueError):
            rows = []
        if len(rows) >= count:
            return rows
        if run is not None and run.process is not None and run.process.poll() is not None:
            raise AssertionError(f"efo run exited {run.process.returncode}:\n{run.tail()}")
        time.sleep(0.5)
    raise AssertionError(f"{len(rows)} of {count} rows after {timeout_s} s" + (f":\n{run.tail()}" if run else ""))


def keys(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["shard_id"], r["sequence_number"]) for r in rows]


def assert_exactly(rows: list[dict[str, Any]], puts: list[Put]) -> None:
    got = keys(rows)
    expected = {(p.shard_id, p.sequence_number) for p in puts}
    missing = expected - set(got)
    assert not missing, f"{len(missing)} acknowledged records missing, e.g. {sorted(missing)[:3]}"
    assert len(got) == len(set(got)), f"{len(got) - len(set(got))} duplicates"
    unexpected = set(got) - expected
    assert not unexpected, f"{len(unexpected)} records that were never put, e.g. {sorted(unexpected)[:3]}"
