"""The bridge's payload column (efo.kinesis.columns): one copy of a batch's payloads, into blocks it keeps.

The column must hold every payload of every chunk in order, copied once, into a block that is not
written while anything made on it is alive; the bridge's table must be the one the per-row lists
made.
"""

from __future__ import annotations

import io
import os
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from efo.kinesis import columns
from efo.kinesis.columns import ReusableBlocks, join_payloads, write_groups
from efo.pipeline.records import RecordChunk, Row
from sparkbridge.arrow import SCHEMA, to_table

# ---- the bridge's table -----------------------------------------------------------------------------


def _chunk(shard: str, start: int, payloads: list[bytes], *, kpl: bool = False) -> RecordChunk:
    rows = []
    for i, payload in enumerate(payloads):
        optional: dict[str, Any] = {}
        if kpl and i % 2:
            optional = {"sub_sequence_number": i, "explicit_hash_key": str(i)}
        elif kpl and i % 3 == 0:
            optional = {"error": "corrupt_aggregate"}
        rows.append(Row(str(start + i), payload, f"pk-{i}", 1_700_000_000_000 + i, **optional))
    return RecordChunk.of_rows("s", shard, start, rows)


def reference_table(chunks: list[RecordChunk]) -> pa.Table:
    """The batch table as the bridge built it before the column path: one Python list per column."""

    def column(name: str) -> list[Any]:
        return [value for chunk in chunks for value in getattr(chunk, name)]

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
@given(st.lists(st.tuples(st.lists(st.binary(max_size=20), max_size=5), st.booleans()), max_size=6))
def test_the_table_is_the_one_the_per_row_lists_made(chunks: list[tuple[list[bytes], bool]]) -> None:
    """KPL rows or plain ones, in any mix: the table the per-row lists made."""
    mixed = [_chunk(f"shard-{i % 2}", 100 * i, payloads, kpl=kpl) for i, (payloads, kpl) in enumerate(chunks)]
    mixed = [chunk for chunk in mixed if len(chunk)]
    table = to_table(mixed)
    assert table.schema == SCHEMA
    assert table.equals(reference_table(mixed))


