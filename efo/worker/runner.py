"""One shard's claim from its start position to its release (KCL's ShardConsumer).

:meth:`ShardRunner.start` owns the lease here and runs its subscription as a task of the group;
the subscription ends at the shard's end (DRAINING, then SHARD_END once the sink committed the
last record), when the lease is lost, or when it is stopped here. :meth:`ShardRunner.hand_over`
gives a lease to the next owner without losing or repeating anything; :meth:`ShardRunner.release`
is the final checkpoint and release of a stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import structlog

from efo.clock import SYSTEM_CLOCK, Clock
from efo.config import Settings
from efo.errors import EfoError, LeaseLost, ResourceNotFound
from efo.kinesis.registration import StreamInfo, describe_consumer
from efo.kinesis.shards import list_shards
from efo.kinesis.subscription import Backoff, ShardEnded, ShardSubscription, SubscriptionStopped
from efo.leases.lifecycle import OwnedShard, ShardPhase
from efo.leases.model import Lease
from efo.leases.table import LeaseTable
from efo.observability import METRICS
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import Position
from efo.worker.bound import BoundState, ShardBound
from efo.worker.checkpointer import Checkpointer
from efo.worker.liveness import LeaseTrust
from efo.worker.owned import OwnedLeases

if TYPE_CHECKING:
    from efo.worker.bound import RunEnd

log = structlog.get_logger("efo.worker.runner")

T = TypeVar("T")
Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]

HANDOVER_POLL_S = 0.05


class ChildLeases(Protocol):
    """Where the leases of a closed shard's children are created (efo.worker.shardsync.ShardSync)."""

    async def born(self, children: Mapping[str, tuple[str, ...]]) -> None: ...


