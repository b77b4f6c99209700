"""The bounded thread-safe queue between the asyncio service thread and the Spark driver thread.

Every chunk put here already holds pool budget, so the queue can never hold more than the pool
allows: ``pool.max_pending_records`` / ``pool.max_pending_bytes`` bound both together.

The driver is woken when its batch can move, not for every chunk: for the first chunk of a batch,
then when what is queued reaches the batch's bounds (or at ``max_wait_s``, a cut or the close).
Chunks of the batch being filled wait here until then, so a batch closed by its bounds, its
deadline or a cut holds the chunks it would hold if each had been taken as it came. A close while
a batch is being filled leaves that batch with its first chunks only: the rest are among the
chunks ``close()`` hands back, never taken, their budget returned.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from efo.pipeline.records import RecordChunk

#: What a taker waiting for the first chunk of a batch is woken at: any chunk.
_ANY_CHUNK = (0, 0)


class HandoffClosed(Exception):
    pass


class Handoff:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._chunks: deque[RecordChunk] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._cut = False  # batches close at once with what is queued ...
        self._cut_chunks = 0  # ... until the chunks queued at the cut have been taken
        self._queued_records = 0
        self._queued_bytes = 0
        #: (records, bytes) queued at which a put wakes the driver (either one); None: it is not waiting.
        self._wake_at: tuple[int, int] | None = None
        self._clock = clock

    def __len__(self) -> int:
        """Chunks waiting for the driver, those of the batch being filled included."""
        return len(self._chunks)

    @property
    def closed(self) -> bool:
        """Intake stopped (:meth:`close`): every take returns at once, empty."""
        return self._closed

    @property
    def filling(self) -> bool:
        """Whether the driver has a batch open: it took the batch's first chunk and waits for its
        bounds, ``max_wait_s`` or a cut."""
        wake_at = self._wake_at
        return wake_at is not None and wake_at != _ANY_CHUNK

    def put(self, chunk: RecordChunk) -> None:
        with self._cond:
            if self._closed:
                raise HandoffClosed()
            self._chunks.append(chunk)
            self._queued_records += len(chunk)
            self._queued_bytes += chunk.data_bytes
            wake_at = self._wake_at
            if wake_at is not None and (self._queued_records >= wake_at[0] or self._queued_bytes >= wake_at[1]):
                self._cond.notify()

    def cut(self) -> None:
        """Close the batch being taken now (or, if none is, the next one) with what is queued,
        without waiting for ``max_wait_s``, and so every batch until what is queued now has been
        taken: a stop or a handover is waiting for those records."""
        with self._cond:
            self._cut = True
            self._cut_chunks = len(self._chunks)
            self._cond.notify_all()

    def close(self) -> list[RecordChunk]:
        """Stop intake; wake the driver; return what was never taken (its budget must be returned)."""
        with self._cond:
            self._closed = True
            left = list(self._chunks)
            self._chunks.clear()
            self._queued_records = self._queued_bytes = 0
            self._cond.notify_all()
            return left

    def take_batch(
        self, max_records: int, max_bytes: int, max_wait_s: float, idle_wait_s: float = 0.5
    ) -> list[RecordChunk]:
        """Chunks for one batch: wait up to ``idle_wait_s`` for the first, then close the batch at
        ``max_records``, ``max_bytes`` or ``max_wait_s`` after the first, whichever comes first.
        A chunk that alone exceeds a bound forms a batch of its own; after a :meth:`cut` it closes
        at once with what is queued (within its bounds). Returns [] when idle or closed.
        """
        with self._cond:
            try:
                return self._take(max_records, max_bytes, max_wait_s, idle_wait_s)
            finally:
                self._cut = self._cut_chunks > 0

    def _take(self, max_records: int, max_bytes: int, max_wait_s: float, idle_wait_s: float) -> list[RecordChunk]:
        batch: list[RecordChunk] = []
        records = 0
        nbytes = 0
        with self._waking_at(*_ANY_CHUNK):
            if not self._cond.wait_for(lambda: self._chunks or self._closed or self._cut, idle_wait_s):
                return batch
        deadline = self._clock() + max_wait_s
        while not self._closed:
            while self._chunks:
                chunk = self._chunks[0]
                if batch and (records + len(chunk) > max_records or nbytes + chunk.data_bytes > max_bytes):
                    return batch
                self._chunks.popleft()
                self._queued_records -= len(chunk)
                self._queued_bytes -= chunk.data_bytes
                self._cut_chunks = max(0, self._cut_chunks - 1)
                batch.append(chunk)
                records += len(chunk)
                nbytes += chunk.data_bytes
            if records >= max_records or nbytes >= max_bytes or self._cut:
                return batch
            remaining = deadline - self._clock()
            if remaining <= 0:
                return batch
            with self._waking_at(max_records - records, max_bytes - nbytes):  # what would reach a bound
                self._cond.wait(remaining)
        return batch

    @contextlib.contextmanager
    def _waking_at(self, records: int, nbytes: int) -> Iterator[None]:
        """While the taker waits inside: a put wakes it once ``records`` or ``nbytes`` are queued."""
        self._wake_at = (records, nbytes)
        try:
            yield
        finally:
            self._wake_at = None
