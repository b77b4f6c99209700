"""What every sink shares: the batch it is told about, the protocol it implements, and its
capabilities, declared as typed attributes rather than looked for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


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


@dataclass(frozen=True, slots=True)
class SinkCapabilities:
    """How the driver hands a sink its batches."""

    #: Handed the batch's Arrow table, not a DataFrame: no Spark session at all.
    takes_arrow: bool = False
    #: Its DataFrame needs no size estimate (written, not joined): its rows are made from Arrow in
    #: Spark's tasks (sparkbridge.session.dataframe_of), at half the JVM's CPU. Otherwise a local
    #: relation, whose known size lets a join broadcast the batch.
    rows_in_tasks: bool = False


#: What a sink that declares nothing gets (a sink of the caller's: anything with ``write``).
DEFAULT_CAPABILITIES = SinkCapabilities()


@runtime_checkable
class DeclaresCapabilities(Protocol):
    """A sink that says how it takes its batches (every sink of sparkbridge.sinks does)."""

    capabilities: SinkCapabilities

    def write(self, df: Any, batch: BatchInfo) -> None: ...


def capabilities_of(sink: object) -> SinkCapabilities:
    return sink.capabilities if isinstance(sink, DeclaresCapabilities) else DEFAULT_CAPABILITIES
