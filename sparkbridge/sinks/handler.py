"""``handler:<module>:<function>``: the batch's DataFrame handed to a function of the user's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from efo.config import SinkSpec
from sparkbridge.sinks.base import BatchInfo, SinkCapabilities
from sparkbridge.sinks.function import import_function

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class HandlerSink:
    """``handler:<module>:<function>``: calls ``function(df, batch)``. A function that only writes
    the batch (no join) may set ``function.rows_in_tasks = True`` to be handed its DataFrame as the
    Parquet sink is (see :class:`SinkCapabilities`)."""

    def __init__(self, target: str) -> None:
        self._function: Callable[[DataFrame, BatchInfo], Any] = import_function("handler", target)
        # The function's own flag is the documented way (README) a handler asks for rows made in tasks.
        self.capabilities = SinkCapabilities(rows_in_tasks=bool(getattr(self._function, "rows_in_tasks", False)))

    @classmethod
    def from_spec(cls, spec: SinkSpec, partition_by: tuple[str, ...] = ()) -> HandlerSink:
        return cls(spec.target)

    def write(self, df: DataFrame, batch: BatchInfo) -> None:
        self._function(df, batch)


SINK = HandlerSink
