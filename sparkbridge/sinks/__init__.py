"""Sinks: where a batch's DataFrame goes. A sink is anything with ``write(df, batch)``.

Writing your own takes a few lines::

    class MySink:
        def write(self, df: DataFrame, batch: BatchInfo) -> None:
            df.write.format("delta").mode("append").save("s3://bucket/table")

Delivery is at-least-once: after a crash a batch may be written again. De-duplicate on
``(stream, shard_id, sequence_number, sub_sequence_number)`` (shard ids repeat across streams).

Each kind of ``EFO_SINK`` is one module here, ``sparkbridge.sinks.<kind>``, whose ``SINK`` class is
made from the setting (``SINK.from_spec``) and declares its :class:`SinkCapabilities`; its grammar is
its entry in :data:`efo.sink_kinds.SINK_KINDS`. :func:`make_sink` finds the module by the kind's name.
"""

from __future__ import annotations

import importlib
from typing import Protocol, cast

from efo.config import SinkSpec
from sparkbridge.sinks.arrow import ArrowSink
from sparkbridge.sinks.base import (
    DEFAULT_CAPABILITIES,
    BatchInfo,
    DeclaresCapabilities,
    ShardRange,
    Sink,
    SinkCapabilities,
    capabilities_of,
)
from sparkbridge.sinks.console import ConsoleSink
from sparkbridge.sinks.handler import HandlerSink
from sparkbridge.sinks.parquet import BATCH_COLUMN, PARTITION_COLUMNS, WRITE_OPTIONS, ParquetSink

__all__ = [
    "BATCH_COLUMN",
    "DEFAULT_CAPABILITIES",
    "PARTITION_COLUMNS",
    "WRITE_OPTIONS",
    "ArrowSink",
    "BatchInfo",
    "ConsoleSink",
    "DeclaresCapabilities",
    "HandlerSink",
    "ParquetSink",
    "ShardRange",
    "Sink",
    "SinkCapabilities",
    "SinkClass",
    "capabilities_of",
    "make_sink",
    "rows_in_tasks",
    "sink_class",
    "takes_arrow",
]


class SinkClass(Protocol):
    """What a kind's module names ``SINK``: made from the setting."""

    def from_spec(self, spec: SinkSpec, partition_by: tuple[str, ...] = ()) -> DeclaresCapabilities: ...


def sink_class(kind: str) -> SinkClass:
    """The ``SINK`` of ``sparkbridge.sinks.<kind>`` (the kind one of efo.sink_kinds.SINK_KINDS)."""
    return cast(SinkClass, importlib.import_module(f"{__name__}.{kind}").SINK)


def make_sink(spec: SinkSpec, partition_by: tuple[str, ...] = ()) -> Sink:
    return sink_class(spec.kind).from_spec(spec, partition_by)


def rows_in_tasks(sink: object) -> bool:
    """The sink's rows are made from Arrow in Spark's tasks (see :class:`SinkCapabilities`)."""
    return capabilities_of(sink).rows_in_tasks


def takes_arrow(sink: object) -> bool:
    """The sink is handed the batch's Arrow table, not a DataFrame (and needs no Spark)."""
    return capabilities_of(sink).takes_arrow
