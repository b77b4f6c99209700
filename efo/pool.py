"""The global pending-records pool: one budget of records and bytes for the whole process.

A subscription acquires budget for an event's records *before* it reads the next event, and the
budget is released only when the sink has committed the records (or they are discarded on lease
loss or shutdown). Waiters are served first come, first served; an event larger than the whole
budget waits at the head and is admitted alone once the pool is empty, so the pool never
deadlocks and never rejects a valid record. It knows nothing of AWS or shards. Loop-thread only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass


@dataclass(slots=True)
class Grant:
    records: int
    bytes: int
    released: bool = False


class PendingPool:
    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.records = 0
        self.bytes = 0
        self._waiters: deque[tuple[Grant, asyncio.Future[None]]] = deque()

    def _fits(self, grant: Grant) -> bool:
        if self.records == 0 and self.bytes == 0:
            return True  # an oversize event is admitted alone into an empty pool
        return self.records + grant.records <= self.max_records and self.bytes + grant.bytes <= self.max_bytes

    async def acquire(self, records: int, nbytes: int) -> Grant:
        grant = Grant(records, nbytes)
        if not self._waiters and self._fits(grant):
            self._take(grant)
            return grant
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (grant, future)
        self._waiters.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(grant)  # admitted just as we were cancelled: give it back
            else:
                self._waiters.remove(entry)
                self._admit()
            raise
        return grant

    def release(self, grant: Grant) -> None:
        if grant.released:
            return
        grant.released = True
        self.records -= grant.records
        self.bytes -= grant.bytes
        self._admit()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _take(self, grant: Grant) -> None:
        self.records += grant.records
        self.bytes += grant.bytes

    def _admit(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            grant, future = self._waiters.popleft()
            self._take(grant)
            future.set_result(None)
