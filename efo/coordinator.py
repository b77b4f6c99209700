"""The coordinator: one task group owning every task of the service.

It bootstraps the lease table at the application's first start, keeps shards in sync with
ListShards, starts a subscription for each shard whose parents are finished, turns the Spark
driver's commits into coalesced checkpoints, writes SHARD_END once a shard's last record is
committed (which is what lets its children start), heartbeats, and on stop cancels intake,
flushes checkpoints and releases its leases.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from efo.config import InitialPosition, Settings
from efo.errors import EfoError, LeaseLost, StreamRecreated
from efo.kinesis.registration import StreamInfo
from efo.kinesis.shards import ShardGraph, list_shards
from efo.kinesis.subscription import ShardEnded, ShardSubscription
from efo.leases.table import Lease, LeaseTable, TableState
from efo.observability import METRICS
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import Grant, PendingPool
from efo.pipeline.records import Position

log = structlog.get_logger("efo.coordinator")


@dataclass(frozen=True, slots=True)
class Commit:
    """The driver's acknowledgement of one committed chunk."""

    shard_id: str
    serial: int
    records: int
    grant: Grant | None


@dataclass(eq=False)
class ShardState:
    """One owned shard: its lease, what is handed on but not committed, and what to checkpoint."""

    lease: Lease
    outstanding: deque[tuple[int, Position]] = field(default_factory=deque)
    checkpoint_due: Position | None = None  # committed, not yet written
    urgent: bool = False  # write at once rather than at the next interval
    serial: int = 0
    uncheckpointed_records: int = 0  # committed by the sink, checkpoint not yet written
    first_event: bool = False
    ended: ShardEnded | None = None
    task: asyncio.Task[None] | None = None
    on_progress: Callable[[ShardState], None] = lambda state: None

    @property
    def shard_id(self) -> str:
        return self.lease.shard_id

    # ShardProgress, called by the subscription on the loop thread
    def next_serial(self) -> int:
        self.serial += 1
        return self.serial

    def started(self, first: Position) -> None:
        self.first_event = True
        start = self.lease.checkpoint
        if start is not None and start.kind in ("LATEST", "AT_TIMESTAMP") and self.checkpoint_due is None:
            # Pin LATEST / AT_TIMESTAMP to a concrete position at once, so a restart never
            # applies them again and never skips what was written while the service was down.
            self.checkpoint_due = first
            self.urgent = True
        self.on_progress(self)

    def enqueued(self, serial: int, resume: Position) -> None:
        self.outstanding.append((serial, resume))

    def idle(self, resume: Position) -> None:
        if self.outstanding:
            # No records between the last outstanding chunk and this continuation.
            self.outstanding[-1] = (self.outstanding[-1][0], resume)
        else:
            self.checkpoint_due = resume

    def committed(self, serial: int, records: int) -> None:
        self.uncheckpointed_records += records
        while self.outstanding and self.outstanding[0][0] <= serial:
            _, resume = self.outstanding.popleft()
            self.checkpoint_due = resume

    @property
    def drained(self) -> bool:
        return self.ended is not None and not self.outstanding


