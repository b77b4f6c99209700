"""The shards of the stream and their leases (KCL's ShardSyncTask).

At the application's first start, a lease for every shard at the initial position. Afterwards a
shard's children get their leases from its last event (ChildShards names them and their parents:
:meth:`ShardSync.born`), written by the worker that read it to its end, before its SHARD_END; so no
worker needs to list the stream to follow a reshard. One worker lists it all the same every
``shards.sync_interval_s``: the first live worker in name order (a bounded run lists on every worker,
for its end): it writes a lease for any shard that has none (the children of a worker that died
before it wrote them) and finishes the leases of shards gone from the stream. Which shards have a
lease is taken from the lease cycle's last read of the table, not from a read of its own.

The worker that lists also grows the lease table's layout (efo.leases.model.Layout): when the
newest generation of lease partitions holds more leases than it should (64 a partition: every new
lease goes there), it adds a generation sized for twice the open shards, so that no lease partition
key holds the leases of a stream resharded far beyond its first start. Only while every heartbeat row is of a
release that reads generations: an older one would miss the leases written in partitions it does
not know (it cannot start once the table grew: it fails on the meta row).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import structlog

from efo.clock import SYSTEM_CLOCK, Clock
from efo.concurrency import bounded, periodically
from efo.config import InitialPosition, Settings
from efo.errors import EfoError, StreamRecreated
from efo.kinesis.graph import Shard, ShardGraph
from efo.kinesis.registration import StreamInfo
from efo.kinesis.shards import list_shards
from efo.kinesis.subscription import Backoff
from efo.leases.model import Meta, lease_partitions_for
from efo.leases.table import LeaseTable
from efo.pipeline.records import SHARD_END, Position

log = structlog.get_logger("efo.worker.shardsync")

#: The first start's lease rows go out this many at once (4,096 one at a time took minutes).
BOOTSTRAP_CONCURRENCY = 32
#: Between batches of this many lease rows, a bootstrap reads the meta row: it stops if another worker
#: completed it meanwhile (a batch takes seconds, far less than ``lease.delete_finished_after_s``).
BOOTSTRAP_BATCH = 256
#: A worker waits at most this long for another's bootstrap, then writes the missing leases itself.
BOOTSTRAP_WAIT_MAX_S = 120.0


class LeaseReads(Protocol):
    """The lease cycle as shard sync uses it (efo.worker.cycle.LeaseCycle, which reads the listing in
    turn): its last read of the table, and a cycle at once after a listing."""

    @property
    def first_live(self) -> bool:
        """This worker comes first in name order among the live ones (it lists the stream)."""
        ...

    def leased(self) -> Collection[str] | None:
        """The shards with a lease, as of the cycle's last read of the table (None: not read yet)."""
        ...

    def run_now(self) -> None:
        """A cycle at once (a listing landed: it may finish leases, or delete finished ones)."""
        ...


@dataclass(slots=True)
class _Waiting:
    began_at: float
    beat: int | None  # the bootstrapping worker's heartbeat as last seen, and since when
    beat_since: float


