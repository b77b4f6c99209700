import zlib

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

from efo.devstack.eventstream import FrameDecoder, decode_message, decode_messages, encode_message


def test_round_trip_through_botocore_decoder() -> None:
    headers = {":message-type": "event", ":event-type": "SubscribeToShardEvent", ":content-type": "application/json"}
    raw = encode_message(headers, b'{"Records":[]}')
    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    (message,) = list(buffer)
    assert message.headers == headers
    assert message.payload == b'{"Records":[]}'
    assert message.prelude.total_length == len(raw)


def test_empty_headers_and_payload_and_unicode() -> None:
    assert decode_message(encode_message({}, b"")).payload == b""
    frame = decode_message(encode_message({"name": "välue"}, b"\x00\xff"))
    assert frame.headers == {"name": "välue"}
    assert frame.payload == b"\x00\xff"


def test_crcs_are_checked() -> None:
    raw = bytearray(encode_message({"a": "b"}, b"payload"))
    raw[-5] ^= 0xFF  # corrupt the payload: the message CRC no longer matches
    with pytest.raises(ChecksumMismatch):
        decode_message(bytes(raw))
    prelude_crc = int.from_bytes(raw[8:12], "big")
    assert prelude_crc == zlib.crc32(bytes(raw[:8]))


def test_incremental_decoding_across_chunk_boundaries() -> None:
    raw = encode_message({"n": "1"}, b"one") + encode_message({"n": "2"}, b"two")
    decoder = FrameDecoder()
    frames = [frame for i in range(len(raw)) for frame in decoder.feed(raw[i : i + 1])]
    assert [f.payload for f in frames] == [b"one", b"two"]
    assert not decoder.pending


def test_trailing_partial_message_is_an_error() -> None:
    raw = encode_message({"n": "1"}, b"one")
    with pytest.raises(ValueError, match="partial"):
        decode_messages(raw + raw[:7])
