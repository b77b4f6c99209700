"""The column path (efo.kinesis.columns): the same rows as the per-record path, for every input.

Payloads decoded in bulk into one Arrow column per event must be exactly the values the per-record
decoder produced (or the event must fall back to it); the KPL expansion of a column must give the
rows, sub-sequence numbers, dead letters and errors the list gives; the bridge's table must not
depend on which of the two a chunk carries.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import string
from typing import Any

import pyarrow as pa
import pybase64
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efo.kinesis.columns import (
    ReusableBlocks,
    as_list,
    column_bytes,
    decode_base64,
    is_column,
    join_payloads,
    starts_with_any,
)
from efo.kinesis.decoder import decode_payloads
from efo.kinesis.kpl import MAGIC, CorruptAggregate, expand
from efo.pipeline.records import MAX_SUB_SEQUENCE, RecordChunk, Row
from sparkbridge.arrow import SCHEMA, to_table
from tests.unit.test_kpl import AGG, CORRUPT, aggregate

B64 = string.ascii_letters + string.digits + "+/"


def per_record(values: list[str]) -> list[bytes] | None:
    """What the decoder did before the column path: strict per record, or None if one fails."""
    try:
        return [pybase64.b64decode(value, validate=True) for value in values]
    except binascii.Error:
        return None


def old_payloads(values: list[str]) -> list[bytes]:
    """The decoder's payloads before the column path, fallback included."""
    strict = per_record(values)
    return strict if strict is not None else [pybase64.b64decode(value) for value in values]


def _or_error(decode: Any) -> Any:
    try:
        return decode()
    except (binascii.Error, ValueError) as error:
        return (type(error), str(error))


# ---- base64 in bulk --------------------------------------------------------------------------------

valid = st.binary(max_size=200).map(lambda data: base64.b64encode(data).decode())


@st.composite
def mangled(draw: st.DrawFn) -> str:
    """A base64 value, often made invalid (or valid in a non-canonical way) in one of the ways that matter."""
    value = draw(valid)
    how = draw(st.sampled_from(["keep", "pad", "strip", "insert", "replace", "bits"]))
    at = draw(st.integers(0, len(value)))
    if how == "pad":  # a "=" anywhere, or one too many
        return value[:at] + "=" + value[at:]
    if how == "strip":  # a length that is not a multiple of four
        return value[: max(0, len(value) - draw(st.integers(1, 3)))]
    if how == "insert":
        return value[:at] + draw(st.sampled_from([" ", "\n", "-", "_", "é", "\x00", "A", "AAAA", "=="])) + value[at:]
    if how == "replace" and value:
        at = min(at, len(value) - 1)
        return value[:at] + draw(st.sampled_from(["=", "-", "*", "A"])) + value[at + 1 :]
    if how == "bits" and value.endswith("="):  # non-zero trailing bits in the padded quad: still accepted
        stem = value.rstrip("=")
        return stem[:-1] + draw(st.sampled_from(B64)) + value[len(stem) :]
    return value


@settings(max_examples=400, deadline=None)
@given(st.lists(valid, max_size=40))
def test_valid_values_decode_to_the_per_record_bytes(values: list[str]) -> None:
    column = decode_base64(values)
    assert column is not None and is_column(column)
    assert column.type == pa.binary()
    assert column.to_pylist() == per_record(values)
    assert column_bytes(column) == sum(map(len, column.to_pylist()))


@settings(max_examples=600, deadline=None)
@given(st.lists(mangled(), max_size=12))
def test_a_column_exactly_when_every_value_is_strict_base64(values: list[str]) -> None:
    strict = per_record(values)
    column = decode_base64(values)
    if strict is None:
        assert column is None
    else:
        assert column is not None and column.to_pylist() == strict
    # the decoder's answer, whichever path: the same bytes, or the same error
    assert _or_error(lambda: as_list(decode_payloads(values))) == _or_error(lambda: old_payloads(values))


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], []),
        ([""], [b""]),
        (["QR=="], [b"A"]),  # trailing bits are ignored, as pybase64 and the standard library do
        (["QUJD", "QQ==", "", "QUI="], [b"ABC", b"A", b"", b"AB"]),
        (["QQ==QQ=="], None),  # padding inside a value
        (["Q==="], None),
        (["QQ=A"], None),
        (["QQ"], None),
        (["-_=="], None),
        (["QUJD", "Q Q="], None),
        (["é"], None),
    ],
)
def test_edge_cases(values: list[str], expected: list[bytes] | None) -> None:
    column = decode_base64(values)
    assert (None if column is None else column.to_pylist()) == expected