def test_a_column_pa_array_splits_is_the_same_column(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over 2 GiB of strings (keys, say) pa.array returns the list array in pieces, whose
    ``flatten`` would be the wrong thing (a list of fields): each piece is flattened."""
    from sparkbridge import arrow

    real = pa.array

    def in_pieces(values: Any, type: Any = None, **kwargs: Any) -> Any:
        whole = real(values, type, **kwargs)
        if not isinstance(type, pa.ListType) or len(whole) < 2:
            return whole
        return pa.chunked_array([whole.slice(0, 1), whole.slice(1)], type)

    chunks = [_chunk(f"shard-{i}", 10 * i, [b"x" * i] * (i + 1), kpl=True) for i in range(4)]
    monkeypatch.setattr(arrow.pa, "array", in_pieces)
    table = to_table(chunks)
    monkeypatch.undo()
    assert table.equals(reference_table(chunks))


SHARED_BLOCKS = ReusableBlocks(2)  # across examples, so later ones write over earlier ones' blocks


@given(
    st.lists(st.lists(st.binary(max_size=64), max_size=12), max_size=6),
    st.sampled_from([None, SHARED_BLOCKS]),
)
def test_joined_payloads_are_the_column_pa_array_builds_of_every_value_in_order(
    parts: list[list[bytes]], blocks: ReusableBlocks | None
) -> None:
    """Into a fresh block or a reused one."""
    joined = join_payloads(parts, blocks)
    joined.validate(full=True)
    assert joined.equals(pa.array([value for part in parts for value in part], pa.binary()))


@given(st.lists(st.integers(0, 300), max_size=40), st.integers(1, 500))
@example([1, 0], 1)  # an empty payload at the end starts at the total, a step of its own: with the last group
@example([8, 300, 0], 308)
@example([0, 0], 4)
def test_a_block_is_written_a_step_of_bytes_at_a_time(sizes: list[int], step: int) -> None:
    """The payloads are copied in groups, in order, all of them once, each group those that start
    within one step of bytes (so a call copies at most a step and one payload); empty payloads at
    the very end, which start at the total, go with the last group."""
    offsets = np.zeros(len(sizes) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    total = int(offsets[-1])

    def step_of(i: int) -> int:
        return min(int(offsets[i]), max(total - 1, 0)) // step

    groups = write_groups(offsets, step)
    assert [i for first, end in groups for i in range(first, end)] == list(range(len(sizes)))
    assert all(first < end for first, end in groups)
    for first, end in groups:
        assert len({step_of(i) for i in range(first, end)}) == 1
    for (_, end), (first, _) in pairwise(groups):
        assert step_of(end - 1) != step_of(first)  # a group is all that start in its step
    assert len(groups) <= total // step + 1


@settings(deadline=None)
@given(st.lists(st.lists(st.binary(max_size=64), max_size=12), max_size=6), st.integers(1, 100))
def test_payloads_written_a_few_bytes_at_a_time_join_into_the_same_column(parts: list[list[bytes]], step: int) -> None:
    """Into a block, however small the step: the column pa.array builds."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(columns, "BYTES_PER_WRITE", step)
        joined = join_payloads(parts, ReusableBlocks(1))
    joined.validate(full=True)
    assert joined.equals(pa.array([value for part in parts for value in part], pa.binary()))


@settings(deadline=None)
@given(
    st.lists(st.lists(st.binary(max_size=64), max_size=12), max_size=6),
    st.integers(1, 100),
    st.lists(st.integers(0, 2_000), min_size=6, max_size=6),
)
def test_wrong_part_sizes_cost_no_wrong_column(parts: list[list[bytes]], step: int, claimed: list[int]) -> None:
    """The parts' sizes only size the block and its writes (the chunks' ``data_bytes``): any
    figures, too large or too small, give the column pa.array builds."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(columns, "BYTES_PER_WRITE", step)
        joined = join_payloads(parts, ReusableBlocks(1), claimed[: len(parts)])
    joined.validate(full=True)
    assert joined.equals(pa.array([value for part in parts for value in part], pa.binary()))


def test_one_size_is_given_per_part() -> None:
    with pytest.raises(ValueError, match="2 sizes for 3 parts"):
        join_payloads([[b"a"], [b"b"], [b"c"]], ReusableBlocks(1), [1, 1])


class _CountingBlock(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def writelines(self, lines: Any) -> None:
        lines = list(lines)
        self.calls.append(sum(map(len, lines)))
        super().writelines(lines)


@settings(deadline=None)
@given(st.lists(st.lists(st.integers(0, 300), max_size=12), max_size=8), st.integers(1, 500))
@example([[300, 300], [1]], 100)  # a large part, then a small one
@example([[50], [60], [70], [80]], 100)  # small parts, several a call
def test_a_call_copies_at_most_two_steps_of_small_parts_or_a_step_and_a_payload_of_a_large_one(
    sizes: list[list[int]], step: int
) -> None:
    """So the GIL is let go every step or two of bytes, whatever the events' sizes; each payload
    is written once, in order, and its length returned."""
    parts = [[bytes([65 + i % 26]) * size for i, size in enumerate(part)] for part in sizes]
    block = _CountingBlock()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(columns, "BYTES_PER_WRITE", step)
        lengths = columns._write_parts(block, parts, np.array([sum(part) for part in sizes], np.int64))
    payloads = [payload for part in parts for payload in part]
    assert lengths.tolist() == [len(payload) for payload in payloads]
    assert block.getvalue() == b"".join(payloads)
    largest = max((len(payload) for payload in payloads), default=0)
    assert all(call <= max(2 * step, step + largest) for call in block.calls), block.calls
    assert len(block.calls) <= 2 * (sum(map(len, payloads)) // step + 1) + len(parts)


def _data_address(column: Any) -> int:
    return int(column.buffers()[2].address)


def test_a_block_is_not_written_while_anything_made_on_it_is_alive_and_is_reused_once_nothing_is() -> None:
    blocks = ReusableBlocks(2)
    first = join_payloads([[b"a" * 10, b"b" * 5], [b"c"]], blocks)
    second = join_payloads([[b"d" * 7], [b"e", b"f"]], blocks)
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


def test_a_block_keeps_its_allocation_through_a_smaller_batch_for_a_larger_one_after() -> None:
    """Batches vary in size: one smaller than the block (more than half of it) leaves the block as
    large as it was, so the next, as large as the first, is not given a fresh block."""
    blocks = ReusableBlocks(1)
    first = join_payloads([[b"x" * 1000] * 100], blocks)
    address = _data_address(first)
    del first
    for records in (90, 100, 60, 100):
        column = join_payloads([[b"x" * 1000] * records], blocks)
        assert _data_address(column) == address, records
        del column


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
    empty = join_payloads([[], []], blocks)
    assert len(empty) == 0 and column.to_pylist() == [b"ab", b"c"]


@pytest.mark.parametrize("blocks", [None, ReusableBlocks], ids=["fresh", "into-a-new-block"])
def test_joined_payloads_are_copied_once(blocks: type[ReusableBlocks] | None) -> None:
    """The batch's payloads are never held twice over while its column is made: one exact-size
    copy, nothing more (a column per run of lists, then a concatenation, took two), into a
    fresh block or one allocated at the batch's size. Arrow's allocations go through a proxy
    pool whose peak is read; Python's through tracemalloc."""
    import tracemalloc

    big = [os.urandom(1000) for _ in range(1024)]
    parts: list[Any] = [big, big[:512], big[100:600]]
    payload_bytes = 1000 * (1024 + 512 + 500)
    default = pa.default_memory_pool()
    proxy = pa.proxy_memory_pool(default)
    pa.set_memory_pool(proxy)
    tracemalloc.start()
    try:
        joined = join_payloads(parts, blocks() if blocks else None)
        _, python_peak = tracemalloc.get_traced_memory()
        arrow_peak = proxy.max_memory()
        assert joined.buffers()[2].size == payload_bytes
        del joined  # before the proxy that may own its buffers goes
    finally:
        tracemalloc.stop()
        pa.set_memory_pool(default)
    assert arrow_peak + python_peak < payload_bytes + 2**18, (arrow_peak, python_peak)


def test_no_payloads_join_into_an_empty_column() -> None:
    assert join_payloads([]).equals(pa.array([], pa.binary()))
    assert join_payloads([[], []]).equals(pa.array([], pa.binary()))


@pytest.mark.parametrize("blocks", [None, ReusableBlocks], ids=["fresh", "into-a-block"])
def test_joined_payloads_refuse_a_buffer_whose_length_is_not_its_bytes(blocks: type[ReusableBlocks] | None) -> None:
    from array import array

    with pytest.raises(TypeError, match="payloads are bytes"):
        join_payloads([[memoryview(array("i", [1, 2]))]], blocks() if blocks else None)


def test_a_runner_prepares_each_batch_into_a_free_block_and_reuses_it_once_the_batch_is_gone() -> None:
    """The driver's BatchRunner copies the payloads of the batch it prepares into its blocks: the
    batch in the sink and the next one never share a block; once the first is let go, the one
    after next takes its block."""
    from sparkbridge.batches import BatchRunner

    runner = BatchRunner(None, sink=None, max_attempts=1, retry_backoff_s=0)  # type: ignore[arg-type]
    payloads = [os.urandom(100) for _ in range(8)]

    def prepare(serial: int) -> Any:
        return runner.prepare(f"b-{serial}", [_chunk("shard-0", 100 * serial, payloads)])

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
