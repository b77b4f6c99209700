"""The coordinator: one task group owning every task of the service.

It bootstraps the lease table at the application's first start, keeps shards in sync with
ListShards, claims each shard whose parents are finished and runs it as an
:class:`~efo.leases.lifecycle.OwnedShard` (its own subscription task, its own checkpoint ledger),
turns the Spark driver's commits into coalesced checkpoints, and heartbeats.

What a worker knows about its leases, and when:

- a claim's epoch is the lease counter it set; every chunk and every commit carries it, and a
  commit of an earlier claim never moves a checkpoint;
- every sync reads the whole table: a lease another worker took is dropped at once, not at the
  next failed write;
- a worker whose last successful heartbeat is older than ``lease.failover_s`` minus one heartbeat
  interval can no longer prove its leases: it drops them all (stops reading, stops checkpointing)
  and claims again only after a heartbeat lands and the table has been read;
- a batch that makes no progress for ``batch.stall_timeout_s`` stops the worker, so its shards move.

Stopping (SIGTERM): nothing new is claimed; every subscription stops; the driver gets until
``shutdown_timeout_s`` to commit what it holds; the committed positions are checkpointed and every
lease held is released, so the next worker takes over at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from efo.config import InitialPosition, Settings
from efo.errors import EfoError, LeaseLost, ResourceNotFound, SinkStalled, StreamRecreated
from efo.kinesis.registration import StreamInfo, describe_consumer
from efo.kinesis.shards import ShardGraph, list_shards
from efo.kinesis.subscription import ShardSubscription
from efo.leases.lifecycle import Commit, OwnedShard, ShardPhase
from efo.leases.table import Lease, LeaseTable, TableState
from efo.observability import METRICS
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import SHARD_END, Position

log = structlog.get_logger("efo.coordinator")

#: After the driver is done (or its time is up): the last checkpoints and releases, at most this long,
#: this many at once (256 shards release in about 3 s against moto, well under a second on AWS).
FINAL_WRITES_TIMEOUT_S = 5.0
FINAL_WRITES_CONCURRENCY = 16


class Coordinator:
    def __init__(
        self,
        *,
        settings: Settings,
        stream: StreamInfo,
        consumer_arn: str,
        kinesis: Any,
        subscriber: Any,
        table: LeaseTable,
        pool: PendingPool,
        handoff: Handoff,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.stream = stream
        self.consumer_arn = consumer_arn
        self._kinesis = kinesis
        self._subscriber = subscriber
        self.table = table
        self.pool = pool
        self.handoff = handoff
        self._clock = clock
        self.owned: dict[str, OwnedShard] = {}
        self._log = log.bind(worker_id=table.worker_id)
        self._sync_now = asyncio.Event()
        self._checkpoint_now = asyncio.Event()
        self._observed: dict[str, tuple[int | None, float]] = {}
        self._ready = False
        self._stopping = False
        self._group: asyncio.TaskGroup | None = None
        self._leases_in_doubt = False  # no heartbeat landed for too long: nothing is claimed or written
        self._heartbeat_deadline: asyncio.TimerHandle | None = None
        self._batch_started_at: float | None = None  # the driver's batch in the sink, for stall detection

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
        self._log.info(
            "leases.bootstrapped", stream=self.stream.name, shards=len(graph.shards), initial_position=str(initial)
        )

    @staticmethod
    def _first_start_position(initial: InitialPosition, graph: ShardGraph, shard_id: str) -> Position:
        if initial.kind == "LATEST":
            # Closed shards hold only what was written before the first start: nothing to read.
            return SHARD_END if graph.is_closed(shard_id) else Position("LATEST")
        if initial.kind == "AT_TIMESTAMP":
            return Position("AT_TIMESTAMP", timestamp=initial.timestamp)
        return Position("TRIM_HORIZON")

    # ---- the task group -------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, driver_done: asyncio.Event) -> None:
        """Run until ``stop``; then stop intake, give the driver until ``shutdown_timeout_s``,
        checkpoint what it committed and release every lease. A fatal error of any task ends the
        group; what was committed is still checkpointed and the leases released (bounded)."""
        sent_at = self._clock()
        await self.table.heartbeat()
        self._heartbeat_landed(sent_at)
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                heartbeat = group.create_task(self._heartbeat_loop(), name="heartbeat")
                checkpoints = group.create_task(self._checkpoint_loop(), name="checkpoints")
                sync = group.create_task(self._sync_loop(), name="shard-sync")
                await stop.wait()
                stop_at = self._clock()
                self._log.info("service.stopping", shards=len(self.owned))
                await self._stop_intake(sync)
                await self._wait_for_driver(driver_done, stop_at + self.settings.shutdown_timeout_s)
                await _cancelled(checkpoints)
                await self._finish()
                heartbeat.cancel()
        except Exception:
            await self._finish()  # a fatal error: leave the table as tidy as it can be, then fail
            raise
        finally:
            if self._heartbeat_deadline is not None:
                self._heartbeat_deadline.cancel()

    async def _stop_intake(self, sync: asyncio.Task[None]) -> None:
        """Nothing is claimed from here on, and every subscription stops reading."""
        self._stopping = True
        await _cancelled(sync)
        tasks = []
        for owned in self.owned.values():
            if owned.phase.reading:
                owned.enter(ShardPhase.RELEASING)
                if owned.task is not None:
                    owned.task.cancel()
                    tasks.append(owned.task)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _wait_for_driver(self, driver_done: asyncio.Event, deadline: float) -> None:
        try:
            async with asyncio.timeout(max(0.0, deadline - self._clock())):
                await driver_done.wait()
        except TimeoutError:
            self._log.warning("service.driver_timeout", timeout_s=self.settings.shutdown_timeout_s)
        for chunk in self.handoff.close():  # never taken: the next owner reads these again
            if chunk.grant is not None:
                self.pool.release(chunk.grant)

    async def _finish(self) -> None:
        """Checkpoint what was committed and release every lease held, within FINAL_WRITES_TIMEOUT_S."""
        self._stopping = True
        released = 0
        slots = asyncio.Semaphore(FINAL_WRITES_CONCURRENCY)

        async def release(owned: OwnedShard) -> int:
            async with slots:
                try:
                    return await self._release(owned)
                except EfoError as exc:
                    owned.log.warning("lease.release_failed", error=str(exc), code=exc.code)
                    return 0

        try:
            async with asyncio.timeout(FINAL_WRITES_TIMEOUT_S):
                released = sum(await asyncio.gather(*(release(owned) for owned in list(self.owned.values()))))
                released += await self._release_untracked()
                await self.table.remove_worker()
        except (TimeoutError, EfoError) as exc:
            self._log.warning("leases.release_failed", error=str(exc) or type(exc).__name__)
        self._log.info("leases.released", shards=released)

    async def _release(self, owned: OwnedShard) -> int:
        if owned.task is not None and not owned.task.done():
            owned.task.cancel()
            await asyncio.gather(owned.task, return_exceptions=True)
        if not self._leases_in_doubt:
            await self._write_checkpoint(owned)
        if owned.phase.terminal:  # ended (SHARD_END) or lost meanwhile
            return 0
        owned.enter(ShardPhase.RELEASING)
        try:
            await self.table.release(owned.lease)
        except LeaseLost as exc:
            self._lose(owned, str(exc))
            return 0
        owned.enter(ShardPhase.RELEASED)
        self._forget(owned)
        return 1

    async def _release_untracked(self) -> int:
        """A claim whose request was under way when the sync was cancelled may have landed: release
        whatever the table still shows as this worker's."""
        state = await self.table.read()
        released = 0
        for lease in state.leases.values():
            if lease.owner == self.table.worker_id:
                try:
                    await self.table.release(lease)
                    released += 1
                except LeaseLost:
                    continue
        return released

    # ---- liveness ----------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval_s = self.settings.lease.heartbeat_interval_s
        while True:
            await asyncio.sleep(interval_s)
            self._check_batch_progress()
            sent_at = self._clock()
            try:
                async with asyncio.timeout(interval_s):  # a slower write is as good as a failed one
                    await self.table.heartbeat()
            except TimeoutError:
                self._log.warning("lease.heartbeat_failed", error=f"no answer within {interval_s:g} s")
            except EfoError as exc:
                if not exc.retriable:
                    raise
                self._log.warning("lease.heartbeat_failed", error=str(exc), code=exc.code)
            else:
                self._heartbeat_landed(sent_at)

    @property
    def lease_validity_s(self) -> float:
        """How long after its last successful heartbeat this worker still trusts its leases: others
        take them ``failover_s`` after they last saw the heartbeat change; one interval of margin."""
        return self.settings.lease.failover_s - self.settings.lease.heartbeat_interval_s

    def _heartbeat_landed(self, sent_at: float) -> None:
        if self._heartbeat_deadline is not None:
            self._heartbeat_deadline.cancel()
        delay_s = max(0.0, sent_at + self.lease_validity_s - self._clock())
        self._heartbeat_deadline = asyncio.get_running_loop().call_later(delay_s, self._leases_expired)
        if self._leases_in_doubt:
            self._leases_in_doubt = False
            self._log.info("lease.heartbeat_recovered")
            self._sync_now.set()  # read the table, then claim again what is still ours

    def _leases_expired(self) -> None:
        """No heartbeat landed for the lease validity: others may own these shards by now."""
        self._leases_in_doubt = True
        self._log.warning("lease.in_doubt", shards=len(self.owned), validity_s=self.lease_validity_s)
        for owned in list(self.owned.values()):
            self._lose(owned, f"no heartbeat landed for {self.lease_validity_s:g} s")

    def batch_started(self) -> None:
        self._batch_started_at = self._clock()

    def _check_batch_progress(self) -> None:
        started = self._batch_started_at
        limit_s = self.settings.batch.stall_timeout_s
        if started is not None and self._clock() - started > limit_s:
            raise SinkStalled(
                f"a batch has been in the sink for more than {limit_s:g} s (batch.stall_timeout_s): "
                "stopping this worker so that its shards move to others"
            )

    # ---- shards -------------------------------------------------------------------------------

    async def _sync_loop(self) -> None:
        while True:
            try:
                if not self._leases_in_doubt:
                    graph = await list_shards(self._kinesis, self.stream.arn)
                    state = await self.table.read()
                    await self._reconcile(graph, state)
            except EfoError as exc:
                if not exc.retriable:
                    raise
                self._log.warning("shards.sync_failed", error=str(exc), code=exc.code)
            self._sync_now.clear()
            try:
                async with asyncio.timeout(self.settings.shards.sync_interval_s):
                    await self._sync_now.wait()
            except TimeoutError:
                pass

    async def _reconcile(self, graph: ShardGraph, state: TableState) -> None:
        created = False
        for shard_id, shard in graph.shards.items():
            if shard_id not in state.leases:
                # Born after the first start (split or merge): read from its own beginning.
                created |= await self.table.create_lease(shard_id, shard.parents, Position("TRIM_HORIZON"))
                self._log.info("shard.discovered", shard_id=shard_id, parents=list(shard.parents))
        if created:
            state = await self.table.read()
        self._check_owned(state)
        dead = self._dead_workers(state)
        for lease in sorted(state.leases.values(), key=lambda lease: lease.shard_id):
            if self._stopping or self._leases_in_doubt:
                return
            if lease.finished or lease.shard_id in self.owned:
                continue
            if lease.shard_id in graph.shards and not self._parents_finished(lease, state, graph):
                continue
            if lease.owner not in (None, self.table.worker_id) and lease.owner not in dead:
                continue
            try:
                claimed = await self.table.claim(lease)
            except LeaseLost:
                continue
            self._start(claimed, listed=lease.shard_id in graph.shards)
        self._check_ready()

    def _check_owned(self, state: TableState) -> None:
        """A lease another worker took (or reset) is dropped now, not at the next failed write."""
        for owned in list(self.owned.values()):
            lease = state.leases.get(owned.shard_id)
            if lease is None or lease.owner != self.table.worker_id or lease.counter != owned.epoch:
                holder = f"{lease.owner} (counter {lease.counter})" if lease is not None else "nobody (row gone)"
                self._lose(owned, f"the lease is now held by {holder}")

    @staticmethod
    def _parents_finished(lease: Lease, state: TableState, graph: ShardGraph) -> bool:
        for parent in lease.parents:
            parent_lease = state.leases.get(parent)
            if parent_lease is not None and not parent_lease.finished and parent in graph.shards:
                return False
        return True

    def _dead_workers(self, state: TableState) -> set[str]:
        """Owners whose heartbeat has not changed for ``lease.failover_s`` as seen from here
        (observed on this clock, so no clocks need to agree)."""
        now = self._clock()
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

    def _start(self, lease: Lease, *, listed: bool) -> None:
        assert self._group is not None and not self._stopping
        owned = OwnedShard.claim(lease, self.table.worker_id, self._on_change)
        self.owned[owned.shard_id] = owned
        self.pool.register(owned.shard_id)
        METRICS.shards_owned.set(len(self.owned))
        if not listed:
            # Gone from the stream (past its retention) before it was finished: nothing is left to
            # read, and its children must not wait for it for ever.
            METRICS.shards_expired.inc()
            owned.log.warning("shard.expired", position=str(lease.checkpoint))
            self._end(owned, ())
            return
        owned.log.info("shard.started", position=str(lease.checkpoint))
        owned.task = self._group.create_task(self._run_shard(owned), name=f"shard-{owned.shard_id}")

    async def _run_shard(self, owned: OwnedShard) -> None:
        await self._subscriber.ensure_room(len(self.owned))
        subscription = ShardSubscription(
            client=self._subscriber,
            consumer_arn=self.consumer_arn,
            stream=self.stream.name,
            shard_id=owned.shard_id,
            start=owned.lease.checkpoint,
            pool=self.pool,
            handoff=self.handoff,
            progress=owned.ledger,
            settings=self.settings.subscription,
            epoch=owned.epoch,
            backpressure_timeout_s=self.settings.pool.backpressure_timeout_s,
            on_corrupt_aggregate=self.settings.on_corrupt_aggregate,
            lease_check=lambda: self.table.holds(owned.lease),
            on_phase=owned.enter,
            logger=owned.log,
        )
        try:
            ended = await subscription.run()
        except LeaseLost as exc:  # another worker owns the shard now: stop it here, nothing else
            self._lose(owned, str(exc))
            return
        except ResourceNotFound as exc:
            await self._not_found(owned, exc)
            return
        self._end(owned, ended.child_shard_ids)

    async def _not_found(self, owned: OwnedShard, error: ResourceNotFound) -> None:
        """The consumer, the stream or the shard is gone. Only the last one is not fatal."""
        graph = await list_shards(self._kinesis, self.stream.arn)
        if owned.shard_id not in graph.shards:
            METRICS.shards_expired.inc()
            owned.log.warning("shard.expired", position=str(owned.ledger.written), error=str(error))
            self._end(owned, ())
            return
        if await describe_consumer(self._kinesis, stream_arn=self.stream.arn, arn=self.consumer_arn) is None:
            raise ResourceNotFound(
                f"consumer {self.consumer_arn} is no longer registered on stream {self.stream.name!r} "
                "(deregistered while running?); register it again ('efo consumer register') and restart"
            ) from None
        raise error

    def _end(self, owned: OwnedShard, children: tuple[str, ...]) -> None:
        """The shard's last event was handed on: SHARD_END once the sink committed it."""
        owned.children = children
        owned.enter(ShardPhase.DRAINING)
        owned.ledger.ended()
        self._on_change(owned)

    def _lose(self, owned: OwnedShard, reason: str) -> None:
        if owned.phase.terminal:
            return
        owned.enter(ShardPhase.LOST)
        owned.log.warning("lease.lost", reason=reason)
        if owned.task is not None and owned.task is not asyncio.current_task():
            owned.task.cancel()
        self._forget(owned)

    def _forget(self, owned: OwnedShard) -> None:
        if self.owned.get(owned.shard_id) is owned:
            del self.owned[owned.shard_id]
        self.pool.unregister(owned.shard_id)
        METRICS.shards_owned.set(len(self.owned))
        self._apply_backlog_bound()

    def _on_change(self, owned: OwnedShard) -> None:
        if owned.ledger.urgent:
            self._checkpoint_now.set()
        self._check_ready()

    # ---- commits and checkpoints ----------------------------------------------------------

    def on_committed(self, commits: Iterable[Commit]) -> None:
        """The sink committed these chunks (loop thread): release budget, advance checkpoints."""
        self._batch_started_at = None
        stale = 0
        for commit in commits:
            if commit.grant is not None:
                self.pool.release(commit.grant)
            METRICS.records_committed.inc(commit.records)
            owned = self.owned.get(commit.shard_id)
            if owned is None or not owned.committed(commit):
                stale += 1  # an earlier claim's: its records are read again by the current owner
                continue
            if owned.ledger.urgent:
                self._checkpoint_now.set()
        if stale:
            self._log.debug("commit.stale", chunks=stale)
        self._apply_backlog_bound()

    def _apply_backlog_bound(self) -> None:
        """Pause reading while too many committed records wait for their checkpoint (DynamoDB down
        or throttled), so the duplicates a crash would cause stay bounded."""
        backlog = sum(owned.ledger.uncheckpointed_records for owned in self.owned.values())
        bound = self.settings.pool.max_uncheckpointed_records
        if backlog >= bound and not self.pool.paused:
            self.pool.pause()
            self._log.warning("pool.paused", records=backlog, bound=bound)
        elif backlog < bound and self.pool.paused:
            self.pool.resume()
            self._log.info("pool.resumed", records=backlog)

    async def _checkpoint_loop(self) -> None:
        interval_s = self.settings.checkpoint.interval_s
        last_flush = self._clock()
        while True:
            try:
                async with asyncio.timeout(max(0.0, last_flush + interval_s - self._clock())):
                    await self._checkpoint_now.wait()
            except TimeoutError:
                pass
            self._checkpoint_now.clear()
            force = self._clock() - last_flush >= interval_s
            await self._flush_checkpoints(force=force)
            if force:
                last_flush = self._clock()

    async def _flush_checkpoints(self, *, force: bool) -> None:
        for owned in list(self.owned.values()):
            if self._leases_in_doubt:
                return
            if force or owned.ledger.urgent:
                await self._write_checkpoint(owned)

    async def _write_checkpoint(self, owned: OwnedShard) -> None:
        due = owned.ledger.due
        if due is None or owned.phase.terminal:
            return
        records = owned.ledger.uncheckpointed_records
        try:
            owned.lease = await self.table.checkpoint(owned.lease, due)
        except LeaseLost as exc:
            self._lose(owned, str(exc))
            return
        except EfoError as exc:
            if not exc.retriable:
                raise
            owned.log.warning("checkpoint.failed", error=str(exc), code=exc.code)
            return
        METRICS.checkpoints_written.inc()
        if owned.phase.terminal:  # lost while the write was under way (it still landed, fenced)
            return
        owned.ledger.wrote(due, records)
        self._apply_backlog_bound()
        if due == SHARD_END:
            owned.enter(ShardPhase.ENDED)
            owned.log.info("checkpoint.shard_end", children=list(owned.children))
            self._forget(owned)
            self._sync_now.set()  # its children may start now
        else:
            owned.log.debug("checkpoint.written", position=str(due))

    # ---- readiness ------------------------------------------------------------------------

    def _check_ready(self) -> None:
        if self._ready or not self.owned:
            return
        reading = [owned for owned in self.owned.values() if owned.phase.reading]
        if reading and all(owned.first_event for owned in reading):
            self._ready = True
            self._log.info("service.ready", stream=self.stream.name, shards=len(reading))


async def _cancelled(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