def test_large_events_and_many_small_records() -> None:
    for size, count in ((10240, 25), (1024, 100), (100, 500), (0, 3)):
        values = [base64.b64encode(bytes([i % 251]) * (size + i % 3)).decode() for i in range(count)]
        assert as_list(decode_payloads(values)) == per_record(values)


# ---- the KPL expansion of a column ------------------------------------------------------------------


@st.composite
def events(draw: st.DrawFn) -> tuple[list[str], list[str], list[int], list[bytes]]:
    """Records of an event in sequence order: plain ones (some with the magic prefix), aggregates, corrupt ones."""
    kinds = draw(st.lists(st.sampled_from(["plain", "magic", "agg", "small-agg", "corrupt", "bad-md5"]), max_size=8))
    data: list[bytes] = []
    for kind in kinds:
        if kind == "plain":
            data.append(draw(st.binary(max_size=40)))
        elif kind == "magic":
            data.append(MAGIC + draw(st.binary(max_size=30)))
        elif kind == "agg":
            data.append(AGG)
        elif kind == "small-agg":
            users = draw(st.lists(st.tuples(st.sampled_from("xyz"), st.binary(max_size=8)), min_size=1, max_size=4))
            data.append(aggregate([(key, payload, None) for key, payload in users])[0])
        elif kind == "corrupt":
            data.append(CORRUPT)
        else:
            data.append(AGG[:-1] + bytes([AGG[-1] ^ 0xFF]))
    first = draw(st.integers(1, 10**30))
    sequence_numbers = [str(first + 2 * i) for i in range(len(data))]
    partition_keys = [f"pk-{i % 3}" for i in range(len(data))]
    arrival_ms = [1_700_000_000_000 + i for i in range(len(data))]
    return sequence_numbers, partition_keys, arrival_ms, data


def _outcome(event: tuple[list[str], list[str], list[int], Any], delivered: Any, policy: Any) -> Any:
    try:
        out = expand(*event, delivered, policy=policy)
    except CorruptAggregate as error:
        return ("raised", error.reason)
    fields = (
        out.sequence_numbers,
        out.sub_sequence_numbers,
        out.partition_keys,
        out.explicit_hash_keys,
        out.arrival_ms,
        as_list(out.data),
        out.errors,
    )
    assert out.data_bytes == sum(map(len, as_list(out.data)))
    return (list(map(list, fields)), out.data_bytes, out.dead_letters, out.corrupt, out.duplicates)


@settings(max_examples=300, deadline=None)
@given(
    events(),
    st.sampled_from(["passthrough", "dead_letter", "fail"]),
    st.one_of(st.none(), st.tuples(st.integers(0, 16), st.sampled_from([0, 1, 3, MAX_SUB_SEQUENCE]))),
)
def test_expanding_a_column_gives_the_rows_of_the_list(
    event: tuple[list[str], list[str], list[int], list[bytes]], policy: Any, watermark: tuple[int, int] | None
) -> None:
    sequence_numbers, partition_keys, arrival_ms, data = event
    delivered = None
    if watermark is not None and sequence_numbers:  # somewhere in or around the event
        delivered = (int(sequence_numbers[0]) - 1 + watermark[0], watermark[1])
    as_column = pa.array(data, pa.binary())
    assert _outcome((sequence_numbers, partition_keys, arrival_ms, as_column), delivered, policy) == _outcome(
        event, delivered, policy
    )


def test_a_plain_column_comes_back_as_itself_or_a_slice() -> None:
    column = decode_base64([base64.b64encode(b"one").decode(), base64.b64encode(b"two").decode()])
    out = expand(["1", "2"], ["a", "b"], [0, 0], column, None)
    assert out.data is column and out.data_bytes == 6
    out = expand(["1", "2"], ["a", "b"], [0, 0], column, (1, MAX_SUB_SEQUENCE))
    assert is_column(out.data) and out.data.to_pylist() == [b"two"] and out.data_bytes == 3


