"""The coordinator: wires one worker's parts together and orders its start-up and shutdown
(KCL's Scheduler). One task group owns every task.

The parts (each alone in a module of :mod:`efo.worker`, each tested alone):

- :class:`~efo.worker.liveness.Liveness` writes the heartbeat and says whether the leases can still
  be trusted; when they cannot (no heartbeat landed for ``failover_s`` minus one interval), every
  lease is dropped and nothing is claimed or written until a heartbeat lands again;
- :class:`~efo.worker.shardsync.ShardSync` bootstraps the leases at the application's first start
  and creates leases for shards born later (splits, merges);
- :class:`~efo.worker.cycle.LeaseCycle` reads the lease table and acts on it: drops what another
  worker took, applies resets and handover requests, claims its share, hands over what it holds
  above it and asks for what it lacks;
- :class:`~efo.worker.runner.ShardRunner` runs each claim (its own subscription task, its own
  checkpoint ledger) and hands leases over: the subscription stops, the sink commits what was
  handed on, the checkpoint is written and the lease released, so the next owner starts where
  this one stopped, nothing lost and nothing read twice;
- :class:`~efo.worker.checkpointer.Checkpointer` turns the Spark driver's commits into fenced,
  coalesced checkpoint writes, and stops the worker when a batch stalls in the sink;
- :class:`~efo.worker.owned.OwnedLeases` is the only writer of the set of shards held here.

Stopping (SIGTERM): nothing new is claimed; every subscription stops, once the youngest is 5 s old
(Kinesis would not take the next owner's call sooner: :meth:`Coordinator._read_on`); the driver gets until
``shutdown_timeout_s`` to commit what it holds; the committed positions are checkpointed and every
lease held is released, so the next worker takes over at once. A fatal error of any task ends the
group the same way (bounded), then fails.

A bounded run (``run.until``, :mod:`efo.worker.bound`) also stops on its own: once every shard is
at the run's end, nothing more is read, the sink commits everything handed on, the checkpoints are
written and the leases released, and :attr:`Coordinator.completed` says the run is whole.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import structlog

from efo.clock import SYSTEM_CLOCK, Clock
from efo.config import Settings
from efo.errors import EfoError, SinkStalled
from efo.kinesis.registration import StreamInfo
from efo.leases.lifecycle import MIN_RENEW_INTERVAL_S, Commit, OwnedShard, ShardPhase
from efo.leases.table import LeaseTable
from efo.observability import METRICS
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.worker.bound import RunEnd
from efo.worker.checkpointer import Checkpointer, SharedBacklog
from efo.worker.cycle import LeaseCycle, parents_finished
from efo.worker.liveness import HeartbeatWriter, Liveness, Trust
from efo.worker.owned import OwnedLeases
from efo.worker.runner import HANDOVER_POLL_S, ShardRunner, Spawn
from efo.worker.shardsync import ShardSync
from efo.worker.streams import StreamShares

log = structlog.get_logger("efo.coordinator")

#: After the driver is done (or its time is up): the last checkpoints and releases, at most this long,
#: this many at once (256 shards release in about 3 s against moto, well under a second on AWS).
FINAL_WRITES_TIMEOUT_S = 5.0
FINAL_WRITES_CONCURRENCY = 16
#: A stop's first heartbeat, the one that says it leaves, is waited for at most this long.
LEAVE_TIMEOUT_S = 2.0
#: A stop reads on at most this long: its youngest subscription is under MIN_RENEW_INTERVAL_S old
#: as it begins, and one renewed meanwhile is that old that much later.
READ_ON_MAX_S = 2 * MIN_RENEW_INTERVAL_S
#: While a stop reads on for a call under way, it looks again this often (the call may fail).
CALL_RECHECK_S = 0.25
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
        heartbeats: HeartbeatWriter | None = None,
        shares: StreamShares | None = None,
        shared_backlog: SharedBacklog | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.settings = settings
        self.stream = stream
        self.consumer_arn = consumer_arn
        self.table = table
        self.pool = pool
        self.handoff = handoff
        self._clock = clock
        self._log = log.bind(worker_id=table.worker_id)
        self._ready = False
        self.stopping = asyncio.Event()  # nothing new is claimed or started
        #: No new SubscribeToShard: set with ``stopping``, but on a stop that reads on, once it has.
        self.calls_end = asyncio.Event()
        #: No subscription reads any more (a stop's reading on is over, or the run ended): the driver
        #: commits what it has and ends.
        self.intake_stopped = asyncio.Event()
        self._spawn: Spawn | None = None  # the task group's create_task, while it runs
        METRICS.add_stream(stream.name)  # its series at 0 from the start
        self.owned = OwnedLeases(table.worker_id, pool, self._on_change, stream=stream.name, clock=clock)
        self.liveness = Liveness(
            heartbeats or table,
            settings.lease,
            on_expired=self._leases_expired,
            on_recovered=self._recovered,
            clock=clock,
        )
        self.checkpointer = Checkpointer(
            table=table,
            owned=self.owned,
            pool=pool,
            settings=settings,
            trust=self.liveness,
            on_shard_end=self._shard_ended,  # its children may start now
            shared_backlog=shared_backlog,
            clock=clock,
        )
        # It writes the claims of ``owned``, which tells it when one leaves (the backlog bound is checked again).
        self.owned.connect(self.checkpointer)
        self.shards = ShardSync(
            settings=settings,
            stream=stream,
            kinesis=kinesis,
            table=table,
            clock=clock,
        )
        until = settings.run.bound
        #: A bounded run (run.until): where each shard's reading ends, and when this worker is done.
        self.bounds = (
            None
            if until is None
            else RunEnd(
                settings=settings.run,
                until=until,
                worker_id=table.worker_id,
                handoff=handoff,
                pool=pool,
                owned=self.owned,
                listing=self.shards,
                parents_finished=parents_finished,
                clock=clock,
                stream=stream.name,
            )
        )
        #: A bounded run that reached its end: everything read was committed and checkpointed.
        self.completed = False
        #: Why a bounded run is not complete: "stopped" (a stop was asked for), "max_duration"
        #: (run.max_duration_s reached) or "final_writes" (a final checkpoint or release did not land).
        self.incomplete: str | None = None
        self.runner = ShardRunner(
            settings=settings,
            stream=stream,
            consumer_arn=consumer_arn,
            kinesis=kinesis,
            subscriber=subscriber,
            table=table,
            pool=pool,
            handoff=handoff,
            owned=self.owned,
            checkpointer=self.checkpointer,
            stopping=self.stopping,
            trust=self.liveness,
            calls_end=self.calls_end,
            on_ended=self._on_change,
            children=self.shards,
            bounds=self.bounds,
            clock=clock,
        )
        self.cycle = LeaseCycle(
            settings=settings,
            table=table,
            owned=self.owned,
            runner=self.runner,
            shards=self.shards,
            stopping=self.stopping,
            trust=self.liveness,
            after_cycle=self._check_ready,
            shares=shares,
            clock=clock,
        )
        # The cycle reads the listing and the listing reads the cycle's last read of the table (and so
        # does the run's end, which the runner the cycle drives takes): connected once both exist.
        self.shards.connect(self.cycle)
        if self.bounds is not None:
            self.bounds.connect(self.cycle)
        self._heartbeat: asyncio.Task[None] | None = None

    # ---- start-up -------------------------------------------------------------------------

    async def check(self) -> None:
        """Before anything runs: refuse a table that belongs to an earlier stream of the same name."""
        await self.shards.check()

    async def bootstrap(self) -> None:
        """At the application's first start, a lease for every shard at the initial position."""
        await self.shards.bootstrap()

    # ---- the task group -------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, driver_done: asyncio.Event) -> None:
        """Run until ``stop``; then stop intake, give the driver until ``shutdown_timeout_s``,
        checkpoint what it committed and release every lease. A fatal error of any task ends the
        group; what was committed is still checkpointed and the leases released (bounded)."""
        await self.liveness.beat()  # liveness first: before any lease work, and never behind it
        try:
            async with asyncio.TaskGroup() as group:
                self._spawn = self.runner.spawn = lambda coroutine, name: group.create_task(coroutine, name=name)
                # Before each heartbeat: has a batch been in the sink too long (SinkStalled ends the group)?
                beats = self.liveness.run(before_beat=self.checkpointer.check_batch_progress)
                self._heartbeat = heartbeat = group.create_task(beats, name="heartbeat")
                checkpoints = group.create_task(self.checkpointer.run(), name="checkpoints")
                intake: list[asyncio.Task[None]] = []
                intake.append(group.create_task(self._start_intake(group, intake), name="bootstrap"))
                if self.bounds is None:
                    await stop.wait()  # also during the bootstrap, which a stop cuts short
                else:
                    intake.append(group.create_task(self.bounds.run(), name="run-end"))
                    await _first_of(stop, self.bounds.finished)
                complete = self.bounds is not None and not stop.is_set()
                stop_at = self._clock.now()
                self._log.info("run.stopping" if complete else "service.stopping", shards=len(self.owned))
                await self._stop_intake(intake, None if complete else driver_done)
                if complete:
                    complete = await self._drain(stop)
                if not complete:
                    await self._wait_for_driver(driver_done, stop_at + self.settings.shutdown_timeout_s)
                await _cancelled(checkpoints)
                final = await self._finish()
                heartbeat.cancel()
                out_of_time = self.bounds is not None and self.bounds.out_of_time
                self.completed = complete and final and not out_of_time  # exit 0 only at the end, all written
                if self.bounds is not None and not self.completed:
                    self.incomplete = "final_writes" if not final else "max_duration" if out_of_time else "stopped"
        except Exception as error:
            await self._let_the_sink_commit(error)
            await self._finish()  # a fatal error: leave the table as tidy as it can be, then fail
            raise
        finally:
            self.intake_stopped.set()
            self.liveness.close()

    async def _start_intake(self, group: asyncio.TaskGroup, intake: list[asyncio.Task[None]]) -> None:
        """The leases bootstrapped, then shard discovery and the lease cycle (added to ``intake``)."""
        await self.bootstrap()
        intake.append(group.create_task(self.shards.run(), name="shard-discovery"))
        intake.append(group.create_task(self.cycle.run(), name="lease-cycle"))

    async def _stop_intake(self, intake: list[asyncio.Task[None]], driver: asyncio.Event | None) -> None:
        """Nothing is claimed from here on, and every subscription stops reading: at once at a
        bounded run's end (``driver`` None); on a stop after :meth:`_read_on`, except the claims only
        waiting to call (a first call paced, a retry after a backoff: not read, and a call of theirs
        would start another 5 s for the next owner; not one subscribed under 5 s ago, whose first
        event may be on its way), stopped now. A stop with no young subscription
        and no call under way (nothing to read on for) makes no new call from its first moment; one
        that reads on goes on renewing what Kinesis ends until it has."""
        began = self._clock.now()
        self.stopping.set()
        reads_on = driver is not None and _read_on_s(self._ages_s(self._clock.wall())) > 0
        if not reads_on:
            self.calls_end.set()
        for task in intake:  # a cycle under way may be writing claims: it ends here
            await _cancelled(task)
        watching: asyncio.Task[None] | None = None
        if driver is not None:
            await self._stop_waiting()
            # While it reads on, its cycles only watch its part of the ring (the others count on it
            # to find a death) and drop what it lost: they claim nothing.
            assert self._spawn is not None
            watching = self._spawn(self.cycle.run(), "lease-cycle-stopping")
            budget_s = self.settings.shutdown_timeout_s / 2  # the rest is the sink's
            await self._leave(min(LEAVE_TIMEOUT_S, budget_s))
            await self._read_on(driver, budget_s - (self._clock.now() - began))
        self.calls_end.set()
        if watching is not None:
            await _cancelled(watching)
        await self._stop_reading(owned for owned in self.owned.values() if owned.phase.reading)
        self.handoff.cut()  # nothing more comes in: the batch being filled goes to the sink now
        self.intake_stopped.set()

    async def _leave(self, timeout_s: float) -> None:
        """It says it is leaving, twice: on the version row, so that every worker's next cycle counts
        no share for it (each claims what it releases as soon as it does, rather than once its row
        is gone); and in its heartbeat, so that the workers watching it (they read its row every
        cycle) watch on past it from their next cycle, not from when its row is gone (it watches on
        while it reads on, not while it waits for the driver). Bounded; a failure only delays that."""
        try:
            async with self._clock.timeout(timeout_s):
                for said in await asyncio.gather(self.table.leaving(), self.liveness.leave(), return_exceptions=True):
                    if isinstance(said, BaseException):
                        raise said
        except (TimeoutError, EfoError) as exc:
            self._log.warning("worker.leave_failed", error=str(exc) or type(exc).__name__)

    @staticmethod
    async def _stop_reading(claims: Iterable[OwnedShard]) -> None:
        tasks = []
        for owned in list(claims):
            owned.enter(ShardPhase.RELEASING)
            if owned.task is not None:
                owned.task.cancel()
                tasks.append(owned.task)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _read_on(self, driver: asyncio.Event, budget_s: float) -> None:
        """Kinesis takes the next owner's SubscribeToShard only ``MIN_RENEW_INTERVAL_S`` after this
        worker's last one: a shard released sooner goes unread until then. So the subscriptions read
        on, and the driver commits what they read, until the youngest is that old, a call under way
        counted as made now (a renewal of one that Kinesis ended meanwhile; looked at again every
        CALL_RECHECK_S, and a claim whose call failed is stopped): at most READ_ON_MAX_S and
        ``budget_s`` (what is left of half of ``shutdown_timeout_s``: the rest is the sink's), less
        if the driver ends first."""
        deadline = self._clock.now() + min(budget_s, READ_ON_MAX_S)
        logged_until = 0.0
        while not driver.is_set():
            await self._stop_waiting()
            ages_s = self._ages_s(self._clock.wall())
            now = self._clock.now()
            until = min(now + _read_on_s(ages_s), deadline)
            if until <= now:
                return
            if until > logged_until:
                young = sum(1 for age_s in ages_s if age_s < MIN_RENEW_INTERVAL_S)
                self._log.info("service.reading_on", seconds=round(until - now, 3), young_subscriptions=young)
                logged_until = until
            wait_s = until - now
            if any(owned.calling for owned in self.owned.values()):
                wait_s = min(wait_s, CALL_RECHECK_S)
            try:
                async with self._clock.timeout(wait_s):
                    await driver.wait()
            except TimeoutError:
                pass

    async def _stop_waiting(self) -> None:
        """Stop the claims only waiting to call (a first call paced, a retry after a failed call):
        not read, and a call of theirs would start another 5 s for the next owner. Not one subscribed
        under 5 s ago whose first event may be on its way (OwnedShard.young)."""
        now = self._clock.wall()
        await self._stop_reading(
            owned for owned in self.owned.values() if owned.phase is ShardPhase.SUBSCRIBING and not owned.young(now)
        )

    def _ages_s(self, now: datetime) -> list[float]:
        """How long ago each claim that reads subscribed; one whose call is under way counts as
        subscribing now (Kinesis may take it, and count 5 s from it)."""
        ages_s = []
        for owned in self.owned.values():
            if owned.calling:
                ages_s.append(0.0)
            elif owned.phase.reading and owned.subscribed_at is not None:
                ages_s.append((now - owned.subscribed_at).total_seconds())
        return ages_s

    async def _drain(self, stop: asyncio.Event) -> bool:
        """A bounded run at its end: the sink commits everything handed on (so the final
        checkpoints cover every record read). False if a stop came first. The sink must make
        progress: nothing committed for ``batch.stall_timeout_s`` plus ``batch.max_wait_s`` fails."""
        limit_s = self.settings.batch.stall_timeout_s + self.settings.batch.max_wait_s
        last, since = -1, self._clock.now()
        while True:
            outstanding = sum(owned.ledger.outstanding for owned in self.owned.values())
            if outstanding == 0:
                return True
            if stop.is_set():
                return False
            if outstanding != last:
                last, since = outstanding, self._clock.now()
            elif self._clock.now() - since > limit_s:
                raise SinkStalled(
                    f"the sink committed nothing of the last {outstanding} chunk(s) of a bounded run for "
                    f"{limit_s:g} s (batch.stall_timeout_s + batch.max_wait_s)"
                )
            await self._clock.sleep(HANDOVER_POLL_S)

    async def _let_the_sink_commit(self, error: Exception) -> None:
        """A fatal error: nothing is read any more, but the batch in the sink may still commit (within
        ``shutdown_timeout_s``), and its checkpoint must be among the final ones, as after SIGTERM.
        Not when the error is the sink itself being stuck."""
        self.stopping.set()
        self.calls_end.set()
        if isinstance(error, BaseExceptionGroup) and error.subgroup(SinkStalled) is not None:
            return
        deadline = self._clock.now() + self.settings.shutdown_timeout_s
        while self.checkpointer.batch_started_at is not None and self._clock.now() < deadline:
            await self._clock.sleep(HANDOVER_POLL_S)

    async def _wait_for_driver(self, driver_done: asyncio.Event, deadline: float) -> None:
        try:
            async with self._clock.timeout(max(0.0, deadline - self._clock.now())):
                await driver_done.wait()
        except TimeoutError:
            self._log.warning("service.driver_timeout", timeout_s=self.settings.shutdown_timeout_s)
        for chunk in self.handoff.close():  # never taken: the next owner reads these again
            if chunk.grant is not None:
                self.pool.release(chunk.grant)

    async def _finish(self) -> bool:
        """Checkpoint what was committed and release every lease held, within FINAL_WRITES_TIMEOUT_S.
        True if every claim was released with its final checkpoint, or ended (SHARD_END written):
        a bounded run is complete only then."""
        self.stopping.set()
        self.calls_end.set()
        released = 0
        failed: list[str] = []  # claims left held, or released without their final checkpoint
        slots = asyncio.Semaphore(FINAL_WRITES_CONCURRENCY)
        claims = list(self.owned.values())

        deadline = self._clock.now() + FINAL_WRITES_TIMEOUT_S

        async def release(owned: OwnedShard) -> int:
            async with slots:
                try:
                    done = await self.runner.release(owned, deadline)
                except EfoError as exc:
                    owned.log.warning("lease.release_failed", error=str(exc), code=exc.code)
                    return 0
            return int(done)

        clean = True
        try:
            # Each partition's version moves once, as the last of them lands (table.changing): not
            # once for each lease, a slot held while it moved, which let a stop release some 300 a
            # second. Cut short by the deadline, the versions move in the next block.
            changing = self.table.changing(cut_short_to_bump_again=True)
            async with self._clock.timeout(FINAL_WRITES_TIMEOUT_S), changing:
                released = sum(await asyncio.gather(*(release(owned) for owned in claims)))
                released += await self.cycle.release_untracked()
        except (TimeoutError, EfoError) as exc:
            clean = False
            self._log.warning("leases.release_failed", error=str(exc) or type(exc).__name__)
        for owned in claims:
            if owned.phase is ShardPhase.ENDED:
                continue  # SHARD_END written: its final checkpoint
            if owned.phase is not ShardPhase.RELEASED or owned.ledger.due is not None:
                failed.append(owned.shard_id)
        try:
            async with self._clock.timeout(FINAL_WRITES_TIMEOUT_S):
                if self._heartbeat is not None:  # a beat in flight would write the row again
                    await _cancelled(self._heartbeat)
                await self.table.remove_worker()  # first: one write, another row
                await self.table.bump_again()  # releases whose version write the deadline cut short
                # The others read its row again (it has none), and no longer count it as stopping. The
                # counter as it is now: a move named on an older one would go out unnamed (every row read).
                with contextlib.suppress(EfoError):
                    await self.table.read_version()
                me = [self.table.worker_id]
                await self.table.members_changed(not_leaving=me, about=me, stopped=clean and not failed)
        except (TimeoutError, EfoError) as exc:  # the row ages out: other workers see it dead after failover_s
            self._log.warning("worker.remove_failed", error=str(exc) or type(exc).__name__)
        if clean and not failed:
            self._log.info("leases.released", shards=released)
            return True
        self._log.warning(
            "leases.release_incomplete",
            shards=released,
            failed=len(failed),
            failed_shards=sorted(failed)[:10],
            hint="these leases stay held until lease.failover_s passes; their checkpoints may be behind "
            "what was committed (read again, not lost)",
        )
        return False

    # ---- the driver's side (loop thread) ------------------------------------------------------

    def batch_started(self) -> None:
        self.checkpointer.batch_started()

    def on_committed(self, commits: Iterable[Commit]) -> None:
        self.checkpointer.on_committed(commits)

    # ---- changes ------------------------------------------------------------------------------

    def _on_change(self, owned: OwnedShard) -> None:
        self.checkpointer.urge(owned)
        self._check_ready()

    def _shard_ended(self, owned: OwnedShard) -> None:
        if self.bounds is not None:
            self.bounds.ended(owned)
        self.shards.list_now()

    def _recovered(self) -> None:
        """A heartbeat landed after doubt: tell the others, read the table, claim again what is still ours."""
        self.cycle.membership.announce = True
        self.cycle.run_now()

    def _leases_expired(self) -> None:
        self.owned.lose_all(f"no heartbeat landed for {self.liveness.validity_s:g} s")

    # ---- readiness ------------------------------------------------------------------------

    def table_problem(self) -> str | None:
        """/readyz: None while the lease table was read within ``failover_s`` (or 3 cycles)."""
        bound_s = max(self.settings.lease.failover_s, 3 * self.settings.lease.sync_interval_s)
        read_at = self.cycle.read_at
        if read_at is None:
            return "the lease table has not been read yet"
        age_s = self._clock.now() - read_at
        if age_s > bound_s:
            return f"the lease table was last read {age_s:.0f} s ago (more than {bound_s:g} s)"
        return None

    def shards_problem(self) -> str | None:
        """/readyz: None once every shard this worker reads has a subscription (none to own is fine)."""
        owned_now = self.owned.snapshot()  # this runs on the HTTP server's thread
        if self.liveness.trust is Trust.UNPROVEN:
            return "no heartbeat has landed yet: nothing is claimed until one does"
        if self.liveness.in_doubt:
            return "no heartbeat landed for the lease validity: every lease was dropped until one does"
        if not self._ready:
            waiting = sum(1 for owned in owned_now if owned.phase.reading and not owned.first_event)
            return f"waiting for the first lease cycle or the first event of {waiting} shard(s)"
        now = self._clock.now()  # the clock of OwnedShard.phase_since
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

    @property
    def ready(self) -> bool:
        return self._ready

    def _check_ready(self) -> None:
        """Ready: a lease cycle has run and every shard it claimed has delivered its first event
        (from here LATEST holds); a worker with no share of the shards is ready with none."""
        if self._ready or self.cycle.cycles == 0 or self.liveness.in_doubt:
            return  # in doubt, it holds nothing because it may not: not "ready with none"
        reading = [owned for owned in self.owned.values() if owned.phase.reading]
        if all(owned.first_event for owned in reading):
            self._ready = True
            self._log.info("service.ready", stream=self.stream.name, shards=len(reading))


def _read_on_s(ages_s: list[float]) -> float:
    """Until the youngest subscription is MIN_RENEW_INTERVAL_S old (0: none is younger)."""
    return min(max(0.0, MIN_RENEW_INTERVAL_S - min(ages_s, default=MIN_RENEW_INTERVAL_S)), MIN_RENEW_INTERVAL_S)


async def _first_of(*events: asyncio.Event) -> None:
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            await _cancelled(wait)


async def _cancelled(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
