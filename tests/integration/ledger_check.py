"""What the multi-worker tests write and check: a producer whose records carry their partition key
and a per-key counter, a Spark-free sink (``EFO_SINK=arrow:tests.integration.ledger_check:write``)
that every ``efo run`` process of a test appends to, and the invariant checker.

The checker compares what Kinesis acknowledged with what the sinks committed:

- **lost**: acknowledged and never committed (must be 0);
- **out of order**: for one partition key, a record committed for the first time after a record
  with a higher counter was (must be 0: per-key order holds within a shard's lineage, parents
  before children);
- **duplicates**: committed more than once (allowed only where a process was killed or frozen:
  the records it had not checkpointed). Given the :class:`Disruption` list, ``check`` makes that
  bound exact: each names its victims and their checkpoints as the lease table had them at that
  moment; a duplicate is due only if a victim committed it past its shard's checkpoint, one extra
  copy per such commit (``Verdict.undue`` lists the records with more copies than that).

The sink misbehaves on request, per process (the chaos tests): ``EFO_TEST_SINK_FAIL_EVERY=n`` raises
on every n-th call, before writing; ``EFO_TEST_SINK_DELAY_S=s`` takes s seconds per batch;
``EFO_TEST_SINK_HANG_AFTER=n`` never returns from the call after n written batches.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

OUTPUT_ENV = "EFO_TEST_SINK_DIR"
FAIL_EVERY_ENV = "EFO_TEST_SINK_FAIL_EVERY"
DELAY_ENV = "EFO_TEST_SINK_DELAY_S"
HANG_AFTER_ENV = "EFO_TEST_SINK_HANG_AFTER"

_calls = itertools.count(1)
_written = itertools.count(1)
#: What a hanging call waits for: never set in a service process (a unit test sets it).
hang_released = threading.Event()


class InjectedSinkFailure(RuntimeError):
    pass


def _misbehave() -> None:
    """What the environment asks of this call: fail, take its time, or never return."""
    call = next(_calls)
    fail_every = int(os.environ.get(FAIL_EVERY_ENV) or 0)
    if fail_every and call % fail_every == 0:
        raise InjectedSinkFailure(f"{FAIL_EVERY_ENV}={fail_every}: call {call} fails")
    hang_after = os.environ.get(HANG_AFTER_ENV)
    if hang_after and next(_written) > int(hang_after):
        # A log line of the process's own format, so that a test knows when the hang began.
        event = {"event": "test_sink.hanging", "timestamp": datetime.now(UTC).isoformat()}
        print(json.dumps(event), file=sys.stderr, flush=True)
        hang_released.wait()
    time.sleep(float(os.environ.get(DELAY_ENV) or 0))


def write(table: Any, batch: Any) -> None:
    """The sink: one JSON-lines file per committed batch, moved into place whole (a batch is
    either there or not), named so that files sort in commit order on this machine."""
    _misbehave()
    directory = Path(os.environ[OUTPUT_ENV])
    rows = table.select(["stream", "shard_id", "sequence_number", "partition_key", "data"]).to_pylist()
    committed_ns = time.time_ns()
    name = f"{committed_ns:020d}-{batch.batch_id}"
    temporary = directory / f".{name}.tmp"
    with temporary.open("w") as out:
        for row in rows:
            out.write(
                json.dumps(
                    {
                        "stream": row["stream"],
                        "shard": row["shard_id"],
                        "seq": row["sequence_number"],
                        "key": row["partition_key"],
                        "data": row["data"].decode(),
                        "worker": os.environ.get("EFO_WORKER_ID", ""),
                        "pid": os.getpid(),
                        "batch": name,
                        "committed_ns": committed_ns,
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
    """Writes records whose data is ``<pad><key>:<counter>``; remembers what Kinesis acknowledged."""

    def __init__(self, kinesis: Any, stream: str, keys: int = 24, pad: str = "", hash_key: str | None = None) -> None:
        self.kinesis = kinesis
        self.stream = stream
        self.pad = pad  # makes the records as large as a test needs; the checker reads it as part of the key
        self.hash_key = hash_key  # an ExplicitHashKey for every record: all of them to one shard
        self.keys = [f"key-{i:03d}" for i in range(keys)]
        self.counters: Counter[str] = Counter()
        self.acknowledged: list[Produced] = []

    def put(self, count: int) -> list[Produced]:
        from efo.devstack.producer import put_all

        entries = []
        for i in range(count):
            key = self.keys[(len(self.acknowledged) + i) % len(self.keys)]
            self.counters[key] += 1
            entry = {"Data": f"{self.pad}{key}:{self.counters[key]}".encode(), "PartitionKey": key}
            if self.hash_key is not None:
                entry["ExplicitHashKey"] = self.hash_key
            entries.append(entry)
        puts = put_all(self.kinesis, self.stream, entries)
        produced = [
            Produced(p.shard_id, p.sequence_number, p.partition_key, int(p.data.decode().rsplit(":", 1)[1]))
            for p in puts
        ]
        self.acknowledged.extend(produced)
        return produced


@dataclass(frozen=True)
class Checkpoint:
    """A lease row's checkpoint, as far as the records of its shard a next owner reads again."""

    kind: str
    sequence_number: int | None = None

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> Checkpoint:
        """From a lease row as DynamoDB returns it (efo/leases/table.py)."""
        sequence_number = lease.get("sequence_number", {}).get("S")
        return cls(lease["position_kind"]["S"], None if sequence_number is None else int(sequence_number))

    def reads_again(self, sequence_number: str) -> bool:
        if self.kind == "SHARD_END":
            return False
        if self.sequence_number is None:  # TRIM_HORIZON, or a moment (LATEST's first start, AT_TIMESTAMP)
            return True
        if self.kind == "AFTER_SEQUENCE_NUMBER":
            return int(sequence_number) > self.sequence_number
        return int(sequence_number) >= self.sequence_number