def test_starts_with_any() -> None:
    assert not starts_with_any(pa.array([], pa.binary()), MAGIC)
    assert not starts_with_any(pa.array([b"", MAGIC[:3], b"x" + MAGIC], pa.binary()), MAGIC)
    assert starts_with_any(pa.array([b"x", MAGIC], pa.binary()), MAGIC)
    assert starts_with_any(pa.array([b"x", MAGIC + b"y"], pa.binary()).slice(1), MAGIC)
    assert not starts_with_any(pa.array([MAGIC, b"y"], pa.binary()).slice(1), MAGIC)


# ---- the bridge's table -----------------------------------------------------------------------------


def _chunk(shard: str, start: int, payloads: list[bytes], *, column: bool, kpl: bool = False) -> RecordChunk:
    rows = []
    for i, payload in enumerate(payloads):
        optional: dict[str, Any] = {}
        if kpl and i % 2:
            optional = {"sub_sequence_number": i, "explicit_hash_key": str(i)}
        elif kpl and i % 3 == 0:
            optional = {"error": "corrupt_aggregate"}
        rows.append(Row(str(start + i), payload, f"pk-{i}", 1_700_000_000_000 + i, **optional))
    chunk = RecordChunk.of_rows("s", shard, start, rows)
    if column:
        chunk.data = pa.array(chunk.data, pa.binary())  # as small records come from the decoder
    return chunk


def reference_table(chunks: list[RecordChunk]) -> pa.Table:
    """The batch table as the bridge built it before the column path: one Python list per column."""

    def column(name: str) -> list[Any]:
        return [value for chunk in chunks for value in as_list(getattr(chunk, name))]

    return pa.Table.from_arrays(
        [
            pa.array([chunk.stream for chunk in chunks for _ in range(len(chunk))], pa.string()),
            pa.array([chunk.shard_id for chunk in chunks for _ in range(len(chunk))], pa.string()),
            pa.array(column("sequence_numbers"), pa.string()),
            pa.array(column("sub_sequence_numbers"), pa.int64()),
            pa.array(column("partition_keys"), pa.string()),
            pa.array(column("explicit_hash_keys"), pa.string()),
            pa.array(column("arrival_ms"), pa.int64()).view(SCHEMA.field("approximate_arrival_timestamp").type),
            pa.array(column("data"), pa.binary()),
            pa.array(column("errors"), pa.string()),
        ],
        schema=SCHEMA,
    )


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.binary(max_size=20), max_size=5), st.booleans(), st.booleans()), max_size=6))
def test_the_table_does_not_depend_on_how_chunks_carry_their_data(
    chunks: list[tuple[list[bytes], bool, bool]],
) -> None:
    """Whatever mix of columns and lists, KPL rows or plain ones: the table the per-row lists made."""
    mixed = [
        _chunk(f"shard-{i % 2}", 100 * i, payloads, column=column, kpl=kpl)
        for i, (payloads, column, kpl) in enumerate(chunks)
    ]
    mixed = [chunk for chunk in mixed if len(chunk)]
    table = to_table(mixed)
    assert table.schema == SCHEMA
    assert table.equals(reference_table(mixed))


SHARED_BLOCKS = ReusableBlocks(2)  # across examples, so later ones write over earlier ones' blocks


@given(
    st.lists(
        st.tuples(st.lists(st.binary(max_size=64), max_size=12), st.booleans(), st.integers(0, 3), st.integers(0, 3)),
        max_size=6,
    ),
    st.sampled_from([None, SHARED_BLOCKS]),
)
def test_joined_payloads_are_the_column_pa_array_builds_of_every_value_in_order(
    parts: list[tuple[list[bytes], bool, int, int]], blocks: ReusableBlocks | None
) -> None:
    """Lists of bytes and Arrow columns (sliced, as a cut or the watermark leave them) in any mix,
    into a fresh block or a reused one."""
    drawn: list[Any] = []
    values: list[bytes] = []
    for part, column, head, tail in parts:
        kept = part[head : len(part) - tail]
        values.extend(kept)
        drawn.append(pa.array(part, pa.binary()).slice(head, len(kept)) if column else kept)
    joined = join_payloads(drawn, blocks)
    joined.validate(full=True)
    assert joined.equals(pa.array(values, pa.binary()))
    assert column_bytes(joined) == sum(map(len, values))


def _data_address(column: Any) -> int:
    return int(column.buffers()[2].address)


