"""What this worker knows of the others, from successive reads of the lease table, on its own clock.

No two clocks need to agree: a worker is dead when its heartbeat counter has not changed for
``failover_s`` as seen from here; a lease moved when its owner or counter changed between two
reads; a free lease another worker asked for is kept for it while that request is younger than
``failover_s`` as seen from here.

Each read of the heartbeats counts with two moments: a counter first seen in a read counts from
when that read was **answered** (it changed at the latest then), and a counter still the same
counts as unchanged up to when the read was **issued** (the table was read then or later). A slow
read, or lease reads after it, never make a live worker look older than it is.

Only a worker with a heartbeat row is alive: a worker that stopped removed its row, a dead one's row
is reaped (:meth:`efo.leases.table.LeaseTable.reap_worker`), so a lease owner without a row is free to
take at once. A worker whose last heartbeat says it is **in doubt** (it does not trust its leases and
reads nothing) counts as not alive either: its leases are taken now, not after ``failover_s``.
"""

from __future__ import annotations

from efo.clock import SYSTEM_CLOCK, Clock
from efo.leases.table import TableState


class TableView:
    def __init__(self, me: str, failover_s: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self.me = me
        self.failover_s = failover_s
        self._clock = clock
        self._beats: dict[str, tuple[int, float]] = {}  # worker -> (heartbeat, first seen at)
        self._holders: dict[str, tuple[str | None, int]] = {}  # shard -> (owner, counter)
        self._moved_at: dict[str, float] = {}
        self._asked_seen: dict[tuple[str, str], float] = {}  # (shard, asker) -> first seen at
        self.live: set[str] = {me}
        self.dead: set[str] = set()  # with a row whose counter did not change for failover_s
        self.doubting: set[str] = set()  # with a row that says it is in doubt

    def update(self, state: TableState, *, issued_at: float, answered_at: float) -> None:
        """``state``'s heartbeats were read by a request issued at ``issued_at`` and answered at
        ``answered_at`` (this worker's clock); its leases may have been read later."""
        for worker, row in state.workers.items():
            seen = self._beats.get(worker)
            if seen is None or seen[0] != row.heartbeat:
                self._beats[worker] = (row.heartbeat, answered_at)
        for worker in set(self._beats) - set(state.workers):  # stopped cleanly, or reaped
            del self._beats[worker]
        self.doubting = {worker for worker, row in state.workers.items() if row.in_doubt and worker != self.me}
        self.dead = {
            worker
            for worker, (_, since) in self._beats.items()
            if worker != self.me and issued_at - since >= self.failover_s
        }
        self.live = (set(self._beats) - self.dead - self.doubting) | {self.me}
        for shard_id, lease in state.leases.items():
            holder = (lease.owner, lease.counter)
            if self._holders.get(shard_id, holder) != holder:
                self._moved_at[shard_id] = answered_at
            self._holders[shard_id] = holder
        asked = {(lease.shard_id, lease.wanted_by) for lease in state.leases.values() if lease.wanted_by}
        self._asked_seen = {key: self._asked_seen.get(key, answered_at) for key in asked}  # type: ignore[misc]

    def beat(self, worker: str) -> int | None:
        """The counter of ``worker``'s heartbeat as last read (None: no row)."""
        seen = self._beats.get(worker)
        return seen[0] if seen is not None else None

    def confirm(self, worker: str, heartbeat: int | None, in_doubt: bool, *, read_at: float) -> bool:
        """A fresh read of a worker thought dead (or in doubt): True if it still is. A counter that
        moved makes it alive again, from ``read_at``."""
        seen = self._beats.get(worker)
        if heartbeat is None:
            self._beats.pop(worker, None)
            self.live.discard(worker)
            return True
        if in_doubt:
            return True
        if seen is not None and seen[0] == heartbeat and worker in self.dead:
            return True
        self._beats[worker] = (heartbeat, read_at)
        self.dead.discard(worker)
        self.doubting.discard(worker)
        self.live.add(worker)
        return False

    def next_death_at(self) -> float | None:
        """When the first worker alive now would be dead, if its counter does not move before."""
        times = [since + self.failover_s for w, (_, since) in self._beats.items() if w in self.live and w != self.me]
        return min(times) if times else None

    def moved_within(self, seconds: float) -> set[str]:
        now = self._clock.now()
        return {shard_id for shard_id, at in self._moved_at.items() if now - at < seconds}

    def reserved_for_others(self) -> set[str]:
        """Shards another live worker asked for, its request younger than ``failover_s``."""
        now = self._clock.now()
        return {
            shard_id
            for (shard_id, asker), since in self._asked_seen.items()
            if asker != self.me and asker in self.live and now - since < self.failover_s
        }

    def owner_is_dead(self, owner: str | None) -> bool:
        """A lease owner that is not alive: dead, in doubt, or without a heartbeat row."""
        return owner is not None and owner not in self.live
