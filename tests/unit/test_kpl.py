"""KPL de-aggregation: round trips against the reference aggregator, corrupt input, the column expansion."""

from __future__ import annotations

import hashlib
import tracemalloc
from typing import Any

import pytest
from aws_kinesis_agg.aggregator import RecordAggregator
from aws_kinesis_agg.messages_pb2 import AggregatedRecord
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from efo.kinesis.kpl import (
    CORRUPT_AGGREGATE,
    DIGEST_SIZE,
    MAGIC,
    CorruptAggregate,
    DeadLetter,
    SubRecord,
    deaggregate,
    expand,
    is_aggregate,
)
from efo.pipeline.records import MAX_SUB_SEQUENCE, Position

UserRecord = tuple[str, bytes, str | None]  # (partition key, data, explicit hash key)


# --- helpers ---------------------------------------------------------------------------------------


def aggregate(records: list[UserRecord], max_size: int | None = None) -> list[bytes]:
    """The KPL aggregates the reference library makes of ``records``, in order."""
    aggregator = RecordAggregator() if max_size is None else RecordAggregator(max_size)
    out: list[bytes] = []
    for partition_key, data, explicit_hash_key in records:
        full = aggregator.add_user_record(partition_key, data, explicit_hash_key)
        if full is not None:
            out.append(full.get_contents()[2])
    last = aggregator.clear_and_get()
    if last is not None:
        out.append(last.get_contents()[2])
    return out


def frame(body: bytes) -> bytes:
    return MAGIC + body + hashlib.md5(body).digest()


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def ld(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return tag(number, 2) + varint(len(payload)) + payload


def vi(number: int, value: int) -> bytes:
    """A varint field."""
    return tag(number, 0) + varint(value)


def record(pk_index: int, data: bytes, ehk_index: int | None = None) -> bytes:
    body = vi(1, pk_index) + (vi(2, ehk_index) if ehk_index is not None else b"") + ld(3, data)
    return ld(3, body)


def expected(records: list[UserRecord]) -> list[SubRecord]:
    return [SubRecord(pk, ehk or None, data) for pk, data, ehk in records]


def reference_decode(body: bytes) -> list[SubRecord] | None:
    """What the protobuf library makes of an AggregatedRecord body, or None if it rejects it."""
    message: Any = AggregatedRecord()
    try:
        message.ParseFromString(body)
    except Exception:
        return None
    pks, ehks = list(message.partition_key_table), list(message.explicit_hash_key_table)
    out = []
    for r in message.records:
        has_ehk = r.HasField("explicit_hash_key_index")
        if r.partition_key_index >= len(pks) or (has_ehk and r.explicit_hash_key_index >= len(ehks)):
            return None  # valid protobuf, but not a valid aggregate
        ehk = ehks[r.explicit_hash_key_index] if has_ehk else None
        out.append(SubRecord(pks[r.partition_key_index], ehk, bytes(r.data)))
    return out


# --- round trips against aws-kinesis-agg -----------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 7, 100, 1000])
@pytest.mark.parametrize("with_hash_keys", [False, True])
def test_round_trip_with_the_reference_aggregator(count: int, with_hash_keys: bool) -> None:
    records: list[UserRecord] = [
        (
            f"key-{i % 13}",
            f"payload {i}".encode() * (i % 5),  # i % 5 == 0: empty data
            str(i * 7919 % 2**128) if with_hash_keys and i % 3 else None,
        )
        for i in range(count)
    ]
    [blob] = aggregate(records)
    assert is_aggregate(blob)
    assert deaggregate(blob) == expected(records)


def test_round_trip_unicode_keys_and_empty_data() -> None:
    records: list[UserRecord] = [
        ("ключ", b"", None),
        ("鍵🔑", b"\x00\xff", "340282366920938463463374607431768211455"),
        ("ключ", b"x", "0"),
        ("é" * 256, b"", "鍵"),
    ]
    [blob] = aggregate(records)
    assert deaggregate(blob) == expected(records)


def test_round_trip_across_several_aggregates() -> None:
    records: list[UserRecord] = [(f"pk{i}", bytes([i % 256]) * 1000, None) for i in range(300)]
    blobs = aggregate(records, max_size=50_000)
    assert len(blobs) > 1
    assert [sub for blob in blobs for sub in deaggregate(blob)] == expected(records)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=20),
            st.binary(max_size=64),
            st.none() | st.text(min_size=1, max_size=40),
        ),
        min_size=1,
        max_size=60,
    )
)
def test_round_trip_property(records: list[UserRecord]) -> None:
    [blob] = aggregate(records)
    assert deaggregate(blob) == expected(records)