class Coordinator:
    def __init__(
        self,
        *,
        settings: Settings,
        stream: StreamInfo,
        consumer_arn: str,
        kinesis: Any,
        subscriber_client: Any,
        table: LeaseTable,
        pool: PendingPool,
        handoff: Handoff,
    ) -> None:
        self.settings = settings
        self.stream = stream
        self.consumer_arn = consumer_arn
        self._kinesis = kinesis
        self._subscriber_client = subscriber_client
        self.table = table
        self.pool = pool
        self.handoff = handoff
        self.shards: dict[str, ShardState] = {}
        self._sync_now = asyncio.Event()
        self._checkpoint_now = asyncio.Event()
        self._observed: dict[str, tuple[int | None, float]] = {}
        self._ready = False
        self._epochs = itertools.count(1)  # each start of a shard: resets the driver's watermark
        self._finished: set[str] = set()  # SHARD_END written by this worker (a table read may be older)
        self._group: asyncio.TaskGroup | None = None

    # ---- start-up -------------------------------------------------------------------------

    async def bootstrap(self) -> None:
        """At the first start, create a lease for every shard with the configured position;
        afterwards, refuse a table that belongs to an earlier stream of the same name."""
        state = await self.table.read()
        if state.meta is not None:
            if abs(state.meta.stream_created_at.timestamp() - self.stream.created_at.timestamp()) > 1e-3:
                raise StreamRecreated(
                    f"stream {self.stream.name!r} was created at {self.stream.created_at.isoformat()}, "
                    f"but the checkpoints in table {self.table.table!r} belong to the stream created at "
                    f"{state.meta.stream_created_at.isoformat()} (deleted and recreated?); to start over run "
                    f"'efo checkpoints reset --yes' with the same configuration"
                )
            return
        initial = self.settings.start
        graph = await list_shards(self._kinesis, self.stream.arn)
        for shard_id, shard in graph.shards.items():
            await self.table.create_lease(shard_id, shard.parents, self._first_start_position(initial, graph, shard_id))
        await self.table.create_meta(self.stream.created_at, str(initial))
        log.info(
            "leases.bootstrapped", stream=self.stream.name, shards=len(graph.shards), initial_position=str(initial)
        )

    @staticmethod
    def _first_start_position(initial: InitialPosition, graph: ShardGraph, shard_id: str) -> Position | None:
        if initial.kind == "LATEST":
            # Closed shards hold only what was written before the first start: nothing to read.
            return None if graph.is_closed(shard_id) else Position("LATEST")
        if initial.kind == "AT_TIMESTAMP":
            return Position("AT_TIMESTAMP", timestamp=initial.timestamp)
        return Position("TRIM_HORIZON")

    # ---- the task group -------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, driver_done: asyncio.Event) -> None:
        await self.table.heartbeat()
        async with asyncio.TaskGroup() as group:
            self._group = group
            loops = [
                group.create_task(self._heartbeat_loop(), name="heartbeat"),
                group.create_task(self._checkpoint_loop(), name="checkpoints"),
                group.create_task(self._sync_loop(), name="shard-sync"),
            ]
            await stop.wait()
            log.info("service.stopping", worker_id=self.table.worker_id)
            await self._stop_intake()
            try:
                await asyncio.wait_for(driver_done.wait(), self.settings.shutdown_timeout_s)
            except TimeoutError:
                log.warning("service.driver_timeout", timeout_s=self.settings.shutdown_timeout_s)
            for chunk in self.handoff.close():  # never taken: the next owner reads these again
                if chunk.grant is not None:
                    self.pool.release(chunk.grant)
            for task in loops:
                task.cancel()
        await self._flush_checkpoints(force=True)
        await self._release_leases()

    async def _stop_intake(self) -> None:
        tasks = [s.task for s in self.shards.values() if s.task is not None and not s.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease.heartbeat_interval_s)
            try:
                await self.table.heartbeat()
            except EfoError as exc:
                if not exc.retriable:
                    raise
                log.warning("lease.heartbeat_failed", error=str(exc))

    async def _sync_loop(self) -> None:
        while True:
            try:
                graph = await list_shards(self._kinesis, self.stream.arn)
                state = await self.table.read()
                await self._reconcile(graph, state)
            except EfoError as exc:
                if not exc.retriable:
                    raise
                log.warning("shards.sync_failed", error=str(exc))
            self._sync_now.clear()
            try:
                await asyncio.wait_for(self._sync_now.wait(), self.settings.shards.sync_interval_s)
            except TimeoutError:
                pass

    async def _reconcile(self, graph: ShardGraph, state: TableState) -> None:
        for shard_id, shard in graph.shards.items():
            if shard_id not in state.leases:
                # Born after the first start (split or merge): read from its own beginning.
                await self.table.create_lease(shard_id, shard.parents, Position("TRIM_HORIZON"))
                log.info("shard.discovered", shard_id=shard_id, parents=list(shard.parents))
        if any(shard_id not in state.leases for shard_id in graph.shards):
            state = await self.table.read()
        dead = self._dead_workers(state)
        for lease in state.leases.values():
            if lease.finished or lease.shard_id in self.shards or lease.shard_id in self._finished:
                continue
            if not self._parents_finished(lease, state, graph):
                continue
            if lease.owner not in (None, self.table.worker_id) and lease.owner not in dead:
                continue
            try:
                claimed = await self.table.claim(lease)
            except LeaseLost:
                continue
            self._start_shard(claimed)
        self._check_ready()

    def _parents_finished(self, lease: Lease, state: TableState, graph: ShardGraph) -> bool:
        for parent in lease.parents:
            parent_lease = state.leases.get(parent)
            if parent_lease is not None and not parent_lease.finished and parent in graph.shards:
                return False
        return True

    def _dead_workers(self, state: TableState) -> set[str]:
        """Owners whose heartbeat has not changed for ``lease.failover_s`` as seen from here
        (observed on this clock, so no clocks need to agree)."""
        now = time.monotonic()
        owners = {lease.owner for lease in state.leases.values() if lease.owner} - {self.table.worker_id}
        dead = set()
        for owner in owners:
            beat = state.heartbeats.get(owner)
            seen = self._observed.get(owner)
            if seen is None or seen[0] != beat:
                self._observed[owner] = (beat, now)
            elif now - seen[1] >= self.settings.lease.failover_s:
                dead.add(owner)
        if owners - dead:
            # Look again once the failover time has passed rather than at the next full interval.
            asyncio.get_running_loop().call_later(self.settings.lease.failover_s, self._sync_now.set)
        return dead

    def _start_shard(self, lease: Lease) -> None:
        assert self._group is not None and lease.checkpoint is not None
        state = ShardState(lease, on_progress=self._on_progress)
        self.shards[lease.shard_id] = state
        self.pool.register(lease.shard_id)
        subscription = ShardSubscription(
            client=self._subscriber_client,
            consumer_arn=self.consumer_arn,
            stream=self.stream.name,
            shard_id=lease.shard_id,
            start=lease.checkpoint,
            pool=self.pool,
            handoff=self.handoff,
            progress=state,
            settings=self.settings.subscription,
            epoch=next(self._epochs),
            backpressure_timeout_s=self.settings.pool.backpressure_timeout_s,
            on_corrupt_aggregate=self.settings.on_corrupt_aggregate,
            lease_check=lambda: self.table.holds(state.lease),
        )
        state.task = self._group.create_task(self._run_shard(state, subscription), name=f"shard-{lease.shard_id}")
        METRICS.shards_owned.set(len(self.shards))
        log.info(
            "shard.started", shard_id=lease.shard_id, position=str(lease.checkpoint), worker_id=self.table.worker_id
        )

    async def _run_shard(self, state: ShardState, subscription: ShardSubscription) -> None:
        try:
            state.ended = await subscription.run()
        except LeaseLost as exc:  # another worker owns the shard now: stop it here, nothing else
            log.warning("lease.lost", shard_id=state.shard_id, error=str(exc))
            self._drop_shard(state)
            return
        self._maybe_finish(state)

    # ---- commits and checkpoints ----------------------------------------------------------

    def on_committed(self, commits: Iterable[Commit]) -> None:
        """The sink committed these chunks (loop thread): release budget, advance checkpoints."""
        for commit in commits:
            if commit.grant is not None:
                self.pool.release(commit.grant)
            METRICS.records_committed.inc(commit.records)
            state = self.shards.get(commit.shard_id)
            if state is not None:
                state.committed(commit.serial, commit.records)
                self._maybe_finish(state)
        self._apply_backlog_bound()

    def _maybe_finish(self, state: ShardState) -> None:
        if state.drained:
            state.urgent = True
            self._checkpoint_now.set()

    def _apply_backlog_bound(self) -> None:
        """Pause reading while too many committed records wait for their checkpoint (DynamoDB down
        or throttled), so the duplicates a crash would cause stay bounded."""
        backlog = sum(s.uncheckpointed_records for s in self.shards.values())
        bound = self.settings.pool.max_uncheckpointed_records
        if backlog >= bound and not self.pool.paused:
            self.pool.pause()
            log.warning("pool.paused", records=backlog, bound=bound)
        elif backlog < bound and self.pool.paused:
            self.pool.resume()
            log.info("pool.resumed", records=backlog)

    async def _checkpoint_loop(self) -> None:
        interval_s = self.settings.checkpoint.interval_s
        last_flush = time.monotonic()
        while True:
            timeout_s = max(0.0, last_flush + interval_s - time.monotonic())
            try:
                await asyncio.wait_for(self._checkpoint_now.wait(), timeout_s)
            except TimeoutError:
                pass
            self._checkpoint_now.clear()
            force = time.monotonic() - last_flush >= interval_s
            await self._flush_checkpoints(force=force)
            if force:
                last_flush = time.monotonic()

    async def _flush_checkpoints(self, *, force: bool) -> None:
        for state in list(self.shards.values()):
            if not (force or state.urgent):
                continue
            state.urgent = False
            try:
                await self._write_checkpoint(state)
            except LeaseLost as exc:
                log.warning("lease.lost", shard_id=state.shard_id, error=str(exc))
                self._drop_shard(state)
            except EfoError as exc:
                if not exc.retriable:
                    raise
                state.urgent = True
                log.warning("checkpoint.failed", shard_id=state.shard_id, error=str(exc))

    async def _write_checkpoint(self, state: ShardState) -> None:
        if state.drained:
            state.lease = await self.table.checkpoint(state.lease, None)
            METRICS.checkpoints_written.inc()
            self._finished.add(state.shard_id)
            self._forget(state)  # done here; the table says so from now on
            children = list(state.ended.child_shard_ids) if state.ended else []
            log.info("checkpoint.shard_end", shard_id=state.shard_id, children=children)
            self._sync_now.set()  # its children may start now
            return
        due = state.checkpoint_due
        committed = state.uncheckpointed_records
        if due is not None and due != state.lease.checkpoint:
            state.lease = await self.table.checkpoint(state.lease, due)
            METRICS.checkpoints_written.inc()
            state.uncheckpointed_records -= committed
            self._apply_backlog_bound()
            log.debug("checkpoint.written", shard_id=state.shard_id, position=str(due))

    def _drop_shard(self, state: ShardState) -> None:
        if state.task is not None:
            state.task.cancel()
        self._forget(state)

    def _forget(self, state: ShardState) -> None:
        self.shards.pop(state.shard_id, None)
        self.pool.unregister(state.shard_id)
        METRICS.shards_owned.set(len(self.shards))
        self._apply_backlog_bound()

    async def _release_leases(self) -> None:
        for state in list(self.shards.values()):
            try:
                await self.table.release(state.lease)
            except EfoError as exc:
                log.warning("lease.release_failed", shard_id=state.shard_id, error=str(exc))
        try:
            await self.table.remove_worker()
        except EfoError as exc:
            log.warning("worker.remove_failed", error=str(exc))
        log.info("leases.released", worker_id=self.table.worker_id, shards=len(self.shards))

    # ---- readiness ------------------------------------------------------------------------

    def _on_progress(self, state: ShardState) -> None:
        if state.urgent:
            self._checkpoint_now.set()
        self._check_ready()

    def _check_ready(self) -> None:
        if self._ready or not self.shards:
            return
        running = [s for s in self.shards.values() if not s.lease.finished and s.ended is None]
        if all(s.first_event for s in running):
            self._ready = True
            log.info("service.ready", stream=self.stream.name, shards=len(running), worker_id=self.table.worker_id)