class ShardSync:
    def __init__(
        self,
        *,
        settings: Settings,
        stream: StreamInfo,
        kinesis: Any,
        table: LeaseTable,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._settings = settings
        self._stream = stream
        self._kinesis = kinesis
        self._table = table
        self._clock = clock
        self._now = asyncio.Event()
        self._cycle: LeaseReads | None = None  # connect()
        self._bounded = settings.run.until is not None  # a bounded run: every worker lists, for its end
        self.graph: ShardGraph | None = None
        self.listed_at = 0.0  # when the listing behind ``graph`` was asked for
        #: How a listed shard is parsed (efo.sim's workers share one parse of each shard it lists).
        self.parse_shard: Callable[[dict[str, Any]], Shard] = Shard.from_api
        self._waiting: _Waiting | None = None  # for another worker's bootstrap
        self._log = log.bind(worker_id=table.worker_id)

    def connect(self, cycle: LeaseReads) -> None:
        """Take which shards have a lease, and who lists, from ``cycle`` (the lease cycle), and run it
        after each listing. The cycle is built after this part, which it reads the listing from.
        Unconnected (a start-up check, a test), it knows no lease and lists."""
        assert self._cycle is None, "connected already"
        self._cycle = cycle

    def list_now(self) -> None:
        self._now.set()

    def _lists(self) -> bool:
        """Whether this worker lists the stream: the first live worker by name, or every worker of a
        bounded run."""
        return self._cycle is None or self._bounded or self._cycle.first_live

    def _leased(self) -> Collection[str] | None:
        """The shards with a lease, as of the lease cycle's last read (None: not read yet)."""
        return None if self._cycle is None else self._cycle.leased()

    # ---- the first start ----------------------------------------------------------------------

    async def check(self) -> Meta | None:
        """Refuse a table that belongs to an earlier stream of the same name, or whose layout is older
        than lease partitions (it names the command that migrates it)."""
        meta = await self._table.read_meta()
        if meta is None:
            return None
        if abs(meta.stream_created_at.timestamp() - self._stream.created_at.timestamp()) > 1e-3:
            raise StreamRecreated(
                f"stream {self._stream.name!r} was created at {self._stream.created_at.isoformat()}, "
                f"but the checkpoints in table {self._table.table!r} belong to the stream created at "
                f"{meta.stream_created_at.isoformat()} (deleted and recreated?); to start over run "
                f"'efo checkpoints reset --delete-all --yes' with the same configuration"
            )
        self._table.adopt(meta)
        return meta

    async def bootstrap(self) -> None:
        """:meth:`bootstrap_once` until it succeeds or fails for a reason that is not retriable (a
        throttled or unreachable DynamoDB at start-up is waited out: the heartbeat runs meanwhile)."""
        subscription = self._settings.subscription
        backoff = Backoff(subscription.backoff_initial_s, subscription.backoff_max_s)
        while True:
            try:
                return await self.bootstrap_once()
            except EfoError as exc:
                if not exc.retriable:
                    raise
                self._log.warning("leases.bootstrap_failed", error=str(exc), code=exc.code)
                await self._clock.sleep(backoff.next_delay_s())

    async def bootstrap_once(self) -> None:
        """At the application's first start, a lease for every shard at the initial position.

        Several workers starting at once agree on one bootstrap: the meta row (the first start's
        position and moment, and who writes its leases) is written first, conditionally, so one
        worker's wins and all use it. The winner writes every lease (conditionally, a bounded number
        at once) and marks the meta row complete last; the others wait for that while the winner's
        heartbeat lives. A bootstrap whose worker died half-way is completed the same way by the next."""
        await self._table.register_partition()  # for the operator CLI's Query of every application's workers
        meta = await self.check()
        if meta is not None and meta.complete:
            return
        graph = await list_shards(self._kinesis, self._stream.arn, self.parse_shard)
        # Under LATEST a shard this listing shows closed holds nothing to read only if the listing was
        # made before the start moment: so only when this attempt writes the meta row after it. A
        # bootstrap completed later (its worker died, or an attempt failed) lists after the start, and
        # a shard that closed since then holds records written after it.
        listed_before_start = False
        if meta is None:
            listed_before_start = await self._table.create_meta(
                self._stream.created_at,
                str(self._settings.start),
                self._clock.wall(),
                lease_partitions=lease_partitions_for(len(graph.shards)),
            )
            meta = await self.check()
        assert meta is not None
        if not meta.complete and meta.bootstrapper not in (None, self._table.worker_id):
            meta = await self._wait_for_bootstrap(meta)
        if meta.complete:
            return
        initial = InitialPosition.parse(meta.initial_position)
        started_at = meta.started_at or self._clock.wall()
        shards = list(graph.shards.values())
        async with self._table.changing():  # one version move for the whole bootstrap
            for first in range(0, len(shards), BOOTSTRAP_BATCH):
                if first:
                    current = await self.check()
                    if current is not None and current.complete:
                        # Taken over (this worker was slow, or paused) and completed: the others run,
                        # and may have deleted leases that finished since (efo.leases.cleanup), which
                        # this worker's writes would bring back at the start position.
                        self._log.warning("leases.bootstrap_completed_elsewhere", written=first)
                        return
                # No reservations: the table grows only once its first start is complete, and a lease
                # with none is where every writer of a grown table looks first (LeaseTable._place).
                await bounded(
                    BOOTSTRAP_CONCURRENCY,
                    lambda shard: self._table.create_lease(
                        shard.shard_id,
                        shard.parents,
                        first_start_position(
                            initial, graph, shard.shard_id, started_at, listed_before_start=listed_before_start
                        ),
                        reserve=False,
                    ),
                    shards[first : first + BOOTSTRAP_BATCH],
                )
        await self._table.complete_meta()
        self._log.info(
            "leases.bootstrapped", stream=self._stream.name, shards=len(graph.shards), initial_position=str(initial)
        )

    async def _wait_for_bootstrap(self, meta: Meta) -> Meta:
        """Until the bootstrapping worker completed the meta row; or its heartbeat stopped changing for
        ``lease.failover_s`` (it died half-way), or BOOTSTRAP_WAIT_MAX_S passed since this worker
        began to wait (it is stuck): then the rest is this worker's to write. What it saw of the other's
        heartbeat survives a retried attempt (a throttled read does not restart the count)."""
        bootstrapper = meta.bootstrapper or ""
        if self._waiting is None:
            self._log.info("leases.waiting_for_bootstrap", bootstrapper=bootstrapper)
            now = self._clock.now()
            self._waiting = _Waiting(began_at=now, beat=None, beat_since=now)
        waiting = self._waiting
        while True:
            await self._clock.sleep(self._settings.lease.sync_interval_s)
            current = await self.check()
            assert current is not None
            if current.complete:
                return current
            row = (await self._table.read_control()).workers.get(bootstrapper)
            now = self._clock.now()
            if row is not None and row.heartbeat != waiting.beat:
                waiting.beat, waiting.beat_since = row.heartbeat, now
            elif now - waiting.beat_since >= self._settings.lease.failover_s:
                self._log.warning("leases.bootstrap_abandoned", bootstrapper=bootstrapper, reason="heartbeat stopped")
                return current
            if now - waiting.began_at >= BOOTSTRAP_WAIT_MAX_S:
                self._log.warning("leases.bootstrap_abandoned", bootstrapper=bootstrapper, reason="too long")
                return current

    # ---- later shards -------------------------------------------------------------------------

    async def run(self) -> None:
        """ListShards every ``shards.sync_interval_s`` (and when asked): a lease for every shard born
        since (a split or a merge), read from its own beginning. Until cancelled."""
        await periodically(
            self.sync,
            interval_s=self._settings.shards.sync_interval_s,
            wake=self._now,
            log=self._log,
            failed="shards.sync_failed",
            clock=self._clock,
        )

    async def sync(self) -> None:
        """The listing and the leases it shows missing, on the worker that lists; nothing on the others."""
        if not self._lists():
            self.graph = None  # another worker lists: this one's last listing grows old
            return
        asked_at = self._clock.now()
        graph = await list_shards(self._kinesis, self._stream.arn, self.parse_shard)
        known = await self._known()
        needing = graph.needing_leases(known)
        closed = {parent for shard in graph.shards.values() for parent in shard.parents}
        if closed.intersection(needing) and self._leased() is not None:
            # A closed shard looks unleased. Its descendants' leases may only be missing from the lease
            # cycle's last read (a partition whose version move was lost is read again only by the
            # next full read), and a finished shard's deleted lease must never be written again.
            table = (await self._table.read()).leases.keys()
            needing = graph.needing_leases(table)
            # Every worker's read lacks those leases until its next full read: their partitions'
            # versions move now (once each), or each listing would read the table again.
            unseen = {self._table.partition_of(shard_id): shard_id for shard_id in sorted(set(table) - set(known))}
            for shard_id in unseen.values():
                await self._table.unseen_change(shard_id)
        await self._write({shard_id: graph.shards[shard_id].parents for shard_id in needing})
        self.graph, self.listed_at = graph, asked_at
        if self._cycle is not None:
            self._cycle.run_now()
        await self.grow(sum(1 for shard_id in graph.shards if shard_id not in closed))

    async def grow(self, open_shards: int) -> bool:
        """A generation of lease partitions more, if the leases (as the lease cycle last read them) outgrew
        the newest and every worker reads generations (True: this worker added it)."""
        layout = await self._table.lease_layout()
        leased = self._leased()
        if leased is None:
            return False
        grown = layout.grown_for(self._table.newest_rows(leased), open_shards)
        if grown is None:
            return False
        workers = await self._table.read_workers(consistent=True)
        older = sorted(worker_id for worker_id, row in workers.items() if not row.reads_generations)
        if older:
            self._log.info("lease.layout_growth_waits", open_shards=open_shards, older_workers=older[:8])
            return False
        if await self._table.grow(layout, grown):
            self._log.info("lease.layout_grew", open_shards=open_shards, generations=list(grown.sizes))
            # A worker of an older release that read the meta row just before the growth, and whose
            # heartbeat landed after the rows above were read, runs with the old layout: said, since
            # nothing here can stop it (it misses the new generation's leases; restarted, it fails on
            # the grown meta row).
            workers = await self._table.read_workers(consistent=True)
            older = sorted(worker_id for worker_id, row in workers.items() if not row.reads_generations)
            if older:
                self._log.error(
                    "lease.layout_grew_under_older", older_workers=older[:8], action="stop them and run this release"
                )
            return True
        await self._table.relayout()  # another worker grew it first: adopt that
        return False

    async def born(self, children: Mapping[str, tuple[str, ...]]) -> None:
        """A lease, read from its own beginning, for each of these new shards (with their parents) that
        has none as of the lease cycle's last read, and whose parents all have one. A merge's other
        parent may have none yet (born and merged between two listings): a child's lease written before
        it would hide it for ever (:meth:`~efo.kinesis.shards.ShardGraph.needing_leases`), so the lister
        writes that lineage, parents first; the child cannot be read before that parent anyway."""
        known = await self._known()
        await self._write(
            {
                shard_id: parents
                for shard_id, parents in children.items()
                if shard_id not in known and all(parent in known for parent in parents)
            }
        )

    async def _known(self) -> Collection[str]:
        known = self._leased()
        return set((await self._table.read()).leases) if known is None else known

    async def _write(self, missing: Mapping[str, tuple[str, ...]]) -> None:
        """A lease at TRIM_HORIZON for each shard. One found there already, though the lease cycle's
        last read did not show it (its writer died before it moved its partition's version), moves
        the version now, so that every worker reads it."""
        for shard_id, parents in missing.items():
            if await self._table.create_lease(shard_id, parents, Position("TRIM_HORIZON")):
                self._log.info("shard.discovered", shard_id=shard_id, parents=list(parents))
            else:
                await self._table.unseen_change(shard_id)


def first_start_position(
    initial: InitialPosition, graph: ShardGraph, shard_id: str, now: datetime, *, listed_before_start: bool = True
) -> Position:
    if initial.kind == "LATEST":
        # Closed shards hold only what was written before the first start: nothing to read (when
        # ``graph`` was listed before that start; one listed after it may show closed a shard that
        # was open at the start: read from the start, it reaches its end at once if it holds nothing).
        # LATEST means "from the first start": kept as that moment, not as the word LATEST,
        # so that no later claim (a crash, a handover before the first event) starts from a
        # later "now" and skips what was written in between.
        closed_before = listed_before_start and graph.is_closed(shard_id)
        return SHARD_END if closed_before else Position("AT_TIMESTAMP", timestamp=now)
    if initial.kind == "AT_TIMESTAMP":
        return Position("AT_TIMESTAMP", timestamp=initial.timestamp)
    return Position("TRIM_HORIZON")
