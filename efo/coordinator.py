"""The coordinator: one task group owning every task of the service.

It bootstraps the lease table at the application's first start, lists shards (splits, merges),
and every ``lease.sync_interval_s`` reads the lease table and acts on it: it claims its share of
the shards that can be read (parents finished) and runs each as an
:class:`~efo.leases.lifecycle.OwnedShard` (its own subscription task, its own checkpoint ledger),
hands over what it holds above its share, asks for a share it lacks, applies operators' resets,
turns the Spark driver's commits into coalesced checkpoints, and heartbeats.

What a worker knows about its leases, and when:

- a claim's epoch is the lease counter it set; every chunk and every commit carries it, and a
  commit of an earlier claim never moves a checkpoint;
- every lease cycle reads the whole table: a lease another worker took is dropped at once, not at
  the next failed write;
- a worker whose last successful heartbeat is older than ``lease.failover_s`` minus one heartbeat
  interval can no longer prove its leases: it drops them all (stops reading, stops checkpointing)
  and claims again only after a heartbeat lands and the table has been read;
- a batch that makes no progress for ``batch.stall_timeout_s`` stops the worker, so its shards move.

Handing a lease over (a rebalance, a steal request, a stop): the subscription stops, the sink
commits what was handed on, the checkpoint is written and the lease released: the next owner
starts where this one stopped, nothing lost and nothing read twice.

Stopping (SIGTERM): nothing new is claimed; every subscription stops; the driver gets until
``shutdown_timeout_s`` to commit what it holds; the committed positions are checkpointed and every
lease held is released, so the next worker takes over at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import structlog

from efo.config import InitialPosition, Settings
from efo.errors import EfoError, LeaseLost, ResourceNotFound, SinkStalled, StreamRecreated
from efo.kinesis.registration import StreamInfo, describe_consumer
from efo.kinesis.shards import ShardGraph, list_shards
from efo.kinesis.subscription import Backoff, ShardSubscription
from efo.leases.balance import plan
from efo.leases.lifecycle import Commit, OwnedShard, ShardPhase
from efo.leases.table import Lease, LeaseTable, TableState
from efo.leases.view import TableView
from efo.observability import METRICS
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import SHARD_END, Position

log = structlog.get_logger("efo.coordinator")

T = TypeVar("T")

#: After the driver is done (or its time is up): the last checkpoints and releases, at most this long,
#: this many at once (256 shards release in about 3 s against moto, well under a second on AWS).
FINAL_WRITES_TIMEOUT_S = 5.0
FINAL_WRITES_CONCURRENCY = 16
#: A lease that changed owner this many lease cycles ago or less is not moved again (no ping-pong).
SETTLE_CYCLES = 10
#: A worker short of its share asks for a lease only after this many cycles: time for the others to
#: see its heartbeat and shed on their own (asking at once races that, and more moves than needed).
ASK_AFTER_CYCLES = 3
HANDOVER_POLL_S = 0.05
#: /readyz fails while a shard has been trying to subscribe for longer than this.
SUBSCRIBING_READY_S = 30.0


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
        self._discover_now = asyncio.Event()
        self._cycle_now = asyncio.Event()
        self._checkpoint_now = asyncio.Event()
        self._graph: ShardGraph | None = None
        self._listed_at = 0.0  # when the listing behind _graph was asked for
        self._unlisted_since: dict[str, float] = {}  # leases missing from the listing: first seen then
        self._view = TableView(table.worker_id, settings.lease.failover_s, clock)
        self._asked: dict[str, float] = {}  # shards this worker asked for: when it asked
        self._short_since: float | None = None  # below its share, nothing free: since when
        self._ready = False
        self._stopping = False
        self._group: asyncio.TaskGroup | None = None
        self._leases_in_doubt = False  # no heartbeat landed for too long: nothing is claimed or written
        self._heartbeat_deadline: asyncio.TimerHandle | None = None
        self._heartbeat_ok_at: float | None = None  # when the last heartbeat that landed was sent
        self._batch_started_at: float | None = None  # the driver's batch in the sink, for stall detection
        self._table_read_at: float | None = None  # the last lease cycle's successful read, for /readyz

    # ---- start-up -------------------------------------------------------------------------

    async def bootstrap(self) -> None:
        """At the application's first start, a lease for every shard at the initial position;
        afterwards, refuse a table that belongs to an earlier stream of the same name.

        Several workers starting at once agree on one bootstrap: the meta row (the first start's
        position and moment) is written first, conditionally, so one worker's wins and all use it;
        every lease is written conditionally; the meta row is marked complete last. A worker that
        dies half-way leaves it incomplete, and the next worker completes it the same way."""
        await self.table.register_partition()  # for the operator CLI's Query of every application's workers
        state = await self.table.read()
        if state.meta is None:
            await self.table.create_meta(self.stream.created_at, str(self.settings.start), datetime.now(UTC))
            state = await self.table.read()
        meta = state.meta
        assert meta is not None
        if abs(meta.stream_created_at.timestamp() - self.stream.created_at.timestamp()) > 1e-3:
            raise StreamRecreated(
                f"stream {self.stream.name!r} was created at {self.stream.created_at.isoformat()}, "
                f"but the checkpoints in table {self.table.table!r} belong to the stream created at "
                f"{meta.stream_created_at.isoformat()} (deleted and recreated?); to start over run "
                f"'efo checkpoints reset --delete-all --yes' with the same configuration"
            )
        if meta.complete:
            return
        initial = InitialPosition.parse(meta.initial_position)
        started_at = meta.started_at or datetime.now(UTC)
        graph = await list_shards(self._kinesis, self.stream.arn)
        for shard_id, shard in graph.shards.items():
            start = self._first_start_position(initial, graph, shard_id, started_at)
            await self.table.create_lease(shard_id, shard.parents, start)
        await self.table.complete_meta()
        self._log.info(
            "leases.bootstrapped", stream=self.stream.name, shards=len(graph.shards), initial_position=str(initial)
        )

    @staticmethod
    def _first_start_position(initial: InitialPosition, graph: ShardGraph, shard_id: str, now: datetime) -> Position:
        if initial.kind == "LATEST":
            # Closed shards hold only what was written before the first start: nothing to read.
            # LATEST means "from the first start": kept as that moment, not as the word LATEST,
            # so that no later claim (a crash, a handover before the first event) starts from a
            # later "now" and skips what was written in between.
            return SHARD_END if graph.is_closed(shard_id) else Position("AT_TIMESTAMP", timestamp=now)
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
                intake = [
                    group.create_task(self._discovery_loop(), name="shard-discovery"),
                    group.create_task(self._lease_loop(), name="lease-cycle"),
                ]
                await stop.wait()
                stop_at = self._clock()
                self._log.info("service.stopping", shards=len(self.owned))
                await self._stop_intake(intake)
                await self._wait_for_driver(driver_done, stop_at + self.settings.shutdown_timeout_s)
                await _cancelled(checkpoints)
                await self._finish()
                heartbeat.cancel()
        except Exception as error:
            await self._let_the_sink_commit(error)
            await self._finish()  # a fatal error: leave the table as tidy as it can be, then fail
            raise
        finally:
            if self._heartbeat_deadline is not None:
                self._heartbeat_deadline.cancel()

    async def _stop_intake(self, intake: list[asyncio.Task[None]]) -> None:
        """Nothing is claimed from here on, and every subscription stops reading."""
        self._stopping = True
        for task in intake:
            await _cancelled(task)
        tasks = []
        for owned in self.owned.values():
            if owned.phase.reading:
                owned.enter(ShardPhase.RELEASING)
                if owned.task is not None:
                    owned.task.cancel()
                    tasks.append(owned.task)
        await asyncio.gather(*tasks, return_exceptions=True)
        self.handoff.cut()  # nothing more comes in: the batch being filled goes to the sink now

    async def _let_the_sink_commit(self, error: Exception) -> None:
        """A fatal error: nothing is read any more, but the batch in the sink may still commit (within
        ``shutdown_timeout_s``), and its checkpoint must be among the final ones, as after SIGTERM.
        Not when the error is the sink itself being stuck."""
        self._stopping = True
        if isinstance(error, BaseExceptionGroup) and error.subgroup(SinkStalled) is not None:
            return
        deadline = self._clock() + self.settings.shutdown_timeout_s
        while self._batch_started_at is not None and self._clock() < deadline:
            await asyncio.sleep(HANDOVER_POLL_S)

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
        await self._write_checkpoint(owned)
        if owned.phase.terminal or not self._lease_valid():  # ended (SHARD_END), lost, or in doubt
            return 0
        if owned.phase is not ShardPhase.RELEASING:
            owned.enter(ShardPhase.RELEASING)
        try:
            await self.table.release(owned.lease)
        except LeaseLost as exc:
            self._lose(owned, str(exc))
            return 0
        if owned.phase.terminal:  # in doubt while the release was under way (it landed, fenced)
            return 0
        owned.enter(ShardPhase.RELEASED)
        self._forget(owned)
        METRICS.lease_changes.labels(reason="released").inc()
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
                # A write that lands late still counts (from when it was sent); past the validity it is moot.
                async with asyncio.timeout(self.lease_validity_s):
                    await self.table.heartbeat()
            except TimeoutError:
                self._log.warning("lease.heartbeat_failed", error=f"no answer within {self.lease_validity_s:g} s")
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
        self._heartbeat_ok_at = sent_at
        if self._heartbeat_deadline is not None:
            self._heartbeat_deadline.cancel()
        delay_s = max(0.0, sent_at + self.lease_validity_s - self._clock())
        self._heartbeat_deadline = asyncio.get_running_loop().call_later(delay_s, self._leases_expired)
        if self._leases_in_doubt:
            self._leases_in_doubt = False
            self._log.info("lease.heartbeat_recovered")
            self._cycle_now.set()  # read the table, then claim again what is still ours

    def _lease_valid(self) -> bool:
        return (
            not self._leases_in_doubt
            and self._heartbeat_ok_at is not None
            and self._clock() - self._heartbeat_ok_at < self.lease_validity_s
        )

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

    # ---- shards and leases -----------------------------------------------------------------

    async def _discovery_loop(self) -> None:
        """ListShards every ``shards.sync_interval_s`` (and when a shard ends): a lease for every
        shard born since (a split or a merge), read from its own beginning."""
        while True:
            try:
                asked_at = self._clock()
                graph = await list_shards(self._kinesis, self.stream.arn)
                known = {lease.shard_id for lease in (await self.table.read()).leases.values()}
                for shard_id, shard in graph.shards.items():
                    if shard_id not in known:
                        await self.table.create_lease(shard_id, shard.parents, Position("TRIM_HORIZON"))
                        self._log.info("shard.discovered", shard_id=shard_id, parents=list(shard.parents))
                self._graph, self._listed_at = graph, asked_at
                self._cycle_now.set()
            except EfoError as exc:
                if not exc.retriable:
                    raise
                self._log.warning("shards.sync_failed", error=str(exc), code=exc.code)
            await _wait(self._discover_now, self.settings.shards.sync_interval_s)

    async def _lease_loop(self) -> None:
        while True:
            try:
                if self._graph is not None and not self._leases_in_doubt:
                    state = await self.table.read()
                    self._table_read_at = self._clock()
                    await self._cycle(state, self._graph)
            except EfoError as exc:
                if not exc.retriable:
                    raise
                self._log.warning("leases.cycle_failed", error=str(exc), code=exc.code)
            await _wait(self._cycle_now, self.settings.lease.sync_interval_s)

    async def _cycle(self, state: TableState, graph: ShardGraph) -> None:
        """One read of the table, acted on: losses, requests, resets, then claims and handovers."""
        self._view.update(state)
        METRICS.workers_live.set(len(self._view.live))
        self._check_owned(state)
        await self._apply_requests(state, graph)
        if self._stopping or self._leases_in_doubt:
            return
        handing_over = {sid for sid, owned in self.owned.items() if owned.phase is ShardPhase.RELEASING}
        readable = []
        stranded = set()  # ours in the table, not running here (after leases were in doubt, a restart)
        for lease in state.leases.values():
            if not self._readable(lease, state, graph):
                continue
            if lease.shard_id in handing_over:
                # On its way: the asker's already (so nothing else is shed for it), or free for others.
                lease = replace(lease, owner=lease.wanted_by if lease.wanted_by in self._view.live else None)
            elif lease.owner == self.table.worker_id and lease.shard_id not in self.owned:
                lease = replace(lease, owner=None)  # ours in the table, not running here: take it back
                stranded.add(lease.shard_id)
            readable.append(lease)
        METRICS.shards_unowned.set(
            sum(1 for lease in readable if lease.owner is None or self._view.owner_is_dead(lease.owner))
        )
        settled_s = SETTLE_CYCLES * self.settings.lease.sync_interval_s
        busy = {sid for sid, owned in self.owned.items() if not owned.phase.reading}  # draining: leave it be
        moves = plan(
            self.table.worker_id,
            readable,
            self._view.live,
            moved_recently=self._view.moved_within(settled_s) | busy,
            reserved_for_others=self._view.reserved_for_others() | handing_over,
            asked=len(self._asked),
            may_ask=self._short_since is not None
            and self._clock() - self._short_since >= ASK_AFTER_CYCLES * self.settings.lease.sync_interval_s,
            max_leases=self.settings.lease.max_leases_per_worker,
            max_steals=self.settings.lease.max_steals_per_cycle,
        )
        if not moves.short:
            self._short_since = None
        elif self._short_since is None:
            self._short_since = self._clock()
        for lease in moves.claim:
            await self._claim(state.leases[lease.shard_id], graph)  # fenced on the lease as it is in the table
        # Ours in the table but beyond this worker's share: others see them held by a live worker and
        # would never take them (a spread of one asks for nothing), so give them up now.
        for shard_id in sorted(stranded - {lease.shard_id for lease in moves.claim}):
            await self._release_stranded(state.leases[shard_id])
        for shard_id in moves.shed:
            self._hand_over(self.owned[shard_id], f"above this worker's share of {moves.target}")
        for lease in moves.ask:
            await self._ask(lease)
        await self._take_overdue(state, graph, asked_now={lease.shard_id for lease in moves.ask})
        await self._finish_expired(state, graph)
        self._check_ready()

    def _readable(self, lease: Lease, state: TableState, graph: ShardGraph) -> bool:
        """Can be read now: not finished, still in the stream, its parents finished."""
        return not lease.finished and lease.shard_id in graph.shards and self._parents_finished(lease, state, graph)

    def _check_owned(self, state: TableState) -> None:
        """A lease another worker took (or reset) is dropped now, not at the next failed write."""
        for owned in list(self.owned.values()):
            lease = state.leases.get(owned.shard_id)
            if lease is None or lease.owner != self.table.worker_id or lease.counter != owned.epoch:
                holder = f"{lease.owner} (counter {lease.counter})" if lease is not None else "nobody (row gone)"
                self._lose(owned, f"the lease is now held by {holder}")

    async def _apply_requests(self, state: TableState, graph: ShardGraph) -> None:
        """Operators' resets (of finished leases first: their children may have to wait again) and
        other workers' handover requests for leases held here."""
        for lease in sorted(state.leases.values(), key=lambda lease: not lease.finished):
            owned = self.owned.get(lease.shard_id)
            if lease.reset is not None and lease.finished and lease.owner is None:
                try:
                    state.leases[lease.shard_id] = await self.table.apply_reset(lease)
                    self._log.info("shard.reset", shard_id=lease.shard_id, position=str(lease.reset.position))
                except LeaseLost:
                    continue
            elif lease.reset is not None and owned is not None and lease.counter == owned.epoch:
                await self._apply_reset(owned, lease, state, graph)
            elif lease.wanted_by and owned is not None and owned.phase.reading and lease.counter == owned.epoch:
                self._hand_over(owned, f"asked for by {lease.wanted_by}")

    async def _apply_reset(self, owned: OwnedShard, lease: Lease, state: TableState, graph: ShardGraph) -> None:
        """Restart the shard at the reset position, here and now: a new claim (a new epoch), so what
        the old one handed on is committed but moves nothing."""
        assert lease.reset is not None
        await self._stop_reading(owned)
        try:
            reset = await self.table.apply_reset(lease)
        except LeaseLost as exc:
            self._lose(owned, str(exc))
            return
        if owned.phase.terminal or self._stopping:
            return
        owned.enter(ShardPhase.RELEASED)
        self._forget(owned)
        owned.log.info("shard.reset", position=str(lease.reset.position))
        state.leases[lease.shard_id] = reset
        if self._readable(reset, state, graph):
            self._start(reset)
        else:  # its parents are to be read again first
            await self.table.release(reset)

    async def _claim(self, lease: Lease, graph: ShardGraph) -> None:
        try:
            claimed = await self.table.claim(lease)
        except LeaseLost:
            return
        self._asked.pop(lease.shard_id, None)
        if self._leases_in_doubt or self._stopping:
            return  # taken while this worker's leases went into doubt: claimed again once it is sure
        # Asked of a live worker (handed over, or taken overdue), not free or left by a dead one.
        stolen = lease.wanted_by == self.table.worker_id or (
            lease.owner not in (None, self.table.worker_id) and not self._view.owner_is_dead(lease.owner)
        )
        if lease.owner not in (None, self.table.worker_id):
            self._log.info("lease.taken", shard_id=lease.shard_id, previous_owner=lease.owner)
        METRICS.lease_changes.labels(reason="stolen" if stolen else "taken").inc()
        self._start(claimed)

    async def _release_stranded(self, lease: Lease) -> None:
        try:
            await self.table.release(lease)
        except LeaseLost:
            return
        METRICS.lease_changes.labels(reason="released").inc()
        self._log.info("lease.released_stranded", shard_id=lease.shard_id)

    async def _ask(self, lease: Lease) -> None:
        try:
            await self.table.want(lease)
        except LeaseLost:
            return
        self._asked[lease.shard_id] = self._clock()
        self._log.info("lease.asked", shard_id=lease.shard_id, owner=lease.owner)

    async def _take_overdue(self, state: TableState, graph: ShardGraph, asked_now: AbstractSet[str]) -> None:
        """A lease asked for and not handed over within ``failover_s`` is taken (fenced by the counter).
        ``asked_now``: asked in this cycle, after ``state`` was read (its request is not in it)."""
        for shard_id, asked_at in list(self._asked.items()):
            if shard_id in asked_now:
                continue
            lease = state.leases.get(shard_id)
            if lease is None or lease.wanted_by != self.table.worker_id or lease.finished:
                del self._asked[shard_id]  # taken, finished, or the request was cleared
                continue
            if lease.owner is not None and self._clock() - asked_at >= self.settings.lease.failover_s:
                self._log.warning("lease.taken_overdue", shard_id=shard_id, owner=lease.owner)
                await self._claim(lease, graph)
                self._asked.pop(shard_id, None)

    async def _finish_expired(self, state: TableState, graph: ShardGraph) -> None:
        """A shard gone from the stream (past its retention) before it was finished: nothing is
        left to read, and its children must not wait for it for ever. Gone means: missing from a
        listing asked for after its lease was first seen missing (another worker may have created
        the lease from a listing newer than this worker's)."""
        for shard_id in list(self._unlisted_since):
            if shard_id in graph.shards or shard_id not in state.leases:
                del self._unlisted_since[shard_id]
        for lease in state.leases.values():
            if lease.finished or lease.shard_id in graph.shards or lease.shard_id in self.owned:
                continue
            first_missing = self._unlisted_since.setdefault(lease.shard_id, self._clock())
            if self._listed_at <= first_missing + 2 * self.settings.shards.sync_interval_s:
                self._discover_now.set()  # list again (and again) before calling it gone
                continue
            if lease.owner not in (None, self.table.worker_id) and not self._view.owner_is_dead(lease.owner):
                continue
            try:
                claimed = await self.table.claim(lease)
            except LeaseLost:
                continue
            owned = self._own(claimed)
            METRICS.shards_expired.inc()
            owned.log.warning("shard.expired", position=str(claimed.checkpoint))
            self._end(owned, ())

    @staticmethod
    def _parents_finished(lease: Lease, state: TableState, graph: ShardGraph) -> bool:
        for parent in lease.parents:
            parent_lease = state.leases.get(parent)
            if parent_lease is not None and not parent_lease.finished and parent in graph.shards:
                return False
        return True

    def _own(self, lease: Lease, start: Position | None = None) -> OwnedShard:
        assert self._group is not None and not self._stopping
        owned = OwnedShard.claim(lease, self.table.worker_id, self._on_change, start=start)
        self.owned[owned.shard_id] = owned
        self.pool.register(owned.shard_id)
        METRICS.leases_held.set(len(self.owned))
        return owned

    def _start(self, lease: Lease) -> None:
        start = self._start_position(lease)
        owned = self._own(lease, start)
        owned.log.info("shard.started", position=str(start), checkpoint=str(lease.checkpoint))
        assert self._group is not None
        owned.task = self._group.create_task(self._run_shard(owned), name=f"shard-{owned.shard_id}")

    def _start_position(self, lease: Lease) -> Position:
        """The checkpoint, or with ``skip_older_than`` a checkpoint older than that: AT_TIMESTAMP
        (now - skip_older_than). What is younger is read; what is older is skipped, and counted."""
        limit_s = self.settings.skip_older_than_s
        start = lease.checkpoint
        if limit_s is None or start.kind == "LATEST" or lease.updated_at is None:
            return start
        age_s = (datetime.now(UTC) - lease.updated_at).total_seconds()
        if age_s <= limit_s:
            return start
        METRICS.positions_skipped.inc()
        skipped = Position("AT_TIMESTAMP", timestamp=datetime.now(UTC) - timedelta(seconds=limit_s))
        self._log.info(
            "shard.skipped_old",
            shard_id=lease.shard_id,
            checkpoint=str(start),
            age_s=round(age_s),
            position=str(skipped),
        )
        return skipped

    def _hand_over(self, owned: OwnedShard, reason: str) -> None:
        """Give the lease to the next owner without losing or repeating anything: stop reading, let
        the sink commit what was handed on, write the checkpoint, release. Within ``failover_s / 2``
        (what is not committed by then is read again by the next owner)."""
        if not owned.phase.reading or self._stopping:
            return
        owned.log.info("lease.handing_over", reason=reason)
        owned.enter(ShardPhase.RELEASING)  # now, so that the rest of this cycle counts it as leaving
        if owned.task is not None:
            owned.task.cancel()
        assert self._group is not None
        self._group.create_task(self._complete_handover(owned), name=f"handover-{owned.shard_id}")

    async def _complete_handover(self, owned: OwnedShard) -> None:
        started = self._clock()
        await self._stop_reading(owned)
        if owned.ledger.outstanding:
            self.handoff.cut()  # its last records may sit in the batch being filled: send it to the sink now
        deadline = started + self.settings.lease.failover_s / 2
        while owned.ledger.outstanding and self._clock() < deadline and not owned.phase.terminal:
            await asyncio.sleep(HANDOVER_POLL_S)
        if owned.phase.terminal or self._stopping:
            return  # lost meanwhile, or the stop releases it
        await self._write_checkpoint(owned)
        if owned.phase.terminal:
            return
        try:
            await self.table.release(owned.lease)
        except LeaseLost as exc:
            self._lose(owned, str(exc))
            return
        if owned.phase.terminal:
            return
        owned.enter(ShardPhase.RELEASED)
        self._forget(owned)
        METRICS.lease_changes.labels(reason="handed_over").inc()
        owned.log.info(
            "lease.handed_over",
            waited_s=round(self._clock() - started, 3),
            uncommitted_chunks=owned.ledger.outstanding,
            checkpoint=str(owned.ledger.written),
        )

    async def _stop_reading(self, owned: OwnedShard) -> None:
        if owned.phase.reading:
            owned.enter(ShardPhase.RELEASING)
        if owned.task is not None and not owned.task.done():
            owned.task.cancel()
            await asyncio.gather(owned.task, return_exceptions=True)

    async def _run_shard(self, owned: OwnedShard) -> None:
        await self._subscriber.ensure_room(len(self.owned))
        subscription = ShardSubscription(
            client=self._subscriber,
            consumer_arn=self.consumer_arn,
            stream=self.stream.name,
            shard_id=owned.shard_id,
            start=owned.ledger.start,
            pool=self.pool,
            handoff=self.handoff,
            progress=owned.ledger,
            settings=self.settings.subscription,
            epoch=owned.epoch,
            backpressure_timeout_s=self.settings.pool.backpressure_timeout_s,
            on_corrupt_aggregate=self.settings.on_corrupt_aggregate,
            lease_check=lambda: self.table.holds(owned.lease),
            on_phase=owned.enter,
            on_first_event=lambda first: self._pin(owned),
            series=owned.series,
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

    async def _pin(self, owned: OwnedShard) -> None:
        """LATEST and AT_TIMESTAMP name a moment: write the first event's position before any of its
        records moves on, so that no later claim (after a crash, a failover) starts from "now" again."""
        pin = owned.ledger.due
        if pin is None:  # a start that names a record already: nothing to pin
            return
        backoff = Backoff(self.settings.subscription.backoff_initial_s, self.settings.subscription.backoff_max_s)
        while owned.ledger.written != pin:
            if owned.phase.terminal:
                raise LeaseLost(f"lease of shard {owned.shard_id} lost before its start position was pinned")
            await self._write_checkpoint(owned)
            if owned.ledger.written != pin:
                await asyncio.sleep(backoff.next_delay_s())

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` until it succeeds or fails for a reason that is not retriable."""
        backoff = Backoff(self.settings.subscription.backoff_initial_s, self.settings.subscription.backoff_max_s)
        while True:
            try:
                return await call()
            except EfoError as exc:
                if not exc.retriable:
                    raise
                self._log.warning("aws.retry", error=str(exc), code=exc.code)
                await asyncio.sleep(backoff.next_delay_s())

    async def _not_found(self, owned: OwnedShard, error: ResourceNotFound) -> None:
        """The consumer, the stream or the shard is gone. Only the last one is not fatal."""
        graph = await self._retrying(lambda: list_shards(self._kinesis, self.stream.arn))
        if owned.shard_id not in graph.shards:
            METRICS.shards_expired.inc()
            owned.log.warning("shard.expired", position=str(owned.ledger.written), error=str(error))
            self._end(owned, ())
            return
        consumer = await self._retrying(
            lambda: describe_consumer(self._kinesis, stream_arn=self.stream.arn, arn=self.consumer_arn)
        )
        if consumer is None:
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
        METRICS.lease_changes.labels(reason="lost").inc()
        owned.log.warning("lease.lost", reason=reason)
        if owned.task is not None and owned.task is not asyncio.current_task():
            owned.task.cancel()
        self._forget(owned)

    def _forget(self, owned: OwnedShard) -> None:
        if self.owned.get(owned.shard_id) is owned:
            del self.owned[owned.shard_id]
            METRICS.forget_shard(owned.shard_id)
        self.pool.unregister(owned.shard_id)
        METRICS.leases_held.set(len(self.owned))
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
            owned = self.owned.get(commit.shard_id)
            if owned is None or not owned.committed(commit):
                stale += 1  # an earlier claim's: its records are read again by the current owner
                continue
            owned.series.committed(commit.records, commit.bytes)
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
        if not self._lease_valid():
            return  # no heartbeat landed for too long: another worker may hold the lease by now
        records = owned.ledger.uncheckpointed_records
        started = self._clock()
        try:
            if due == SHARD_END:
                owned.lease = await self.table.finish(owned.lease)
            else:
                owned.lease = await self.table.checkpoint(owned.lease, due, lag_ms=owned.series.lag_ms)
        except LeaseLost as exc:
            METRICS.checkpoint_writes.labels(outcome="conflict").inc()
            self._lose(owned, str(exc))
            return
        except EfoError as exc:
            METRICS.checkpoint_writes.labels(outcome="error").inc()
            if not exc.retriable:
                raise
            owned.log.warning("checkpoint.failed", error=str(exc), code=exc.code)
            return
        finally:
            METRICS.checkpoint_write_seconds.observe(self._clock() - started)
        METRICS.checkpoint_writes.labels(outcome="ok").inc()
        if owned.phase.terminal:  # lost while the write was under way (it still landed, fenced)
            return
        owned.ledger.wrote(due, records)
        self._apply_backlog_bound()
        if due == SHARD_END:
            owned.enter(ShardPhase.ENDED)
            METRICS.lease_changes.labels(reason="finished").inc()
            owned.log.info("checkpoint.shard_end", children=list(owned.children))
            self._forget(owned)
            self._discover_now.set()  # its children may start now
        else:
            owned.log.debug("checkpoint.written", position=str(due))

    # ---- readiness ------------------------------------------------------------------------

    def table_problem(self) -> str | None:
        """/readyz: None while the lease table was read within ``failover_s`` (or 3 cycles)."""
        bound_s = max(self.settings.lease.failover_s, 3 * self.settings.lease.sync_interval_s)
        if self._table_read_at is None:
            return "the lease table has not been read yet"
        age_s = self._clock() - self._table_read_at
        if age_s > bound_s:
            return f"the lease table was last read {age_s:.0f} s ago (more than {bound_s:g} s)"
        return None

    def shards_problem(self) -> str | None:
        """/readyz: None once every shard this worker reads has a subscription (none to own is fine)."""
        owned_now = tuple(self.owned.values())  # one copy: this runs on the HTTP server's thread
        if self._leases_in_doubt:
            return "no heartbeat landed for the lease validity: every lease was dropped until one does"
        if not self._ready:
            waiting = sum(1 for owned in owned_now if owned.phase.reading and not owned.first_event)
            return f"waiting for the first lease cycle or the first event of {waiting} shard(s)"
        now = time.monotonic()  # the clock of OwnedShard.phase_since
        stuck = sorted(
            owned.shard_id
            for owned in owned_now
            if owned.phase is ShardPhase.SUBSCRIBING and now - owned.phase_since > SUBSCRIBING_READY_S
        )
        if stuck:
            return f"{len(stuck)} shard(s) without a subscription for over {SUBSCRIBING_READY_S:g} s: " + ", ".join(
                stuck[:5]
            )
        return None

    def _check_ready(self) -> None:
        """Ready: a lease cycle has run and every shard it claimed has delivered its first event
        (from here LATEST holds); a worker with no share of the shards is ready with none."""
        if self._ready or self._graph is None or self._leases_in_doubt:
            return  # in doubt, it holds nothing because it may not: not "ready with none"
        reading = [owned for owned in self.owned.values() if owned.phase.reading]
        if all(owned.first_event for owned in reading):
            self._ready = True
            self._log.info("service.ready", stream=self.stream.name, shards=len(reading))


async def _cancelled(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    """Until ``event`` is set or ``timeout_s`` passed; the event is cleared for the next wait."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        pass
    event.clear()
