"""Helpers for tests of the Spark source (efo.source, pyspark_efo) on the local stack: its options,
micro-batches planned as Spark plans them, and the verdict on what a query read (nothing lost,
per-key order, duplicates). Records are put with tests.integration.service.put_records."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from efo.devstack.producer import Put, wait_active
from efo.devstack.stack import StackEndpoints
from efo.source.engine import Engine, Planned, initial_offset
from efo.source.options import SourceOptions, parse

#: Every wait of these tests has this deadline: a hang guard, not a measurement.
WITHIN_S = 90.0


def source_options(stack: StackEndpoints, stream: str, **options: str) -> dict[str, str]:
    """The options of a source on the local stack (quick shard listings)."""
    return {
        "streams": stream,
        "consumerName": "test-source",
        "region": stack.region,
        "endpoint": stack.kinesis_endpoint,
        "startingPosition": "TRIM_HORIZON",
        "shardSyncInterval": "1",
        **options,
    }


@dataclass(frozen=True)
class Row:
    stream: str
    shard_id: str
    sequence_number: str
    sub_sequence_number: int | None
    partition_key: str
    data: bytes
    batch: int  # the micro-batch it came in


@dataclass
class Verdict:
    lost: list[Put] = field(default_factory=list)
    duplicates: int = 0
    out_of_order: list[str] = field(default_factory=list)  # keys whose records came out of put order
    unexpected: int = 0  # rows no put names (records of other producers, or the bound's later ones)

    @property
    def ok(self) -> bool:
        return not self.lost and not self.duplicates and not self.out_of_order and not self.unexpected


def verdict(puts: Sequence[Put], rows: Iterable[Row]) -> Verdict:
    """What ``rows`` (in delivered order: batch by batch, and in a batch as handed on) did with ``puts``
    (in the order Kinesis acknowledged them): each key's records must come in that order."""
    rows = list(rows)
    out = Verdict()
    wanted = {(p.shard_id, p.sequence_number) for p in puts}
    seen: dict[tuple[str, str], int] = defaultdict(int)
    for row in rows:
        seen[(row.shard_id, row.sequence_number)] += 1
    out.duplicates = sum(n - 1 for n in seen.values() if n > 1)
    out.lost = [p for p in puts if (p.shard_id, p.sequence_number) not in seen]
    out.unexpected = sum(1 for key in seen if key not in wanted)
    by_key: dict[str, list[bytes]] = defaultdict(list)
    for put in puts:
        by_key[put.partition_key].append(put.data)
    got: dict[str, list[bytes]] = defaultdict(list)
    for row in rows:
        if (row.shard_id, row.sequence_number) in wanted and row.data not in got[row.partition_key]:
            got[row.partition_key].append(row.data)
    for key, data in by_key.items():
        delivered = [d for d in got.get(key, []) if d in set(data)]
        expected = [d for d in data if d in set(delivered)]
        if delivered != expected:
            out.out_of_order.append(key)
    return out


@dataclass
class Batch:
    start: dict[str, Any]
    end: dict[str, Any]
    planned: Planned


def rows_of(batches: Sequence[Batch]) -> list[Row]:
    return [
        Row(c.stream, c.shard_id, seq, sub, key, data, index)
        for index, batch in enumerate(batches)
        for c in batch.planned.chunks
        for seq, sub, key, data in zip(
            c.sequence_numbers, c.sub_sequence_numbers, c.partition_keys, c.data, strict=True
        )
    ]


def engine_of(stack: StackEndpoints, stream: str, *, available_now_at_ms: int | None = None, **options: str) -> Engine:
    return Engine(parse(source_options(stack, stream, **options)), available_now_at_ms=available_now_at_ms).start()


def plan_until(
    engine: Engine,
    rows: int,
    *,
    start: dict[str, Any] | None = None,
    max_rows: int | None = None,
    max_bytes: int | None = None,
    within_s: float = WITHIN_S,
) -> list[Batch]:
    """Micro-batches as Spark would plan them, from ``start`` (the initial offset by default), until
    ``rows`` rows were read; each batch's end is the next one's start."""
    batches: list[Batch] = []
    start = start if start is not None else initial_offset()
    deadline = time.monotonic() + within_s
    read = 0
    while read < rows:
        assert time.monotonic() < deadline, f"{read} of {rows} rows within {within_s} s"
        planned = engine.plan(start, max_rows, max_bytes)
        if not planned.advanced:
            time.sleep(0.2)
            continue
        batches.append(Batch(start, planned.end, planned))
        read += planned.rows
        start = planned.end
    return batches


def options_of(stack: StackEndpoints, stream: str, **options: str) -> SourceOptions:
    return parse(source_options(stack, stream, **options))


def split(kinesis: Any, stream: str, shard_id: str) -> None:
    """Split ``shard_id`` in two halves of its hash key range (tests.integration.service.split_first_shard
    splits the first listed shard, closed after a first split)."""
    (shard,) = [s for s in kinesis.list_shards(StreamName=stream)["Shards"] if s["ShardId"] == shard_id]
    low, high = int(shard["HashKeyRange"]["StartingHashKey"]), int(shard["HashKeyRange"]["EndingHashKey"])
    kinesis.split_shard(StreamName=stream, ShardToSplit=shard_id, NewStartingHashKey=str((low + high) // 2))
    wait_active(kinesis, stream)


def merge_children(kinesis: Any, stream: str, parent: str) -> str:
    """Merge the two children of ``parent`` (adjacent by construction); returns the merged shard's id."""
    children = sorted(
        s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"] if s.get("ParentShardId") == parent
    )
    kinesis.merge_shards(StreamName=stream, ShardToMerge=children[0], AdjacentShardToMerge=children[1])
    wait_active(kinesis, stream)
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    return str(
        next(s["ShardId"] for s in shards if s.get("ParentShardId") in children and s.get("AdjacentParentShardId"))
    )


def parents_of(kinesis: Any, stream: str) -> dict[str, list[str]]:
    """Each shard's parents (a split's one, a merge's two), as ListShards gives them."""
    return {
        s["ShardId"]: [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p]
        for s in kinesis.list_shards(StreamName=stream)["Shards"]
    }


def parents_first(rows: Sequence[Row], parents: dict[str, list[str]]) -> list[str]:
    """Each child shard whose rows came in a micro-batch no later than one of its parents' rows."""
    batches: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        batches[row.shard_id].append(row.batch)
    return [
        f"{child} read in the batch of its parent {parent}"
        for child, of in parents.items()
        for parent in of
        if batches.get(child) and batches.get(parent) and max(batches[parent]) >= min(batches[child])
    ]
