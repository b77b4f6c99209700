"""``console``: prints each batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from efo.config import SinkSpec
from sparkbridge.sinks.base import BatchInfo, SinkCapabilities

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class ConsoleSink:
    """Prints each batch, for a quick look."""

    capabilities = SinkCapabilities()

    @classmethod
    def from_spec(cls, spec: SinkSpec, partition_by: tuple[str, ...] = ()) -> ConsoleSink:
        return cls()

    def write(self, df: DataFrame, batch: BatchInfo) -> None:
        print(f"batch {batch.batch_id}: {batch.records} records")
        df.show(20, truncate=60)


SINK = ConsoleSink