class ShardRunner:
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
        owned: OwnedLeases,
        checkpointer: Checkpointer,
        stopping: asyncio.Event,
        trust: LeaseTrust,
        calls_end: asyncio.Event | None = None,
        on_ended: Callable[[OwnedShard], None] = lambda owned: None,
        children: ChildLeases,
        bounds: RunEnd | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._settings = settings
        self._children = children
        self._stream = stream
        self._consumer_arn = consumer_arn
        self._kinesis = kinesis
        self._subscriber = subscriber
        self._table = table
        self._pool = pool
        self._handoff = handoff
        self._owned = owned
        self._checkpointer = checkpointer
        self._stopping = stopping
        self._calls_end = stopping if calls_end is None else calls_end  # set: no new SubscribeToShard
        self._trust = trust
        self._on_ended = on_ended
        self._bounds = bounds  # a bounded run (run.until): each claim stops at the run's end
        self._clock = clock
        self.spawn: Spawn | None = None  # the task group's create_task, set while the group runs
        self._log = log.bind(worker_id=table.worker_id)

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        assert self.spawn is not None, "the task group is not running"
        return self.spawn(coroutine, name)

    # ---- start --------------------------------------------------------------------------------

    def start(self, lease: Lease) -> OwnedShard:
        """Own ``lease`` here and read it from its start position."""
        assert not self._stopping.is_set()
        start = self.start_position(lease)
        owned = self._owned.own(lease, start)
        owned.log.info("shard.started", position=str(start), checkpoint=str(lease.checkpoint))
        owned.task = self._spawn(self._run(owned), f"shard-{owned.shard_id}")
        return owned

    def start_position(self, lease: Lease) -> Position:
        """The checkpoint, or with ``skip_older_than`` a checkpoint older than that: AT_TIMESTAMP
        (now - skip_older_than). What is younger is read; what is older is skipped, and counted."""
        limit_s = self._settings.skip_older_than_s
        start = lease.checkpoint
        if limit_s is None or start.kind == "LATEST" or lease.updated_at is None:
            return start
        now = self._clock.wall()
        age_s = (now - lease.updated_at).total_seconds()
        if age_s <= limit_s:
            return start
        METRICS.positions_skipped.labels(stream=self._owned.stream).inc()
        skipped = Position("AT_TIMESTAMP", timestamp=now - timedelta(seconds=limit_s))
        self._log.info(
            "shard.skipped_old",
            shard_id=lease.shard_id,
            checkpoint=str(start),
            age_s=round(age_s),
            position=str(skipped),
        )
        return skipped

    async def _run(self, owned: OwnedShard) -> None:
        await self._subscriber.ensure_room(len(self._owned))
        bound = self._bounds.track(owned) if self._bounds is not None else None
        subscription = ShardSubscription(
            client=self._subscriber,
            consumer_arn=self._consumer_arn,
            stream=self._stream.name,
            shard_id=owned.shard_id,
            start=owned.ledger.start,
            pool=self._pool,
            handoff=self._handoff if bound is None else cast(Handoff, bound),
            progress=owned.ledger if bound is None else bound,
            settings=self._settings.subscription,
            epoch=owned.epoch,
            backpressure_timeout_s=self._settings.pool.backpressure_timeout_s,
            on_corrupt_aggregate=self._settings.on_corrupt_aggregate,
            lease_check=lambda: self._table.holds(owned.lease),
            on_phase=owned.enter,
            on_first_event=lambda first: self._checkpointer.pin(owned),
            on_subscribed=owned.subscribed,
            on_call=owned.call_under_way,
            previous_call_at=owned.lease.subscribed_at,
            stopping=self._calls_end,
            series=owned.series,
            logger=owned.log,
            clock=self._clock,
        )
        try:
            ended = await subscription.run() if bound is None else await bound.read(subscription.run())
        except LeaseLost as exc:  # another worker owns the shard now: stop it here, nothing else
            self._owned.lose(owned, str(exc))
            return
        except SubscriptionStopped:  # the stop releases it
            if owned.phase.reading:
                owned.enter(ShardPhase.RELEASING)
            return
        except ResourceNotFound as exc:
            await self._not_found(owned, exc)
            return
        if bound is not None and bound.state is BoundState.CUT:
            ended = None  # cut (--until TIME): never SHARD_END over the cut's checkpoint, whatever was read past it
        if ended is None:  # the run's end (run.until): the lease stays here until the run ends
            if owned.phase.reading:
                owned.enter(ShardPhase.AT_BOUND)
            return
        await self._children_born(ended, bound)
        self.end(owned, ended.child_shard_ids)

    async def _children_born(self, ended: ShardEnded, bound: ShardBound | None = None) -> None:
        """The children's leases, from the shard's last event, before its SHARD_END: they can be read
        as soon as it is written, without a listing of the stream. A write that fails for a reason that
        passes is tried again (with backoff) until it lands: the children cannot be read before the
        parent's SHARD_END anyway, and the listing that would write them otherwise may be far off (the
        first live worker in name order lists, and that may be one that stopped and whose row stays
        until its watchers reap it). A stop or a lost lease cancels the wait; the next owner reads the
        last event again. In a bounded run the wait is the shard's activity (``bound``): not silence,
        which run.shard_timeout_s would blame on Kinesis; run.max_duration_s bounds it."""
        backoff = self._backoff()
        while True:
            try:
                await self._children.born(dict(ended.child_parents))
                return
            except EfoError as exc:
                if not exc.retriable:
                    raise
                self._log.warning("shard.children_not_created", error=str(exc), code=exc.code)
            if bound is not None:
                bound.activity_at = self._clock.now()
            await self._clock.sleep(backoff.next_delay_s())

    def end(self, owned: OwnedShard, children: tuple[str, ...]) -> None:
        """The shard's last event was handed on: SHARD_END once the sink committed it."""
        owned.children = children
        owned.enter(ShardPhase.DRAINING)
        owned.ledger.ended()
        self._on_ended(owned)

    async def _not_found(self, owned: OwnedShard, error: ResourceNotFound) -> None:
        """The consumer, the stream or the shard is gone. Only the last one is not fatal."""
        graph = await self._retrying(lambda: list_shards(self._kinesis, self._stream.arn))
        if owned.shard_id not in graph.shards:
            METRICS.shards_expired.labels(stream=self._owned.stream).inc()
            owned.log.warning("shard.expired", position=str(owned.ledger.written), error=str(error))
            self.end(owned, ())
            return
        consumer = await self._retrying(
            lambda: describe_consumer(self._kinesis, stream_arn=self._stream.arn, arn=self._consumer_arn)
        )
        if consumer is None:
            raise ResourceNotFound(
                f"consumer {self._consumer_arn} is no longer registered on stream {self._stream.name!r} "
                "(deregistered while running?); register it again ('efo consumer register') and restart"
            ) from None
        raise error

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` until it succeeds or fails for a reason that is not retriable."""
        backoff = self._backoff()
        while True:
            try:
                return await call()
            except EfoError as exc:
                if not exc.retriable:
                    raise
                self._log.warning("aws.retry", error=str(exc), code=exc.code)
                await self._clock.sleep(backoff.next_delay_s())

    # ---- stop ---------------------------------------------------------------------------------

    async def stop_reading(self, owned: OwnedShard) -> None:
        if owned.phase.reading:
            owned.enter(ShardPhase.RELEASING)
        if owned.task is not None and not owned.task.done():
            owned.task.cancel()
            await asyncio.gather(owned.task, return_exceptions=True)

    def hand_over(self, owned: OwnedShard, reason: str) -> None:
        """Give the lease to the next owner without losing or repeating anything: stop reading, let
        the sink commit what was handed on, write the checkpoint, release. Within ``failover_s / 2``
        (what is not committed by then is read again by the next owner)."""
        if not owned.phase.reading or self._stopping.is_set():
            return
        owned.log.info("lease.handing_over", reason=reason)
        owned.enter(ShardPhase.RELEASING)  # now, so that the rest of this cycle counts it as leaving
        if owned.task is not None:
            owned.task.cancel()
        self._spawn(self._complete_handover(owned), f"handover-{owned.shard_id}")

    async def _complete_handover(self, owned: OwnedShard) -> None:
        started = self._clock.now()
        await self.stop_reading(owned)
        if owned.ledger.outstanding:
            self._handoff.cut()  # its last records may sit in the batch being filled: send it to the sink now
        deadline = started + self._settings.lease.failover_s / 2
        while owned.ledger.outstanding and self._clock.now() < deadline and not owned.phase.terminal:
            await self._clock.sleep(HANDOVER_POLL_S)
        if owned.phase.terminal or self._stopping.is_set():
            return  # lost meanwhile, or the stop releases it
        if await self._give_up(owned, self._clock.now() + self._settings.lease.failover_s / 2):
            METRICS.lease_changes.labels(stream=self._owned.stream, reason="handed_over").inc()
            owned.log.info(
                "lease.handed_over",
                waited_s=round(self._clock.now() - started, 3),
                uncommitted_chunks=owned.ledger.outstanding,
                checkpoint=str(owned.ledger.written),
            )

    async def release(self, owned: OwnedShard, deadline: float) -> bool:
        """A stop's last word on a claim: its checkpoint, then the lease released, each tried again
        until ``deadline``. True if released."""
        await self.stop_reading(owned)
        if owned.phase.terminal:
            return False
        if await self._give_up(owned, deadline):
            METRICS.lease_changes.labels(stream=self._owned.stream, reason="released").inc()
            return True
        return False

    async def _give_up(self, owned: OwnedShard, deadline: float) -> bool:
        """Checkpoint, then release (both fenced, each tried again after throttling or an outage until
        ``deadline``); False if the claim ended, was lost or is in doubt, or the release did not land.

        A checkpoint that cannot land by the deadline does not hold the release back: the next owner
        reads again from the checkpoint in the table (what was committed since, read twice), which is
        better than a shard nobody reads. A release that cannot land leaves the claim ABANDONED: the
        lease stays this worker's in the table, and the lease cycle releases it or claims it again."""
        backoff = self._backoff()
        while owned.ledger.due is not None and not owned.phase.terminal and self._clock.now() < deadline:
            await self._checkpointer.write(owned)
            if owned.ledger.due is not None:
                await self._clock.sleep(min(backoff.next_delay_s(), max(0.0, deadline - self._clock.now())))
        if owned.phase.terminal:  # ended (SHARD_END) or lost
            return False
        if not self._trust.valid:  # in doubt: another worker may hold it by now; it expires instead
            owned.log.warning("lease.release_skipped", reason="leases in doubt (no heartbeat landed lately)")
            return False
        if owned.ledger.due is not None:
            owned.log.warning(
                "checkpoint.final_failed",
                due=str(owned.ledger.due),
                checkpoint=str(owned.ledger.written),
                hint="the next owner reads again from the checkpoint in the table",
            )
        if owned.phase is not ShardPhase.RELEASING:
            owned.enter(ShardPhase.RELEASING)
        backoff = self._backoff()
        while True:
            try:
                await self._table.release(owned.lease, subscribed_at=owned.subscribed_at)
                break
            except LeaseLost as exc:
                self._owned.lose(owned, str(exc))
                return False
            except EfoError as exc:
                if not exc.retriable:
                    raise
                delay_s = backoff.next_delay_s()
                if owned.phase.terminal or self._clock.now() + delay_s >= deadline:
                    owned.log.warning("lease.release_failed", error=str(exc), code=exc.code)
                    if not owned.phase.terminal:
                        owned.enter(ShardPhase.ABANDONED)
                        self._owned.forget(owned)
                    return False
                await self._clock.sleep(delay_s)
        if owned.phase.terminal:  # in doubt while the release was under way (it landed, fenced)
            return False
        owned.enter(ShardPhase.RELEASED)
        self._owned.forget(owned)
        return True

    def _backoff(self) -> Backoff:
        subscription = self._settings.subscription
        return Backoff(subscription.backoff_initial_s, subscription.backoff_max_s)
