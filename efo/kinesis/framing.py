"""efo's own event-stream framing: botocore's ``EventStreamBuffer`` checks, without its copies.

A SubscribeToShard response body is a sequence of event-stream messages::

    [total length: u32][headers length: u32][prelude CRC: u32][headers][payload][message CRC: u32]

botocore's :class:`~botocore.eventstream.EventStreamBuffer` appends every socket read to one
``bytes`` (``_data += data``: the whole pending message copied again per read), then copies each
message's bytes for its CRC, its payload, and what follows it, and parses the headers through a
chain of slicing helpers into a new dict per message. For an event of 100 records of 1 KiB
(~140 KB of base64 JSON) that is four to five copies of the event and a few hundred Python calls;
py-spy put it at 12 % of efo's GIL time at 64 shards x 1 KiB once payloads were decoded into columns.

:class:`Framer` does the same work with one copy at most (the reads that make up a message are
joined once, when the message is complete) and hands the payload on as a ``memoryview`` of those
bytes. Every check botocore makes is kept, in the same order and with the same exceptions:

* the prelude CRC (:class:`~botocore.eventstream.ChecksumMismatch`), as soon as 12 bytes are there;
* the header and payload length limits (``InvalidHeadersLength``, ``InvalidPayloadLength``);
* the message CRC, computed from the prelude CRC as botocore does (``crc32(bytes[8:-4], prelude_crc)``),
  with zlib-ng's CRC-32, which gives zlib's values several times faster;
* the headers, parsed as botocore parses them (every header type, ``DuplicateHeader``): a header
  block this parser does not take in stride (an unknown type, a truncated value, a duplicate, bad
  UTF-8) is handed to botocore's own ``EventStreamHeaderParser``, which returns or raises exactly
  what it would have;
* a message whose lengths do not add up (total length below prelude + headers + CRC) is handed
  whole to botocore's ``EventStreamBuffer``, so it fails (or not) as it would have.

The framer only frames: :func:`efo.kinesis.decoder.take_over` puts it under aiobotocore's raw
generator, which still reads the body (aiohttp's errors, a truncated message at the end dropped
silently as before: the subscription then ends as if the server had closed it).

Header dicts are shared between messages with the same header bytes (every SubscribeToShardEvent
of a stream has the same three headers): callers must not modify them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

from botocore.eventstream import (
    ChecksumMismatch,
    EventStreamBuffer,
    EventStreamHeaderParser,
    InvalidHeadersLength,
    InvalidPayloadLength,
)
from zlib_ng import zlib_ng

PRELUDE_LENGTH = 12
MESSAGE_CRC_LENGTH = 4
MAX_HEADERS_LENGTH = 128 * 1024  # botocore.eventstream._MAX_HEADERS_LENGTH
MAX_PAYLOAD_LENGTH = 24 * 1024 * 1024  # botocore.eventstream._MAX_PAYLOAD_LENGTH
_HEADER_CACHE_SIZE = 64

_prelude = struct.Struct("!III").unpack_from
_u32 = struct.Struct("!I").unpack_from
_u16 = struct.Struct("!H").unpack_from
_INTS = {kind: struct.Struct(f) for kind, f in ((2, "!b"), (3, "!h"), (4, "!i"), (5, "!q"), (8, "!q"))}
# zlib-ng's CRC-32: the same checksum as zlib's, several times faster (SIMD). With zlib's, the message
# CRC over every byte of an event was an eighth of efo's event loop at 64 shards x 1 KiB (docs/benchmarks.md).
_crc32 = zlib_ng.crc32

#: One message: its headers (shared, do not modify) and its payload (a view of the received bytes).
Message = tuple[dict[str, Any], memoryview]


def parse_headers(data: bytes) -> dict[str, Any]:
    """The headers of a message, exactly as botocore's ``EventStreamHeaderParser().parse(data)``."""
    try:
        return _parse_headers(data)
    except Exception:
        # Whatever this parser does not take in stride, botocore decides: the same dict or the same error.
        return EventStreamHeaderParser().parse(data)  # type: ignore[no-any-return]


