"""The asyncio side of ``efo run``, in a thread of its own.

The Spark driver owns the main thread and the signals; it starts a :class:`Service`, takes
batches from its :class:`Handoff`, and reports commits back. Everything that crosses between
the two threads goes through the thread-safe methods below.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable

import structlog

from efo import progress
from efo.aws import Clients, Endpoints
from efo.config import Settings
from efo.coordinator import Coordinator
from efo.errors import EfoError, translate
from efo.health import Health, loop_answers
from efo.kinesis.registration import StreamInfo, describe_stream, ensure_consumer
from efo.leases.lifecycle import Commit
from efo.leases.table import LeaseTable
from efo.observability import METRICS
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool

log = structlog.get_logger("efo.service")

#: /healthz fails this long after ``shutdown_timeout_s`` past the service's end if the process is
#: still alive (the driver exits by then: final writes take at most 5 s, its grace 7 s).
EXIT_OVERDUE_S = 10.0


class Service:
    def __init__(self, settings: Settings, handoff: Handoff | None = None) -> None:
        self.settings = settings
        self.handoff = handoff or Handoff()
        self.error: EfoError | None = None
        self.finished = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._driver_done: asyncio.Event | None = None
        self._coordinator: Coordinator | None = None
        self._checked: tuple[StreamInfo, str] | None = None  # stream and consumer, once checked
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
        self._call(lambda: self._coordinator.batch_started() if self._coordinator else None)

    def commit(self, commits: Iterable[Commit]) -> None:
        commits = list(commits)
        self._call(lambda: self._coordinator.on_committed(commits) if self._coordinator else None)

    def request_stop(self) -> None:
        self._call(lambda: self._stop.set() if self._stop else None)

    def driver_finished(self) -> None:
        self._call(lambda: self._driver_done.set() if self._driver_done else None)

    def _exit_overdue(self) -> str | None:
        """/healthz: the service ended (a stop, or a task died) and the process, which exits on its
        own within ``shutdown_timeout_s`` plus its final writes, is still here: restart it. Failing
        sooner would have the kubelet's SIGTERM cut the driver's own exit short (and its last line)."""
        if self._finished_at is None:
            return None
        ended_s = time.monotonic() - self._finished_at
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
            self.handoff.close()
            self._finished_at = time.monotonic()
            self.finished.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
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

    async def _prepare(self, clients: Clients) -> Coordinator:
        """The coordinator, after checking the stream, the table and the consumer and bootstrapping
        the leases; what the pre-flight already checked is not asked again."""
        settings = self.settings
        kinesis = await clients.kinesis()
        if self._checked is None:
            stream = await describe_stream(kinesis, settings.stream)
        else:
            stream, consumer_arn = self._checked
        table = LeaseTable(
            await clients.dynamodb(),
            table=settings.table_name,
            app=settings.app,
            stream_arn=stream.arn,
            worker_id=settings.worker_id,
        )
        if self._checked is None:
            await table.ensure_table()
            consumer_arn = await ensure_consumer(
                kinesis,
                stream_arn=stream.arn,
                name=None if settings.consumer_arn else settings.consumer,
                arn=settings.consumer_arn,
            )
        table.consumer_arn = consumer_arn  # its heartbeat row says which consumer it reads through
        # The heartbeat's own client (its own connections): no lease or checkpoint traffic delays it.
        heartbeats = table.with_client(await clients.dynamodb())
        coordinator = Coordinator(
            settings=settings,
            stream=stream,
            consumer_arn=consumer_arn,
            kinesis=kinesis,
            subscriber=clients.subscriber(settings.subscription.read_timeout_s),
            table=table,
            pool=PendingPool.of(settings.pool),
            handoff=self.handoff,
            heartbeats=heartbeats,
        )
        if self._checked is None:
            await coordinator.check()  # the leases themselves are bootstrapped once the heartbeat runs
            self._checked = (stream, consumer_arn)
        return coordinator

    async def _serve(self) -> None:
        assert self._stop is not None and self._driver_done is not None
        async with Clients(self._endpoints()) as clients:
            coordinator = await self._prepare(clients)
            log.info("consumer.active", stream=coordinator.stream.name, consumer_arn=coordinator.consumer_arn)
            pool = coordinator.pool
            METRICS.pool_records.set_function(lambda: pool.records)
            METRICS.pool_bytes.set_function(lambda: pool.bytes)
            METRICS.pool_capacity_records.set(pool.max_records)
            METRICS.pool_capacity_bytes.set(pool.max_bytes)
            self.health.ready_check("table", coordinator.table_problem)
            self.health.ready_check("shards", coordinator.shards_problem)
            self._coordinator = coordinator
            display = None
            if coordinator.bounds is not None and progress.wanted(self.settings.log.format):
                display = progress.TerminalProgress(str(coordinator.bounds.until)).start()
                coordinator.bounds.on_progress = display.update
            try:
                await coordinator.run(self._stop, self._driver_done)
            finally:
                if display is not None:
                    display.close()
            self.completed = coordinator.completed
            self.incomplete = coordinator.incomplete

    @property
    def stopped_before_end(self) -> bool:
        """A bounded run (run.until) that ended before the stream was read to its end (a SIGTERM):
        what it read is checkpointed, and a run started again reads on from there."""
        return self.settings.run.until is not None and not self.completed
