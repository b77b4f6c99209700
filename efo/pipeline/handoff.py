"""The bounded thread-safe queue between the asyncio service thread and the Spark driver thread.

Every chunk put here already holds pool budget, so the queue can never hold more than the pool
allows: ``pool.max_pending_records`` / ``pool.max_pending_bytes`` bound both together.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from efo.pipeline.records import RecordChunk


class HandoffClosed(Exception):
    pass


class Handoff:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._chunks: deque[RecordChunk] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._clock = clock

    def __len__(self) -> int:
        """Chunks waiting for the driver."""
        return len(self._chunks)

    def put(self, chunk: RecordChunk) -> None:
        with self._cond:
            if self._closed:
                raise HandoffClosed()
            self._chunks.append(chunk)
            self._cond.notify()

    def close(self) -> list[RecordChunk]:
        """Stop intake; wake the driver; return what was never taken (its budget must be returned)."""
        with self._cond:
            self._closed = True
            left = list(self._chunks)
            self._chunks.clear()
            self._cond.notify_all()
            return left

    def take_batch(
        self, max_records: int, max_bytes: int, max_wait_s: float, idle_wait_s: float = 0.5
    ) -> list[RecordChunk]:
        """Chunks for one batch: wait up to ``idle_wait_s`` for the first, then close the batch at
        ``max_records``, ``max_bytes`` or ``max_wait_s`` after the first, whichever comes first.
        A chunk that alone exceeds a bound forms a batch of its own. Returns [] when idle or closed.
        """
        batch: list[RecordChunk] = []
        records = 0
        nbytes = 0
        with self._cond:
            if not self._cond.wait_for(lambda: self._chunks or self._closed, idle_wait_s):
                return batch
            deadline = self._clock() + max_wait_s
            while not self._closed:
                while self._chunks:
                    chunk = self._chunks[0]
                    if batch and (records + len(chunk) > max_records or nbytes + chunk.data_bytes > max_bytes):
                        return batch
                    self._chunks.popleft()
                    batch.append(chunk)
                    records += len(chunk)
                    nbytes += chunk.data_bytes
                if records >= max_records or nbytes >= max_bytes:
                    return batch
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return batch
                self._cond.wait(remaining)
        return batch
