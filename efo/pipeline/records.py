"""What travels from a subscription to the Spark driver, and positions within a shard.

Records travel as columns (one list per field, one chunk per SubscribeToShard event) so the driver
builds a batch's Arrow table column by column, never a Python object per row. Sequence numbers are
strings on the wire and in the output, and compared as integers everywhere (they run to 128 digits).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, NamedTuple

PositionKind = Literal[
    "LATEST", "TRIM_HORIZON", "AT_TIMESTAMP", "AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER", "SHARD_END"
]


@dataclass(frozen=True, slots=True)
class Position:
    """A SubscribeToShard starting position, and the shape in which checkpoints are stored.

    ``AFTER_SEQUENCE_NUMBER n`` resumes after record n. ``sub_sequence_number`` is kept for KPL
    aggregates: ``AT_SEQUENCE_NUMBER n`` with ``sub_sequence_number k`` means "re-read record n and
    drop its sub-records at or below k". :data:`SHARD_END` (the one value for it) is the checkpoint
    of a shard whose last record the sink committed: nothing is read from it again.
    """

    kind: PositionKind
    sequence_number: str | None = None
    sub_sequence_number: int | None = None
    timestamp: datetime | None = None

    @property
    def is_concrete(self) -> bool:
        """Names a record (or the shard's end) rather than a moment: the same on every call."""
        return self.sequence_number is not None or self.kind == "SHARD_END"

    def starting_position(self) -> dict[str, Any]:
        """The ``StartingPosition`` argument of SubscribeToShard."""
        assert self.kind != "SHARD_END", "a finished shard is never subscribed to"
        position: dict[str, Any] = {"Type": self.kind}
        if self.sequence_number is not None:
            position["SequenceNumber"] = self.sequence_number
        if self.timestamp is not None:
            position["Timestamp"] = self.timestamp
        return position

    def delivered_through(self) -> tuple[int, int] | None:
        """The (sequence, sub-sequence) at or below which a record was already delivered."""
        if self.sequence_number is None:
            return None
        seq = int(self.sequence_number)
        if self.kind == "AFTER_SEQUENCE_NUMBER":
            return (seq, MAX_SUB_SEQUENCE)
        if self.kind == "AT_SEQUENCE_NUMBER" and self.sub_sequence_number is not None:
            return (seq, self.sub_sequence_number)
        return (seq - 1, MAX_SUB_SEQUENCE)

    def __str__(self) -> str:
        if self.sequence_number is not None:
            sub = f"/{self.sub_sequence_number}" if self.sub_sequence_number is not None else ""
            return f"{self.kind}:{self.sequence_number}{sub}"
        if self.timestamp is not None:
            return f"{self.kind}:{self.timestamp.isoformat()}"
        return self.kind


MAX_SUB_SEQUENCE = 2**63 - 1

#: The checkpoint of a finished shard: its children may start.
SHARD_END: Final = Position("SHARD_END")


def shard_key(stream: str, shard_id: str) -> str:
    """One shard's name among the shards of every stream read here (shard ids repeat across
    streams): the pool's owner of its budget."""
    return f"{stream}/{shard_id}"


def after(sequence_number: str) -> Position:
    return Position("AFTER_SEQUENCE_NUMBER", sequence_number)


class Row(NamedTuple):
    """One record's values (:meth:`RecordChunk.of_rows`)."""

    sequence_number: str
    data: bytes
    partition_key: str
    arrival_ms: int
    sub_sequence_number: int | None = None
    explicit_hash_key: str | None = None
    error: str | None = None


#: A chunk's columns with one value per row, in the table's order.
ROW_COLUMNS = (
    "sequence_numbers",
    "sub_sequence_numbers",
    "partition_keys",
    "explicit_hash_keys",
    "arrival_ms",
    "data",
    "errors",
)
#: Columns that are mostly all null (no KPL aggregate, nothing corrupt).
OPTIONAL_COLUMNS = frozenset({"sub_sequence_numbers", "explicit_hash_keys", "errors"})


@dataclass(slots=True)
class RecordChunk:
    """The records of one SubscribeToShard event of one shard, as columns, in sequence order."""

    stream: str
    shard_id: str
    serial: int  # per claim, increasing: the chunk's number in its claim's checkpoint ledger
    epoch: int = 0  # the claim (lease counter) it was read under; a new one resets the driver's watermark
    sequence_numbers: list[str] = field(default_factory=list)
    sub_sequence_numbers: list[int | None] = field(default_factory=list)
    partition_keys: list[str] = field(default_factory=list)
    explicit_hash_keys: list[str | None] = field(default_factory=list)
    arrival_ms: list[int] = field(default_factory=list)  # epoch milliseconds, UTC
    data: list[bytes] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)
    data_bytes: int = 0
    dead_letters: list[Any] = field(default_factory=list)  # efo.kinesis.kpl.DeadLetter: committed with the chunk
    grant: Any = None  # the pool budget this chunk holds until its batch is committed

    def __len__(self) -> int:
        """Rows for the sink (dead letters are carried beside them)."""
        return len(self.sequence_numbers)

    def rows(self, start: int, stop: int | None = None) -> RecordChunk:
        """A chunk of rows ``[start:stop]`` of this one (every column): the same shard, serial, epoch
        and grant, without dead letters."""
        part = RecordChunk(self.stream, self.shard_id, self.serial, self.epoch, grant=self.grant)
        for name in ROW_COLUMNS:
            setattr(part, name, getattr(self, name)[start:stop])
        part.data_bytes = sum(map(len, part.data))
        return part

    @classmethod
    def of_rows(cls, stream: str, shard_id: str, serial: int, rows: Iterable[Row], *, epoch: int = 0) -> RecordChunk:
        """A chunk of whole rows (tests, dead letters)."""
        rows = list(rows)
        return cls(
            stream,
            shard_id,
            serial,
            epoch,
            sequence_numbers=[row.sequence_number for row in rows],
            sub_sequence_numbers=[row.sub_sequence_number for row in rows],
            partition_keys=[row.partition_key for row in rows],
            explicit_hash_keys=[row.explicit_hash_key for row in rows],
            arrival_ms=[row.arrival_ms for row in rows],
            data=[row.data for row in rows],
            errors=[row.error for row in rows],
            data_bytes=sum(len(row.data) for row in rows),
        )
