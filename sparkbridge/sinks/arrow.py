"""``arrow:<module>:<function>``: the batch's Arrow table handed to a function of the user's; no Spark."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from efo.config import SinkSpec
from sparkbridge.sinks.base import BatchInfo, SinkCapabilities
from sparkbridge.sinks.function import import_function


class ArrowSink:
    """``arrow:<module>:<function>``: calls ``function(table, batch)`` with the batch as a
    ``pyarrow.Table`` of the DataFrame schema. No Spark session is started: for streams a Python
    process writes on its own, and for tests of your own code."""

    capabilities = SinkCapabilities(takes_arrow=True)

    def __init__(self, target: str) -> None:
        self._function: Callable[[pa.Table, BatchInfo], Any] = import_function("arrow", target)

    @classmethod
    def from_spec(cls, spec: SinkSpec, partition_by: tuple[str, ...] = ()) -> ArrowSink:
        return cls(spec.target)

    def write(self, table: pa.Table, batch: BatchInfo) -> None:
        self._function(table, batch)


SINK = ArrowSink
