"""This worker's copy of the lease table, read as little as it can be.

Every read takes the version row (each lease partition's version and the membership counter: one
small, strongly consistent GetItem, so that a change is seen at the next cycle); a lease partition
is read again only when its leases may have changed: its
version moved, this worker changed a lease there (or a write found one not as read: both from
:meth:`efo.leases.table.LeaseTable.take_changed`), it was found out of date (:meth:`LeaseCache.stale`),
or the last read of every partition is ``full_read_interval_s`` old (a safety net for a change
whose version write was lost). Checkpoints move no version, so a lease's checkpoint here may be
old: a claim starts from the row it writes, never from this.
"""

from __future__ import annotations

from efo.clock import SYSTEM_CLOCK, Clock
from efo.errors import EfoError
from efo.leases.table import Lease, LeaseTable, TableState
from efo.observability import METRICS


class LeaseCache:
    def __init__(
        self,
        table: LeaseTable,
        full_read_interval_s: float,
        clock: Clock = SYSTEM_CLOCK,
        *,
        stream: str = "",
    ) -> None:
        self._table = table
        self._stream = stream  # the stream's name, for the reads' metric
        self._full_read_interval_s = full_read_interval_s
        self._clock = clock
        self._leases: dict[int, dict[str, Lease]] = {}  # lease partition -> its rows, as last read
        self._read_all_at = 0.0  # the last read of every partition
        self._versions: dict[int, int] = {}  # lease partition -> its version as of its last read
        self._stale: set[int] = set()  # lease partitions found out of date: read them next time
        self.answered_at = 0.0  # when the last read's version row was answered

    def stale(self, shard_id: str) -> None:
        """``shard_id``'s row was found not as cached: read its partition at the next read."""
        self._stale.add(self._table.partition_of(shard_id))

    async def read(self) -> TableState:
        """The versions and the membership counter now, and every lease as fresh as it needs to be (no
        heartbeat row: efo.worker.membership reads those). A copy: the caller may change it."""
        control = await self._table.read_version(consistent=True)
        METRICS.lease_reads.labels(stream=self._stream, rows="control").inc()
        now = self.answered_at = self._clock.now()
        stale = self._table.take_changed() | self._stale  # first: a change from here on is read next time
        self._stale = set()
        everything = not self._leases or now - self._read_all_at >= self._full_read_interval_s
        if everything:
            stale = set(range(await self._table.layout()))
        stale |= {p for p, version in control.versions.items() if version > self._versions.get(p, 0)}
        if stale:
            try:
                fresh = (await self._table.read_leases(stale)).leases
            except EfoError:
                self._stale |= stale  # still to be read: a failed read forgets nothing
                raise
            for partition in stale:
                self._leases[partition] = {}
            for shard_id, lease in fresh.items():
                self._leases[self._table.partition_of(shard_id)][shard_id] = lease
            METRICS.lease_reads.labels(stream=self._stream, rows="leases").inc(len(stale))
        if everything:
            self._read_all_at = now
        for partition, version in control.versions.items():  # an older answer never moves one back
            self._versions[partition] = max(self._versions.get(partition, 0), version)
        leases = {shard_id: lease for part in self._leases.values() for shard_id, lease in part.items()}
        return TableState(leases=leases, versions=control.versions, members=control.members)
