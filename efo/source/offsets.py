"""The source's offsets: what Spark writes to its checkpoint before each micro-batch, and all a
restarted query needs (no other state: no lease table, nothing on the driver's disk).

Per stream (keyed by its ARN, with its name and creation time, so that a stream deleted and
recreated under the same name is told apart), per shard:

- ``from``: where reading of the shard began in this query: ``TRIM_HORIZON`` or
  ``AT_TIMESTAMP:<epoch ms>`` (LATEST is kept as the moment it was resolved, never as the word,
  so that a restart never skips what was written in between). A shard born after the query began
  (a split or a merge) starts at TRIM_HORIZON, whatever the starting position. It changes only
  when reading starts again elsewhere on purpose (``skipOlderThan``), and then ``seq`` is cleared.
  (A ``seq`` past the stream's retention with ``failOnDataLoss=false`` keeps the origin: reading
  goes on from the oldest record left, and so does a replay of that batch.)
- ``seq`` and ``sub``: the last record handed to Spark (``sub`` set for a KPL sub-record; without
  it the whole record was handed on), ``arrival`` its ApproximateArrivalTimestamp (epoch ms);
- ``rows``: rows handed to Spark from this shard since the query began, so that a batch read again
  after a restart can be checked to be the same size (records trimmed since are found, not skipped);
- ``parents`` (lineage) and ``end``: read to its end (SHARD_END), after which its children may
  start: a child never starts before every parent's end is in an offset, so a parent's records are
  always in an earlier micro-batch than any of its children's.

An offset is a plain dict of strings, numbers, booleans and lists (what Spark's Python data source
API asks for), written here with sorted keys so that equal offsets have equal JSON text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from efo.errors import ConfigError
from efo.pipeline.records import MAX_SUB_SEQUENCE, Position, after

VERSION = 1


@dataclass(frozen=True, slots=True)
class ShardOffset:
    origin: str  # "TRIM_HORIZON" or "AT_TIMESTAMP:<epoch ms>"
    parents: tuple[str, ...] = ()
    sequence_number: str | None = None
    sub_sequence_number: int | None = None
    rows: int = 0
    arrival_ms: int | None = None
    ended: bool = False

    def resume(self) -> Position:
        """Where reading goes on: after the last record handed to Spark, or the shard's origin."""
        if self.sequence_number is None:
            return origin_position(self.origin)
        if self.sub_sequence_number is not None:
            # Part of a KPL aggregate was handed on: read the record again, its sub-records at or
            # below this one are dropped (Position.delivered_through).
            return Position("AT_SEQUENCE_NUMBER", self.sequence_number, self.sub_sequence_number)
        return after(self.sequence_number)

    def delivered_through(self) -> tuple[int, int] | None:
        """The (sequence, sub-sequence) at or below which rows were handed to Spark."""
        if self.sequence_number is None:
            return None
        sub = MAX_SUB_SEQUENCE if self.sub_sequence_number is None else self.sub_sequence_number
        return (int(self.sequence_number), sub)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"from": self.origin, "rows": self.rows}
        if self.parents:
            out["parents"] = list(self.parents)
        if self.sequence_number is not None:
            out["seq"] = self.sequence_number
        if self.sub_sequence_number is not None:
            out["sub"] = self.sub_sequence_number
        if self.arrival_ms is not None:
            out["arrival"] = self.arrival_ms
        if self.ended:
            out["end"] = True
        return out

    @classmethod
    def from_json(cls, value: Any, where: str) -> ShardOffset:
        if not isinstance(value, dict) or not isinstance(value.get("from"), str):
            raise _unreadable(where, "a shard without its 'from'")
        origin_position(value["from"], where)
        seq = value.get("seq")
        sub = value.get("sub")
        rows = value.get("rows", 0)
        arrival = value.get("arrival")
        parents = value.get("parents", [])
        if (
            (seq is not None and not (isinstance(seq, str) and seq.isdigit()))
            or (sub is not None and not (isinstance(sub, int) and sub >= 0 and seq is not None))
            or not (isinstance(rows, int) and rows >= 0)
            or (arrival is not None and not isinstance(arrival, int))
            or not (isinstance(parents, list) and all(isinstance(p, str) for p in parents))
        ):
            raise _unreadable(where, f"a shard entry {json.dumps(value)} that is not one")
        return cls(
            origin=value["from"],
            parents=tuple(parents),
            sequence_number=seq,
            sub_sequence_number=sub,
            rows=rows,
            arrival_ms=arrival,
            ended=bool(value.get("end", False)),
        )