# --- framing and hand-built protobuf -----------------------------------------------------------------


def test_is_aggregate() -> None:
    assert not is_aggregate(b"")
    assert not is_aggregate(b"plain data that is long enough")
    assert not is_aggregate(MAGIC + b"\x00" * 15)
    assert is_aggregate(MAGIC + b"\x00" * 16)
    assert not is_aggregate(b"\xf3\x89\x9a\xc3" + b"\x00" * 40)


def test_not_an_aggregate_and_bad_md5() -> None:
    with pytest.raises(CorruptAggregate, match="not an aggregate"):
        deaggregate(b"plain")
    [blob] = aggregate([("k", b"data", None)])
    broken = blob[:-1] + bytes([blob[-1] ^ 1])
    with pytest.raises(CorruptAggregate) as caught:
        deaggregate(broken)
    assert caught.value.reason == "md5 mismatch"
    assert str(caught.value) == "corrupt KPL aggregate: md5 mismatch"


def test_unknown_fields_of_every_wire_type_are_skipped_like_protobuf_does() -> None:
    unknown = (
        vi(9, 2**64 - 1)
        + tag(10, 1)
        + b"8bytes!!"
        + tag(11, 5)
        + b"4byt"
        + ld(12, b"\x01\x02\x03")
        + tag(13, 3)  # a group, with a nested group and fields inside
        + vi(1, 5)
        + tag(14, 3)
        + ld(2, b"in")
        + tag(14, 4)
        + tag(13, 4)
    )
    tags = ld(4, ld(1, b"tag-key") + ld(2, b"tag-value"))
    body = (
        unknown
        + ld(3, unknown + vi(1, 1) + tags + ld(3, b"first") + vi(2, 0) + unknown)
        + ld(1, b"pk0")
        + unknown
        + ld(1, "pk1é".encode())
        + ld(2, b"12345")
        + ld(3, vi(1, 0) + ld(3, b"second"))
    )
    want = [SubRecord("pk1é", "12345", b"first"), SubRecord("pk0", None, b"second")]
    assert deaggregate(frame(body)) == want
    assert reference_decode(body) == want


def test_last_scalar_wins_like_protobuf() -> None:
    body = ld(1, b"a") + ld(1, b"b") + ld(3, vi(1, 0) + ld(3, b"old") + vi(1, 1) + ld(3, b"new"))
    want = [SubRecord("b", None, b"new")]
    assert deaggregate(frame(body)) == want
    assert reference_decode(body) == want


