"""A fast decoder for SubscribeToShard events.

botocore parses each event-stream message by walking the service model's shapes (a dict per
record, a datetime per timestamp, stdlib base64): on this machine that caps one process at about
48k records/s of 1 KiB. Here botocore and aiobotocore still sign and send the call, open the
connection, check the HTTP status and read the initial-response frame; after the call returns we
read the rest of the body with efo's own framing (:mod:`efo.kinesis.framing`: botocore's checks,
fewer copies) and decode each SubscribeToShardEvent into columns (:class:`ShardEvent`): with
msgspec, which parses the JSON and base64-decodes the records' data in one pass, when the event's
first record is small (at most :data:`TYPED_MAX_DATA_CHARS` of base64), otherwise with orjson and
pybase64 (msgspec's base64 is slower than pybase64's on large records; see :func:`decode_event`).
With ``EFO_TEST_FRAMING=botocore`` in the environment (or :data:`FRAMING` set to ``"botocore"``),
or when the stream cannot be taken over, the raw event-stream messages come from the
:class:`~aiobotocore.eventstream.AioEventStream` itself (botocore's own framing and CRC checks).

What a message becomes, exactly as aiobotocore would have it:

* ``:message-type`` ``exception`` or ``error`` → botocore's own event-stream error parser builds
  the response and :class:`botocore.exceptions.EventStreamError` is raised (so
  :func:`efo.errors.translate` sees the same code and message).
* any other message whose ``:event-type`` is ``SubscribeToShardEvent`` → a :class:`ShardEvent`.
* anything else (unknown event types) → skipped.

Arrival timestamps come as epoch seconds (a JSON number, possibly fractional) and become epoch
milliseconds equal to ``int(dt.timestamp() * 1000)`` of the datetime botocore would have parsed.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import os
import re
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

import botocore.loaders
import botocore.model
import botocore.parsers
import msgspec
import numpy as np
import orjson
import pybase64
from aiobotocore.eventstream import AioEventStream
from botocore.eventstream import EventStreamBuffer
from botocore.exceptions import EventStreamError

from efo.kinesis.framing import Framer, Message
from efo.observability import METRICS

OPERATION_NAME = "SubscribeToShard"
EVENT_TYPE = "SubscribeToShardEvent"
#: Whose framing reads the event stream: "efo" (efo.kinesis.framing) or "botocore" (aiobotocore's
#: generator, as before efo had its own). tests/unit/test_framing.py compares the two on the same bytes
#: and runs the decoder on both; ``EFO_TEST_FRAMING=botocore`` runs any other test (or the service) on
#: botocore's (an ``EFO_TEST_`` variable is the tooling's, not a setting).
FRAMING = os.environ.get("EFO_TEST_FRAMING", "efo")


@dataclass(slots=True)
class ShardEvent:
    """One SubscribeToShardEvent with its records as columns, in the order they arrived."""

    sequence_numbers: list[str] = field(default_factory=list)
    arrival_ms: list[int] = field(default_factory=list)  # epoch milliseconds, UTC
    data: list[bytes] = field(default_factory=list)
    partition_keys: list[str] = field(default_factory=list)
    data_bytes: int = 0  # the total length of data: every decoder sets it, and expand takes it as is
    continuation_sequence_number: str | None = None  # None: the shard has ended
    millis_behind_latest: int | None = None
    child_shards: list[dict[str, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.sequence_numbers)


# ---- the one place that touches aiobotocore internals ----------------------------------------


def raw_messages(stream: AioEventStream) -> AsyncIterator[Any]:
    """The raw botocore ``EventStreamMessage`` objects left in ``stream`` after the initial response.

    aiobotocore (like botocore's ``EventStream``) keeps them in the private ``_event_generator``,
    the async generator that ``get_initial_response()`` already advanced past the first frame and
    that its own ``async for`` parses from. Every aiobotocore 2.x/3.x release has it.
    """
    generator = getattr(stream, "_event_generator", None)
    if generator is None or not hasattr(generator, "__anext__"):
        raise RuntimeError(
            f"aiobotocore {_aiobotocore_version()} has no AioEventStream._event_generator async generator: "
            "efo.kinesis.decoder.raw_messages must be adapted to this aiobotocore release"
        )
    return generator  # type: ignore[no-any-return]


def take_over(stream: AioEventStream) -> bool:
    """Make aiobotocore's raw generator frame with efo's :class:`~efo.kinesis.framing.Framer`:
    True when done, False when this aiobotocore does not look as expected (nothing is changed then,
    and botocore frames as before).

    ``get_initial_response()`` left ``_create_raw_event_generator`` suspended at its ``yield``,
    inside ``for event in event_stream_buffer`` with no half-parsed prelude. The generator goes on
    reading the body as it always does (``add_data(chunk)``, then ``next()`` until StopIteration),
    but its buffer's ``add_data`` and ``next`` become the framer's, which starts from the bytes the
    buffer held past the initial response. Messages then come out as ``(headers, payload)``.
    """
    generator = getattr(stream, "_event_generator", None)
    frame = getattr(generator, "ag_frame", None)
    if frame is None or getattr(generator, "ag_running", True):
        return False
    buffer = frame.f_locals.get("event_stream_buffer")
    if type(buffer) is not EventStreamBuffer or getattr(buffer, "_prelude", True) is not None:
        return False
    data = getattr(buffer, "_data", None)
    if not isinstance(data, bytes):
        return False
    buffer._data = b""
    # Its class, not its methods: ``for event in buffer`` looks ``__next__`` up on the type, so the
    # swap holds however botocore's ``__next__`` is written.
    buffer.__class__ = FramedBuffer
    assert isinstance(buffer, FramedBuffer)
    buffer.start(Framer(data))
    return True


class FramedBuffer(EventStreamBuffer):  # type: ignore[misc]
    """botocore's buffer whose framing is efo's :class:`~efo.kinesis.framing.Framer` (what
    :func:`take_over` turns aiobotocore's buffer into): messages come out as ``(headers, payload)``."""

    _framer: Framer
    _messages: Iterator[Message]

    def start(self, framer: Framer) -> None:
        self._framer = framer
        self._messages = framer.feed(b"")

    def add_data(self, data: bytes) -> None:
        self._messages = self._framer.feed(data)

    def next(self) -> Message:  # type: ignore[override]
        return next(self._messages)  # StopIteration ends botocore's ``for event in buffer``

    __next__ = next


def _aiobotocore_version() -> str:
    try:
        from importlib.metadata import version

        return version("aiobotocore")
    except Exception:
        return "(unknown version)"


# ---- decoding ----------------------------------------------------------------------------------


async def iter_events(stream: Any) -> AsyncGenerator[ShardEvent, None]:
    """The SubscribeToShardEvents of a subscription's ``response["EventStream"]``.

    A real :class:`AioEventStream` is decoded from its raw messages. Anything else (a test's fake
    stream of botocore-parsed dicts) is read with ``async for`` and converted by :func:`from_parsed`.
    """
    if not isinstance(stream, AioEventStream):
        async for parsed in stream:
            payload = parsed.get(EVENT_TYPE)
            if payload is not None:
                yield from_parsed(payload)
        return
    if FRAMING == "efo" and take_over(stream):
        async for headers, payload in raw_messages(stream):
            event = decode_message(headers, payload)
            del payload  # as below
            if event is not None:
                yield event
        return
    async for message in raw_messages(stream):
        event = decode_message(message.headers, message.payload)
        # An event waiting for pool budget must not also pin its raw frame (base64 text, 1.4x the
        # data): the memory bound counts one decoded event in flight per shard.
        del message
        if event is not None:
            yield event


def decode_message(headers: dict[str, Any], payload: bytes | memoryview) -> ShardEvent | None:
    """Decode one raw event-stream message: a :class:`ShardEvent`, None to skip, or raise."""
    message_type = headers.get(":message-type")
    if message_type == "exception" or message_type == "error":
        raise event_stream_error(dict(headers), bytes(payload))
    if headers.get(":event-type") != EVENT_TYPE:
        return None
    return decode_event(payload)


#: Events whose first record's data is at most this many base64 characters (1,350 bytes) are parsed
#: by msgspec, the others by orjson. Measured per event of 100 records in a loop, msgspec's one pass
#: costs 0.43 of orjson and pybase64 at 100 B records, 0.58 at 512 B, 0.93 at 1 KiB, 1.05 at 1.5 KiB
#: and 1.6 at 10 KiB (its base64 decoder is scalar, pybase64's vectorised).
TYPED_MAX_DATA_CHARS = 1800
#: How much of an event is searched for its first record's data (the keys before it are short).
_HEAD_BYTES = 4096
_DATA_VALUE = re.compile(rb'"Data"[ \t\n\r]*:[ \t\n\r]*"')
_Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


# Every field an event and its records have is declared, and any other refused: msgspec would skip an
# unknown value without checking it as orjson does (its UTF-8, its numbers, its depth).
class _Record(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    SequenceNumber: str
    ApproximateArrivalTimestamp: _Int64 | float
    Data: bytes  # base64 in the JSON, decoded strictly (a non-canonical value fails, as validate=True)
    PartitionKey: str
    EncryptionType: str | None = None  # not read


class _Event(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    Records: list[_Record] | None = None
    ContinuationSequenceNumber: str | None = None
    MillisBehindLatest: _Int64 | None = None
    ChildShards: None = None  # a shard's last event has them: orjson parses that one


_decode_typed = msgspec.json.Decoder(_Event).decode


def decode_event(payload: bytes | memoryview) -> ShardEvent:
    """Decode the JSON payload of a SubscribeToShardEvent message.

    An event whose first record is small goes through msgspec, which parses the JSON and decodes
    each record's base64 data in one pass into typed fields: no dict or base64 string per record.
    Its fields are typed as orjson gives them where they are valid (a str, an int within 64 bits or
    a float, canonical base64), and every field an event has is declared. Anything else (bad JSON,
    an unknown or missing field, a value of another type, base64 that ``validate=True`` would refuse,
    an event with child shards) fails there, and the event is decoded again by orjson and pybase64,
    as every event of large records is (``efo_events_decoded_twice_total`` counts them), with
    botocore's lenient base64 as the last resort. So both paths give the same values and raise the
    same errors (tests/unit/test_decoder.py checks it on arbitrary and corrupted events)."""
    if _first_record_is_small(payload):
        try:
            body = _decode_typed(payload)
        except ValueError:  # msgspec's DecodeError and ValidationError, a UnicodeDecodeError
            METRICS.events_decoded_twice.inc()
        else:
            return _from_typed(body)
    return _from_json(orjson.loads(payload))


def _first_record_is_small(payload: bytes | memoryview) -> bool:
    """Whether the first record's base64 data, within the event's first bytes, is at most TYPED_MAX_DATA_CHARS long."""
    head = bytes(payload[:_HEAD_BYTES])
    value = _DATA_VALUE.search(head)
    if value is None:
        return False
    end = head.find(b'"', value.end())
    return end >= 0 and end - value.end() <= TYPED_MAX_DATA_CHARS


def _from_typed(body: _Event) -> ShardEvent:
    event = ShardEvent(
        continuation_sequence_number=body.ContinuationSequenceNumber,
        millis_behind_latest=body.MillisBehindLatest,
    )
    records = body.Records
    if records:
        event.sequence_numbers = [record.SequenceNumber for record in records]
        event.partition_keys = [record.PartitionKey for record in records]
        event.arrival_ms = epoch_ms_of([record.ApproximateArrivalTimestamp for record in records])
        data = event.data = [record.Data for record in records]
        event.data_bytes = sum(map(len, data))
    return event


def _from_json(body: Any) -> ShardEvent:
    event = ShardEvent(
        continuation_sequence_number=body.get("ContinuationSequenceNumber"),
        millis_behind_latest=body.get("MillisBehindLatest"),
        child_shards=body.get("ChildShards") or [],
    )
    records = body.get("Records")
    if records:
        event.sequence_numbers = [record["SequenceNumber"] for record in records]
        event.partition_keys = [record["PartitionKey"] for record in records]
        event.arrival_ms = epoch_ms_of([record["ApproximateArrivalTimestamp"] for record in records])
        data = event.data = decode_payloads([record["Data"] for record in records])
        event.data_bytes = sum(map(len, data))
    return event


def decode_payloads(encoded: list[str]) -> list[bytes]:
    """The records' data as botocore decodes it: strictly (pybase64, vectorised), or, when a value
    is not canonical base64, with the standard library's ``base64.b64decode``, as botocore's
    parsers do (junk characters dropped, nothing read past the padding; pybase64's lenient mode
    reads on, and is not used)."""
    try:
        return [pybase64.b64decode(value, validate=True) for value in encoded]
    except binascii.Error:
        return [base64.b64decode(value) for value in encoded]


def _epoch_ms(seconds: float | int) -> int:
    """``int(dt.timestamp() * 1000)`` for ``dt = datetime.fromtimestamp(seconds, tz)`` without the datetime.

    ``fromtimestamp`` keeps whole seconds and rounds the fraction to microseconds half-to-even;
    ``timestamp()`` divides the total microseconds (an exact int) by 10**6.
    """
    if type(seconds) is int:
        return int(seconds * 1_000_000 / 1_000_000 * 1000)
    fraction, whole = math.modf(seconds)
    micros = round(fraction * 1e6)
    return int((int(whole) * 1_000_000 + micros) / 1_000_000 * 1000)


#: Arrival times an event's records share at most for them to be converted one distinct value at a
#: time; with more, all at once in numpy.
FEW_DISTINCT_ARRIVALS = 8
#: Seconds below which numpy's conversion is exact: the epoch microseconds stay below 2**53, where
#: a float64 holds every integer and its division rounds as Python's int division does.
_EXACT_BELOW_S = 2**53 // 1_000_000


def epoch_ms_of(arrivals: list[Any]) -> list[int]:
    """``[_epoch_ms(seconds) for seconds in arrivals]``, the same ints.

    Records read from a busy shard mostly arrived at different milliseconds: converting each in
    Python costs about a microsecond a record. All at once, numpy does the same arithmetic on the
    same doubles (``modf``, a half-to-even rounding, one true division, truncation), which gives
    the same results while the epoch microseconds are below 2**53 (until the year 2255); anything
    else (older or newer, negative, not a number) is converted value by value."""
    distinct = set(arrivals)
    if len(distinct) <= FEW_DISTINCT_ARRIVALS:
        millis = {seconds: _epoch_ms(seconds) for seconds in distinct}
        return [millis[seconds] for seconds in arrivals]
    values = np.array(arrivals)
    if values.dtype.kind not in "if" or not (values.min() >= 0 and values.max() < _EXACT_BELOW_S):
        return [_epoch_ms(seconds) for seconds in arrivals]
    fraction, whole = np.modf(values.astype(np.float64))
    micros = whole.astype(np.int64) * 1_000_000 + np.rint(fraction * 1e6).astype(np.int64)
    return (micros / 1_000_000 * 1000).astype(np.int64).tolist()  # type: ignore[no-any-return]


def arrival_ms(value: datetime | float | int | str) -> int:
    """Epoch milliseconds of an already parsed ``ApproximateArrivalTimestamp``, whatever parser made it."""
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return _epoch_ms(float(value) if isinstance(value, str) else value)


def from_parsed(payload: dict[str, Any]) -> ShardEvent:
    """A :class:`ShardEvent` from a SubscribeToShardEvent as botocore parses it (a dict per record)."""
    records: Iterable[dict[str, Any]] = payload.get("Records") or ()
    event = ShardEvent(
        continuation_sequence_number=payload.get("ContinuationSequenceNumber"),
        millis_behind_latest=payload.get("MillisBehindLatest"),
        child_shards=list(payload.get("ChildShards") or ()),
    )
    values: list[bytes] = []
    for record in records:
        event.sequence_numbers.append(record["SequenceNumber"])
        event.partition_keys.append(record["PartitionKey"])
        event.arrival_ms.append(arrival_ms(record["ApproximateArrivalTimestamp"]))
        values.append(record["Data"])
    event.data = values
    event.data_bytes = sum(map(len, values))
    return event


# ---- exceptions: rare, so botocore's own parser builds them -------------------------------------


@functools.cache
def _event_stream_shape() -> botocore.model.Shape:
    loader = botocore.loaders.create_loader()
    model = botocore.model.ServiceModel(loader.load_service_model("kinesis", "service-2"), "kinesis")
    return model.operation_model(OPERATION_NAME).output_shape.members["EventStream"]


def event_stream_error(headers: dict[str, Any], payload: bytes) -> EventStreamError:
    """The error aiobotocore raises for an ``exception``/``error`` message (same code and message).

    botocore leaves the code empty for an exception type its model does not list (a bare
    ``InternalFailure``, say); the ``:exception-type`` header and the payload's message are used
    then, so the error can be classified by its code like any other."""
    response = {"status_code": 400, "headers": headers, "body": payload}
    parsed = botocore.parsers.EventStreamJSONParser().parse(response, _event_stream_shape())
    error = parsed.setdefault("Error", {})
    if not error.get("Code") and headers.get(":exception-type"):
        error["Code"] = headers[":exception-type"]
        if not error.get("Message"):
            try:
                body = orjson.loads(payload) if payload else {}
            except orjson.JSONDecodeError:
                body = {}
            error["Message"] = str(body.get("message") or body.get("Message") or "") if isinstance(body, dict) else ""
    return EventStreamError(parsed, OPERATION_NAME)


__all__ = [
    "ShardEvent",
    "arrival_ms",
    "decode_event",
    "decode_message",
    "decode_payloads",
    "epoch_ms_of",
    "event_stream_error",
    "from_parsed",
    "iter_events",
    "raw_messages",
    "take_over",
]