def _parse_headers(data: bytes) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    end = len(data)
    i = 0
    while i < end:
        name_end = i + 1 + data[i]
        name = data[i + 1 : name_end].decode("utf-8")
        kind = data[name_end]
        i = name_end + 1
        value: Any
        if kind == 7 or kind == 6:
            size = _u16(data, i)[0]
            value = data[i + 2 : i + 2 + size]
            if kind == 7:
                value = value.decode("utf-8")
            i += 2 + size
        elif kind == 0 or kind == 1:
            value = kind == 0
        elif kind == 9:
            value = data[i : i + 16]
            i += 16
        else:
            unpacker = _INTS[kind]  # KeyError for an unknown type: botocore's parser raises it
            value = unpacker.unpack_from(data, i)[0]
            i += unpacker.size
        if name in headers:
            raise KeyError(name)  # botocore raises DuplicateHeader: let it
        headers[name] = value
    return headers


class Framer:
    """Splits the bytes of an event stream into messages, checking them as botocore does.

    ``for headers, payload in framer.feed(chunk)`` with each chunk as it is read; messages come out
    as soon as they are complete, and an error is raised when the faulty message is reached (the
    messages before it are yielded first), as iterating an ``EventStreamBuffer`` would.
    """

    __slots__ = ("_headers", "_need", "_parts", "_size")

    def __init__(self, data: bytes = b"") -> None:
        self._parts: list[bytes] = [data] if data else []
        self._size = len(data)
        self._need = PRELUDE_LENGTH  # bytes needed before anything can be parsed again
        self._headers: dict[bytes, dict[str, Any]] = {}

    def feed(self, data: bytes) -> Iterator[Message]:
        if data:
            self._parts.append(data)
            self._size += len(data)
        if self._size < self._need:
            return
        parts = self._parts
        buffer = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        size = self._size
        view = memoryview(buffer)
        position = 0
        while True:
            available = size - position
            if available < PRELUDE_LENGTH:
                break
            total, headers_length, prelude_crc = _prelude(buffer, position)
            computed = _crc32(view[position : position + 8])
            if computed != prelude_crc:
                self._keep(buffer, position, size)
                raise ChecksumMismatch(prelude_crc, computed)
            if headers_length > MAX_HEADERS_LENGTH:
                self._keep(buffer, position, size)
                raise InvalidHeadersLength(headers_length)
            payload_start = position + PRELUDE_LENGTH + headers_length
            payload_end = position + total - MESSAGE_CRC_LENGTH
            if payload_end - payload_start > MAX_PAYLOAD_LENGTH:
                self._keep(buffer, position, size)
                raise InvalidPayloadLength(payload_end - payload_start)
            if available < total:
                break
            if payload_end < payload_start:
                # Lengths that do not add up: botocore's buffer decides what they mean.
                yield _botocore_message(buffer[position:size])
                position += total
                continue
            expected = _u32(buffer, payload_end)[0]
            computed = _crc32(view[position + 8 : payload_end], prelude_crc)
            if computed != expected:
                self._keep(buffer, position, size)
                raise ChecksumMismatch(expected, computed)
            header_bytes = buffer[position + PRELUDE_LENGTH : payload_start]
            headers = self._headers.get(header_bytes)
            if headers is None:
                headers = parse_headers(header_bytes)
                if len(self._headers) < _HEADER_CACHE_SIZE:
                    self._headers[header_bytes] = headers
            payload = view[payload_start:payload_end]
            position += total
            yield headers, payload
        self._keep(buffer, position, size)

    def _keep(self, buffer: bytes, position: int, size: int) -> None:
        """Keep ``buffer[position:size]`` for the next feed (whose prelude, if whole, was checked)."""
        parts = self._parts
        parts.clear()
        if position < size:
            parts.append(buffer[position:size] if position else buffer)
        self._size = size - position
        # The whole next message once its prelude is there (a prelude the next feed checks again).
        self._need = max(PRELUDE_LENGTH, _u32(parts[0], 0)[0]) if self._size >= PRELUDE_LENGTH else PRELUDE_LENGTH


def _botocore_message(data: bytes) -> Message:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    message = next(buffer)
    return message.headers, memoryview(message.payload)


__all__ = ["Framer", "Message", "parse_headers"]