TABLE = ld(1, b"pk") + ld(2, b"1")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "no sub-records"),
        (TABLE, "no sub-records"),
        (TABLE + b"\x1a", "truncated varint"),
        (TABLE + b"\x1a\x80", "truncated varint"),
        (TABLE + b"\x1a\x05\x08\x00", "truncated field"),
        (TABLE + ld(3, vi(1, 0) + b"\x1a\x7f"), "truncated field"),
        (TABLE + tag(9, 1) + b"1234567", "truncated field"),
        (TABLE + tag(9, 5) + b"123", "truncated field"),
        (TABLE + b"\x1a" + b"\xff" * 10 + b"\x01", "varint over 10 bytes"),
        (TABLE + b"\x1a" + b"\xff" * 9 + b"\x7f", "varint over 64 bits"),
        (TABLE + vi(3, 1), "aggregate field 3 has wire type 0"),
        (tag(1, 5) + b"abcd" + record(0, b"x"), "aggregate field 1 has wire type 5"),
        (TABLE + ld(3, ld(1, b"0") + ld(3, b"x")), "record field 1 has wire type 2"),
        (TABLE + ld(3, vi(1, 0) + vi(3, 7)), "record field 3 has wire type 0"),
        (TABLE + ld(3, vi(1, 0) + ld(3, b"x") + vi(4, 1)), "record field 4 has wire type 0"),
        (TABLE + ld(3, ld(3, b"x")), "record without partition key index"),
        (TABLE + ld(3, vi(1, 0)), "record without data"),
        (TABLE + record(1, b"x"), "partition key index out of range"),
        (TABLE + record(0, b"x", ehk_index=1), "explicit hash key index out of range"),
        (ld(1, b"pk") + record(0, b"x", ehk_index=0), "explicit hash key index out of range"),
        (TABLE + record(2**64 - 1, b"x"), "partition key index out of range"),
        (b"\x00\x00" + TABLE + record(0, b"x"), "field number 0"),
        (TABLE + ld(3, b"\x00" + vi(1, 0) + ld(3, b"x")), "field number 0"),
        (TABLE + tag(9, 3) + vi(1, 1) + tag(8, 4) + record(0, b"x"), "mismatched end group"),
        (TABLE + tag(9, 3) + vi(1, 1), "truncated varint"),
        (TABLE + tag(9, 3) * 100, "groups nested too deep"),
        (TABLE + tag(9, 4) + record(0, b"x"), "unexpected wire type 4"),
        (TABLE + tag(9, 6) + record(0, b"x"), "unexpected wire type 6"),
        (TABLE + ld(3, vi(1, 0) + ld(3, b"x") + tag(9, 7)), "unexpected wire type 7"),
        (ld(1, b"\xff\xfe") + record(0, b"x"), "partition key is not UTF-8"),
        (ld(1, b"pk") + ld(2, b"\xc3") + record(0, b"x"), "explicit hash key is not UTF-8"),
    ],
)
def test_malformed_protobuf_is_corrupt_with_a_reason(body: bytes, reason: str) -> None:
    with pytest.raises(CorruptAggregate) as caught:
        deaggregate(frame(body))
    assert caught.value.reason == reason


def test_sub_record_cap() -> None:
    body = TABLE + record(0, b"x") * 5
    assert len(deaggregate(frame(body), max_sub_records=5)) == 5
    with pytest.raises(CorruptAggregate, match="more than 4 sub-records"):
        deaggregate(frame(body), max_sub_records=4)


def test_default_cap_rejects_a_flood_of_empty_records() -> None:
    # 200 000 minimal records (6 bytes each) in 1.2 MB: over the default cap of 100 000.
    body = TABLE + record(0, b"") * 200_000
    with pytest.raises(CorruptAggregate, match="more than 100000 sub-records"):
        deaggregate(frame(body))


def test_huge_declared_lengths_allocate_nothing() -> None:
    body = TABLE + tag(3, 2) + varint(2**63) + b"x" * 10
    tracemalloc.start()
    try:
        with pytest.raises(CorruptAggregate, match="truncated field"):
            deaggregate(frame(body))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


# --- corrupted bytes: only ever CorruptAggregate -------------------------------------------------------

SAMPLES = [
    aggregate([("k", b"v", None)])[0],
    aggregate([(f"k{i % 4}", bytes(range(i % 50)), str(i) if i % 2 else None) for i in range(40)])[0],
    aggregate([("ключ", b"", "42"), ("鍵", b"\x00" * 300, None)])[0],
]
samples = st.sampled_from(SAMPLES)


