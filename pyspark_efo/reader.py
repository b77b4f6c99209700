"""The stream reader Spark calls, on efo's engine (efo.source.engine).

Where the records are read: in Spark's reader process for the query, on the driver, by efo's
subscriptions, which stay open from one micro-batch to the next. ``latestOffset`` takes what they have
read (up to the read limit) and keeps it as Arrow batches; ``partitions`` hands those same batches to
Spark with the plan (Spark's "prefetched" path for Python sources: the JVM gets them over the reader's
socket and no Python worker on an executor reads anything). A batch planned again after a restart has
nothing kept for it: Spark's executor then calls ``read``, which reads exactly those records again by
GetRecords (efo.source.replay).

That prefetched path belongs to pyspark's wrapper of ``SimpleDataSourceStreamReader``
(``pyspark.sql.datasource_internal._SimpleStreamReaderWrapper``): the reader is that wrapper, so that
Spark's reader process sends the kept batches, while its own ``latestOffset`` takes Spark's read limits
(ReadMaxRows, ReadMaxBytes), which the public simple reader cannot.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import structlog
from pyspark.sql.datasource import InputPartition, SimpleDataSourceStreamReader
from pyspark.sql.datasource_internal import SimpleInputPartition, _SimpleStreamReaderWrapper
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from efo.errors import EfoError
from efo.kinesis.columns import ReusableBlocks
from efo.source.engine import Engine, initial_offset, positions_of
from efo.source.offsets import SourceOffset
from efo.source.options import SourceOptions
from pyspark_efo.schema import to_batches

log = structlog.get_logger("pyspark_efo")


class _Planner(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """The simple reader inside the wrapper: Spark's reader process asks it whether the source
    supports Trigger.AvailableNow and calls ``prepareForTriggerAvailableNow`` on it; an executor
    calls ``readBetweenOffsets`` on it for a batch planned again after a restart."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.available_now_at_ms: int | None = None

    def initialOffset(self) -> dict[str, Any]:
        return initial_offset()

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now_at_ms = int(time.time() * 1000)
        log.info("source.available_now", at_ms=self.available_now_at_ms)

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[Any, ...]], dict[str, Any]]:
        raise NotImplementedError("the efo source plans through EfoStreamReader.latestOffset")

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        from efo.observability import configure_logging
        from efo.source.replay import read_between

        configure_logging()  # an executor's Python worker: its log lines as the reader process's
        chunks = read_between(self.options, SourceOffset.from_json(start), SourceOffset.from_json(end))
        return iter(to_batches(chunks))


@dataclass
class _Kept:
    start: str
    end: str
    batches: list[pa.RecordBatch]


class EfoStreamReader(_SimpleStreamReaderWrapper):  # type: ignore[misc]
    """Spark's view of the source. Made (and pickled) in several processes: nothing starts before the
    first ``latestOffset``, which is called in the reader process only."""

    simple_reader: _Planner

    def __init__(self, options: SourceOptions) -> None:
        super().__init__(_Planner(options))
        self.options = options
        self._engine: Engine | None = None
        self._kept: list[_Kept] = []
        self._blocks: ReusableBlocks | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "planner": self.simple_reader}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.simple_reader = state["planner"]
        self.options = state["options"]
        self.cache = []
        self._engine = None
        self._kept = []
        self._blocks = None

    def initialOffset(self) -> dict[str, Any]:
        return initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        max_rows, max_bytes = self._limits(limit)
        planned = self._started().plan(start, max_rows, max_bytes)
        if planned.advanced:
            if self._blocks is None:
                # Payloads copied into blocks kept from batch to batch (their pages stay mapped): the
                # batch kept for Spark, the one planned after it, and one free (efo.kinesis.columns).
                self._blocks = ReusableBlocks(3)
            batches = to_batches(planned.chunks, self._blocks)
            self._kept.append(_Kept(positions_of(start), positions_of(planned.end), batches))
        return planned.end

    def _limits(self, limit: ReadLimit) -> tuple[int | None, int | None]:
        if isinstance(limit, ReadAllAvailable):
            return None, None  # Spark says so (Trigger.Once, or a limit it does not apply): every row read
        if isinstance(limit, ReadMaxRows):
            return limit.max_rows, self.options.max_bytes_per_trigger
        if isinstance(limit, ReadMaxBytes):
            return self.options.max_records_per_trigger, limit.max_bytes
        raise EfoError(f"efo source: Spark asked for a read limit it does not offer: {limit!r}")

    def _started(self) -> Engine:
        if self._engine is None:
            from efo.observability import configure_logging

            configure_logging()
            self._engine = Engine(self.options, available_now_at_ms=self.simple_reader.available_now_at_ms).start()
        elif self.simple_reader.available_now_at_ms is not None and self._engine.available_now_at_ms is None:
            self._engine.available_now_at_ms = self.simple_reader.available_now_at_ms
        return self._engine

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        return [SimpleInputPartition(start, end)]

    def getCache(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[pa.RecordBatch] | None:
        """The batches ``latestOffset`` kept for this range; None (Spark's executor reads it again)
        for a range planned before this process started."""
        first, last = positions_of(start), positions_of(end)
        for index, kept in enumerate(self._kept):
            if kept.start == first and kept.end == last:
                del self._kept[index]  # the JVM has them from here on: not held twice
                return iter(kept.batches)
        return None

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed every batch through ``end``: what was kept for them is dropped."""
        last = positions_of(end)
        for index, kept in enumerate(self._kept):
            if kept.end == last:
                del self._kept[: index + 1]
                return

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        assert isinstance(partition, SimpleInputPartition)
        return self.simple_reader.readBetweenOffsets(partition.start, partition.end)  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self._engine is not None:
            self._engine.close()