def test_a_block_is_not_written_while_anything_made_on_it_is_alive_and_is_reused_once_nothing_is() -> None:
    blocks = ReusableBlocks(2)
    first = join_payloads([[b"a" * 10, b"b" * 5], [b"c"]], blocks)
    second = join_payloads([[b"d" * 7], pa.array([b"e", b"f"], pa.binary())], blocks)
    third = join_payloads([[b"g" * 3], [b"h"]], blocks)  # both blocks in use: a fresh one
    assert len({_data_address(first), _data_address(second), _data_address(third)}) == 3
    assert first.to_pylist() == [b"a" * 10, b"b" * 5, b"c"]
    assert second.to_pylist() == [b"d" * 7, b"e", b"f"]
    assert third.to_pylist() == [b"g" * 3, b"h"]

    first_block, second_block = _data_address(first), _data_address(second)
    kept = pa.table({"data": second}).slice(1, 1)  # what a sink might keep of a batch
    del first, second
    fourth = join_payloads([[b"i" * 12], [b"j" * 4]], blocks)  # as large as the first: not moved
    assert _data_address(fourth) == first_block  # its pages already mapped
    fifth = join_payloads([[b"k"], [b"l"]], blocks)  # the second block is still held by the slice
    assert _data_address(fifth) != second_block
    assert kept.column("data").to_pylist() == [b"e"]
    assert fourth.to_pylist() == [b"i" * 12, b"j" * 4] and fifth.to_pylist() == [b"k", b"l"]
    del kept, fifth
    assert _data_address(join_payloads([[b"m" * 5], [b"n" * 4]], blocks)) == second_block


def test_a_block_keeps_its_pages_for_the_next_batch_and_is_made_anew_for_one_under_half_of_it() -> None:
    """The point of reusing: the next batch of the same size touches no new page, where a fresh
    copy of 40 MiB (over glibc's largest mmap threshold, so always mapped anew) touches all of
    them; and an idle block holds no more than its last batch."""
    import resource

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    pages = (40 << 20) // resource.getpagesize()
    batch = [[os.urandom(1 << 20) for _ in range(40)]]
    before = faults()
    fresh = join_payloads(batch)
    assert faults() - before > pages // 2  # the control: this machine maps a fresh block page by page
    del fresh
    blocks = ReusableBlocks(1)
    column = join_payloads(batch, blocks)
    assert blocks.sizes()[0] >= 40 << 20
    del column
    before = faults()
    column = join_payloads(batch, blocks)
    assert faults() - before < pages // 20
    assert column.to_pylist() == batch[0]
    assert not column.buffers()[2].is_mutable  # a view of the block, read-only
    del column
    small = join_payloads([[b"x" * 1000] * 10, [b"y"]], blocks)
    assert small.to_pylist() == [b"x" * 1000] * 10 + [b"y"]
    assert blocks.sizes()[0] < 64 << 10


def test_a_block_is_allocated_at_its_batch_s_size_not_grown_by_its_writes() -> None:
    """Grown write by write, a BytesIO over-allocates by up to an eighth (1.105x for 3,060 records
    of 1000 B), past the README's two copies of a batch; a block is made at the batch's size."""
    blocks = ReusableBlocks(1)
    batch = [[os.urandom(1000) for _ in range(3060)]]
    column = join_payloads(batch, blocks)
    empty = io.BytesIO().__sizeof__()
    assert blocks.sizes()[0] - empty <= 3_060_000 + 64
    assert column.to_pylist() == batch[0]


def test_an_empty_join_into_a_block_in_use_leaves_it_alone() -> None:
    blocks = ReusableBlocks(1)
    column = join_payloads([[b"ab"], [b"c"]], blocks)
    empty = join_payloads([[], pa.array([], pa.binary())], blocks)
    assert len(empty) == 0 and column.to_pylist() == [b"ab", b"c"]


