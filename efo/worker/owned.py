"""The shards this worker holds: the only writer of that set (aiokafka's SubscriptionState).

Every claim enters through :meth:`OwnedLeases.own` and leaves through :meth:`OwnedLeases.forget`
(released, ended) or :meth:`OwnedLeases.lose` (another worker holds it now, or this one cannot
prove it still does). Readers get a read-only mapping; the HTTP thread takes :meth:`snapshot`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from efo.clock import SYSTEM_CLOCK, Clock
from efo.leases.ledger import RecordTally
from efo.leases.lifecycle import OwnedShard, ShardPhase
from efo.leases.model import Lease
from efo.observability import METRICS
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import Position, shard_key


class BacklogBound(Protocol):
    """What hears that a claim left the set (efo.worker.checkpointer.Checkpointer): its uncheckpointed
    records no longer count, so reading paused by the backlog may resume."""

    def apply_backlog_bound(self) -> None: ...


class OwnedLeases(Mapping[str, OwnedShard]):
    def __init__(
        self,
        worker_id: str,
        pool: PendingPool,
        on_change: Callable[[OwnedShard], None] = lambda owned: None,
        *,
        stream: str = "",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.worker_id = worker_id
        self._clock = clock
        self.stream = stream  # the name of the stream these shards belong to (the pool's owners are per stream)
        self._pool = pool
        self._on_change = on_change
        self._shards: dict[str, OwnedShard] = {}
        #: The held claims' committed records whose checkpoint is not written yet, kept as they change.
        self.backlog = RecordTally()
        self._bound: BacklogBound | None = None  # connect()

    def connect(self, bound: BacklogBound) -> None:
        """Tell ``bound`` (the checkpointer) after each claim that leaves the set. The checkpointer is
        built after this part, which it takes to find the claims it writes."""
        assert self._bound is None, "connected already"
        self._bound = bound

    def __getitem__(self, shard_id: str) -> OwnedShard:
        return self._shards[shard_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._shards)

    def __len__(self) -> int:
        return len(self._shards)

    def snapshot(self) -> tuple[OwnedShard, ...]:
        """One copy, for another thread (the HTTP server's)."""
        return tuple(self._shards.values())

    def own(self, lease: Lease, start: Position | None = None) -> OwnedShard:
        """A new claim of ``lease`` (its owner is this worker), read from ``start``."""
        owned = OwnedShard.claim(
            lease, self.worker_id, self._on_change, start=start, stream=self.stream, clock=self._clock
        )
        self.add(owned)
        return owned

    def add(self, owned: OwnedShard) -> None:
        replaced = self._shards.get(owned.shard_id)
        if replaced is not None and replaced is not owned:
            replaced.ledger.count_in(None)
        self._shards[owned.shard_id] = owned
        owned.ledger.count_in(self.backlog)
        self._pool.register(shard_key(self.stream, owned.shard_id))
        METRICS.leases_held.labels(stream=self.stream).set(len(self._shards))

    def forget(self, owned: OwnedShard) -> None:
        if self._shards.get(owned.shard_id) is owned:
            del self._shards[owned.shard_id]
            owned.ledger.count_in(None)
            METRICS.forget_shard(self.stream, owned.shard_id)
        self._pool.unregister(shard_key(self.stream, owned.shard_id))
        METRICS.leases_held.labels(stream=self.stream).set(len(self._shards))
        if self._bound is not None:
            self._bound.apply_backlog_bound()

    def lose(self, owned: OwnedShard, reason: str) -> None:
        """Another worker holds the lease now (or may): stop the claim here, write nothing more."""
        if owned.phase.terminal:
            return
        owned.enter(ShardPhase.LOST)
        METRICS.lease_changes.labels(stream=self.stream, reason="lost").inc()
        owned.log.warning("lease.lost", reason=reason)
        if owned.task is not None and owned.task is not asyncio.current_task():
            owned.task.cancel()
        self.forget(owned)

    def lose_all(self, reason: str) -> None:
        for owned in list(self._shards.values()):
            self.lose(owned, reason)
