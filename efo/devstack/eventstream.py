"""Minimal AWS event-stream (vnd.amazon.eventstream) framing: string-header encoding and decoding."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from botocore.eventstream import EventStreamBuffer, EventStreamMessage

_PRELUDE = struct.Struct(">II")
_CRC = struct.Struct(">I")
_STRING_HEADER_TYPE = 7
PRELUDE_LENGTH = _PRELUDE.size + _CRC.size  # total length, headers length, prelude CRC


@dataclass(frozen=True)
class Frame:
    headers: dict[str, str]
    payload: bytes


def encode_headers(headers: dict[str, str]) -> bytes:
    out = bytearray()
    for name, value in headers.items():
        raw_name = name.encode("utf-8")
        raw_value = value.encode("utf-8")
        if len(raw_name) > 255:
            raise ValueError(f"event-stream header name too long: {name!r}")
        if len(raw_value) > 0xFFFF:
            raise ValueError(f"event-stream header value too long for {name!r}")
        out += bytes([len(raw_name)]) + raw_name
        out += bytes([_STRING_HEADER_TYPE]) + struct.pack(">H", len(raw_value)) + raw_value
    return bytes(out)


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """Encode one event-stream message whose headers are all strings."""
    raw_headers = encode_headers(headers)
    total = PRELUDE_LENGTH + len(raw_headers) + len(payload) + _CRC.size
    prelude = _PRELUDE.pack(total, len(raw_headers))
    head = prelude + _CRC.pack(zlib.crc32(prelude)) + raw_headers + payload
    return head + _CRC.pack(zlib.crc32(head))


def frame_length(prelude: bytes) -> int:
    """Total message length announced by the first 4+ bytes of a message."""
    (total,) = struct.unpack_from(">I", prelude)
    return int(total)


def _to_frame(message: EventStreamMessage) -> Frame:
    headers = {str(k): v if isinstance(v, str) else str(v) for k, v in message.headers.items()}
    return Frame(headers=headers, payload=bytes(message.payload))


def decode_message(data: bytes) -> Frame:
    """Decode exactly one complete message (CRCs are verified by botocore)."""
    frames = decode_messages(data)
    if len(frames) != 1:
        raise ValueError(f"expected exactly one event-stream message, got {len(frames)}")
    return frames[0]


def decode_messages(data: bytes) -> list[Frame]:
    """Decode all complete messages in ``data``; trailing partial bytes raise ValueError."""
    decoder = FrameDecoder()
    frames = list(decoder.feed(data))
    if decoder.pending:
        raise ValueError("trailing partial event-stream message")
    return frames


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get complete frames back."""

    def __init__(self) -> None:
        self._buffer = EventStreamBuffer()
        self._pending = 0

    @property
    def pending(self) -> bool:
        return self._pending > 0

    def feed(self, data: bytes) -> Iterator[Frame]:
        self._buffer.add_data(data)
        self._pending += len(data)
        for message in self._buffer:
            self._pending -= int(message.prelude.total_length)
            yield _to_frame(message)
