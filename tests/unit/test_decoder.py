"""efo.kinesis.decoder against botocore's own parsing, frame for frame.

Both sides read the same bytes through a real :class:`AioEventStream` over a fake aiohttp body:
the stock side iterates it (botocore's shape-walking parser, default datetime timestamps), efo's
side goes through :func:`efo.kinesis.decoder.iter_events`.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any
from unittest.mock import patch

import botocore.exceptions
import botocore.loaders
import botocore.model
import botocore.utils
import orjson
import pytest
from aiobotocore.eventstream import AioEventStream
from aiobotocore.parsers import create_parser
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from efo.devstack.eventstream import encode_message
from efo.kinesis import decoder
from efo.kinesis.decoder import (
    _EXACT_BELOW_S,
    FEW_DISTINCT_ARRIVALS,
    ShardEvent,
    _epoch_ms,
    arrival_ms,
    decode_event,
    epoch_ms_of,
    from_parsed,
    iter_events,
)

EVENT_HEADERS = {":message-type": "event", ":event-type": "SubscribeToShardEvent", ":content-type": "application/json"}
INITIAL_RESPONSE = encode_message(
    {":message-type": "event", ":event-type": "initial-response", ":content-type": "application/json"}, b"{}"
)
MODELED_EXCEPTIONS = [
    "ResourceNotFoundException",
    "ResourceInUseException",
    "KMSDisabledException",
    "KMSThrottlingException",
    "InternalFailureException",
]


def _operation_model() -> Any:
    loader = botocore.loaders.create_loader()
    service = botocore.model.ServiceModel(loader.load_service_model("kinesis", "service-2"), "kinesis")
    return service.operation_model("SubscribeToShard")


OPERATION = _operation_model()
EVENT_STREAM_SHAPE = OPERATION.output_shape.members["EventStream"]


class _Content:
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def iter_chunks(self) -> AsyncIterator[tuple[bytes, bool]]:
        for chunk in self._chunks:
            yield chunk, True


class _RawBody:
    """What AioEventStream reads: an aiohttp-like response with ``content.iter_chunks()``."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.content = _Content(chunks)
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _event_stream(chunks: list[bytes]) -> AioEventStream:
    """An AioEventStream built exactly as aiobotocore's JSON parser builds SubscribeToShard's."""
    parser = create_parser("json")
    return AioEventStream(_RawBody(chunks), EVENT_STREAM_SHAPE, parser._event_stream_parser, "SubscribeToShard")