@dataclass(frozen=True, slots=True)
class StreamOffset:
    name: str
    created_ms: int
    shards: dict[str, ShardOffset] = field(default_factory=dict)
    behind_ms: int | None = None  # reported only (MillisBehindLatest at the time): never read back

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "stream": self.name,
            "created": self.created_ms,
            "shards": {shard_id: self.shards[shard_id].to_json() for shard_id in sorted(self.shards)},
        }
        if self.behind_ms is not None:
            out["behindMs"] = self.behind_ms
        return out

    @classmethod
    def from_json(cls, value: Any, where: str) -> StreamOffset:
        if not isinstance(value, dict) or not isinstance(value.get("stream"), str):
            raise _unreadable(where, "a stream without its name")
        created = value.get("created")
        shards = value.get("shards", {})
        if not isinstance(created, int) or not isinstance(shards, dict):
            raise _unreadable(where, "a stream without its creation time or shards")
        return cls(
            name=value["stream"],
            created_ms=created,
            shards={
                shard_id: ShardOffset.from_json(item, f"{where}, shard {shard_id}") for shard_id, item in shards.items()
            },
        )


@dataclass(frozen=True, slots=True)
class SourceOffset:
    """All streams' positions; keyed by stream ARN."""

    streams: dict[str, StreamOffset] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"v": VERSION, "streams": {arn: self.streams[arn].to_json() for arn in sorted(self.streams)}}

    @classmethod
    def from_json(cls, value: Any) -> SourceOffset:
        if not isinstance(value, dict) or value.get("v") != VERSION or not isinstance(value.get("streams"), dict):
            raise _unreadable("the offset", f"version {value.get('v') if isinstance(value, dict) else None!r}")
        return cls(
            {arn: StreamOffset.from_json(item, f"stream {arn}") for arn, item in value["streams"].items()},
        )


def canonical(offset: dict[str, Any]) -> str:
    """An offset's JSON text, the same for equal offsets (sorted keys)."""
    return json.dumps(offset, sort_keys=True, separators=(",", ":"))


def origin_of(position: Position) -> str:
    """A shard's ``from`` for a starting position that names a moment (TRIM_HORIZON, AT_TIMESTAMP)."""
    if position.kind == "TRIM_HORIZON":
        return "TRIM_HORIZON"
    if position.kind == "AT_TIMESTAMP" and position.timestamp is not None:
        return f"AT_TIMESTAMP:{int(position.timestamp.timestamp() * 1000)}"
    raise ValueError(f"not a starting moment: {position}")


def origin_position(origin: str, where: str = "the offset") -> Position:
    if origin == "TRIM_HORIZON":
        return Position("TRIM_HORIZON")
    kind, _, ms = origin.partition(":")
    if kind == "AT_TIMESTAMP" and ms.isdigit():
        return Position("AT_TIMESTAMP", timestamp=datetime.fromtimestamp(int(ms) / 1000, UTC))
    raise _unreadable(where, f"a starting position {origin!r}")


def _unreadable(where: str, what: str) -> ConfigError:
    return ConfigError(
        f"efo source: the checkpoint's offset holds {what} ({where}): it was not written by this version of the "
        "efo source; start the query with a new checkpointLocation"
    )


__all__ = ["VERSION", "ShardOffset", "SourceOffset", "StreamOffset", "canonical", "origin_of", "origin_position"]
