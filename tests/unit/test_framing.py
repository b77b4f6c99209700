"""efo.kinesis.framing against botocore's EventStreamBuffer on the same bytes.

Random messages (every header type botocore knows), cut at random points, corrupted at a random
byte or truncated: both give the same messages, then the same error (type and text) at the same
message, or both end quietly. Then the whole decoder: iter_events over a real AioEventStream gives
the same events and errors with efo's framing as with botocore's (``decoder.FRAMING``).
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import zlib
from typing import Any

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer, EventStreamHeaderParser
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from efo.kinesis import decoder
from efo.kinesis.framing import Framer, _crc32, parse_headers

# ---- encoding any header type (efo.devstack.eventstream encodes strings only) -------------------


def _header(name: bytes, kind: int, value: Any) -> bytes:
    head = bytes([len(name)]) + name + bytes([kind])
    if kind in (0, 1):
        return head
    if kind in (2, 3, 4, 5, 8):
        return head + struct.pack({2: "!b", 3: "!h", 4: "!i", 5: "!q", 8: "!q"}[kind], value)
    if kind in (6, 7):
        raw = value.encode() if kind == 7 else value
        return head + struct.pack("!H", len(raw)) + raw
    return head + value  # 9: 16 bytes


def _message(header_block: bytes, payload: bytes) -> bytes:
    total = 12 + len(header_block) + len(payload) + 4
    prelude = struct.pack("!II", total, len(header_block))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    body = prelude + header_block + payload
    return body + struct.pack("!I", zlib.crc32(body[8:], zlib.crc32(prelude[:8])))


names = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=12).map(str.encode)
header_values = st.one_of(
    st.tuples(st.just(0), st.none()),
    st.tuples(st.just(1), st.none()),
    st.tuples(st.just(2), st.integers(-128, 127)),
    st.tuples(st.just(3), st.integers(-(2**15), 2**15 - 1)),
    st.tuples(st.just(4), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.just(5), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just(6), st.binary(max_size=40)),
    st.tuples(st.just(7), st.text(max_size=20)),
    st.tuples(st.just(8), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just(9), st.binary(min_size=16, max_size=16)),
)
header_blocks = st.dictionaries(names, header_values, max_size=5).map(
    lambda headers: b"".join(_header(name, kind, value) for name, (kind, value) in headers.items())
)
messages = st.tuples(header_blocks, st.binary(max_size=300)).map(lambda m: _message(*m))


def _split(raw: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    return [raw[a:b] for a, b in itertools.pairwise(points) if b > a]


def _botocore(chunks: list[bytes]) -> tuple[list[tuple[Any, bytes]], tuple[type, str] | None]:
    buffer = EventStreamBuffer()
    out: list[tuple[Any, bytes]] = []
    try:
        for chunk in chunks:
            buffer.add_data(chunk)
            out.extend((message.headers, message.payload) for message in buffer)
    except Exception as exc:
        return out, (type(exc), str(exc))
    return out, None


def _efo(chunks: list[bytes], first: bytes = b"") -> tuple[list[tuple[Any, bytes]], tuple[type, str] | None]:
    framer = Framer(first)
    out: list[tuple[Any, bytes]] = []
    try:
        for chunk in [b"", *chunks]:
            out.extend((dict(headers), bytes(payload)) for headers, payload in framer.feed(chunk))
    except Exception as exc:
        return out, (type(exc), str(exc))
    return out, None


# ---- properties ----------------------------------------------------------------------------------


long_bytes = st.integers(0, 300_000).map(lambda n: bytes(range(256)) * (n // 256) + b"x" * (n % 256))


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=5000) | long_bytes,
    start=st.integers(0, 10**6),
    stop=st.integers(0, 10**6),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_framers_crc32_is_zlibs(data: bytes, start: int, stop: int, seed: int) -> None:
    """zlib-ng's CRC-32 (the framer's) gives zlib's value (botocore's) for every length, alignment
    and starting value, on memoryview slices as the framer passes them: its SIMD paths start at 64
    bytes and fold in blocks, so sizes up to an event of 300 KB are drawn."""
    start, stop = sorted((start % (len(data) + 1), stop % (len(data) + 1)))
    piece = memoryview(data)[start:stop]
    assert _crc32(piece, seed) == zlib.crc32(piece, seed)
    assert _crc32(data) == zlib.crc32(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    frames=st.lists(messages, min_size=1, max_size=5),
    cuts=st.lists(st.integers(0, 10**6), max_size=8),
    damage=st.none() | st.tuples(st.integers(0, 10**6), st.integers(1, 255)),
    truncate=st.none() | st.integers(0, 10**6),
    first=st.integers(0, 10**6),
)
def test_framing_matches_botocore(
    frames: list[bytes], cuts: list[int], damage: tuple[int, int] | None, truncate: int | None, first: int
) -> None:
    raw = bytearray(b"".join(frames))
    if damage is not None:
        raw[damage[0] % len(raw)] ^= damage[1]
    if truncate is not None:
        del raw[truncate % len(raw) :]
    data = bytes(raw)
    chunks = _split(data, cuts)
    expected = _botocore(chunks)
    assert _efo(chunks) == expected
    # what aiobotocore's buffer held past the initial response, handed over at the start
    head = first % (len(data) + 1)
    assert _efo(_split(data[head:], cuts), data[:head]) == expected
    if damage is None and truncate is None:
        assert expected[1] is None and len(expected[0]) == len(frames)


@settings(max_examples=500, deadline=None)
@given(st.one_of(header_blocks, st.binary(max_size=60), header_blocks.map(lambda b: b + b[:7])))
def test_headers_parse_as_botocore_parses_them(block: bytes) -> None:
    """Valid blocks, random bytes, duplicates and truncated values: the same dict or the same error."""
    try:
        expected: Any = EventStreamHeaderParser().parse(block)
    except Exception as exc:
        with pytest.raises(type(exc)) as raised:
            parse_headers(block)
        assert str(raised.value) == str(exc)
    else:
        assert parse_headers(block) == expected


def test_a_corrupt_prelude_fails_before_the_rest_arrives() -> None:
    raw = bytearray(_message(_header(b":event-type", 7, "x"), b"payload" * 100))
    raw[9] ^= 1  # the prelude CRC
    framer = Framer()
    with pytest.raises(ChecksumMismatch):
        list(framer.feed(bytes(raw[:12])))


def test_messages_before_a_corrupt_one_come_out_first() -> None:
    good = _message(_header(b"n", 7, "1"), b"one")
    bad = bytearray(_message(_header(b"n", 7, "2"), b"two"))
    bad[-6] ^= 1
    framer = Framer()
    feed = framer.feed(good + bytes(bad))
    headers, payload = next(feed)
    assert headers == {"n": "1"} and bytes(payload) == b"one"
    with pytest.raises(ChecksumMismatch):
        next(feed)


# ---- the decoder on either framing ---------------------------------------------------------------


def test_iter_events_takes_over_aiobotocore_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.test_decoder import INITIAL_RESPONSE, _encode_event, _encode_exception
    from tests.unit.test_decoder import _efo as read

    event = {"Records": [], "MillisBehindLatest": 0, "ContinuationSequenceNumber": "1"}
    raw = INITIAL_RESPONSE + _encode_event(event, True) + _encode_exception("ResourceInUseException", "message", "x")
    chunks = _split(raw, [5, 70, 200])
    taken: list[bool] = []
    take_over = decoder.take_over

    def spy(stream: Any) -> bool:
        taken.append(take_over(stream))
        return taken[-1]

    monkeypatch.setattr(decoder, "take_over", spy)
    results = {}
    for framing in ("efo", "botocore"):
        monkeypatch.setattr(decoder, "FRAMING", framing)
        events, error = asyncio.run(read(chunks))
        results[framing] = ([e.continuation_sequence_number for e in events], type(error), str(error))
    assert taken == [True], "efo's framing took over; botocore's was not asked to"
    assert results["efo"] == results["botocore"]
    assert results["efo"][0] == ["1"] and results["efo"][1].__name__ == "EventStreamError"
    assert "ResourceInUseException" in results["efo"][2]


def test_the_takeover_holds_when_botocore_iterates_without_calling_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """If a botocore release wrote ``__next__`` without going through ``self.next()``, a takeover
    that replaced only the buffer's methods would leave botocore's parser on an emptied buffer: every
    subscription empty, silently. The takeover swaps the buffer's class, which the loop consults."""
    from tests.unit.test_decoder import INITIAL_RESPONSE, _encode_event
    from tests.unit.test_decoder import _efo as read

    def inlined(self: EventStreamBuffer) -> Any:  # botocore's own parsing, not via self.next()
        return EventStreamBuffer.next(self)

    monkeypatch.setattr(EventStreamBuffer, "__next__", inlined)
    event = {"Records": [], "MillisBehindLatest": 0, "ContinuationSequenceNumber": "7"}
    raw = (
        INITIAL_RESPONSE
        + _encode_event(event, True)
        + _encode_event({**event, "ContinuationSequenceNumber": "8"}, True)
    )
    monkeypatch.setattr(decoder, "FRAMING", "efo")
    events, error = asyncio.run(read(_split(raw, [9, 100])))
    assert [e.continuation_sequence_number for e in events] == ["7", "8"] and error is None