def _split(raw: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    return [raw[a:b] for a, b in itertools.pairwise(points) if b > a]


async def _stock(chunks: list[bytes]) -> tuple[list[dict[str, Any]], BaseException | None]:
    stream = _event_stream(chunks)
    await stream.get_initial_response()
    events: list[dict[str, Any]] = []
    try:
        async for parsed in stream:
            if "SubscribeToShardEvent" in parsed:
                events.append(parsed["SubscribeToShardEvent"])
    except Exception as exc:
        return events, exc
    return events, None


async def _efo(chunks: list[bytes]) -> tuple[list[ShardEvent], BaseException | None]:
    stream = _event_stream(chunks)
    await stream.get_initial_response()
    events: list[ShardEvent] = []
    try:
        async for event in iter_events(stream):
            events.append(event)
    except Exception as exc:
        return events, exc
    return events, None


# ---- strategies ----------------------------------------------------------------------------------

digits = st.from_regex(r"[0-9]{1,128}", fullmatch=True)
timestamps = st.one_of(
    st.floats(min_value=0, max_value=4e9, allow_nan=False, allow_infinity=False),
    st.integers(min_value=0, max_value=4_000_000_000),
    st.builds(lambda ms: ms / 1000, st.integers(min_value=1_500_000_000_000, max_value=2_000_000_000_000)),
    st.builds(lambda s, f: s + f, st.integers(1_500_000_000, 2_000_000_000), st.floats(0, 1, exclude_max=True)),
)
records = st.fixed_dictionaries(
    {
        "SequenceNumber": digits,
        "ApproximateArrivalTimestamp": timestamps,
        "Data": st.binary(max_size=300),
        "PartitionKey": st.text(min_size=1, max_size=64),
    },
    optional={"EncryptionType": st.sampled_from(["NONE", "KMS"])},
)
child_shards = st.lists(
    st.fixed_dictionaries(
        {
            "ShardId": st.from_regex(r"shardId-[0-9]{12}", fullmatch=True),
            "ParentShards": st.lists(st.from_regex(r"shardId-[0-9]{12}", fullmatch=True), min_size=1, max_size=2),
            "HashKeyRange": st.fixed_dictionaries({"StartingHashKey": digits, "EndingHashKey": digits}),
        }
    ),
    max_size=2,
)
events = st.fixed_dictionaries(
    {"Records": st.lists(records, max_size=50), "MillisBehindLatest": st.integers(0, 2**53)},
    optional={"ContinuationSequenceNumber": digits, "ChildShards": child_shards},
)
exceptions = st.tuples(
    st.sampled_from([*MODELED_EXCEPTIONS, "InternalFailure", "SomethingNew"]),
    st.sampled_from(["message", "Message"]),
    st.text(max_size=40),
)


def _encode_event(event: dict[str, Any], ascii_json: bool) -> bytes:
    wire = dict(event)
    wire["Records"] = [{**r, "Data": base64.b64encode(r["Data"]).decode()} for r in event["Records"]]
    return encode_message(EVENT_HEADERS, json.dumps(wire, ensure_ascii=ascii_json).encode())


def _encode_exception(code: str, key: str, message: str) -> bytes:
    headers = {":message-type": "exception", ":exception-type": code, ":content-type": "application/json"}
    return encode_message(headers, json.dumps({key: message}).encode())


def _assert_same(parsed: dict[str, Any], decoded: ShardEvent) -> None:
    stock_records = parsed.get("Records", [])
    assert decoded.sequence_numbers == [r["SequenceNumber"] for r in stock_records]
    assert decoded.partition_keys == [r["PartitionKey"] for r in stock_records]
    assert decoded.data == [r["Data"] for r in stock_records]
    assert decoded.arrival_ms == [int(r["ApproximateArrivalTimestamp"].timestamp() * 1000) for r in stock_records]
    assert decoded.data_bytes == sum(len(r["Data"]) for r in stock_records)
    assert decoded.continuation_sequence_number == parsed.get("ContinuationSequenceNumber")
    assert decoded.millis_behind_latest == parsed.get("MillisBehindLatest")
    assert decoded.child_shards == parsed.get("ChildShards", [])
    assert decoded == from_parsed(parsed)  # the fallback for fake streams agrees too


# ---- properties ----------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    stream_events=st.lists(events, min_size=1, max_size=4),
    ascii_json=st.booleans(),
    unknown_at=st.integers(0, 5),
    error=st.none() | exceptions,
    cuts=st.lists(st.integers(0, 10**6), max_size=6),
)
def test_decoder_matches_botocore(
    stream_events: list[dict[str, Any]],
    ascii_json: bool,
    unknown_at: int,
    error: tuple[str, str, str] | None,
    cuts: list[int],
) -> None:
    frames = [_encode_event(event, ascii_json) for event in stream_events]
    unknown = encode_message({":message-type": "event", ":event-type": "SomeFutureEvent"}, b'{"x":1}')
    frames.insert(min(unknown_at, len(frames)), unknown)
    if error is not None:
        frames.append(_encode_exception(*error))
        frames.append(_encode_event(stream_events[0], ascii_json))  # never reached
    chunks = _split(INITIAL_RESPONSE + b"".join(frames), cuts)

    stock_events, stock_error = asyncio.run(_stock(chunks))
    efo_events, efo_error = asyncio.run(_efo(chunks))

    assert len(efo_events) == len(stock_events) == len(stream_events)
    for parsed, decoded in zip(stock_events, efo_events, strict=True):
        _assert_same(parsed, decoded)
    if error is None:
        assert stock_error is None and efo_error is None
    else:
        assert isinstance(stock_error, botocore.exceptions.EventStreamError)
        assert isinstance(efo_error, botocore.exceptions.EventStreamError)
        assert efo_error.operation_name == stock_error.operation_name == "SubscribeToShard"
        code, _, message = error
        if code in MODELED_EXCEPTIONS:
            assert efo_error.response == stock_error.response
            assert str(efo_error) == str(stock_error)
        else:  # botocore drops the code of a type its model does not know; efo keeps it
            assert stock_error.response["Error"]["Code"] == ""
            assert efo_error.response["Error"] == {"Code": code, "Message": message}