def flip(blob: bytes, positions: list[int]) -> bytes:
    out = bytearray(blob)
    for bit in positions:
        out[(bit // 8) % len(out)] ^= 1 << (bit % 8)
    return bytes(out)


def decode_or_corrupt(blob: bytes) -> list[SubRecord] | None:
    """Anything but CorruptAggregate escaping is a test failure."""
    try:
        result = deaggregate(blob)
    except CorruptAggregate as error:
        assert error.reason
        return None
    assert all(isinstance(sub, SubRecord) for sub in result)
    return result


@given(samples, st.lists(st.integers(min_value=0, max_value=8 * 2000), min_size=1, max_size=8))
def test_bit_flips_are_corrupt(blob: bytes, bits: list[int]) -> None:
    flipped = flip(blob, bits)
    assume(flipped != blob)
    assert decode_or_corrupt(flipped) is None


@given(samples, st.data())
def test_truncations_are_corrupt(blob: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(min_value=0, max_value=len(blob) - 1))
    assert decode_or_corrupt(blob[:cut]) is None


@given(st.binary(max_size=400))
def test_garbage_after_the_magic_is_corrupt(garbage: bytes) -> None:
    assert decode_or_corrupt(MAGIC + garbage) is None


def body_of(blob: bytes) -> bytes:
    return blob[len(MAGIC) : -16]


def check_against_protobuf(body: bytes) -> None:
    """With a valid MD5 the decoder returns or raises CorruptAggregate; when it and protobuf both accept, they agree."""
    ours = decode_or_corrupt(frame(body))
    if ours is not None:
        reference = reference_decode(body)
        if reference is not None:
            assert ours == reference


@settings(max_examples=300)
@given(samples, st.lists(st.integers(min_value=0, max_value=8 * 2000), min_size=1, max_size=6))
def test_bit_flips_with_md5_recomputed(blob: bytes, bits: list[int]) -> None:
    check_against_protobuf(flip(body_of(blob), bits))


@settings(max_examples=300)
@given(samples, st.data())
def test_splices_with_md5_recomputed(blob: bytes, data: st.DataObject) -> None:
    body = body_of(blob)
    start = data.draw(st.integers(min_value=0, max_value=len(body)))
    stop = data.draw(st.integers(min_value=start, max_value=len(body)))
    insert = data.draw(st.binary(max_size=12))
    check_against_protobuf(body[:start] + insert + body[stop:])


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_random_body_with_md5_recomputed(body: bytes) -> None:
    check_against_protobuf(body)


def fields() -> st.SearchStrategy[bytes]:
    """Random but plausible protobuf: known and unknown field numbers, right and wrong wire types."""
    number = st.sampled_from([0, 1, 2, 3, 4, 5, 15, 16, 2**29 - 1])
    scalar = st.one_of(
        st.builds(lambda n, v: tag(n, 0) + varint(v), number, st.integers(0, 2**64 - 1)),
        st.builds(lambda n, p: tag(n, 1) + p, number, st.binary(min_size=8, max_size=8)),
        st.builds(lambda n, p: tag(n, 5) + p, number, st.binary(min_size=4, max_size=4)),
        st.builds(lambda n, w: tag(n, w), number, st.integers(0, 7)),
    )
    return st.recursive(
        scalar | st.builds(ld, number, st.binary(max_size=8)),
        lambda inner: st.builds(ld, number, st.lists(inner, max_size=6).map(b"".join))
        | st.builds(lambda n, xs: tag(n, 3) + b"".join(xs) + tag(n, 4), number, st.lists(inner, max_size=4)),
        max_leaves=30,
    )


@settings(max_examples=200)
@given(st.lists(fields(), max_size=12).map(b"".join))
def test_structured_garbage_with_md5_recomputed(body: bytes) -> None:
    check_against_protobuf(body)


@settings(max_examples=100, deadline=None)
@given(st.lists(fields(), max_size=12).map(b"".join) | st.binary(max_size=2000))
def test_memory_stays_proportional_to_the_input(body: bytes) -> None:
    blob = frame(body)
    tracemalloc.start()
    try:
        decode_or_corrupt(blob)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * len(blob) + 64 * 1024


# --- the column expansion ---------------------------------------------------------------------------


class Event:
    """A SubscribeToShard event's columns, built record by record."""

    def __init__(self) -> None:
        self.sequence_numbers: list[str] = []
        self.partition_keys: list[str] = []
        self.arrival_ms: list[int] = []
        self.data: list[bytes] = []
        self.given: Any = None  # the data list expand was last given

    def add(self, sequence: int, data: bytes, partition_key: str = "outer") -> Event:
        self.sequence_numbers.append(str(sequence))
        self.partition_keys.append(partition_key)
        self.arrival_ms.append(1_700_000_000_000 + sequence)
        self.data.append(data)
        return self

    def expand(self, delivered: tuple[int, int] | None = None, **options: Any) -> Any:
        self.given = list(self.data)
        return expand(self.sequence_numbers, self.partition_keys, self.arrival_ms, self.given, delivered, **options)


def rows(out: Any) -> list[tuple[Any, ...]]:
    columns = (
        out.sequence_numbers,
        out.sub_sequence_numbers,
        out.partition_keys,
        out.explicit_hash_keys,
        out.arrival_ms,
        out.data,
        out.errors,
    )
    assert len({len(column) for column in columns}) == 1
    assert out.data_bytes == sum(map(len, out.data))
    return list(zip(*columns, strict=True))


BIG = 10**40  # sequence numbers are far beyond 64 bits
AGG = aggregate([("a", b"a0", None), ("b", b"b1", "7"), ("a", b"a2", None), ("c", b"", "8"), ("b", b"b4", "7")])[0]
CORRUPT = frame(TABLE + record(5, b"x"))  # valid MD5, index out of range
T = 1_700_000_000_000


def test_plain_events_come_back_as_the_same_lists() -> None:
    event = Event().add(BIG + 1, b"one").add(BIG + 2, b"two").add(BIG + 3, b"three")
    out = event.expand(None)
    assert out.sequence_numbers is event.sequence_numbers
    assert out.partition_keys is event.partition_keys
    assert out.arrival_ms is event.arrival_ms
    assert out.data is event.given
    assert out.sub_sequence_numbers == out.explicit_hash_keys == out.errors == [None] * 3
    assert (out.duplicates, out.corrupt, out.dead_letters, out.data_bytes) == (0, 0, [], 11)
    out = event.expand((BIG, MAX_SUB_SEQUENCE))
    assert out.data is event.given


def test_a_magic_prefix_too_short_for_an_aggregate_is_a_plain_record() -> None:
    short = MAGIC + b"short"
    out = Event().add(1, b"x").add(2, short).expand(None, policy="fail")
    assert rows(out)[1] == ("2", None, "outer", None, T + 2, short, None)


def test_plain_watermark_drops_the_prefix() -> None:
    event = Event().add(BIG + 1, b"one").add(BIG + 2, b"two").add(BIG + 3, b"three")
    out = event.expand(Position("AFTER_SEQUENCE_NUMBER", str(BIG + 2)).delivered_through())
    assert rows(out) == [(str(BIG + 3), None, "outer", None, T + BIG + 3, b"three", None)]
    assert out.duplicates == 2
    # AT_SEQUENCE_NUMBER n with a sub-sequence: a plain record n counts as sub MAX, so it stays.
    out = event.expand((BIG + 2, 4))
    assert [row[0] for row in rows(out)] == [str(BIG + 2), str(BIG + 3)]
    assert out.duplicates == 1
    out = event.expand(Position("AT_SEQUENCE_NUMBER", str(BIG + 2)).delivered_through())
    assert out.duplicates == 1
    assert event.expand((BIG + 9, 0)).sequence_numbers == []
    assert event.expand((BIG + 9, 0)).duplicates == 3


def test_mixed_plain_and_aggregated() -> None:
    event = Event().add(10, b"plain-10").add(11, AGG, "a").add(12, b"plain-12")
    out = event.expand(None)
    assert rows(out) == [
        ("10", None, "outer", None, T + 10, b"plain-10", None),
        ("11", 0, "a", None, T + 11, b"a0", None),
        ("11", 1, "b", "7", T + 11, b"b1", None),
        ("11", 2, "a", None, T + 11, b"a2", None),
        ("11", 3, "c", "8", T + 11, b"", None),
        ("11", 4, "b", "7", T + 11, b"b4", None),
        ("12", None, "outer", None, T + 12, b"plain-12", None),
    ]
    assert (out.duplicates, out.corrupt) == (0, 0)


@pytest.mark.parametrize(
    ("delivered", "first_row", "duplicates", "kept"),
    [
        ((10, MAX_SUB_SEQUENCE), ("11", 0), 1, 6),
        ((11, 0), ("11", 1), 2, 5),
        ((11, 2), ("11", 3), 4, 3),
        ((11, 4), ("12", None), 6, 1),
        ((11, 99), ("12", None), 6, 1),
        ((11, MAX_SUB_SEQUENCE), ("12", None), 2, 1),  # the aggregate is dropped whole, not decoded
    ],
)
def test_watermark_inside_an_aggregate(
    delivered: tuple[int, int], first_row: tuple[str, int], duplicates: int, kept: int
) -> None:
    event = Event().add(10, b"plain-10").add(11, AGG).add(12, b"plain-12")
    out = event.expand(delivered)
    assert (out.sequence_numbers[0], out.sub_sequence_numbers[0]) == first_row
    assert out.duplicates == duplicates
    assert len(rows(out)) == kept
    assert out.sequence_numbers[-1] == "12"


def test_corrupt_passthrough() -> None:
    event = Event().add(1, b"p").add(2, CORRUPT, "k").add(3, AGG)
    out = event.expand(None)
    assert rows(out)[:2] == [
        ("1", None, "outer", None, T + 1, b"p", None),
        ("2", None, "k", None, T + 2, CORRUPT, CORRUPT_AGGREGATE),
    ]
    assert len(out) == 7
    assert (out.corrupt, out.dead_letters) == (1, [])


def test_corrupt_dead_letter() -> None:
    bad_md5 = AGG[:-1] + bytes([AGG[-1] ^ 0xFF])
    event = Event().add(1, b"p").add(2, CORRUPT, "k").add(3, bad_md5, "j").add(4, b"q")
    out = event.expand(None, policy="dead_letter")
    assert [row[0] for row in rows(out)] == ["1", "4"]
    assert out.dead_letters == [
        DeadLetter("2", "k", T + 2, CORRUPT, "partition key index out of range"),
        DeadLetter("3", "j", T + 3, bad_md5, "md5 mismatch"),
    ]
    assert out.corrupt == 2


def test_corrupt_fail() -> None:
    event = Event().add(1, b"p").add(2, CORRUPT)
    with pytest.raises(CorruptAggregate, match="partition key index out of range"):
        event.expand(None, policy="fail")


def test_corrupt_records_already_delivered_are_dropped_without_decoding() -> None:
    event = Event().add(1, b"p").add(2, CORRUPT).add(3, b"q")
    for policy in ("passthrough", "dead_letter", "fail"):
        out = event.expand((2, MAX_SUB_SEQUENCE), policy=policy)
        assert (out.sequence_numbers, out.corrupt, out.duplicates, out.dead_letters) == (["3"], 0, 2, [])


def test_corrupt_record_at_the_watermark_with_a_sub_sequence_counts_as_plain() -> None:
    out = Event().add(2, CORRUPT).expand((2, 3))
    assert (out.sequence_numbers, out.errors, out.duplicates) == (["2"], [CORRUPT_AGGREGATE], 0)


def test_a_given_data_length_is_taken_as_is_when_no_row_is_dropped_and_summed_again_otherwise() -> None:
    """The subscription passes the decoder's total length of the event's data: it is taken as the
    output's when every record is kept (not summed again; a made-up total shows it), and the
    lengths of what the watermark leaves are summed otherwise."""
    event = Event().add(BIG + 1, b"one").add(BIG + 2, b"two").add(BIG + 3, b"three")
    assert event.expand(None, data_bytes=999).data_bytes == 999
    assert event.expand(None, data_bytes=None).data_bytes == 11
    assert event.expand((BIG + 1, MAX_SUB_SEQUENCE), data_bytes=11).data_bytes == 8


def test_sub_record_cap_applies_per_aggregate() -> None:
    out = Event().add(1, AGG).expand(None, max_sub_records=4)
    assert out.errors == [CORRUPT_AGGREGATE]


@st.composite
def events(draw: st.DrawFn) -> tuple[Event, list[list[SubRecord] | None]]:
    event = Event()
    contents: list[list[SubRecord] | None] = []
    sequence = draw(st.integers(0, 5))
    for _ in range(draw(st.integers(0, 8))):
        sequence += draw(st.integers(1, 3))
        kind = draw(st.sampled_from(["plain", "short-magic", "aggregate", "corrupt", "bad-md5"]))
        if kind == "plain":
            event.add(sequence, draw(st.binary(max_size=8)))
            contents.append(None)
        elif kind == "short-magic":  # the magic prefix without room for the MD5: a plain record
            event.add(sequence, MAGIC + draw(st.binary(max_size=DIGEST_SIZE - 1)))
            contents.append(None)
        elif kind == "corrupt":
            event.add(sequence, CORRUPT)
            contents.append(None)
        elif kind == "bad-md5":
            event.add(sequence, AGG[:-1] + bytes([AGG[-1] ^ 0xFF]))
            contents.append(None)
        else:
            records = [(f"k{i % 3}", bytes([i]), str(i) if i % 2 else None) for i in range(draw(st.integers(1, 6)))]
            event.add(sequence, aggregate(records)[0])
            contents.append(expected(records))
    return event, contents


@given(
    events(),
    st.none() | st.tuples(st.integers(0, 30), st.integers(0, 7) | st.just(MAX_SUB_SEQUENCE)),
    st.sampled_from(["passthrough", "dead_letter", "fail"]),
    st.booleans(),
)
@example(  # plain records only, the watermark past the first: the given total no longer holds
    (Event().add(1, b"one").add(2, b"two"), [None, None]), (1, MAX_SUB_SEQUENCE), "passthrough", True
)
def test_expand_matches_a_naive_model(
    drawn: tuple[Event, list[list[SubRecord] | None]], delivered: tuple[int, int] | None, policy: str, total: bool
) -> None:
    """``total``: the event's data length is given, as the subscription gives the decoder's; ``rows``
    checks the output's against its rows, so a total used where the watermark dropped rows fails."""
    event, contents = drawn
    data_bytes = sum(map(len, event.data)) if total else None
    want: list[tuple[Any, ...]] = []
    dead = []
    corrupt = duplicates = 0
    for i, subs in enumerate(contents):
        seq, pk, arrival, data = event.sequence_numbers[i], event.partition_keys[i], event.arrival_ms[i], event.data[i]
        if delivered is not None and (int(seq), MAX_SUB_SEQUENCE) <= delivered:
            duplicates += 1
            continue
        if subs is None:
            if not is_aggregate(data):
                want.append((seq, None, pk, None, arrival, data, None))
                continue
            corrupt += 1
            if policy == "dead_letter":
                dead.append(seq)
            else:
                want.append((seq, None, pk, None, arrival, data, CORRUPT_AGGREGATE))
        else:
            for sub, record in enumerate(subs):
                if delivered is None or (int(seq), sub) > delivered:
                    want.append((seq, sub, record.partition_key, record.explicit_hash_key, arrival, record.data, None))
                else:
                    duplicates += 1  # a sub-record of the aggregate the watermark falls inside
    if policy == "fail" and corrupt:
        with pytest.raises(CorruptAggregate):
            event.expand(delivered, policy=policy, data_bytes=data_bytes)
        return
    out = event.expand(delivered, policy=policy, data_bytes=data_bytes)
    assert rows(out) == want
    assert [letter.sequence_number for letter in out.dead_letters] == dead
    assert (out.corrupt, out.duplicates) == (corrupt, duplicates)
