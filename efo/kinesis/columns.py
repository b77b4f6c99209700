"""Record payloads as one Arrow binary column per event, base64-decoded in bulk rather than per record.

A SubscribeToShardEvent carries each record's data as its own base64 string, padded to a multiple of
four characters. Decoding them one by one costs a call and a ``bytes`` object per record. Here the
strings of an event are joined and decoded in one call into one buffer, and that buffer becomes the
event's ``data`` column (a ``pyarrow.BinaryArray``) as it is. The decoder takes this path for small
records in the events that orjson parses (efo.kinesis.decoder.decode_payloads: those whose first
record is over 1,350 B, or that msgspec refuses; msgspec decodes the others' payloads into bytes
faster than this). Larger ones are decoded one by one into bytes, and the bridge copies both kinds
into its batch's column at once (:func:`join_payloads`).

Joined strings cannot simply be decoded as one: a record's padding (``=``) would end the decoding
in the middle. So each ``=`` is first replaced by ``A`` (zero bits): every record then decodes to
exactly ``3 * len / 4`` bytes, of which the last one or two (one per ``=``) are not data. Those are
dropped by an Arrow ``take`` over offsets that alternate between a record's data and its padding
bytes (one C pass), giving a compact column.

It is exact, not approximate: :func:`decode_base64` returns the column of
``[pybase64.b64decode(value, validate=True) for value in values]`` whenever every value would pass
that call, and None otherwise (a character outside the alphabet, a length that is not a multiple of
four, a ``=`` anywhere but in the last two places of a record, a value that is not ASCII): the caller
then decodes the event record by record as before, with the same lenient fallback. The trailing bits
of a padded quad are ignored, as pybase64 and the standard library ignore them.
"""

from __future__ import annotations

import binascii
import functools
import io
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pybase64

#: The memory pool of the per-event columns: the C library's allocator. The columns live from one
#: event to its batch's commit and are freed in the thousands a second; with pyarrow's default pool
#: (mimalloc) the freed memory went back to the system and came back page by page, which measured
#: 1.6x the CPU of the whole service's Python side (bench/service_cpu.py, noop sink, 64 x 1 KiB);
#: glibc keeps it for the next events.
POOL = pa.system_memory_pool()

_PAD = ord("=")
_A = ord("A")
_MAX_INT32 = 2**31 - 1


def decode_base64(values: list[str]) -> Any:
    """The ``pa.binary()`` column of the base64 ``values`` decoded, or None when one is not canonical."""
    n = len(values)
    if n == 0:
        return pa.array([], pa.binary())
    joined = "".join(values)
    if not joined.isascii():
        return None
    raw = bytearray(joined, "ascii")  # one copy, written in place below
    del joined
    lengths = np.fromiter(map(len, values), np.int64, n)
    if (lengths & 3).any() or len(raw) // 4 * 3 > _MAX_INT32:
        return None
    ends = np.cumsum(lengths)
    filled = np.flatnonzero(lengths)  # records of four characters or more: their last two are their own
    last = ends[filled] - 1
    text = np.frombuffer(raw, np.uint8)
    one = text[last] == _PAD
    two = one & (text[last - 1] == _PAD)
    padding = int(one.sum()) + int(two.sum())
    if padding:
        # Each record's padding becomes "A": any "=" left (elsewhere in a record, or a third one) fails validation.
        text[last[one]] = _A
        text[last[two] - 1] = _A
    try:
        decoded = pybase64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return None
    sizes = lengths // 4 * 3
    if not padding:
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(sizes, out=offsets[1:])
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(decoded)])
    pads = np.zeros(n, np.int32)
    pads[filled] = one.astype(np.int32) + two
    # Offsets alternating between each record's data and the bytes its padding decoded to; keep the former.
    offsets = np.empty(2 * n + 1, np.int32)
    offsets[0] = 0
    np.cumsum(sizes, out=offsets[2::2])
    offsets[1::2] = offsets[2::2] - pads
    interleaved = pa.Array.from_buffers(pa.binary(), 2 * n, [None, pa.py_buffer(offsets), pa.py_buffer(decoded)])
    return pc.take(interleaved, _evens(n), memory_pool=POOL)


@functools.lru_cache(maxsize=64)
def _evens(n: int) -> Any:
    """0, 2, ..., 2n - 2 as an Arrow array (events mostly have the same few sizes)."""
    return pa.array(np.arange(0, 2 * n, 2, dtype=np.int32))


def is_column(data: object) -> bool:
    """Whether a payload column is an Arrow array (the decoder's) rather than a list of bytes."""
    return isinstance(data, pa.Array)


def starts_with_any(column: Any, prefix: bytes) -> bool:
    """Whether any value of the binary ``column`` starts with ``prefix`` (no Python object per value):
    the values' first bytes, gathered through the offsets, are compared first; only the values
    whose first byte matches are compared whole."""
    n = len(column)
    if not n or not prefix:
        return bool(n)
    validity, offsets_buffer, data_buffer = column.buffers()
    if data_buffer is None or not data_buffer.size:
        return False
    offsets = np.frombuffer(offsets_buffer, np.int32)[column.offset : column.offset + n + 1]
    starts = offsets[:-1][np.diff(offsets) >= len(prefix)]
    if not len(starts):
        return False
    data = np.frombuffer(data_buffer, np.uint8)
    candidates = starts[data[starts] == prefix[0]]
    if validity is not None or len(candidates) == 0:
        return bool(len(candidates)) and bool(pc.any(pc.starts_with(column, pattern=prefix)).as_py())
    head = np.frombuffer(prefix, np.uint8)
    return bool((data[candidates[:, None] + np.arange(len(prefix))] == head).all(axis=1).any())