# ---- msgspec (small records) and orjson give the same events and the same errors -----------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=6,
)
#: Near the edges of what msgspec types as a 64-bit int and orjson parses as an int (to 2**64 - 1) or a float.
edge_integers = st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1])
base64_texts = st.text(alphabet="ABCDQRSTabcz019+/=\n -_\u00e9", max_size=24)
odd_records = st.fixed_dictionaries(
    {},
    optional={
        "SequenceNumber": digits | json_values,
        "ApproximateArrivalTimestamp": timestamps | edge_integers | json_values,
        "Data": st.binary(max_size=40).map(lambda data: base64.b64encode(data).decode()) | base64_texts | json_values,
        "PartitionKey": st.text(max_size=8) | json_values,
        "EncryptionType": st.sampled_from(["NONE", "KMS"]) | json_values,
        "SomethingNew": json_values,
    },
)
wire_records = records.map(lambda r: {**r, "Data": base64.b64encode(r["Data"]).decode()})
wire_events = events.map(
    lambda e: {**e, "Records": [{**r, "Data": base64.b64encode(r["Data"]).decode()} for r in e["Records"]]}
)
odd_events = st.fixed_dictionaries(
    {},
    optional={
        "Records": st.lists(wire_records | odd_records) | json_values,
        "MillisBehindLatest": st.integers(0, 2**53) | edge_integers | json_values,
        "ContinuationSequenceNumber": digits | json_values,
        "ChildShards": child_shards | json_values,
        "SomethingNew": json_values,
    },
)


def _outcome(decode: Any, payload: bytes) -> Any:
    """What decoding gives, types included (1 and 1.0 differ), or the error it raises."""
    try:
        e = decode(payload)
    except Exception as exc:
        return ("raised", type(exc), str(exc))
    fields = (e.sequence_numbers, e.partition_keys, e.arrival_ms, e.data, e.data_bytes)
    return repr((*fields, e.continuation_sequence_number, e.millis_behind_latest, e.child_shards))


def _decode_with_orjson(payload: bytes) -> ShardEvent:
    return decoder._from_json(orjson.loads(payload))


def _typed_decodes(payload: bytes) -> bool:
    """Whether decode_event takes msgspec's path for ``payload`` and msgspec accepts it."""
    try:
        decoder._decode_typed(payload)
    except ValueError:
        return False
    return decoder._first_record_is_small(payload)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    event=wire_events | odd_events,
    compact=st.booleans(),
    cut=st.none() | st.integers(0, 10**4),
    splice=st.sampled_from([b"", b"\\ud800", b"\xff", b"\xed\xa0\x80", b"\x01", b" x", b"1e400", b"[" * 1100]),
)
@example(
    event={
        "Records": [
            {"SequenceNumber": "1", "ApproximateArrivalTimestamp": 2**64 - 1, "Data": "QQ==", "PartitionKey": "k"}
        ]
    },
    compact=True,
    cut=None,
    splice=b"",
)
@example(
    event={
        "Records": [{"SequenceNumber": "1", "ApproximateArrivalTimestamp": 1, "Data": "QQ==\n", "PartitionKey": "k"}]
    },
    compact=False,
    cut=None,
    splice=b"",
)
def test_small_records_decode_as_orjson_and_pybase64_would(
    event: dict[str, Any], compact: bool, cut: int | None, splice: bytes
) -> None:
    payload = json.dumps(event, separators=(",", ":") if compact else None).encode()
    if cut is not None:  # a truncated or corrupted event: both raise, the same error
        cut %= len(payload) + 1
        payload = payload[:cut] + splice + payload[cut:]
    assert _outcome(decode_event, payload) == _outcome(_decode_with_orjson, payload)
    assert _outcome(decode_event, memoryview(payload)) == _outcome(_decode_with_orjson, payload)


@settings(max_examples=200, deadline=None)
@given(event=wire_events, compact=st.booleans())
def test_events_as_kinesis_sends_them_are_decoded_by_msgspec(event: dict[str, Any], compact: bool) -> None:
    payload = json.dumps(event, separators=(",", ":") if compact else None).encode()
    # every field of every record valid: only child shards (a shard's last event) send it to orjson
    assert _typed_decodes(payload) == (bool(event["Records"]) and "ChildShards" not in event)
    assert _outcome(decode_event, payload) == _outcome(_decode_with_orjson, payload)


