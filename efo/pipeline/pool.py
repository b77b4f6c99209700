"""The global pending-records pool: one budget of records and bytes for the whole process.

A subscription acquires budget for an event's records *before* it reads the next event, and the
budget is released only when the sink has committed the records (or they are discarded on lease
loss or shutdown). It knows nothing of AWS: owners are opaque names (the shard ids).

Fairness: every registered owner has a small reserved share; the rest is shared and handed out
first come, first served. A request that fits in its owner's unused reserve is admitted at once,
even past waiters, so a hot shard holding the shared budget cannot starve a quiet one.

Bounded waits: a request larger than the pool minus the other owners' reserves can only ever be
admitted into an empty pool. While such a request is at the head of the queue nobody passes it,
not even from a reserve, so the pool drains as the sink commits and it is admitted alone: the pool
never deadlocks, never rejects a valid record, and no request waits behind others for ever.
``pause()`` stops all admission (the coordinator pauses while checkpoints cannot be written).
Loop-thread only.

Admission costs the same whatever the number of owners: the registered count, the reserve and
the sum of the registered owners' unused reserves are kept up to date as budget moves (a walk
over every owner per event cost 5-10 % of a core at 256 shards; bench/ingest.py, py-spy).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from efo.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from efo.config import PoolSettings


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
    registered: bool = True


class PendingPool:
    def __init__(
        self,
        max_records: int,
        max_bytes: int,
        *,
        reserved_records: int = 0,
        reserved_bytes: int = 0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._clock = clock
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._reserve_records = reserved_records
        self._reserve_bytes = reserved_bytes
        self.records = 0
        self.bytes = 0
        self._usage: dict[str, _Usage] = {}
        self._waiters: deque[tuple[Grant, asyncio.Future[None]]] = deque()
        self._paused = False
        self._registered_count = 0
        self._reserve = self._reserve_for(0)
        self._unused = (0, 0)  # the registered owners' unused reserves, summed (records, bytes)

    @classmethod
    def of(cls, settings: PoolSettings, *, clock: Clock = SYSTEM_CLOCK) -> PendingPool:
        """The pool ``pool.*`` describes."""
        return cls(
            settings.max_pending_records,
            settings.max_pending_bytes,
            reserved_records=settings.reserved_records_per_shard,
            reserved_bytes=settings.reserved_bytes_per_shard,
            clock=clock,
        )

    # ---- owners and their reserves --------------------------------------------------------

    def register(self, owner: str) -> None:
        usage = self._usage.get(owner)
        if usage is None or not usage.registered:
            if usage is None:
                self._usage[owner] = _Usage()
            else:
                usage.registered = True
            self._registered_count += 1
            self._reserves_changed()
        self._admit()

    def unregister(self, owner: str) -> None:
        """Forget an owner's reserve once its outstanding grants are released (at once if none)."""
        usage = self._usage.get(owner)
        if usage is not None:
            if usage.registered:
                usage.registered = False
                self._registered_count -= 1
                self._reserves_changed()
            self._forget_if_idle(owner, usage)
        self._admit()

    def _forget_if_idle(self, owner: str, usage: _Usage) -> None:
        if not usage.registered and usage.records == 0 and usage.bytes == 0:
            del self._usage[owner]

    def _reserve_for(self, owners: int) -> tuple[int, int]:
        owners = max(1, owners)
        return (
            min(self._reserve_records, self.max_records // (2 * owners)),
            min(self._reserve_bytes, self.max_bytes // (2 * owners)),
        )

    def _reserves_changed(self) -> None:
        """The number of owners changed, and with it every reserve: sum the unused ones again."""
        self._reserve = self._reserve_for(self._registered_count)
        records = nbytes = 0
        for usage in self._usage.values():
            if usage.registered:
                unused_records, unused_bytes = self._unused_of(usage)
                records += unused_records
                nbytes += unused_bytes
        self._unused = (records, nbytes)

    def _unused_of(self, usage: _Usage) -> tuple[int, int]:
        return max(0, self._reserve[0] - usage.records), max(0, self._reserve[1] - usage.bytes)

    def _use(self, usage: _Usage, records: int, nbytes: int) -> None:
        """Add to (or, negative, take from) an owner's usage, keeping the unused reserves' sum."""
        if not usage.registered:
            usage.records += records
            usage.bytes += nbytes
            return
        before = self._unused_of(usage)
        usage.records += records
        usage.bytes += nbytes
        after = self._unused_of(usage)
        self._unused = (self._unused[0] + after[0] - before[0], self._unused[1] + after[1] - before[1])

    def reserve(self) -> tuple[int, int]:
        """Each owner's reserve: the configured share, shrunk so all reserves take at most half the pool."""
        return self._reserve

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
        usage = self._usage.get(grant.owner) if grant.owner is not None else None
        if usage is None or not usage.registered:
            return False
        reserve_records, reserve_bytes = self._reserve
        return (
            usage.records + grant.records <= reserve_records
            and usage.bytes + grant.bytes <= reserve_bytes
            and self.records + grant.records <= self.max_records
            and self.bytes + grant.bytes <= self.max_bytes
        )

    def _fits_shared(self, grant: Grant) -> bool:
        if self.records == 0 and self.bytes == 0:
            return True  # an oversize event is admitted alone into an empty pool
        # Unused reserves of the other owners stay set aside.
        held_records, held_bytes = self._unused
        usage = self._usage.get(grant.owner) if grant.owner is not None else None
        if usage is not None and usage.registered:
            own_records, own_bytes = self._unused_of(usage)
            held_records -= own_records
            held_bytes -= own_bytes
        return (
            self.records + grant.records + held_records <= self.max_records
            and self.bytes + grant.bytes + held_bytes <= self.max_bytes
        )

    def _needs_empty_pool(self, grant: Grant) -> bool:
        """Larger than the pool minus the other owners' reserves: fits only into an empty pool."""
        reserve_records, reserve_bytes = self._reserve
        usage = self._usage.get(grant.owner) if grant.owner is not None else None
        others = self._registered_count - (1 if usage is not None and usage.registered else 0)
        return (
            grant.records + others * reserve_records > self.max_records
            or grant.bytes + others * reserve_bytes > self.max_bytes
        )

    def _reserves_may_pass(self) -> bool:
        return not (self._waiters and self._needs_empty_pool(self._waiters[0][0]))

    def can_admit(self, records: int, nbytes: int, owner: str | None = None) -> bool:
        grant = Grant(records, nbytes, owner)
        if self._paused:
            return False
        if self._within_reserve(grant) and self._reserves_may_pass():
            return True
        return not self._waiters and self._fits_shared(grant)

    def try_acquire(self, records: int, nbytes: int, owner: str | None = None) -> Grant | None:
        """Budget at once, or None when the request would have to wait."""
        if not self.can_admit(records, nbytes, owner):
            return None
        grant = Grant(records, nbytes, owner)
        self._take(grant)
        return grant

    async def acquire(
        self, records: int, nbytes: int, owner: str | None = None, *, timeout_s: float | None = None
    ) -> Grant:
        """Budget for ``records`` and ``nbytes``; TimeoutError (holding nothing) after ``timeout_s``.

        The deadline is the clock's timeout inside this coroutine, not a wrapper task: a cancel that
        arrives in the same loop pass as the admission still cancels (the budget is returned)."""
        grant = self.try_acquire(records, nbytes, owner)
        if grant is not None:
            return grant
        grant = Grant(records, nbytes, owner)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (grant, future)
        self._waiters.append(entry)
        try:
            async with self._clock.timeout(timeout_s):
                await future
        except BaseException:  # cancelled, or the deadline passed
            if grant.admitted:
                self.release(grant)  # admitted just as we gave up: give it back
            else:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                self._admit()
            raise
        return grant

    def shrink(self, grant: Grant, records: int, nbytes: int) -> None:
        """Give back the part of an admitted grant above ``records`` and ``nbytes``."""
        assert grant.admitted and not grant.released and records <= grant.records and nbytes <= grant.bytes
        surplus_records, surplus_bytes = grant.records - records, grant.bytes - nbytes
        grant.records, grant.bytes = records, nbytes
        self._give_back(grant.owner, surplus_records, surplus_bytes)

    def release(self, grant: Grant) -> None:
        if grant.released or not grant.admitted:
            return
        grant.released = True
        self._give_back(grant.owner, grant.records, grant.bytes)

    def _give_back(self, owner: str | None, records: int, nbytes: int) -> None:
        self.records -= records
        self.bytes -= nbytes
        usage = self._usage.get(owner) if owner is not None else None
        if usage is not None and owner is not None:
            self._use(usage, -records, -nbytes)
            self._forget_if_idle(owner, usage)
        self._admit()

    def _take(self, grant: Grant) -> None:
        grant.admitted = True
        self.records += grant.records
        self.bytes += grant.bytes
        if grant.owner is not None:
            self._use(self._usage.setdefault(grant.owner, _Usage(registered=False)), grant.records, grant.bytes)

    def _admit(self) -> None:
        if self._paused:
            return
        # Reserve admissions may pass the queue (unless its head can only enter an empty pool);
        # the shared budget goes strictly in order.
        for entry in list(self._waiters):
            if not self._reserves_may_pass():
                break
            if self._within_reserve(entry[0]):
                self._waiters.remove(entry)
                self._grant(entry)
        while self._waiters and self._fits_shared(self._waiters[0][0]):
            self._grant(self._waiters.popleft())

    def _grant(self, entry: tuple[Grant, asyncio.Future[None]]) -> None:
        grant, future = entry
        if future.done():  # cancelled while queued; its task removes nothing it was not given
            return
        self._take(grant)
        future.set_result(None)