@dataclass(frozen=True)
class Disruption:
    """A kill, a freeze or an outage: what its victims had committed past ``checkpoints`` (their
    shards' checkpoints as the lease table had them then) may be committed again by whoever reads
    those shards next. ``victims`` are (worker id, pid) pairs, None for every process;
    ``until_ns`` bounds the commits that count (None: the victims are gone). ``stream``: the
    stream whose shards ``checkpoints`` names (several streams have the same shard ids), None
    for a test of one stream; a disruption of several streams is one of these per stream."""

    what: str
    checkpoints: Mapping[str, Checkpoint]
    victims: frozenset[tuple[str, int]] | None = None
    until_ns: int | None = None
    stream: str | None = None

    def accounts_for(self, row: Mapping[str, Any]) -> bool:
        """``row`` (a committed record) is one this disruption may have left uncheckpointed."""
        if self.stream is not None and row["stream"] != self.stream:
            return False
        if self.victims is not None and (row["worker"], row["pid"]) not in self.victims:
            return False
        if self.until_ns is not None and row["committed_ns"] > self.until_ns:
            return False
        checkpoint = self.checkpoints.get(row["shard"])
        return checkpoint is not None and checkpoint.reads_again(row["seq"])


@dataclass
class Verdict:
    produced: int
    committed: int
    lost: list[tuple[str, str]]
    out_of_order: list[str]
    duplicates: int
    by_worker: dict[str, int]
    #: Extra copies the disruptions account for (each commit a victim left uncheckpointed may be
    #: repeated once: the bound), and the records with more extra copies than that (must be none).
    allowed: int = 0
    undue: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"produced={self.produced} committed={self.committed} lost={len(self.lost)} "
            f"out_of_order={len(self.out_of_order)} duplicates={self.duplicates} (allowed {self.allowed}, "
            f"undue {len(self.undue)}) by_worker={self.by_worker}"
        )


def committed_rows(directory: Path, stream: str | None = None) -> list[dict[str, Any]]:
    """What the sink committed, in commit order; of one stream only if ``stream`` is given."""
    rows: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.jsonl")):
        rows.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return rows if stream is None else [row for row in rows if row["stream"] == stream]


def check(
    produced: Iterable[Produced], directory: Path, disruptions: Iterable[Disruption] = (), *, stream: str | None = None
) -> Verdict:
    """The verdict over what the sink committed (of ``stream`` only, if given: several streams
    have the same shard ids and partition keys)."""
    produced = list(produced)
    rows = committed_rows(directory, stream)
    disruptions = list(disruptions)
    # Each commit a disruption left uncheckpointed may be committed once more by the next reader:
    # a record's extra copies are due up to the number of its commits some disruption accounts for.
    allowed: Counter[tuple[str, str]] = Counter(
        (row["shard"], row["seq"]) for row in rows if any(d.accounts_for(row) for d in disruptions)
    )
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
        allowed=sum(allowed.values()),
        undue=sorted(record for record, count in seen.items() if count - 1 > allowed[record]),
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