def _event_of(key: bytes = b'"k"', arrival: bytes = b"1.5", data: bytes = b'"QQ=="', rest: bytes = b"") -> bytes:
    record = b'{"SequenceNumber":"1","ApproximateArrivalTimestamp":' + arrival + b',"Data":' + data
    return b'{"Records":[' + record + b',"PartitionKey":' + key + b"}]" + rest + b"}"


@pytest.mark.parametrize(
    "payload",
    [
        _event_of(key=b'"\xff"'),  # not UTF-8: msgspec raises UnicodeDecodeError, orjson its JSONDecodeError
        _event_of(key=b'"\xc0\xaf"'),
        _event_of(key=b'"\\ud800"'),  # a lone surrogate
        _event_of(key=b'"\\ud83d\\ude00"'),
        _event_of(key=b'"a\x01"'),
        _event_of(arrival=b"1e400"),
        _event_of(arrival=b"-0.0"),
        _event_of(arrival=b"1E5"),
        _event_of(arrival=b"18446744073709551615"),  # 2**64 - 1: an int for both
        _event_of(arrival=b"123456789012345678901234567890"),  # a float for orjson
        _event_of(rest=b',"MillisBehindLatest":18446744073709551616'),
        _event_of(rest=b',"MillisBehindLatest":-9223372036854775809'),
        _event_of(rest=b',"MillisBehindLatest":1.0'),
        _event_of(rest=b',"ChildShards":[{"ShardId":"s","HashKeyRange":{"StartingHashKey":18446744073709551616}}]'),
        _event_of(rest=b',"ChildShards":{}'),
        _event_of(rest=b',"Records":[]'),  # a duplicate key: the last one counts
        _event_of(data=b'"QQ==\\n"'),  # not canonical: botocore's lenient base64
        _event_of(data=b'"QQ"'),
        _event_of(data=b"null"),
        _event_of() + b" x",
        b"\xef\xbb\xbf" + _event_of(),
        b" \n" + _event_of() + b"\n ",
        b"[]",
        _event_of(rest=b',"EncryptionType":"KM\xffS"'),  # not UTF-8 in a field efo does not read
        _event_of(rest=b',"\xffMillisBehindLatest":0'),
        _event_of(rest=b',"SomethingNew":1e400'),  # no double holds it
        _event_of(rest=b',"SomethingNew":' + b"[" * 1000 + b"]" * 1000),  # within orjson's depth limit
        _event_of(rest=b',"SomethingNew":' + b"[" * 1100 + b"]" * 1100),  # beyond it
        _event_of(rest=b',"ChildShards":' + b"[" * 200 + b"]" * 200),
        _event_of(rest=b',"ChildShards":null'),
        b'{ "Records" : [ { "SequenceNumber" : "1", "ApproximateArrivalTimestamp" : 1.5, "Data" : "QQ==",'
        b' "PartitionKey" : "k", "EncryptionType" : "KMS" } ] }',
    ],
)
def test_corner_cases_decode_as_orjson_and_pybase64_would(payload: bytes) -> None:
    assert _outcome(decode_event, payload) == _outcome(_decode_with_orjson, payload)


