"""The asyncio side of ``efo run``, in a thread of its own.

The Spark driver owns the main thread and the signals; it starts a :class:`Service`, takes
batches from its :class:`Handoff`, and reports commits back. Everything that crosses between
the two threads goes through the thread-safe methods below.

Several streams (``streams``): one :class:`Coordinator` per stream, each with its own consumer,
its own rows in the one lease table, its own heartbeat and its own lease cycle; all of them share
the pool, the handoff and the Spark driver. Each stream's commits go to its own coordinator. A
fatal error of one stops them all the way a SIGTERM does (each finishes its final checkpoints),
then the service fails with it.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from efo import progress
from efo.aws import Clients, Endpoints
from efo.clock import SYSTEM_CLOCK, Clock
from efo.config import Settings
from efo.coordinator import Coordinator
from efo.errors import EfoError, ResourceNotFound, translate
from efo.health import Health, loop_answers
from efo.kinesis.registration import StreamInfo, describe_stream, ensure_consumer
from efo.leases.lifecycle import Commit
from efo.leases.table import LeaseTable
from efo.observability import METRICS
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.worker.checkpointer import SharedBacklog
from efo.worker.streams import StreamShares, streams_digest

log = structlog.get_logger("efo.service")

#: /healthz fails this long after ``shutdown_timeout_s`` past the service's end if the process is
#: still alive (the driver exits by then: final writes take at most 5 s, its grace 7 s).
EXIT_OVERDUE_S = 10.0


class Service:
    def __init__(self, settings: Settings, handoff: Handoff | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.settings = settings
        self._clock = clock  # every part's: its now, sleeps and timeouts
        # Not ``handoff or``: an empty Handoff is falsy (its length), and the caller's must be the one used.
        self.handoff = handoff if handoff is not None else Handoff()
        self.error: EfoError | None = None
        self.finished = threading.Event()
        #: The service stops on its own (one stream's fatal error stops every stream): the driver
        #: stops taking batches at once, rather than at the service's end.
        self.stopping = threading.Event()
        #: Nothing is read any more: every stream's subscriptions have stopped (a stop reads on for
        #: up to 5 s first: Coordinator._read_on), or the service ended. The driver commits until then.
        self.intake_ended = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._stop_requested = threading.Event()
        self._driver_done: asyncio.Event | None = None
        self._coordinators: list[Coordinator] = []
        self._ended: set[str] = set()  # streams whose coordinator ended (read to a bound, gone, failed)
        self._gone: set[str] = set()  # streams deleted while running, no longer read
        self._shares = StreamShares()
        self._backlog: SharedBacklog | None = None  # the pool's, over every stream still read (several streams)
        #: Each stream's description and consumer ARN, by its place in settings.per_stream(), once checked.
        self._checked: list[tuple[StreamInfo, str]] | None = None
        #: A bounded run (run.until) that reached its end: everything read committed and checkpointed.
        self.completed = False
        self.incomplete: str | None = None  # a bounded run's reason for not being complete (Coordinator.incomplete)
        self._thread = threading.Thread(target=self._thread_main, name="efo-service", daemon=True)
        self.health = Health()
        # A finished service has no loop to ask; the process exits on its own within the shutdown bound.
        self.health.live_check("event_loop", loop_answers(lambda: None if self.finished.is_set() else self._loop))
        self.health.live_check("service", self._exit_overdue)
        self._finished_at: float | None = None
        self.health.ready_check("consumer", self._consumer_problem)
        METRICS.handoff_chunks.set_function(lambda: len(self.handoff))

    # ---- called from the driver thread ------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._loop_ready.wait()

    def batch_started(self) -> None:
        """The driver handed a batch to the sink (for stall detection)."""
        self._call(self._batch_started)

    def _batch_started(self) -> None:
        for coordinator in self._coordinators:
            coordinator.batch_started()

    def commit(self, commits: Iterable[Commit]) -> None:
        """Every coordinator hears of every commit (its stall clock stops), with its own stream's chunks."""
        commits = list(commits)
        self._call(lambda: self._committed(commits))

    def _committed(self, commits: list[Commit]) -> None:
        if len(self._coordinators) == 1:
            self._coordinators[0].on_committed(commits)
            return
        for coordinator in self._coordinators:
            name = coordinator.stream.name
            coordinator.on_committed([commit for commit in commits if commit.stream == name])

    def request_stop(self) -> None:
        self._stop_requested.set()  # before the loop runs: _main sets the stop as it starts
        self._call(lambda: self._stop.set() if self._stop else None)

    def driver_finished(self) -> None:
        self._call(lambda: self._driver_done.set() if self._driver_done else None)

    def _exit_overdue(self) -> str | None:
        """/healthz: the service ended (a stop, or a task died) and the process, which exits on its
        own within ``shutdown_timeout_s`` plus its final writes, is still here: restart it. Failing
        sooner would have the kubelet's SIGTERM cut the driver's own exit short (and its last line)."""
        if self._finished_at is None:
            return None
        ended_s = self._clock.now() - self._finished_at
        if ended_s <= self.settings.shutdown_timeout_s + EXIT_OVERDUE_S:
            return None
        reason = f"it failed: {self.error}" if self.error is not None else "it stopped"
        return f"the service ended {ended_s:.0f} s ago ({reason}) and the process has not exited"

    def _consumer_problem(self) -> str | None:
        return None if self._checked is not None else "the consumer is not known to be ACTIVE yet"

    def join(self, timeout_s: float | None = None) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _call(self, fn: object) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn)  # type: ignore[arg-type]
            except RuntimeError:  # the loop closed between the check and the call
                pass

    # ---- the service thread -----------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except EfoError as exc:
            self.error = exc
            log.error("service.failed", error=str(exc), code=exc.code, exit_code=exc.exit_code)
        except BaseException as exc:
            self.error = translate(exc, resource="the service")
            log.exception("service.crashed")
        finally:
            self.intake_ended.set()
            self.handoff.close()
            self._finished_at = self._clock.now()
            self.finished.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._stop_requested.is_set():  # a signal that came before there was a loop to call
            self._stop.set()
        self._driver_done = asyncio.Event()
        self._loop_ready.set()
        try:
            await self._serve()
        except* EfoError as group:
            raise group.exceptions[0] from None

    def preflight(self) -> None:
        """Check the stream, the consumer and the table before Spark starts (seconds, not a JVM
        start-up, to learn of a typo), in a loop of its own that leaves no thread behind."""
        asyncio.run(self._preflight())

    async def _preflight(self) -> None:
        async with Clients(self._endpoints()) as clients:
            await self._prepare(clients)

    def _endpoints(self) -> Endpoints:
        return Endpoints(self.settings.region, self.settings.kinesis_endpoint, self.settings.dynamodb_endpoint)

    async def _prepare(self, clients: Clients) -> list[Coordinator]:
        """A coordinator per stream, after checking each stream, the table and each consumer;
        what the pre-flight already checked is not asked again. One pool for all of them."""
        kinesis = await clients.kinesis()
        dynamodb = await clients.dynamodb()
        every = self.settings.per_stream()
        checking = self._checked is None
        if self._checked is None:
            self._checked = [await self._check_stream(kinesis, settings) for settings in every]
        several = len(every) > 1
        # Which streams this worker reads, in its heartbeat rows (workers reading the same deal alike).
        reads = streams_digest(stream.arn for stream, _ in self._checked) if several else None
        pool = PendingPool.of(self.settings.pool, clock=self._clock)
        shares = self._shares = StreamShares()  # each stream's cycle counts this worker's share over every stream
        # One pool: its backlog bound counts the uncheckpointed records of every stream still read.
        backlog = self._backlog = SharedBacklog() if several else None
        coordinators: list[Coordinator] = []
        for settings, (stream, consumer_arn) in zip(every, self._checked, strict=True):
            table = LeaseTable(
                dynamodb,
                table=settings.table_name,
                app=settings.app,
                stream_arn=stream.arn,
                worker_id=settings.worker_id,
                clock=self._clock,
            )
            if checking and not coordinators:
                await table.ensure_table()  # one table for every stream of the application
            table.consumer_arn = consumer_arn  # its heartbeat row says which consumer it reads through
            table.reads = reads
            coordinator = Coordinator(
                settings=settings,
                stream=stream,
                consumer_arn=consumer_arn,
                kinesis=kinesis,
                subscriber=clients.subscriber(settings.subscription.read_timeout_s),
                table=table,
                pool=pool,
                handoff=self.handoff,
                # The heartbeat's own client (its own connections): no lease or checkpoint traffic delays it.
                heartbeats=table.with_client(await clients.dynamodb()),
                shares=shares,
                shared_backlog=backlog,
                clock=self._clock,
            )
            if checking:
                await coordinator.check()  # the leases themselves are bootstrapped once the heartbeat runs
            coordinators.append(coordinator)
        return coordinators

    def _read(self, coordinators: list[Coordinator]) -> list[Coordinator]:
        """The streams still read: not ended (read to a bound, deleted or failed)."""
        return [c for c in coordinators if c.stream.name not in self._ended]

    def _ended_stream(self, coordinator: Coordinator, coordinators: list[Coordinator]) -> None:
        """A stream is read no more: its shares leave the others' dealing and room, and its backlog
        the pool's bound, which is checked again at once (nothing else would resume the pool)."""
        self._ended.add(coordinator.stream.name)
        self._shares.forget(coordinator.stream.arn)
        if self._backlog is not None:
            self._backlog.forget(coordinator.stream.name)
        for other in self._read(coordinators)[:1]:
            other.checkpointer.apply_backlog_bound()

    async def _check_stream(self, kinesis: Any, settings: Settings) -> tuple[StreamInfo, str]:
        """The stream described and its consumer found (or registered) and ACTIVE."""
        stream = await describe_stream(kinesis, settings.stream_ref)
        consumer_arn = await ensure_consumer(
            kinesis,
            stream_arn=stream.arn,
            name=None if settings.consumer_arn else settings.consumer,
            arn=settings.consumer_arn,
            clock=self._clock,
        )
        return stream, consumer_arn

    async def _serve(self) -> None:
        assert self._stop is not None and self._driver_done is not None
        async with Clients(self._endpoints()) as clients:
            coordinators = await self._prepare(clients)
            for coordinator in coordinators:
                log.info("consumer.active", stream=coordinator.stream.name, consumer_arn=coordinator.consumer_arn)
                METRICS.stream_reading.labels(stream=coordinator.stream.name).set(1)
            pool = coordinators[0].pool
            METRICS.pool_records.set_function(lambda: pool.records)
            METRICS.pool_bytes.set_function(lambda: pool.bytes)
            METRICS.pool_capacity_records.set(pool.max_records)
            METRICS.pool_capacity_bytes.set(pool.max_bytes)
            self.health.ready_check("table", self._first_problem(coordinators, lambda c: c.table_problem()))
            self.health.ready_check("shards", self._first_problem(coordinators, lambda c: c.shards_problem()))
            self._coordinators = coordinators
            display = self._progress_display(coordinators)
            try:
                await self._run_all(coordinators, await clients.kinesis())
            finally:
                if display is not None:
                    display.close()
            # A stream deleted while running has no end to read to: the run is whole without it.
            self.completed = all(c.completed for c in coordinators if c.stream.name not in self._gone)
            self.incomplete = next((c.incomplete for c in coordinators if c.incomplete is not None), None)

    async def _run_all(self, coordinators: list[Coordinator], kinesis: Any) -> None:
        """Every stream's coordinator until each ends. A stream deleted while several are read
        stops being read (its coordinator wrote its last checkpoints and released its leases) and
        the others go on; any other fatal error stops the others as a SIGTERM would (their final
        checkpoints and releases land), then is raised. So is the error of the last stream left."""
        assert self._stop is not None and self._driver_done is not None
        stop, driver_done = self._stop, self._driver_done
        errors: list[BaseException] = []

        async def run(coordinator: Coordinator) -> None:
            name = coordinator.stream.name
            if len(coordinators) > 1:  # every log line of this stream's tasks names it (shard ids repeat)
                structlog.contextvars.bind_contextvars(stream=name)
            try:
                await coordinator.run(stop, driver_done)
            except Exception as error:
                if len(self._gone) + 1 < len(coordinators) and await _stream_gone(kinesis, coordinator.stream, error):
                    log.error(
                        "stream.deleted",
                        stream=name,
                        error=str(error),
                        hint="no longer read; the other streams go on. Remove it from streams (its checkpoints "
                        "stay until 'efo checkpoints reset --delete-all --stream NAME') and restart",
                    )
                    self._gone.add(name)
                    METRICS.stream_gone(name)
                    return
                if not errors:
                    log.error("service.stream_failed", stream=name, error=str(error))
                errors.append(error)
                self.stopping.set()
                stop.set()
            finally:
                coordinator.intake_stopped.set()  # also when it failed before its stop path
                self._ended_stream(coordinator, coordinators)

        async def intake_ended() -> None:
            for coordinator in coordinators:  # each sets it when it stops reading, and when it ends
                await coordinator.intake_stopped.wait()
            self.intake_ended.set()

        async with asyncio.TaskGroup() as group:
            for coordinator in coordinators:
                group.create_task(run(coordinator), name=f"stream:{coordinator.stream.name}")
            group.create_task(intake_ended(), name="intake-ended")
        if errors:
            raise errors[0]

    def _first_problem(
        self, coordinators: list[Coordinator], check: Callable[[Coordinator], str | None]
    ) -> Callable[[], str | None]:
        """One readiness check over every stream still read: the first problem, naming its stream.
        A stream whose coordinator ended (read to a bound, deleted) has nothing left to be ready for."""
        several = len(coordinators) > 1

        def first() -> str | None:
            read = self._read(coordinators)
            if not read:
                return "no stream is read any more (the service is ending)"
            for coordinator in read:
                problem = check(coordinator)
                if problem is not None:
                    return f"stream {coordinator.stream.name!r}: {problem}" if several else problem
            return None

        return first

    def _progress_display(self, coordinators: list[Coordinator]) -> progress.TerminalProgress | None:
        """A bounded run on a terminal: one line for every stream together."""
        bounds = [c.bounds for c in coordinators if c.bounds is not None]
        if not bounds or not progress.wanted(self.settings.log.format):
            return None
        display = progress.TerminalProgress(str(bounds[0].until)).start()
        latest: dict[int, dict[str, Any]] = {}

        def update(place: int, fields: dict[str, Any]) -> None:
            latest[place] = fields
            display.update(progress.combined(list(latest.values())))

        for place, bound in enumerate(bounds):
            bound.on_progress = functools.partial(update, place)
        return display

    @property
    def stopped_before_end(self) -> bool:
        """A bounded run (run.until) that ended before the stream was read to its end (a SIGTERM):
        what it read is checkpointed, and a run started again reads on from there."""
        return self.settings.run.until is not None and not self.completed


async def _stream_gone(kinesis: Any, stream: StreamInfo, error: BaseException) -> bool:
    """``error`` (a coordinator's end) is its stream being gone: deleted, or deleted and recreated."""
    found = error.subgroup(ResourceNotFound) if isinstance(error, BaseExceptionGroup) else error
    if not isinstance(found, (ResourceNotFound, BaseExceptionGroup)):
        return False
    try:
        now = await describe_stream(kinesis, stream.arn)
    except ResourceNotFound:
        return True
    except EfoError:
        return False
    return now.created_at != stream.created_at or now.status == "DELETING"