def column_bytes(data: Any) -> int:
    """The payload bytes of a column: an Arrow binary array (its values, not its offsets) or a list of bytes."""
    if isinstance(data, pa.Array):
        if not len(data):
            return 0
        offsets = np.frombuffer(data.buffers()[1], np.int32)
        return int(offsets[data.offset + len(data)] - offsets[data.offset])
    return sum(map(len, data))


def as_list(data: Any) -> list[bytes]:
    """A payload column as a list of bytes (an Arrow array is converted; a list is itself)."""
    return data.to_pylist() if isinstance(data, pa.Array) else data  # type: ignore[no-any-return]


#: Pieces copied into a block per call, so that other threads get the GIL in between: 256 KiB of
#: 1 KiB records, up to about 25 MiB of the decoder's per-event columns (2-3 ms).
_PIECES_PER_WRITE = 256


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
    read-only views. A block is allocated at exactly the size of the batch it is made for, and
    made anew for a batch larger than it or at most half of it: it holds no more than one batch
    that was written into it. With two (the batch in the sink and the next, prepared while Spark
    commits), the driver stays within the README's two Arrow copies, and keeps them while idle.
    Thread-safe."""

    def __init__(self, count: int = 2) -> None:
        self._blocks = [io.BytesIO() for _ in range(count)]
        self._capacities = [0] * count  # bytes allocated for each block's data
        self._lock = threading.Lock()

    def join(self, pieces: list[Any], total: int) -> Any:
        """The ``pieces`` (``total`` bytes) one after another: a read-only view of a free block, or fresh bytes."""
        if not total:
            return b""
        with self._lock:
            for index, block in enumerate(self._blocks):
                try:
                    block.write(b"")  # nothing, or BufferError while a column made on it is alive
                except BufferError:
                    continue
                capacity = self._capacities[index]
                if total > capacity or total <= capacity // 2:  # (BytesIO itself would shrink it then)
                    block = self._blocks[index] = io.BytesIO()  # the old block is freed
                    block.seek(total - 1)
                    block.write(b"\0")  # one allocation of exactly total bytes (zero-filled)
                    self._capacities[index] = total
                block.seek(0)
                for start in range(0, len(pieces), _PIECES_PER_WRITE):
                    block.writelines(pieces[start : start + _PIECES_PER_WRITE])
                block.truncate()
                return block.getbuffer().toreadonly()
        return b"".join(pieces)

    def sizes(self) -> list[int]:
        """Each block's allocation in bytes (what it keeps while idle)."""
        return [block.__sizeof__() for block in self._blocks]


def join_payloads(parts: Sequence[Any], blocks: ReusableBlocks | None = None) -> Any:
    """One ``pa.binary()`` column of the payloads of ``parts``, in order: the decoder's Arrow binary
    columns (sliced or not) and lists of bytes alike, their bytes joined in one exact-size copy
    (``b"".join`` or :meth:`ReusableBlocks.join`, which copy in C) and the offsets summed in numpy.
    A batch's payloads are never held twice over (a column per run of lists, then a
    concatenation, would be), and ``pa.array``'s builder, which grows its buffer by doubling,
    copies more. One column alone is returned as it is.

    Without ``blocks`` the copy is a fresh block from the C library, freed with the column. pyarrow's
    mimalloc pool was tried instead (7abd072): it keeps a freed block for a second and reuses it
    only for a batch that fits, so the resident memory could outgrow the README's bound of two
    batches, and with batches seconds apart its pages come back page by page as well."""
    if len(parts) == 1 and isinstance(parts[0], pa.Array) and parts[0].type == pa.binary():
        return parts[0]
    pieces: list[Any] = []
    lengths: list[Any] = []
    for part in parts:
        if isinstance(part, pa.Array):
            if part.type != pa.binary():
                raise TypeError(f"a payload column is pa.binary(), not {part.type}")
            if part.null_count:
                raise ValueError("a payload column has no nulls")
            if not len(part):
                continue
            _, offsets_buffer, data_buffer = part.buffers()
            offsets = np.frombuffer(offsets_buffer, np.int32)[part.offset : part.offset + len(part) + 1]
            pieces.append(memoryview(data_buffer)[int(offsets[0]) : int(offsets[-1])])
            lengths.append(np.diff(offsets))
        else:
            pieces.extend(part)
            lengths.append(np.fromiter(map(len, part), np.int64, len(part)))
    sizes = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    total = int(sizes.sum())
    if total > _MAX_INT32:  # a batch is at most batch.max_bytes (1 GiB) and one event
        raise ValueError(f"{total} bytes of payloads exceed a binary column's 2 GiB")
    joined = blocks.join(pieces, total) if blocks is not None else b"".join(pieces)
    if len(joined) != total:  # a buffer whose len() is not its bytes (a memoryview of ints)
        raise TypeError("payloads are bytes (or byte buffers): a value's len() is not its size in bytes")
    offsets = np.zeros(len(sizes) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(sizes), [None, pa.py_buffer(offsets), pa.py_buffer(joined)])


__all__ = [
    "POOL",
    "ReusableBlocks",
    "as_list",
    "column_bytes",
    "decode_base64",
    "is_column",
    "join_payloads",
    "starts_with_any",
]
