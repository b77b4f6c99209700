"""What this worker knows of the others, from successive reads of the lease table, on its own clock.

No two clocks need to agree: a worker is dead when its heartbeat counter has not changed for
``failover_s`` as seen from here; a lease moved when its owner or counter changed between two
reads; a free lease another worker asked for is kept for it while that request is younger than
``failover_s`` as seen from here.
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
        self.dead: set[str] = set()

    def update(self, state: TableState) -> None:
        now = self._clock.now()
        # An owner without a heartbeat row is watched like the others (its row may come, or not).
        owners = {lease.owner for lease in state.leases.values() if lease.owner}
        for worker in set(state.heartbeats) | owners:
            beat = state.heartbeats.get(worker, -1)
            seen = self._beats.get(worker)
            if seen is None or seen[0] != beat:
                self._beats[worker] = (beat, now)
        for worker in set(self._beats) - set(state.heartbeats) - owners:  # stopped cleanly: row and leases gone
            del self._beats[worker]
        self.dead = {w for w, (_, since) in self._beats.items() if w != self.me and now - since >= self.failover_s}
        self.live = (set(self._beats) - self.dead) | {self.me}
        for shard_id, lease in state.leases.items():
            holder = (lease.owner, lease.counter)
            if self._holders.get(shard_id, holder) != holder:
                self._moved_at[shard_id] = now
            self._holders[shard_id] = holder
        asked = {(lease.shard_id, lease.wanted_by) for lease in state.leases.values() if lease.wanted_by}
        self._asked_seen = {key: self._asked_seen.get(key, now) for key in asked}  # type: ignore[misc]

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
        return owner is not None and owner in self.dead
