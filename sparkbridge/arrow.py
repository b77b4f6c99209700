"""Record chunks to one ``pyarrow.Table`` with the public schema; no Python object per row on Spark's side."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import pyarrow as pa

from efo.kinesis.columns import ReusableBlocks, join_payloads
from efo.pipeline.records import ARROW_COLUMNS, OPTIONAL_COLUMNS, RecordChunk, Row

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
    batch (the chunks' lists chained), not once per event; the payloads copied into one of
    ``blocks`` when one is free (efo.kinesis.columns.join_payloads)."""

    def column(name: str) -> pa.Array:
        values = list(chain.from_iterable(getattr(chunk, name) for chunk in chunks))
        # Mostly all null (no KPL aggregate, nothing corrupt): counted in C, built without a value per row.
        if name in OPTIONAL_COLUMNS and values.count(None) == len(values):
            return pa.nulls(len(values), ARROW_COLUMNS[name])
        return pa.array(values, ARROW_COLUMNS[name])

    def repeated(name: str) -> pa.Array:
        # One value per chunk, repeated in C (pa.repeat) rather than through a list of one str per row.
        if not chunks:
            return pa.array([], pa.string())
        return pa.concat_arrays(
            [pa.repeat(pa.scalar(getattr(chunk, name), pa.string()), len(chunk)) for chunk in chunks]
        )

    return pa.Table.from_arrays(
        [
            repeated("stream"),
            repeated("shard_id"),
            column("sequence_numbers"),
            column("sub_sequence_numbers"),
            column("partition_keys"),
            column("explicit_hash_keys"),
            # Epoch ms as int64, viewed (zero-copy) as timestamp[ms, UTC]: same values, no per-value conversion.
            column("arrival_ms").view(SCHEMA.field("approximate_arrival_timestamp").type),
            join_payloads([chunk.data for chunk in chunks], blocks),
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
