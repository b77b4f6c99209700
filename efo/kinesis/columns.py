"""A batch's record payloads as one Arrow binary column, copied once into a block kept from batch to batch.

The decoder hands each event's payloads on as a list of ``bytes`` (efo.kinesis.decoder: msgspec, or
pybase64 one record at a time), and the bridge makes the batch's ``data`` column of them here, in one
copy (:func:`join_payloads`) into one of the driver's :class:`ReusableBlocks`.

Decoding an event's payloads in bulk into an Arrow column of its own (one base64 call over the
joined strings, the padding dropped by an Arrow ``take``) was tried and removed. msgspec now
decodes events of records up to 1,350 B, payloads and all, in one pass; in the events orjson
still parses, the bulk decoding cost more than pybase64 one record at a time
(46-61 against 33-45 us per 100 records of 100-512 B; 38 against 46 at 768 B, where no record
has padding); and the bridge's copy of lists cost no more in the whole service (bench/service_cpu.py
at 100 B records: bridge 0.007 against 0.009 CPU-s per 10,000 records, docs/benchmarks.md).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence
from itertools import chain, pairwise
from typing import Any

import numpy as np
import pyarrow as pa

_MAX_INT32 = 2**31 - 1


#: Bytes copied into a block per call (``writelines`` holds the GIL throughout), so that other
#: threads get it in between: a millisecond or two here. A call copies the chunks (events) that
#: start within one mebibyte: at most two mebibytes when their ``data_bytes`` are right. An event
#: over a mebibyte is copied in calls of the payloads that start within one mebibyte. (A fresh
#: block is zero-filled in one call: about 0.6 ms per MiB, at the first batch and whenever a
#: batch is larger than its block or at most half of it.)
BYTES_PER_WRITE = 1 << 20


def write_groups(offsets: np.ndarray, step: int) -> list[tuple[int, int]]:
    """``(first, end)`` indices of consecutive payloads, in order and covering them all, each group
    the payloads whose start lies within one ``step`` of bytes (empty ones at the very end, which
    start at the total, with the last group); ``offsets`` are the payloads' starts and, last, the
    total (an Arrow binary column's offsets)."""
    count = len(offsets) - 1
    firsts = np.searchsorted(offsets[:count], np.arange(0, int(offsets[-1]), step))  # of each step
    return list(pairwise(sorted({0, count, *firsts.tolist()})))


class ReusableBlocks:
    """Blocks a bridge copies its batches' payloads into, each reused once no column made on it is
    alive: a block's pages stay mapped from one batch to the next.

    A fresh block for every batch (``b"".join``) is mapped anew by the C library and its pages
    touched one by one: about 0.6 ms per MiB here, a 62 ms copy of 100,000 records of 1 KiB against
    12 ms into a block already mapped (docs/benchmarks.md section 2). A block is an
    ``io.BytesIO``, and CPython refuses to write to one while a view of it is exported
    (``BufferError``): a column made on it holds such a view (``pa.py_buffer``) for as long as
    anything refers to its data (the table, a slice, a sink that kept it), so a block in use is
    never overwritten; the next free one is taken, or a fresh block when none is. The columns are
    read-only views. A block is allocated at exactly the size of the batch it is made for (the
    chunks' ``data_bytes``), and made anew for a batch larger than it or at most half of it: it
    holds no more than one batch that was written into it. With two (the batch in the sink and the
    next, prepared while Spark commits), the driver stays within the README's two Arrow copies,
    and keeps them while idle. Thread-safe."""

    def __init__(self, count: int = 2) -> None:
        self._blocks = [io.BytesIO() for _ in range(count)]
        self._capacities = [0] * count  # bytes allocated for each block's data
        self._lock = threading.Lock()

    def join(self, parts: Sequence[list[Any]], part_bytes: np.ndarray) -> tuple[Any, np.ndarray] | None:
        """The payloads of ``parts`` one after another, as a read-only view of a free block, and
        each payload's length; None when every block is in use. ``part_bytes``: each part's size
        in bytes as its chunk counts it (``data_bytes``), which sizes the block and the writes;
        the lengths are read from the payloads, so a wrong figure could cost a larger block or a
        longer write, never a wrong column."""
        total = int(part_bytes.sum())
        with self._lock:
            for index, block in enumerate(self._blocks):
                try:
                    block.write(b"")  # nothing, or BufferError while a column made on it is alive
                except BufferError:
                    continue
                capacity = self._capacities[index]
                if total > capacity or total <= capacity // 2:  # (BytesIO itself would shrink it then)
                    block = self._blocks[index] = io.BytesIO()  # the old block is freed
                    capacity = total
                    if total:
                        block.seek(total - 1)
                        block.write(b"\0")  # one allocation of exactly total bytes (zero-filled)
                block.seek(0)
                lengths = _write_parts(block, parts, part_bytes)
                written = block.tell()
                block.truncate()
                if written > capacity or written <= capacity // 2:  # grown by the writes, or shrunk by
                    capacity = written  # truncate: only when the sizes given were not the payloads'
                self._capacities[index] = capacity
                return block.getbuffer().toreadonly(), lengths
        return None

    def sizes(self) -> list[int]:
        """Each block's allocation in bytes (what it keeps while idle)."""
        return [block.__sizeof__() for block in self._blocks]


def _write_parts(block: io.BytesIO, parts: Sequence[list[Any]], part_bytes: np.ndarray) -> np.ndarray:
    """Write the parts' payloads into ``block`` in order and return their lengths. The parts that
    start within one :data:`BYTES_PER_WRITE` are written in one call (at most two steps' bytes),
    and their lengths read right after, while their objects are still in the cache (read
    beforehand, over a batch's 100,000 objects written long before, they were not: 7.8 against
    5.6 ms). A part larger than a step is measured first and written a step at a time."""
    starts = np.zeros(len(parts) + 1, np.int64)
    np.cumsum(part_bytes, out=starts[1:])
    large = np.flatnonzero(part_bytes > BYTES_PER_WRITE).tolist()
    bounds = {index for group in write_groups(starts, BYTES_PER_WRITE) for index in group}
    lengths: list[np.ndarray] = []
    for first, end in pairwise(sorted(bounds.union(large, [index + 1 for index in large]))):
        if end - first == 1 and part_bytes[first] > BYTES_PER_WRITE:
            part = parts[first]
            part_lengths = np.fromiter(map(len, part), np.int64, len(part))
            offsets = np.zeros(len(part) + 1, np.int64)
            np.cumsum(part_lengths, out=offsets[1:])
            for start, stop in write_groups(offsets, BYTES_PER_WRITE):
                block.writelines(part[start:stop])
        else:
            pieces = list(chain.from_iterable(parts[first:end]))
            block.writelines(pieces)
            part_lengths = np.fromiter(map(len, pieces), np.int64, len(pieces))
        lengths.append(part_lengths)
    return np.concatenate(lengths) if lengths else np.zeros(0, np.int64)


def join_payloads(
    parts: Sequence[list[bytes]], blocks: ReusableBlocks | None = None, part_bytes: Sequence[int] | None = None
) -> Any:
    """One ``pa.binary()`` column of the payloads of ``parts`` (the chunks' lists of bytes), in
    order: their bytes joined in one exact-size copy (``b"".join`` or :meth:`ReusableBlocks.join`,
    which copy in C) and the offsets summed in numpy. A batch's payloads are never held twice over
    (a column per chunk, then a concatenation, would be), and ``pa.array``'s builder, which grows
    its buffer by doubling, copies more. ``part_bytes``: each part's size in bytes (the chunks'
    ``data_bytes``; the copy is exact-size when they are), summed from the payloads when not given.

    Without ``blocks`` the copy is a fresh block from the C library, freed with the column. pyarrow's
    mimalloc pool was tried instead (7abd072): it keeps a freed block for a second and reuses it
    only for a batch that fits, so the resident memory could outgrow the README's bound of two
    batches, and with batches seconds apart its pages come back page by page as well."""
    if part_bytes is not None and len(part_bytes) != len(parts):
        raise ValueError(f"{len(part_bytes)} sizes for {len(parts)} parts of payloads")
    claimed = np.fromiter(
        (sum(map(len, part)) for part in parts) if part_bytes is None else part_bytes, np.int64, len(parts)
    )
    if claimed.sum() > _MAX_INT32:  # a batch is at most batch.max_bytes (1 GiB) and one event
        raise ValueError(f"{claimed.sum()} bytes of payloads exceed a binary column's 2 GiB")
    rows = sum(map(len, parts))
    joined = blocks.join(parts, claimed) if blocks is not None and claimed.any() else None
    if joined is None:
        pieces = list(chain.from_iterable(parts))
        joined = b"".join(pieces), np.fromiter(map(len, pieces), np.int64, rows)
    data, sizes = joined
    total = int(sizes.sum())
    if total > _MAX_INT32:
        raise ValueError(f"{total} bytes of payloads exceed a binary column's 2 GiB")
    if len(data) != total:  # a buffer whose len() is not its bytes (a memoryview of ints)
        raise TypeError("payloads are bytes (or byte buffers): a value's len() is not its size in bytes")
    offsets = np.zeros(rows + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


__all__ = ["BYTES_PER_WRITE", "ReusableBlocks", "join_payloads", "write_groups"]
