"""What the multi-worker tests write and check: a producer whose records carry their partition key
and a per-key counter, a Spark-free sink (``EFO_SINK=arrow:tests.integration.ledger_check:write``)
that every ``efo run`` process of a test appends to, and the invariant checker.

The checker compares what Kinesis acknowledged with what the sinks committed:

- **lost**: acknowledged and never committed (must be 0);
- **out of order**: for one partition key, a record committed for the first time after a record
  with a higher counter was (must be 0: per-key order holds within a shard's lineage, parents
  before children);
- **duplicates**: committed more than once (allowed only where a process was killed or frozen:
  the records it had not checkpointed).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUTPUT_ENV = "EFO_TEST_SINK_DIR"


def write(table: Any, batch: Any) -> None:
    """The sink: one JSON-lines file per committed batch, moved into place whole (a batch is
    either there or not), named so that files sort in commit order on this machine."""
    directory = Path(os.environ[OUTPUT_ENV])
    rows = table.select(["shard_id", "sequence_number", "partition_key", "data"]).to_pylist()
    name = f"{time.time_ns():020d}-{batch.batch_id}"
    temporary = directory / f".{name}.tmp"
    with temporary.open("w") as out:
        for row in rows:
            out.write(
                json.dumps(
                    {
                        "shard": row["shard_id"],
                        "seq": row["sequence_number"],
                        "key": row["partition_key"],
                        "data": row["data"].decode(),
                        "worker": os.environ.get("EFO_WORKER_ID", ""),
                        "batch": name,
                    }
                )
                + "\n"
            )
    temporary.rename(directory / f"{name}.jsonl")


@dataclass(frozen=True)
class Produced:
    shard_id: str
    sequence_number: str
    key: str
    counter: int


class Producer:
    """Writes records whose data is ``<key>:<counter>``; remembers what Kinesis acknowledged."""

    def __init__(self, kinesis: Any, stream: str, keys: int = 24) -> None:
        self.kinesis = kinesis
        self.stream = stream
        self.keys = [f"key-{i:03d}" for i in range(keys)]
        self.counters: Counter[str] = Counter()
        self.acknowledged: list[Produced] = []

    def put(self, count: int) -> list[Produced]:
        from efo.devstack.producer import put_all

        entries = []
        for i in range(count):
            key = self.keys[(len(self.acknowledged) + i) % len(self.keys)]
            self.counters[key] += 1
            entries.append({"Data": f"{key}:{self.counters[key]}".encode(), "PartitionKey": key})
        puts = put_all(self.kinesis, self.stream, entries)
        produced = [
            Produced(p.shard_id, p.sequence_number, p.partition_key, int(p.data.decode().rsplit(":", 1)[1]))
            for p in puts
        ]
        self.acknowledged.extend(produced)
        return produced


@dataclass
class Verdict:
    produced: int
    committed: int
    lost: list[tuple[str, str]]
    out_of_order: list[str]
    duplicates: int
    by_worker: dict[str, int]

    def __str__(self) -> str:
        return (
            f"produced={self.produced} committed={self.committed} lost={len(self.lost)} "
            f"out_of_order={len(self.out_of_order)} duplicates={self.duplicates} by_worker={self.by_worker}"
        )


def committed_rows(directory: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.jsonl")):
        rows.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return rows


def check(produced: Iterable[Produced], directory: Path) -> Verdict:
    produced = list(produced)
    rows = committed_rows(directory)
    seen: Counter[tuple[str, str]] = Counter((row["shard"], row["seq"]) for row in rows)
    lost = sorted({(p.shard_id, p.sequence_number) for p in produced} - set(seen))
    out_of_order = []
    last_counter: dict[str, int] = defaultdict(int)
    first_time: set[tuple[str, str]] = set()
    for row in rows:  # in commit order
        record = (row["shard"], row["seq"])
        if record in first_time:
            continue
        first_time.add(record)
        key, counter = row["data"].rsplit(":", 1)
        if int(counter) < last_counter[key]:
            out_of_order.append(f"{key}: {counter} after {last_counter[key]}")
        last_counter[key] = max(last_counter[key], int(counter))
    return Verdict(
        produced=len(produced),
        committed=len(rows),
        lost=lost,
        out_of_order=out_of_order,
        duplicates=sum(count - 1 for count in seen.values()),
        by_worker=dict(Counter(row["worker"] for row in rows)),
    )


def wait_until_all_committed(
    produced: Iterable[Produced], directory: Path, timeout_s: float = 90.0, alive: Any = None
) -> Verdict:
    produced = list(produced)
    deadline = time.monotonic() + timeout_s
    verdict = check(produced, directory)
    while verdict.lost and time.monotonic() < deadline:
        if alive is not None:
            alive()
        time.sleep(0.5)
        verdict = check(produced, directory)
    return verdict
