"""What this worker knows of the others, from successive reads of the lease table, on its own clock.

No two clocks need to agree: a worker is dead when its heartbeat counter has not changed for
``failover_s`` as seen from here; a lease moved when its owner or counter changed between two
reads; a free lease another worker asked for is kept for it while that request is younger than
``failover_s`` as seen from here.

Heartbeat rows are read in part (:mod:`efo.worker.membership` reads all of them only when someone
joined, left, died or doubted, and each cycle only the few it watches), so the evidence is per
row: a counter is dead only when two reads of that very row, ``failover_s`` apart, found it the
same. A counter that changed counts from when it changed, as near as the reads tell: from the
previous read of that row when that read was at most a heartbeat interval earlier (it landed after
that read was issued; and a worker trusts its leases for ``failover_s`` minus a heartbeat interval
after sending one, so dying at ``failover_s`` from that moment is never early), else from when
this read was answered. A counter still the same counts as unchanged up to when its read was
issued. Slow reads never make a live worker look older than it is.

Only a worker with a heartbeat row is alive: a worker that stopped removed its row, a dead one's row
is reaped (:meth:`efo.leases.table.LeaseTable.reap_worker`), so a lease owner without a row is free to
take at once. A worker whose last heartbeat says it is **in doubt** (it does not trust its leases and
reads nothing) counts as not alive either: its leases are taken now, not after ``failover_s``.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from efo.clock import SYSTEM_CLOCK, Clock
from efo.leases.changes import LeaseChanges
from efo.leases.model import Lease, WorkerRow


@dataclass(slots=True)
class _Seen:
    beat: int
    since: float  # when the counter took this value, as near as the reads tell
    read_at: float  # when the last read that found it was issued
    in_doubt: bool
    leaving: bool = False


class TableView:
    def __init__(
        self, me: str, failover_s: float, heartbeat_interval_s: float = 0.0, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.me = me
        self.failover_s = failover_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self._clock = clock
        self._seen: dict[str, _Seen] = {}
        self._held: dict[str, Lease] = {}  # shard -> its lease as last read, for its owner and counter
        self._moved_at: dict[str, float] = {}  # shard -> when it last changed hands, newest last
        self._moves_in_order = True  # False once a move was stamped before the newest (never, by the clock)
        self._asked_seen: dict[tuple[str, str], float] = {}  # (shard, asker) -> first seen at
        self._changes = LeaseChanges()  # the leases as the last read showed them
        self._resets: set[str] = set()  # shards whose lease has an operator's reset, in the last read
        self._wanted: dict[str, str] = {}  # shard -> who asked for it, in the last read
        self.live: set[str] = {me}
        self.dead: set[str] = set()  # with a row whose counter did not change for failover_s
        self.doubting: set[str] = set()  # with a row that says it is in doubt
        #: Alive and stopping (the version row names it, or its row says so): no share is counted for
        #: it, and its leases stay its own until it releases them.
        self.leaving: set[str] = set()
        self._named_leaving: AbstractSet[str] = frozenset()  # by the version row, as last read
        #: Workers whose stop ended with every lease released (a move of the membership counter says
        #: so) -> when this worker read that: what a lease read from before their releases still
        #: shows them holding is released, not a dead worker's.
        self._stopped_at: dict[str, float] = {}

    # ---- the workers --------------------------------------------------------------------------

    def saw_workers(
        self, rows: Mapping[str, WorkerRow | None], *, issued_at: float, answered_at: float, complete: bool
    ) -> None:
        """Heartbeat rows read by a request issued at ``issued_at`` and answered at ``answered_at``
        (None: that worker has no row). ``complete``: every row there is (a worker not among them has
        none)."""
        for worker, row in rows.items():
            if row is None:
                self._seen.pop(worker, None)
                continue
            seen = self._seen.get(worker)
            if seen is None or seen.beat != row.heartbeat:
                recent = seen is not None and answered_at - seen.read_at <= self.heartbeat_interval_s
                since = seen.read_at if recent and seen is not None else answered_at
                self._seen[worker] = _Seen(row.heartbeat, since, issued_at, row.in_doubt, row.leaving)
            else:
                seen.read_at, seen.in_doubt, seen.leaving = issued_at, row.in_doubt, row.leaving
        if complete:
            for worker in set(self._seen) - set(rows):  # stopped cleanly, or reaped
                del self._seen[worker]
        self._derive()

    def saw_stopped(self, workers: AbstractSet[str]) -> None:
        """Moves of the membership counter said these workers' own stops ended (their rows gone)."""
        for worker in workers:
            self._stopped_at[worker] = self._clock.now()

    def stopped_lately(self) -> set[str]:
        """The workers whose stop ended with every lease released, as moves read within ``failover_s`` said."""
        now = self._clock.now()
        self._stopped_at = {worker: at for worker, at in self._stopped_at.items() if now - at < self.failover_s}
        return set(self._stopped_at)

    def _derive(self) -> None:
        others = {worker: seen for worker, seen in self._seen.items() if worker != self.me}
        self.dead = {worker for worker, seen in others.items() if seen.read_at - seen.since >= self.failover_s}
        self.doubting = {worker for worker, seen in others.items() if seen.in_doubt}
        self.live = (set(others) - self.dead - self.doubting) | {self.me}
        self.leaving = {
            worker for worker in self.live - {self.me} if worker in self._named_leaving or others[worker].leaving
        }

    def saw_leaving(self, workers: AbstractSet[str]) -> None:
        """The workers the version row names as stopping, as this cycle read it."""
        if workers != self._named_leaving:
            self._named_leaving = workers
            self._derive()

    def beat(self, worker: str) -> int | None:
        """The counter of ``worker``'s heartbeat as last read (None: no row)."""
        seen = self._seen.get(worker)
        return seen.beat if seen is not None else None

    def known(self) -> set[str]:
        """Every worker with a heartbeat row, as far as this worker knows (itself included)."""
        return set(self._seen) | {self.me}

    def watched(self, count: int) -> list[str]:
        """The workers after this one, in name order around the ring of every worker with a row, up
        to the ``count``-th that is not leaving: each worker is watched by the ``count`` before it
        that are not stopping (and by those that are, while they still run). A worker that leaves
        (its heartbeat says so) thus hands its part over as its stop begins, not as it ends: those
        watching from then on have seen the rows for the seconds its stop lasts."""
        ring = sorted(self.known())
        place = ring.index(self.me)
        watched: list[str] = []
        if count <= 0:
            return watched
        counted = 0
        for step in range(1, len(ring)):
            worker = ring[(place + step) % len(ring)]
            watched.append(worker)
            seen = self._seen.get(worker)
            if seen is None or not seen.leaving:
                counted += 1
                if counted == count:
                    break
        return watched

    def confirm(self, worker: str, row: WorkerRow | None, *, issued_at: float, answered_at: float) -> bool:
        """A fresh read of a worker thought dead (or in doubt): True if it still is. A counter that
        moved makes it alive again, counted as any other read counts it (from the answer, unless the
        previous read of that row was recent): a confirmation slowed by an outage may find a counter
        written just before its answer."""
        self.saw_workers({worker: row}, issued_at=issued_at, answered_at=answered_at, complete=False)
        return worker not in self.live

    def next_death_at(self, among: set[str]) -> float | None:
        """When the first of ``among`` alive now would be dead, if its counter does not move before
        (a read then would show it)."""
        times = [
            seen.since + self.failover_s
            for worker, seen in self._seen.items()
            if worker in among and worker in self.live and worker != self.me
        ]
        return min(times) if times else None

    def owner_is_dead(self, owner: str | None) -> bool:
        """A lease owner that is not alive: dead, in doubt, or without a heartbeat row."""
        return owner is not None and owner not in self.live

    # ---- the leases ---------------------------------------------------------------------------

    def saw_leases(
        self,
        leases: Mapping[str, Lease],
        *,
        answered_at: float,
        parts: Mapping[int, Mapping[str, Lease]] | None = None,
    ) -> None:
        """One read of the lease rows (``parts``: the same by partition, if known). Only the rows that
        are not the very objects the last read showed are looked at (:mod:`efo.leases.changes`): a
        cycle costs what changed, not every lease."""
        held = self._held
        for shard_id, _, lease in self._changes.update(leases, parts or {}):
            if lease is None:  # gone: its request with it
                self._wanted.pop(shard_id, None)
                self._resets.discard(shard_id)
                continue
            before = held.get(shard_id)
            if before is not None and (before.owner != lease.owner or before.counter != lease.counter):
                self._moved(shard_id, answered_at)
            held[shard_id] = lease
            if lease.wanted_by:
                self._wanted[shard_id] = lease.wanted_by
            else:
                self._wanted.pop(shard_id, None)
            if lease.reset is not None:
                self._resets.add(shard_id)
            else:
                self._resets.discard(shard_id)
        asked = set(self._wanted.items())
        self._asked_seen = {key: self._asked_seen.get(key, answered_at) for key in asked}

    def _moved(self, shard_id: str, at: float) -> None:
        """``shard_id`` changed hands in the read answered ``at``: kept newest last (reads are answered
        in clock order), so :meth:`moved_within` looks at the recent moves only, not every shard that
        ever moved."""
        newest = next(reversed(self._moved_at.values()), None)
        if newest is not None and at < newest:
            self._moves_in_order = False
        self._moved_at.pop(shard_id, None)
        self._moved_at[shard_id] = at

    def moved_within(self, seconds: float) -> set[str]:
        now = self._clock.now()
        if not self._moves_in_order:
            return {shard_id for shard_id, at in self._moved_at.items() if now - at < seconds}
        recent: set[str] = set()
        for shard_id, at in reversed(self._moved_at.items()):
            if now - at >= seconds:
                break  # every move before it is older still
            recent.add(shard_id)
        return recent

    @property
    def resets(self) -> AbstractSet[str]:
        """The shards whose lease the last read showed with an operator's reset. Read-only."""
        return self._resets

    def reserved_for_others(self) -> set[str]:
        """Shards another live worker asked for, its request younger than ``failover_s``."""
        now = self._clock.now()
        return {
            shard_id
            for (shard_id, asker), since in self._asked_seen.items()
            if asker != self.me and asker in self.live and now - since < self.failover_s
        }
