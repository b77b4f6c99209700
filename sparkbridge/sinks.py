"""Sinks: where a batch's DataFrame goes. A sink is anything with ``write(df, batch)``.

Writing your own takes a few lines::

    class MySink:
        def write(self, df: DataFrame, batch: BatchInfo) -> None:
            df.write.format("delta").mode("append").save("s3://bucket/table")

Delivery is at-least-once: after a crash a batch may be written again. De-duplicate on
``(stream, shard_id, sequence_number, sub_sequence_number)`` (shard ids repeat across streams).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from efo.config import SinkSpec
from efo.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ShardRange:
    first_sequence_number: str
    last_sequence_number: str
    records: int


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What a sink learns about the batch besides its rows."""

    batch_id: str  # stable across retries of the same batch
    records: int
    bytes: int
    shards: dict[tuple[str, str], ShardRange] = field(default_factory=dict)  # by (stream, shard id)
    attempt: int = 1


class Sink(Protocol):
    def write(self, df: DataFrame, batch: BatchInfo) -> None: ...


BATCH_COLUMN = "efo_batch_id"


#: Columns the Parquet output may be partitioned by (before efo_batch_id); the arrival ones are derived.
PARTITION_COLUMNS = ("arrival_date", "arrival_hour", "stream", "shard_id")


#: Parquet writer settings for the columns whose values are unique within a batch (sequence
#: numbers) or usually so (payloads, and their text in ``value`` with value_format=utf8). A
#: dictionary seldom pays there: the writer hashes every value into one until the dictionary
#: outgrows its page and then falls back to plain encoding; and min/max statistics of opaque
#: payloads serve no filter. Measured (JFR, 32,000 rows of 1 KiB a batch): building dictionaries
#: was a third of the JVM's samples; without them the JVM spent about 10 % less per batch. Other
#: columns keep both.
WRITE_OPTIONS = {
    "parquet.enable.dictionary#sequence_number": "false",
    "parquet.enable.dictionary#data": "false",
    "parquet.enable.dictionary#value": "false",
    "parquet.column.statistics.enabled#data": "false",
    "parquet.column.statistics.enabled#value": "false",
}

#: A batch id that is its own partition directory name as it is (the driver's: a time, hex and digits).
_PLAIN_BATCH_ID = re.compile(r"[A-Za-z0-9_.-]+")


class ParquetSink:
    """Each batch is its own partition ``efo_batch_id=<id>`` under the path (after the optional
    ``partition_by`` columns, e.g. ``arrival_date``), written through Spark's committer (files
    staged, then moved in at job commit); a retry of the same batch replaces its own partitions
    and nothing else.

    Without ``partition_by`` the batch's directory is written as a path of its own: a retry
    removes what an earlier attempt left there when it starts, and its files move in one by one
    at job commit. With ``partition_by``, under the path with dynamic partition overwrite, each
    partition replaced whole at job commit. The former skips what dynamic partitioning costs per
    row (a sort by the partition columns and a projection of every row): about 18 % of the JVM's
    CPU per batch, measured in pairs in one JVM. Its ``_SUCCESS`` marker, written last, says the
    directory is complete. Either way a batch whose write failed is not acknowledged: its records
    are read again."""

    #: Its batches' rows are made from Arrow in Spark's tasks, not on the driver (session.dataframe_of).
    rows_in_tasks = True

    def __init__(self, path: str, partition_by: tuple[str, ...] = ()) -> None:
        unknown = [c for c in partition_by if c not in PARTITION_COLUMNS]
        if unknown:
            raise ConfigError(
                f"parquet_partition_by (EFO_PARQUET_PARTITION_BY) = {','.join(partition_by)!r}: "
                f"allowed: {', '.join(PARTITION_COLUMNS)}"
            )
        self.path = path
        self.partition_by = partition_by

    def write(self, df: DataFrame, batch: BatchInfo) -> None:
        if not self.partition_by and _PLAIN_BATCH_ID.fullmatch(batch.batch_id):
            directory = f"{self.path.rstrip('/')}/{BATCH_COLUMN}={batch.batch_id}"
            df.write.mode("overwrite").options(**WRITE_OPTIONS).parquet(directory)
            return
        arrival = F.col("approximate_arrival_timestamp")
        derived = {"arrival_date": F.to_date(arrival), "arrival_hour": F.hour(arrival)}
        for name in self.partition_by:
            if name in derived:
                df = df.withColumn(name, derived[name])
        (
            df.withColumn(BATCH_COLUMN, F.lit(batch.batch_id))
            .write.mode("overwrite")
            .option("partitionOverwriteMode", "dynamic")
            .options(**WRITE_OPTIONS)
            .partitionBy(*self.partition_by, BATCH_COLUMN)
            .parquet(self.path)
        )


def _function(kind: str, target: str) -> Callable[..., Any]:
    module_name, _, function_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"sink (EFO_SINK) = '{kind}:{target}': cannot import module {module_name!r}: {exc}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"sink (EFO_SINK) = '{kind}:{target}': {module_name} has no function {function_name!r}")
    return function  # type: ignore[no-any-return]


class HandlerSink:
    """``handler:<module>:<function>``: calls ``function(df, batch)``. A function that only writes
    the batch (no join) may set ``function.rows_in_tasks = True`` to be handed its DataFrame as the
    Parquet sink is (see :func:`rows_in_tasks`)."""

    def __init__(self, target: str) -> None:
        self._function: Callable[[DataFrame, BatchInfo], Any] = _function("handler", target)
        self.rows_in_tasks = bool(getattr(self._function, "rows_in_tasks", False))

    def write(self, df: DataFrame, batch: BatchInfo) -> None:
        self._function(df, batch)


class ArrowSink:
    """``arrow:<module>:<function>``: calls ``function(table, batch)`` with the batch as a
    ``pyarrow.Table`` of the DataFrame schema. No Spark session is started: for streams a Python
    process writes on its own, and for tests of your own code."""

    takes_arrow = True

    def __init__(self, target: str) -> None:
        self._function: Callable[[pa.Table, BatchInfo], Any] = _function("arrow", target)

    def write(self, table: pa.Table, batch: BatchInfo) -> None:
        self._function(table, batch)


def rows_in_tasks(sink: object) -> bool:
    """The sink's DataFrame needs no size estimate (it is written, not joined): its rows are made
    from Arrow in the tasks (sparkbridge.session.dataframe_of), at half the JVM's CPU. Other sinks
    get a local relation, whose known size lets their joins broadcast the batch."""
    return bool(getattr(sink, "rows_in_tasks", False))


def takes_arrow(sink: object) -> bool:
    """The sink is handed the batch's Arrow table, not a DataFrame (and needs no Spark)."""
    return bool(getattr(sink, "takes_arrow", False))


class ConsoleSink:
    def write(self, df: DataFrame, batch: BatchInfo) -> None:
        print(f"batch {batch.batch_id}: {batch.records} records")
        df.show(20, truncate=60)


def make_sink(spec: SinkSpec, partition_by: tuple[str, ...] = ()) -> Sink:
    if spec.kind == "parquet":
        return ParquetSink(spec.target, partition_by)
    if spec.kind == "handler":
        return HandlerSink(spec.target)
    if spec.kind == "arrow":
        return ArrowSink(spec.target)
    return ConsoleSink()
