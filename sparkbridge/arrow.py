"""Record chunks to one ``pyarrow.Table`` with the public schema; no Python object per row on Spark's side."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
import pyarrow as pa

from efo.kinesis.columns import ReusableBlocks, join_payloads
from efo.pipeline.records import OPTIONAL_COLUMNS, ROW_COLUMNS, RecordChunk, Row

#: The Arrow type of each list column of a chunk that :func:`to_table` converts with ``pa.array``
#: (the arrival times and payloads go their own ways). Here rather than beside ROW_COLUMNS in
#: efo.pipeline.records, which the CLI imports and which stays free of pyarrow.
ARROW_COLUMNS = {
    "sequence_numbers": pa.string(),
    "sub_sequence_numbers": pa.int64(),
    "partition_keys": pa.string(),
    "explicit_hash_keys": pa.string(),
    "errors": pa.string(),
}

#: The DataFrame schema: a public contract, documented in the README.
SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string(), nullable=False),
        pa.field("shard_id", pa.string(), nullable=False),
        pa.field("sequence_number", pa.string(), nullable=False),
        pa.field("sub_sequence_number", pa.int64()),
        pa.field("partition_key", pa.string(), nullable=False),
        pa.field("explicit_hash_key", pa.string()),
        pa.field("approximate_arrival_timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("data", pa.binary(), nullable=False),
        pa.field("error", pa.string()),
    ]
)


def to_table(chunks: Sequence[RecordChunk], blocks: ReusableBlocks | None = None) -> pa.Table:
    """The chunks' rows, in order, as one table of :data:`SCHEMA`: each column converted once per
    batch, not once per event; the payloads copied into one of ``blocks`` when one is free
    (efo.kinesis.columns.join_payloads, the chunks' ``data_bytes`` sizing it)."""

    lengths = np.fromiter(map(len, chunks), np.int64, len(chunks))
    rows = int(lengths.sum())
    for name in ROW_COLUMNS:  # a few hundred len() calls: each column below may then trust the lengths
        if not np.array_equal(
            np.fromiter((len(getattr(chunk, name)) for chunk in chunks), np.int64, len(chunks)), lengths
        ):
            raise ValueError(f"a chunk's {name} are not one value per row")

    def column(name: str) -> pa.Array:
        # Mostly all null (no KPL aggregate, nothing corrupt): counted in C, chunk by chunk, and
        # built without a value per row.
        if name in OPTIONAL_COLUMNS and sum(getattr(chunk, name).count(None) for chunk in chunks) == rows:
            return pa.nulls(rows, ARROW_COLUMNS[name])
        # The chunks' lists as one list array, flattened (its values, no copy): no list of every
        # value is made first. 100,000 sequence numbers in chunks of 500, their objects out of the
        # cache, 7.0 ms of CPU against 10.0 chained into one list; their keys 5.2 against 6.5.
        nested = pa.array([getattr(chunk, name) for chunk in chunks], pa.list_(ARROW_COLUMNS[name]))
        if isinstance(nested, pa.ChunkedArray):  # over 2 GiB of strings: pa.array splits them, as a flat list's
            return pa.chunked_array([part.flatten() for part in nested.chunks], ARROW_COLUMNS[name])
        return nested.flatten()

    def arrivals() -> pa.Array:
        # Epoch ms as int64 (numpy reads Python ints faster than pa.array: 1.6 against 2.8 ms per
        # 100,000), then viewed (zero-copy) as the schema's timestamp: the same values, no
        # per-value conversion.
        return pa.array(np.fromiter(chain.from_iterable(chunk.arrival_ms for chunk in chunks), np.int64, rows))

    def repeated(name: str) -> pa.Array:
        # One value per chunk (a stream, a shard), each row taking its chunk's in one C pass over
        # the distinct values, rather than an array per chunk concatenated (8 ms per 100,000 rows
        # in events of 100 records against 1.3) or a Python str per row.
        distinct: dict[str, int] = {}
        codes = np.fromiter((distinct.setdefault(getattr(chunk, name), len(distinct)) for chunk in chunks), np.int32)
        return pa.array(list(distinct), pa.string()).take(pa.array(np.repeat(codes, lengths)))

    return pa.Table.from_arrays(
        [
            repeated("stream"),
            repeated("shard_id"),
            column("sequence_numbers"),
            column("sub_sequence_numbers"),
            column("partition_keys"),
            column("explicit_hash_keys"),
            arrivals().view(SCHEMA.field("approximate_arrival_timestamp").type),
            join_payloads([chunk.data for chunk in chunks], blocks, [chunk.data_bytes for chunk in chunks]),
            column("errors"),
        ],
        schema=SCHEMA,
    )


def warm_up() -> None:
    """Build one tiny table. Arrow's first table costs about 60 MiB of resident memory, once and
    whatever its size (its compute functions, memory pool and thread pool start; measured with
    pyarrow 26): built at start, before any record is read, that cost is part of the service's
    baseline instead of showing up with the first batch as if memory grew with the data."""
    to_table([RecordChunk.of_rows("warm-up", "warm-up", 0, [Row("0", b"", "", 0)])])
