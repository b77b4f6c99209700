"""KPL aggregated records: detection, de-aggregation, and the per-event column expansion.

A producer using the Kinesis Producer Library packs many user records into one Kinesis record::

    F3 89 9A C2 | protobuf AggregatedRecord | MD5 of the protobuf bytes (16 bytes)

    message AggregatedRecord {
      repeated string partition_key_table     = 1;
      repeated string explicit_hash_key_table = 2;
      repeated Record records                 = 3;
    }
    message Record {
      required uint64 partition_key_index     = 1;
      optional uint64 explicit_hash_key_index = 2;
      required bytes  data                    = 3;
      repeated Tag    tags                    = 4;   // not decoded: skipped as bytes
    }

The user records share the Kinesis record's sequence number and are numbered 0..n-1 (the
sub-sequence number, see :class:`efo.pipeline.records.Position`).

The protobuf decoder is written by hand instead of depending on ``protobuf``: it is one fixed
message and about 120 lines of wire-format code, where a dependency would bring generated ``_pb2``
code plus a C/upb extension whose version has to be pinned against the runtime, for no gain. It
is also strict where the generic library is lenient or undefined for our purposes, so every
malformed input ends in one exception, :class:`CorruptAggregate`, with a short reason:

- truncated varints, lengths running past the end, varints over 64 bits, field number 0;
- a known field with the wrong wire type; unknown fields are skipped by wire type (including
  the deprecated groups, matched start to end);
- missing required fields, table indexes out of range, keys that are not UTF-8;
- no sub-records, or more than ``max_sub_records`` (a count that cannot fit in the bytes is
  impossible by construction: records are parsed from the bytes, at least 6 bytes each, and
  nothing is allocated from a declared count).

The decoder works in place on the record (no copy of the body), allocates in proportion to the
input and never from a declared length or count, and does work linear in the input.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import repeat
from typing import Literal

from efo.errors import EfoError
from efo.pipeline.records import MAX_SUB_SEQUENCE

MAGIC = b"\xf3\x89\x9a\xc2"
DIGEST_SIZE = 16
DEFAULT_MAX_SUB_RECORDS = 100_000
CORRUPT_AGGREGATE = "corrupt_aggregate"  # the ``error`` column value of a passed-through corrupt aggregate

CorruptPolicy = Literal["passthrough", "dead_letter", "fail"]

_MAX_GROUP_DEPTH = 64
_HEADER = len(MAGIC)


class CorruptAggregate(EfoError):
    """A record with the KPL magic prefix that is not a valid aggregate. ``reason`` is short."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"corrupt KPL aggregate: {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SubRecord:
    """One user record out of an aggregate; its sub-sequence number is its index in the list."""

    partition_key: str
    explicit_hash_key: str | None
    data: bytes


def is_aggregate(data: bytes) -> bool:
    """Whether ``data`` is framed as a KPL aggregate: the magic prefix and room for the MD5."""
    return data[:_HEADER] == MAGIC and len(data) >= _HEADER + DIGEST_SIZE


def deaggregate(data: bytes, *, max_sub_records: int = DEFAULT_MAX_SUB_RECORDS) -> list[SubRecord]:
    """The user records of an aggregate, in order. Raises :class:`CorruptAggregate`.

    ``data`` must satisfy :func:`is_aggregate`; anything else is reported as corrupt.
    """
    keys, hash_keys, payloads = _deaggregate_columns(data, max_sub_records)
    return list(map(SubRecord, keys, hash_keys, payloads))


def _deaggregate_columns(data: bytes, max_sub_records: int) -> tuple[list[str], list[str | None], list[bytes]]:
    """:func:`deaggregate` as three columns: partition keys, explicit hash keys, data."""
    if not is_aggregate(data):
        raise CorruptAggregate("not an aggregate")
    end = len(data) - DIGEST_SIZE
    if hashlib.md5(memoryview(data)[_HEADER:end], usedforsecurity=False).digest() != data[end:]:
        raise CorruptAggregate("md5 mismatch")
    return _decode(data, _HEADER, end, max_sub_records)


# --- protobuf wire format -------------------------------------------------------------------------
#
# The message is decoded in place in the Kinesis record (no copy of the body): every read checks
# ``pos < end`` itself, because indexing past ``end`` would read the MD5 instead of failing. The
# hot path (one-byte tags, lengths and indexes) is inlined; anything else goes to ``_varint``.


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode a base-128 varint at ``pos``; returns (value, next position)."""
    value = 0
    shift = 0
    while True:
        if pos >= end:
            raise CorruptAggregate("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if value >> 64:
                raise CorruptAggregate("varint over 64 bits")
            return value, pos
        shift += 7
        if shift >= 70:
            raise CorruptAggregate("varint over 10 bytes")


def _length(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode a length prefix; returns (end of the payload, start of the payload)."""
    if pos < end and buf[pos] < 0x80:
        stop = pos + 1 + buf[pos]
        pos += 1
    else:
        size, pos = _varint(buf, pos, end)
        stop = pos + size
    if stop > end:
        raise CorruptAggregate("truncated field")
    return stop, pos


def _skip(buf: bytes, pos: int, end: int, key: int) -> int:
    """Skip the payload of an unknown field whose tag ``key`` was just read."""
    wire = key & 7
    if wire == 0:
        return _varint(buf, pos, end)[1]
    if wire == 2:
        return _length(buf, pos, end)[0]
    if wire == 1 or wire == 5:
        pos += 8 if wire == 1 else 4
        if pos > end:
            raise CorruptAggregate("truncated field")
        return pos
    if wire == 3:  # start group: skip to its matching end group
        open_groups = [key >> 3]
        while open_groups:
            inner, pos = _varint(buf, pos, end)
            if inner >> 3 == 0:
                raise CorruptAggregate("field number 0")
            if inner & 7 == 3:
                if len(open_groups) >= _MAX_GROUP_DEPTH:
                    raise CorruptAggregate("groups nested too deep")
                open_groups.append(inner >> 3)
            elif inner & 7 == 4:
                if open_groups.pop() != inner >> 3:
                    raise CorruptAggregate("mismatched end group")
            else:
                pos = _skip(buf, pos, end, inner)
        return pos
    raise CorruptAggregate(f"unexpected wire type {wire}")


def _other_field(buf: bytes, pos: int, end: int, key: int, known: int, message: str) -> int:
    """A tag the hot path did not expect: field 0 and a known field (1..known) with the wrong wire type are errors."""
    number = key >> 3
    if number == 0:
        raise CorruptAggregate("field number 0")
    if number <= known:
        raise CorruptAggregate(f"{message} field {number} has wire type {key & 7}")
    return _skip(buf, pos, end, key)


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptAggregate(f"{what} is not UTF-8") from None


# Tags (field number << 3 | wire type) of the fields the decoder reads.
_PK_TABLE, _EHK_TABLE, _RECORDS = 0x0A, 0x12, 0x1A  # AggregatedRecord fields 1, 2, 3: length-delimited
_PK_INDEX, _EHK_INDEX, _DATA, _TAGS = 0x08, 0x10, 0x1A, 0x22  # Record fields 1, 2 (varint), 3, 4 (length-delimited)


def _decode(buf: bytes, pos: int, end: int, max_sub_records: int) -> tuple[list[str], list[str | None], list[bytes]]:
    """Decode the ``AggregatedRecord`` in ``buf[pos:end]`` into columns, keys resolved through the tables."""
    pk_table: list[str] = []
    ehk_table: list[str] = []
    pk_indexes: list[int] = []
    ehk_indexes: list[int] = []  # -1: none
    payloads: list[bytes] = []
    while pos < end:
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(buf, pos, end)
        if key != _RECORDS:
            if key in (_PK_TABLE, _EHK_TABLE):
                stop, pos = _length(buf, pos, end)
                if key == _PK_TABLE:
                    pk_table.append(_text(buf[pos:stop], "partition key"))
                else:
                    ehk_table.append(_text(buf[pos:stop], "explicit hash key"))
                pos = stop
            else:
                pos = _other_field(buf, pos, end, key, 3, "aggregate")
            continue
        # One Record, inlined: this loop is the cost of de-aggregation.
        if len(payloads) >= max_sub_records:
            raise CorruptAggregate(f"more than {max_sub_records} sub-records")
        stop, pos = _length(buf, pos, end)
        pk_index = ehk_index = -1
        payload: bytes | None = None
        while pos < stop:
            key = buf[pos]
            if key < 0x80:
                pos += 1
            else:
                key, pos = _varint(buf, pos, stop)
            if key == _DATA:
                data_end, pos = _length(buf, pos, stop)
                payload = buf[pos:data_end]
                pos = data_end
            elif key in (_PK_INDEX, _EHK_INDEX):  # the last one wins, as in protobuf
                if pos < stop and buf[pos] < 0x80:
                    value = buf[pos]
                    pos += 1
                else:
                    value, pos = _varint(buf, pos, stop)
                if key == _PK_INDEX:
                    pk_index = value
                else:
                    ehk_index = value
            elif key == _TAGS:  # not decoded
                pos = _length(buf, pos, stop)[0]
            else:
                pos = _other_field(buf, pos, stop, key, 4, "record")
        if pk_index < 0:
            raise CorruptAggregate("record without partition key index")
        if payload is None:
            raise CorruptAggregate("record without data")
        pk_indexes.append(pk_index)
        ehk_indexes.append(ehk_index)
        payloads.append(payload)
    if not payloads:
        raise CorruptAggregate("no sub-records")
    if max(pk_indexes) >= len(pk_table):
        raise CorruptAggregate("partition key index out of range")
    partition_keys = list(map(pk_table.__getitem__, pk_indexes))
    top = max(ehk_indexes)
    if top < 0:
        return partition_keys, [None] * len(payloads), payloads
    if top >= len(ehk_table):
        raise CorruptAggregate("explicit hash key index out of range")
    with_none: list[str | None] = [*ehk_table, None]  # index -1 is None
    return partition_keys, list(map(with_none.__getitem__, ehk_indexes)), payloads


# --- per-event column expansion ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A corrupt aggregate set aside under the ``dead_letter`` policy (no shard or stream: the caller adds those)."""

    sequence_number: str
    partition_key: str
    arrival_ms: int
    data: bytes
    reason: str


@dataclass(slots=True)
class Expanded:
    """The rows of one event after de-aggregation and de-duplication, as :class:`RecordChunk` columns.

    One row per plain record (``sub_sequence_numbers`` None) and one per user record of an
    aggregate (0..n-1, partition and explicit hash key from the aggregate's tables). The column
    lists may be the caller's own input lists (the fast path returns them as they are).

    ``corrupt``: aggregates that failed to decode, whatever the policy did with them.
    ``duplicates``: what the watermark dropped: one per input record dropped whole (an aggregate
    wholly at or below the watermark is not decoded and counts once), plus one per sub-record
    dropped from the aggregate the watermark falls inside.
    """

    sequence_numbers: list[str]
    sub_sequence_numbers: list[int | None]
    partition_keys: list[str]
    explicit_hash_keys: list[str | None]
    arrival_ms: list[int]
    data: list[bytes]  # the input list itself (or a slice of it) when the event holds no aggregate
    errors: list[str | None]
    data_bytes: int = 0
    dead_letters: list[DeadLetter] = field(default_factory=list)
    corrupt: int = 0
    duplicates: int = 0

    def __len__(self) -> int:
        return len(self.sequence_numbers)


def expand(
    sequence_numbers: list[str],
    partition_keys: list[str],
    arrival_ms: list[int],
    data: list[bytes],
    delivered: tuple[int, int] | None,
    *,
    policy: CorruptPolicy = "passthrough",
    max_sub_records: int = DEFAULT_MAX_SUB_RECORDS,
    data_bytes: int | None = None,
) -> Expanded:
    """Expand one SubscribeToShard event's records into output rows.

    The four input columns are the event's records, in sequence order (Kinesis guarantees it
    within a shard; the watermark is applied by bisection on that order). ``delivered`` is the
    ``(sequence, sub_sequence)`` at or below which rows were already delivered
    (:meth:`Position.delivered_through`); a row's key is ``(int(sequence_number), sub)`` with a
    plain record's ``sub`` taken as ``MAX_SUB_SEQUENCE``. Rows with key <= ``delivered`` are dropped.

    A record with the magic prefix that does not decode is handled by ``policy``:
    ``"passthrough"``: one row with the raw data, ``sub_sequence_number`` None and
    ``error="corrupt_aggregate"``; ``"dead_letter"``: no row, a :class:`DeadLetter` instead;
    ``"fail"``: :class:`CorruptAggregate` is raised (nothing is returned).

    An event without any aggregate costs one prefix check per record and returns the input columns
    themselves (sliced if the watermark drops a prefix); an event with one is expanded row by row.
    ``data_bytes``, when given, is the total length of ``data`` (the decoder has it), not summed again.
    """
    n = len(sequence_numbers)
    start = 0
    straddle_sub = -1  # >= 0: sub-records at or below it of the aggregate at ``start`` were delivered
    if delivered is not None and n:
        w_seq, w_sub = delivered
        if int(sequence_numbers[0]) <= w_seq:
            if w_sub >= MAX_SUB_SEQUENCE:
                start = bisect_right(sequence_numbers, w_seq, key=int)
            else:
                start = bisect_left(sequence_numbers, w_seq, key=int)
                if start < n and int(sequence_numbers[start]) == w_seq:
                    straddle_sub = w_sub

    if not any(map(bytes.startswith, data, repeat(MAGIC))):
        if start:
            sequence_numbers, partition_keys = sequence_numbers[start:], partition_keys[start:]
            arrival_ms, data = arrival_ms[start:], data[start:]
        kept = n - start
        if start or data_bytes is None:
            data_bytes = sum(map(len, data))
        return Expanded(
            sequence_numbers,
            [None] * kept,
            partition_keys,
            [None] * kept,
            arrival_ms,
            data,
            [None] * kept,
            data_bytes=data_bytes,
            duplicates=start,
        )

    out = Expanded([], [], [], [], [], [], [])
    out.duplicates = start
    for i in range(start, n):
        raw = data[i]
        if not is_aggregate(raw):
            _append(out, sequence_numbers[i], None, partition_keys[i], None, arrival_ms[i], raw, None)
            continue
        try:
            keys, hash_keys, payloads = _deaggregate_columns(raw, max_sub_records)
        except CorruptAggregate as error:
            out.corrupt += 1
            if policy == "fail":
                raise
            if policy == "dead_letter":
                out.dead_letters.append(
                    DeadLetter(sequence_numbers[i], partition_keys[i], arrival_ms[i], raw, error.reason)
                )
            else:
                _append(out, sequence_numbers[i], None, partition_keys[i], None, arrival_ms[i], raw, CORRUPT_AGGREGATE)
            continue
        count = len(payloads)
        first = 0
        if i == start and straddle_sub >= 0:
            first = min(straddle_sub + 1, count)
            out.duplicates += first
            keys, hash_keys, payloads = keys[first:], hash_keys[first:], payloads[first:]
        kept = count - first
        out.sequence_numbers.extend(repeat(sequence_numbers[i], kept))
        out.sub_sequence_numbers.extend(range(first, count))
        out.partition_keys.extend(keys)
        out.explicit_hash_keys.extend(hash_keys)
        out.arrival_ms.extend(repeat(arrival_ms[i], kept))
        out.data.extend(payloads)
        out.errors.extend(repeat(None, kept))
        out.data_bytes += sum(map(len, payloads))
    return out


def _append(
    out: Expanded,
    sequence_number: str,
    sub: int | None,
    partition_key: str,
    explicit_hash_key: str | None,
    arrival_ms: int,
    data: bytes,
    error: str | None,
) -> None:
    out.sequence_numbers.append(sequence_number)
    out.sub_sequence_numbers.append(sub)
    out.partition_keys.append(partition_key)
    out.explicit_hash_keys.append(explicit_hash_key)
    out.arrival_ms.append(arrival_ms)
    out.data.append(data)
    out.errors.append(error)
    out.data_bytes += len(data)


__all__ = [
    "CORRUPT_AGGREGATE",
    "DEFAULT_MAX_SUB_RECORDS",
    "DIGEST_SIZE",
    "MAGIC",
    "CorruptAggregate",
    "CorruptPolicy",
    "DeadLetter",
    "Expanded",
    "SubRecord",
    "deaggregate",
    "expand",
    "is_aggregate",
]