def _prelude(total: int, headers_length: int) -> bytes:
    head = struct.pack("!II", total, headers_length)
    return head + struct.pack("!I", zlib.crc32(head))


@pytest.mark.parametrize(
    ("total", "headers_length"),
    [
        (16 + 128 * 1024 + 1, 128 * 1024 + 1),  # headers over botocore's limit
        (16 + 24 * 1024 * 1024 + 1, 0),  # payload over botocore's limit
        (20, 8),  # total below prelude + headers + message CRC
        (16, 0),  # the smallest message: no headers, no payload
    ],
)
def test_crafted_preludes_fail_or_pass_as_in_botocore(total: int, headers_length: int) -> None:
    """Preludes with a valid CRC and lengths at and beyond botocore's limits (only the prelude and
    what fits are sent): the same messages, then the same error, as botocore's buffer."""
    body = _prelude(total, headers_length)
    rest = max(0, min(total, 64) - len(body))
    raw = body + bytes(rest)
    if total == len(raw) and total >= 16:  # a whole message: give it its message CRC
        raw = raw[:-4] + struct.pack("!I", zlib.crc32(raw[8:-4], zlib.crc32(raw[:8])))
    for chunks in ([raw], [raw[:5], raw[5:]], [raw[:12], raw[12:]]):
        assert _efo(chunks) == _botocore(chunks)