@pytest.mark.parametrize("blocks", [None, ReusableBlocks], ids=["fresh", "into-a-new-block"])
def test_joined_payloads_are_copied_once_whatever_the_mix(blocks: type[ReusableBlocks] | None) -> None:
    """The batch's payloads are never held twice over while its column is made: one exact-size
    copy, nothing more (a column per run of lists, then a concatenation, took two), into a
    fresh block or one allocated at the batch's size. Arrow's allocations go through a proxy
    pool whose peak is read; Python's through tracemalloc."""
    import tracemalloc

    big = [os.urandom(1000) for _ in range(1024)]
    parts: list[Any] = [big, pa.array(big, pa.binary()), big[:512], pa.array(big, pa.binary()).slice(100, 500)]
    payload_bytes = 1000 * (1024 + 1024 + 512 + 500)
    default = pa.default_memory_pool()
    proxy = pa.proxy_memory_pool(default)
    pa.set_memory_pool(proxy)
    tracemalloc.start()
    try:
        joined = join_payloads(parts, blocks() if blocks else None)
        _, python_peak = tracemalloc.get_traced_memory()
        arrow_peak = proxy.max_memory()
        assert column_bytes(joined) == payload_bytes
        del joined  # before the proxy that may own its buffers goes
    finally:
        tracemalloc.stop()
        pa.set_memory_pool(default)
    assert arrow_peak + python_peak < payload_bytes + 2**18, (arrow_peak, python_peak)


def test_a_payload_column_of_another_type_is_refused() -> None:
    with pytest.raises(TypeError, match=r"pa\.binary\(\)"):
        join_payloads([[b"a"], pa.array([b"b"], pa.large_binary())])


def test_one_column_alone_is_its_own_join() -> None:
    column = pa.array([b"a", b"bc"], pa.binary())
    assert join_payloads([column]) is column
    assert join_payloads([]).equals(pa.array([], pa.binary()))


def test_large_records_are_decoded_one_by_one_into_a_list_and_small_ones_into_a_column() -> None:
    large = [bytes([i]) * (2000 + i) for i in range(30)]  # over the bulk path's mean: decoded one by one
    assert decode_payloads([base64.b64encode(v).decode() for v in large]) == large
    small = [bytes([i]) * (100 + i) for i in range(30)]
    column = decode_payloads([base64.b64encode(v).decode() for v in small])
    column.validate(full=True)
    assert column.equals(pa.array(small, pa.binary()))


def test_joined_payloads_refuse_a_buffer_whose_length_is_not_its_bytes() -> None:
    from array import array

    with pytest.raises(TypeError, match="payloads are bytes"):
        join_payloads([[memoryview(array("i", [1, 2]))]])


def test_a_runner_prepares_each_batch_into_a_free_block_and_reuses_it_once_the_batch_is_gone() -> None:
    """The driver's BatchRunner copies the payloads of the batch it prepares into its blocks: the
    batch in the sink and the next one never share a block; once the first is let go, the one
    after next takes its block."""
    from sparkbridge.batches import BatchRunner

    runner = BatchRunner(None, sink=None, max_attempts=1, retry_backoff_s=0)  # type: ignore[arg-type]
    payloads = [os.urandom(100) for _ in range(8)]

    def prepare(serial: int) -> Any:
        return runner.prepare(f"b-{serial}", [_chunk("shard-0", 100 * serial, payloads, column=False)])

    first, second = prepare(1), prepare(2)
    first_block = _data_address(first.table.column("data").chunk(0))
    assert _data_address(second.table.column("data").chunk(0)) != first_block
    del first
    third = prepare(3)
    assert _data_address(third.table.column("data").chunk(0)) == first_block
    for batch in (second, third):
        assert batch.table.column("data").to_pylist() == payloads


@given(
    st.lists(
        st.tuples(st.sampled_from(["orders", "payments", "clicks-é"]), st.integers(0, 2), st.integers(0, 3)),
        max_size=12,
    )
)
def test_stream_and_shard_columns_repeat_each_chunk_s_own_in_order(chunks: list[tuple[str, int, int]]) -> None:
    """Several streams and shards interleaved, empty chunks among them."""
    made = [
        RecordChunk.of_rows(stream, f"shardId-{shard}", i, [Row(str(i * 10 + j), b"x", "k", 0) for j in range(rows)])
        for i, (stream, shard, rows) in enumerate(chunks)
    ]
    table = to_table(made)
    assert table.column("stream").to_pylist() == [stream for stream, _, rows in chunks for _ in range(rows)]
    assert table.column("shard_id").to_pylist() == [
        f"shardId-{shard}" for _, shard, rows in chunks for _ in range(rows)
    ]
    assert table.column("sequence_number").to_pylist() == [
        str(i * 10 + j) for i, (_, _, rows) in enumerate(chunks) for j in range(rows)
    ]
