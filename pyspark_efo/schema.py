"""The source's rows: efo's columns (sparkbridge.arrow.to_table, the table ``efo run`` hands its
sinks) under the names Spark sources use, with Spark's timestamp precision."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from efo.errors import ConfigError
from efo.kinesis.columns import ReusableBlocks
from efo.pipeline.records import RecordChunk
from sparkbridge.arrow import SCHEMA as BRIDGE_SCHEMA
from sparkbridge.arrow import to_table

#: The source's schema, column for column the bridge's (``efo run``'s DataFrame schema).
SCHEMA = StructType(
    [
        StructField("stream", StringType(), False),
        StructField("shardId", StringType(), False),
        StructField("sequenceNumber", StringType(), False),
        StructField("subSequenceNumber", LongType(), True),
        StructField("partitionKey", StringType(), False),
        StructField("explicitHashKey", StringType(), True),
        StructField("approximateArrivalTimestamp", TimestampType(), False),
        StructField("data", BinaryType(), False),
        StructField("error", StringType(), True),
    ]
)

#: What Spark's Python data source reader expects of an Arrow batch of SCHEMA (a test checks that it
#: is pyspark's own conversion of SCHEMA): microsecond timestamps in UTC.
ARROW_SCHEMA = pa.schema(
    [
        pa.field(field.name, _type, nullable=field.nullable)
        for field, _type in zip(
            SCHEMA.fields,
            [
                pa.string(),
                pa.string(),
                pa.string(),
                pa.int64(),
                pa.string(),
                pa.string(),
                pa.timestamp("us", tz="UTC"),
                pa.binary(),
                pa.string(),
            ],
            strict=True,
        )
    ]
)

#: The bridge's column names, in the same order.
BRIDGE_NAMES = tuple(BRIDGE_SCHEMA.names)


def check_schema(schema: StructType) -> None:
    """The source's schema is fixed: a schema given with ``readStream.schema(...)`` must be it."""
    if schema != SCHEMA:
        raise ConfigError(
            "efo source: its schema is fixed (see the README, 'efo as a Spark source'); drop .schema(...) "
            f"from readStream, or give exactly {SCHEMA.simpleString()}"
        )


def to_batches(chunks: Sequence[RecordChunk], blocks: ReusableBlocks | None = None) -> list[pa.RecordBatch]:
    """The chunks' rows as Arrow record batches of :data:`ARROW_SCHEMA` (the bridge's table, renamed,
    its arrival times widened to microseconds); the payloads copied into one of ``blocks`` when one
    is free, as the bridge does."""
    if not chunks:
        return []
    table = to_table(chunks, blocks)
    columns = list(table.columns)
    at = BRIDGE_NAMES.index("approximate_arrival_timestamp")
    columns[at] = columns[at].cast(ARROW_SCHEMA.field(at).type)
    batches: list[pa.RecordBatch] = pa.Table.from_arrays(columns, schema=ARROW_SCHEMA).combine_chunks().to_batches()
    return batches
