"""This worker's copy of the lease table, read as little as it can be.

Every read takes the version row (each lease partition's version and the membership counter: one
small, strongly consistent GetItem, so that a change is seen at the next cycle); a lease partition
is read again only when its leases may have changed:

- this worker changed a lease there, or a write found one not as read (both from
  :meth:`efo.leases.table.LeaseTable.take_changed`), or it was found out of date
  (:meth:`LeaseCache.stale`): strongly consistent, since this worker acts on it at once;
- its version moved (another worker changed a lease there): eventually consistent, at half the
  price, since every worker reads it and a strongly consistent read of a whole partition by every
  worker at once is what the busiest partition key could not serve. A lease partition holds a copy
  of its version (its mark, set by every change after the change and the version's move), so an
  answer from before the change is noticed: its mark is below the version just read. Such an
  answer is not used; the partition is read again at the next cycle, eventually consistent once
  more (a replica behind by a moment has caught up), then strongly (a mark left behind: a writer
  of a release before marks, a failed mark write, a writer that died after the version).

Besides, every partition is read again about every ``full_read_interval_s`` (at a random moment of
its second half, so that workers that started together do not read together), eventually
consistent: a safety net for a change whose version never moved (its writer died in between: a
claim fenced on what this cache shows then fails and reads the partition again, and the lister
writes again a lease it finds missing). Checkpoints move no version, so a lease's checkpoint here
may be old: a claim starts from the row it writes, never from this.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

from efo.clock import SYSTEM_CLOCK, Clock
from efo.leases.model import Lease, TableState
from efo.leases.table import LeaseTable
from efo.observability import METRICS

#: A lease partition read this lately (strongly, or eventually with its mark up to date) is left out of an
#: eventually consistent read of every partition: that answer could be older than what this cache holds.
STRONG_IS_FRESH_S = 10.0
#: A moved version's partition is read eventually consistent this many times while its mark shows the
#: answer older than the version, then strongly.
EVENTUAL_TRIES = 2
#: Every partition is read again at a random moment from this share of ``full_read_interval_s`` to all of it.
JITTER_FROM = 0.5


class LeaseCache:
    def __init__(
        self,
        table: LeaseTable,
        full_read_interval_s: float,
        clock: Clock = SYSTEM_CLOCK,
        *,
        stream: str = "",
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._table = table
        self._rng = rng
        self._stream = stream  # the stream's name, for the reads' metric
        self._full_read_interval_s = full_read_interval_s
        self._clock = clock
        self._leases: dict[int, Mapping[str, Lease]] = {}  # lease partition -> its rows, as last read
        self._leases_by_shard: dict[str, Lease] = {}  # every partition's rows in one
        self._gaps = False  # a row was deleted from _leases_by_shard since it was last copied whole
        self._read_all_due = 0.0  # the next read of every partition
        self._versions: dict[int, int] = {}  # lease partition -> its version as of its last read
        self._stale: set[int] = set()  # lease partitions found out of date: read them next time
        self._fresh_at: dict[int, float] = {}  # lease partition -> its last read known to be up to date
        self._behind: dict[int, int] = {}  # lease partition -> eventually consistent answers older than its version
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
        strong = self._table.take_changed() | self._stale  # first: a change from here on is read next time
        self._stale = set()
        moved = {p for p, version in control.versions.items() if version > self._versions.get(p, 0)} - strong
        strong |= {p for p in moved if self._behind.get(p, 0) >= EVENTUAL_TRIES}
        moved -= strong
        first = not self._leases
        everything = first or now >= self._read_all_due
        rest: set[int] = set()
        if everything:  # but not what was read so lately that a stale answer could be older
            recent = {p for p, at in self._fresh_at.items() if now - at < STRONG_IS_FRESH_S}
            try:
                partitions = await self._table.layout()
            except BaseException:
                self._stale |= strong  # still to be read
                raise
            rest = set(range(partitions)) - strong - moved - recent
        if first:  # every partition, each answer checked against the version like a moved one's
            moved, rest = moved | rest, set()
        behind: set[int] = set()
        if strong or moved or rest:
            try:
                parts = (await self._table.read_leases(strong)).parts if strong else {}
                if moved or rest:
                    answer = await self._table.read_leases(moved | rest, consistent=False)
                    # A moved partition whose mark is below the version just read answered from before
                    # the change: not used (its rows stay as last read), read again next time; at the
                    # first read, at once and strongly (there is nothing read before to keep).
                    behind = {p for p in moved if answer.versions.get(p, 0) < control.versions.get(p, 0)}
                    parts.update((p, part) for p, part in answer.parts.items() if p not in behind)
                    if first and behind:
                        parts.update((await self._table.read_leases(behind)).parts)
                        strong, moved, behind = strong | behind, moved - behind, set()
            except BaseException:
                self._stale |= strong  # still to be read: a failed or cut-short read forgets nothing
                raise
            for partition in behind:
                self._behind[partition] = self._behind.get(partition, 0) + 1
            for partition in strong | (moved - behind):
                self._fresh_at[partition] = now
                self._behind.pop(partition, None)
            for partition, part in parts.items():
                self._keep(partition, part)
            METRICS.lease_reads.labels(stream=self._stream, rows="leases").inc(len(strong | moved | rest))
        if everything:
            self._read_all_due = now + self._full_read_interval_s * (JITTER_FROM + (1 - JITTER_FROM) * self._rng())
        for partition, version in control.versions.items():  # an older answer never moves one back
            if partition not in behind:  # its move is still to be read
                self._versions[partition] = max(self._versions.get(partition, 0), version)
        parts = dict(self._leases)
        if sum(map(len, parts.values())) != len(self._leases_by_shard):
            # A shard in two partitions (its finished lease deleted and written again in a newer
            # generation, an older answer of the first kept), or it was till now: every partition
            # merged in order, the later one's copy kept; what changed is found lease by lease.
            self._leases_by_shard, self._gaps, parts = {}, False, {}
            for partition in sorted(self._leases):  # not in the order first read: a newer generation's last
                self._leases_by_shard.update(self._leases[partition])
        if self._gaps:  # a copy of a dict with deleted entries is made row by row; of one without, at once
            self._leases_by_shard, self._gaps = dict(self._leases_by_shard), False
        return TableState(
            leases=dict(self._leases_by_shard),
            versions=control.versions,
            members=control.members,
            leaving=control.leaving,
            member_changes=control.member_changes,
            parts=parts,
        )

    def _keep(self, partition: int, part: Mapping[str, Lease]) -> None:
        """``partition``'s rows as just read, in place of those read before (the merged map is right
        while no shard is in two partitions: :meth:`read` checks that)."""
        before = self._leases.get(partition, {})
        self._leases[partition] = part
        for shard_id in before.keys() - part.keys():
            if self._leases_by_shard.get(shard_id) is before[shard_id]:  # not since read in another partition
                del self._leases_by_shard[shard_id]
                self._gaps = True
        self._leases_by_shard.update(part)