def _record(data_chars: int) -> dict[str, Any]:
    data = base64.b64encode(b"x" * (data_chars // 4 * 3)).decode()
    assert len(data) == data_chars
    return {"SequenceNumber": "1", "ApproximateArrivalTimestamp": 1.5, "Data": data, "PartitionKey": "k"}


def test_events_of_small_records_are_parsed_by_msgspec_and_large_ones_by_orjson(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[int] = []
    monkeypatch.setattr(decoder, "_from_json", lambda body: parsed.append(len(body["Records"])) or ShardEvent())
    limit = decoder.TYPED_MAX_DATA_CHARS
    small = decode_event(orjson.dumps({"Records": [_record(limit), _record(4)]}))
    assert small.data == [b"x" * (limit // 4 * 3), b"xxx"] and parsed == []
    decode_event(orjson.dumps({"Records": [_record(limit + 4), _record(4)]}))  # the first record decides
    decode_event(orjson.dumps({"x": "-" * 5000, "Records": [_record(4)]}))  # no record in the first 4 KiB
    assert parsed == [2, 1]


def test_an_event_msgspec_refuses_is_counted() -> None:
    counter = decoder.METRICS.events_decoded_twice
    before = counter._value.get()
    decode_event(orjson.dumps({"Records": [_record(8)]}))
    assert counter._value.get() == before
    decode_event(orjson.dumps({"Records": [_record(8)], "SomethingNew": 1}))
    decode_event(orjson.dumps({"Records": [_record(8)], "ChildShards": []}))
    assert counter._value.get() == before + 2


@given(st.one_of(st.floats(min_value=0, max_value=1e11, allow_nan=False), st.integers(0, 10**11)))
def test_epoch_ms_is_botocore_datetime_round_trip(seconds: float) -> None:
    parsed = botocore.utils.parse_timestamp(seconds)
    assert _epoch_ms(seconds) == int(parsed.timestamp() * 1000)
    assert arrival_ms(parsed) == _epoch_ms(seconds)
    assert arrival_ms(seconds) == _epoch_ms(seconds)
    # orjson parses the JSON text to the same float json (and so botocore) does
    text = json.dumps(seconds)
    assert orjson.loads(text) == json.loads(text)


arrival_values = st.one_of(
    timestamps,
    st.integers(-10, 2**70),
    st.floats(-1e3, 1e12, allow_nan=False, allow_infinity=False),
    st.builds(lambda s, us: s + us / 1e6 + 5e-7, st.integers(1_500_000_000, 2_000_000_000), st.integers(0, 999_999)),
    st.booleans(),
)


#: Times numpy converts (epoch microseconds below 2**53): ints, floats, and times half a microsecond
#: off a whole one (where the rounding of the fraction decides).
exact_range_values = st.one_of(
    st.integers(0, _EXACT_BELOW_S - 1),
    st.floats(0, _EXACT_BELOW_S, exclude_max=True, allow_nan=False),
    st.builds(lambda s, us: s + us / 1e6 + 5e-7, st.integers(1_500_000_000, 2_000_000_000), st.integers(0, 999_998)),
    st.builds(lambda ms: ms / 1000, st.integers(1_500_000_000_000, 2_000_000_000_000)),
)


@settings(max_examples=300)
@given(st.lists(exact_range_values, min_size=FEW_DISTINCT_ARRIVALS + 1, max_size=60, unique=True))
@example([1_764_200_000 + i / 1000 for i in range(40)])
@example([_EXACT_BELOW_S - 1 + 0.9999995 - i * 1e-6 for i in range(20)])  # just below numpy's exact range
@example([1_650_115_698.5029995 + i for i in range(20)])  # int(seconds * 1000) would be 1 ms short
def test_epoch_ms_of_many_times_in_numpy_is_epoch_ms_of_each(arrivals: list[Any]) -> None:
    assert epoch_ms_of(arrivals) == [_epoch_ms(seconds) for seconds in arrivals]


@settings(max_examples=300)
@given(st.lists(arrival_values, max_size=60))
@example([_EXACT_BELOW_S + i for i in range(20)])  # beyond it: value by value
def test_epoch_ms_of_any_list_is_epoch_ms_of_each_value(arrivals: list[Any]) -> None:
    assert epoch_ms_of(arrivals) == [_epoch_ms(seconds) for seconds in arrivals]


#: What a malformed event's timestamps could hold besides numbers (orjson parses any JSON value).
odd_arrival_values = st.one_of(
    arrival_values,
    st.none(),
    st.text(max_size=3),
    st.just(float("nan")),
    st.just(float("inf")),
    st.lists(st.integers(0, 2**40), min_size=1, max_size=2),
    st.dictionaries(st.text(max_size=1), st.integers(), max_size=1),
)


def _value_or_error(convert: Any) -> Any:
    try:
        return convert()
    except Exception as exc:  # whether it raised, and what
        return type(exc)


@settings(max_examples=300)
@given(st.lists(odd_arrival_values, max_size=40))
@example([[1_700_000_000]] * 10 + [[1_700_000_001]] * 10)  # list values: an event decoded to lists of lists
def test_epoch_ms_of_any_values_gives_what_each_value_does_or_raises(arrivals: list[Any]) -> None:
    """The same ints as converting value by value, or an error where that raises one (which error
    may differ: a set of the values meets an unhashable one before a value fails to convert)."""
    expected = _value_or_error(lambda: [_epoch_ms(seconds) for seconds in arrivals])
    got = _value_or_error(lambda: epoch_ms_of(arrivals))
    if isinstance(expected, list):
        assert got == expected
    else:
        assert isinstance(got, type) and issubclass(got, Exception), got


def test_an_event_of_many_arrival_times_converts_each_like_botocore() -> None:
    seconds = [1_764_200_000 + i * 0.0013 + 0.0000005 for i in range(4 * FEW_DISTINCT_ARRIVALS)]
    records = [
        {"SequenceNumber": str(i), "ApproximateArrivalTimestamp": at, "Data": "aGk=", "PartitionKey": "k"}
        for i, at in enumerate(seconds)
    ]
    event = decode_event(orjson.dumps({"Records": records}))
    assert event.arrival_ms == [int(botocore.utils.parse_timestamp(at).timestamp() * 1000) for at in seconds]


def test_modeled_exception_with_lowercase_message() -> None:
    chunks = [INITIAL_RESPONSE + _encode_exception("ResourceInUseException", "message", "in use")]
    _, error = asyncio.run(_efo(chunks))
    assert isinstance(error, botocore.exceptions.ClientError)
    assert error.response["Error"] == {"Code": "ResourceInUseException", "Message": "in use"}


def _botocore_blobs(values: list[str]) -> Any:
    """What botocore's parsers make of the values (base64.b64decode, parsers.py), or their error."""
    try:
        return [base64.b64decode(value) for value in values]
    except ValueError as error:  # binascii.Error, or a value that is not ASCII
        return type(error), str(error)


def _efo_blobs(values: list[str], by_orjson: bool) -> Any:
    """What decode_event makes of them: by msgspec when it takes them, or (``by_orjson``, as for
    large records) by orjson and pybase64's strict decoding, with the fallback."""
    records = [
        {"SequenceNumber": str(i), "ApproximateArrivalTimestamp": 1, "Data": value, "PartitionKey": "k"}
        for i, value in enumerate(values)
    ]
    try:
        with patch.object(decoder, "TYPED_MAX_DATA_CHARS", -1 if by_orjson else decoder.TYPED_MAX_DATA_CHARS):
            return decode_event(orjson.dumps({"Records": records})).data
    except ValueError as error:
        return type(error), str(error)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.text(alphabet="AQgw09+/=\n -_\u00e9", max_size=12)
        | st.binary(max_size=9).map(lambda b: base64.b64encode(b).decode()),
        min_size=1,
        max_size=4,
    ),
    st.booleans(),
)
@example(["QQ==QQ=="], False)  # data after the padding: the standard library stops at it, pybase64 did not
@example(["0000000=0"], False)
@example(["aGk=\n"], True)
def test_payloads_canonical_or_not_decode_as_botocore_decodes_them(values: list[str], by_orjson: bool) -> None:
    assert _efo_blobs(values, by_orjson) == _botocore_blobs(values)


def test_non_canonical_base64_decodes_like_botocore() -> None:
    record = b'{"SequenceNumber":"1","ApproximateArrivalTimestamp":1.5,"Data":"aGk=\\n","PartitionKey":"k"}'
    payload = b'{"Records":[' + record + b"]}"
    event = decode_event(payload)
    assert event.data == [b"hi"]
    assert event.arrival_ms == [1500]
    assert event.continuation_sequence_number is None
    assert event.child_shards == []


def test_fallback_accepts_parsed_dicts() -> None:
    class FakeStream:
        def __init__(self, items: list[dict[str, Any]]) -> None:
            self._items = items

        def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
            return self._gen()

        async def _gen(self) -> AsyncIterator[dict[str, Any]]:
            for item in self._items:
                yield item

    when = datetime.fromisoformat("2024-01-02T03:04:05.678+00:00")
    parsed = {
        "Records": [{"SequenceNumber": "7", "ApproximateArrivalTimestamp": when, "Data": b"x", "PartitionKey": "p"}],
        "ContinuationSequenceNumber": "7",
        "MillisBehindLatest": 0,
    }

    async def collect() -> list[ShardEvent]:
        stream = FakeStream([{"Other": {}}, {"SubscribeToShardEvent": parsed}])
        return [event async for event in iter_events(stream)]

    (event,) = asyncio.run(collect())
    assert event.sequence_numbers == ["7"]
    assert event.arrival_ms == [1704164645678]
    assert event.data == [b"x"] and event.data_bytes == 1
    assert event.continuation_sequence_number == "7"


def test_missing_private_generator_is_a_clear_error() -> None:
    stream = _event_stream([])
    del stream._event_generator

    async def read() -> None:
        async for _ in iter_events(stream):
            pass

    with pytest.raises(RuntimeError, match="_event_generator"):
        asyncio.run(read())
