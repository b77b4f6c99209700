"""The global pending-records pool: one budget of records and bytes for the whole process.

A subscription acquires budget for an event's records *before* it reads the next event, and the
budget is released only when the sink has committed the records (or they are discarded on lease
loss or shutdown). It knows nothing of AWS: owners are opaque names (the shard ids).

Fairness: every registered owner has a small reserved share; the rest is shared and handed out
first come, first served. A request that fits in its owner's unused reserve is admitted at once,
even past waiters, so a hot shard holding the shared budget cannot starve a quiet one. A request
larger than the whole pool waits at the head and is admitted alone once the pool is empty: the
pool never deadlocks and never rejects a valid record. ``pause()`` stops all admission (the
coordinator pauses while checkpoints cannot be written). Loop-thread only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass


@dataclass(slots=True)
class Grant:
    records: int
    bytes: int
    owner: str | None = None
    admitted: bool = False
    released: bool = False


@dataclass(slots=True)
class _Usage:
    records: int = 0
    bytes: int = 0


class PendingPool:
    def __init__(self, max_records: int, max_bytes: int, *, reserved_records: int = 0, reserved_bytes: int = 0) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._reserve_records = reserved_records
        self._reserve_bytes = reserved_bytes
        self.records = 0
        self.bytes = 0
        self._usage: dict[str, _Usage] = {}
        self._waiters: deque[tuple[Grant, asyncio.Future[None]]] = deque()
        self._room_waiters: list[asyncio.Future[None]] = []
        self._paused = False

    # ---- owners and their reserves --------------------------------------------------------

    def register(self, owner: str) -> None:
        self._usage.setdefault(owner, _Usage())
        self._admit()

    def unregister(self, owner: str) -> None:
        """Forget an owner's reserve; its outstanding grants still count until released."""
        usage = self._usage.get(owner)
        if usage is not None and usage.records == 0 and usage.bytes == 0:
            del self._usage[owner]
        self._admit()

    def reserve(self) -> tuple[int, int]:
        """Each owner's reserve: the configured share, shrunk so all reserves take at most half the pool."""
        owners = max(1, len(self._usage))
        return (
            min(self._reserve_records, self.max_records // (2 * owners)),
            min(self._reserve_bytes, self.max_bytes // (2 * owners)),
        )

    # ---- admission ------------------------------------------------------------------------

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._admit()

    @property
    def paused(self) -> bool:
        return self._paused

    def _within_reserve(self, grant: Grant) -> bool:
        if grant.owner is None or grant.owner not in self._usage:
            return False
        reserve_records, reserve_bytes = self.reserve()
        usage = self._usage[grant.owner]
        return (
            usage.records + grant.records <= reserve_records
            and usage.bytes + grant.bytes <= reserve_bytes
            and self.records + grant.records <= self.max_records
            and self.bytes + grant.bytes <= self.max_bytes
        )

    def _fits_shared(self, grant: Grant) -> bool:
        if self.records == 0 and self.bytes == 0:
            return True  # an oversize event is admitted alone into an empty pool
        reserve_records, reserve_bytes = self.reserve()
        # Unused reserves of the other owners stay set aside.
        held_records = held_bytes = 0
        for owner, usage in self._usage.items():
            if owner != grant.owner:
                held_records += max(0, reserve_records - usage.records)
                held_bytes += max(0, reserve_bytes - usage.bytes)
        return (
            self.records + grant.records + held_records <= self.max_records
            and self.bytes + grant.bytes + held_bytes <= self.max_bytes
        )

    def can_admit(self, records: int, nbytes: int, owner: str | None = None) -> bool:
        grant = Grant(records, nbytes, owner)
        return not self._paused and (self._within_reserve(grant) or (not self._waiters and self._fits_shared(grant)))

    async def acquire(self, records: int, nbytes: int, owner: str | None = None) -> Grant:
        grant = Grant(records, nbytes, owner)
        if self.can_admit(records, nbytes, owner):
            self._take(grant)
            return grant
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (grant, future)
        self._waiters.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if grant.admitted:
                self.release(grant)  # admitted just as we were cancelled: give it back
            else:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                self._admit()
            raise
        return grant

    async def wait_for_room(self, records: int, nbytes: int, owner: str | None = None) -> None:
        """Wait until a request of this size would be admitted, without taking anything."""
        while not self.can_admit(records, nbytes, owner) and not (self.records == 0 and not self._paused):
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._room_waiters.append(future)
            try:
                await future
            finally:
                if future in self._room_waiters:
                    self._room_waiters.remove(future)

    def release(self, grant: Grant) -> None:
        if grant.released:
            return
        grant.released = True
        self.records -= grant.records
        self.bytes -= grant.bytes
        usage = self._usage.get(grant.owner) if grant.owner is not None else None
        if usage is not None:
            usage.records -= grant.records
            usage.bytes -= grant.bytes
        self._admit()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _take(self, grant: Grant) -> None:
        grant.admitted = True
        self.records += grant.records
        self.bytes += grant.bytes
        if grant.owner is not None:
            usage = self._usage.setdefault(grant.owner, _Usage())
            usage.records += grant.records
            usage.bytes += grant.bytes

    def _admit(self) -> None:
        if self._paused:
            return
        # Reserve admissions may pass the queue; the shared budget goes strictly in order.
        for entry in list(self._waiters):
            if self._within_reserve(entry[0]):
                self._waiters.remove(entry)
                self._grant(entry)
        while self._waiters and self._fits_shared(self._waiters[0][0]):
            self._grant(self._waiters.popleft())
        for future in self._room_waiters:
            if not future.done():
                future.set_result(None)
        self._room_waiters.clear()

    def _grant(self, entry: tuple[Grant, asyncio.Future[None]]) -> None:
        grant, future = entry
        if future.done():  # cancelled while queued; its task removes nothing it was not given
            return
        self._take(grant)
        future.set_result(None)
