"""The simulated fleet: W workers' production code against the simulated DynamoDB and Kinesis.

Each :class:`SimWorker` is what ``efo run`` builds for one stream, minus Spark: a real
:class:`efo.coordinator.Coordinator` (liveness, lease cycle, balance, shard sync, runner,
checkpointer, the lease table's requests down to the client call) with its own clock, its own
DynamoDB clients (the lease table's and the heartbeat's), its own pool and handoff, and a sink that
takes a batch every so often, commits it after a while and reports the commit, as the Spark
driver does. Workers start, stop gracefully (SIGTERM), die (SIGKILL), pause and run late.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from efo.config import Settings, load_settings
from efo.coordinator import Coordinator
from efo.devstack.units import item_size
from efo.errors import EfoError
from efo.kinesis.graph import Shard
from efo.kinesis.registration import StreamInfo
from efo.leases.codec import WORKER_PREFIX, parse_lease
from efo.leases.lifecycle import Commit
from efo.leases.rows import LeaseRows, PartitionRows
from efo.leases.table import LeaseTable
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.sim.clock import SimClock
from efo.sim.dynamodb import Behaviour, SimDynamoDB
from efo.sim.invariants import Oracle, Trace
from efo.sim.kinesis import SimKinesisClient, SimStream

APP = "sim"
#: A pod whose process exits is started again after this, doubling up to the maximum (kubelet's back-off).
RESTART_BACKOFF_S = 10.0
RESTART_BACKOFF_MAX_S = 300.0
TABLE = "sim-leases"
STREAM = "sim-stream"

T = TypeVar("T")


class SharedParses(Generic[T]):
    """Each row the simulated DynamoDB stores (each shard its ListShards describes), parsed once for
    the whole fleet: its Query answers every reader with the very item it stored (the lease rows:
    :class:`SharedLeaseRows`); every listing describes a shard with one object until the shard opens
    or closes, and at a mass start every worker lists every shard. A lease and a shard are
    immutable: workers that share one share its value."""

    #: The items parsed last that are kept: more than a few seconds' changes of 16,384 leases.
    KEEP = 1 << 16

    def __init__(self, parse: Callable[[dict[str, Any]], T]) -> None:
        self._parse = parse
        self._parsed: dict[int, tuple[dict[str, Any], T]] = {}  # id of an item (held here) -> it, parsed

    def __call__(self, item: dict[str, Any]) -> T:
        known = self._parsed.get(id(item))
        if known is not None and known[0] is item:
            return known[1]
        value = self._parse(item)
        if len(self._parsed) >= self.KEEP:
            del self._parsed[next(iter(self._parsed))]  # the oldest parse
        self._parsed[id(item)] = (item, value)
        return value


class SharedLeaseRows(LeaseRows):
    """Every worker's read of one state of a lease partition made into leases once for the fleet: the
    simulated Query answers every reader of that state with the same list of the stored rows
    (efo.sim.dynamodb), and after a change every worker reads the partition again. A row unchanged
    since the first reader's last read is the lease it read then, and each row is parsed once
    (:class:`SharedParses`); the answer made from a list is read-only, as every reader of a
    :class:`PartitionRows` treats it."""

    #: The answers kept: more than every partition's last few states at 16,384 shards.
    KEEP = 1 << 12

    def __init__(self) -> None:
        super().__init__(SharedParses(parse_lease))
        self._answers: dict[int, tuple[list[dict[str, Any]], PartitionRows]] = {}  # id of a list (held here)

    def read(self, items: list[dict[str, Any]], last: PartitionRows | None) -> PartitionRows:
        known = self._answers.get(id(items))
        if known is not None and known[0] is items:
            return known[1]
        answer = super().read(items, last)  # an unchanged row is the lease of this reader's last read
        if len(self._answers) >= self.KEEP:
            del self._answers[next(iter(self._answers))]  # the oldest
        self._answers[id(items)] = (items, answer)
        return answer


@dataclass
class FleetConfig:
    shards: int = 64
    workers: int = 4
    #: Records a second per open shard (0: an idle stream).
    records_per_shard_s: float = 0.5
    #: The sink takes a batch every this many seconds and takes ``sink_s`` to commit it.
    batch_interval_s: float = 1.0
    sink_s: tuple[float, float] = (0.05, 0.4)
    #: Settings of every worker, nested as in YAML (the EFO_* environment is not read: a run replays anywhere).
    settings: dict[str, Any] = field(default_factory=dict)
    dynamodb: Behaviour = field(default_factory=Behaviour)
    kinesis_latency_s: float = 0.02
    idle_event_s: float = 5.0


def worker_settings(config: FleetConfig, stream_arn: str) -> Settings:
    values: dict[str, Any] = {
        "stream": stream_arn,
        "app": APP,
        "table": TABLE,
        "sink": "console",
        "initial_position": "TRIM_HORIZON",
        "region": "us-east-1",
        # Finished leases are deleted within the few minutes a run lasts (300 s in production).
        "lease": {"delete_finished_after_s": 20.0},
    }
    for section, fields in config.settings.items():
        merged = isinstance(fields, dict) and isinstance(values.get(section), dict)
        values[section] = {**values[section], **fields} if merged else fields
    return load_settings(environment=False, **values)  # a run is its config's and seed's alone


class SimWorker:
    def __init__(self, fleet: Fleet, name: str) -> None:
        self.fleet = fleet
        self.name = name
        self.clock = SimClock()
        self.rng = random.Random(fleet.rng.random())
        settings = fleet.settings
        db = fleet.db
        table = LeaseTable(
            db.client(name, self.clock, random.Random(self.rng.random())),
            table=TABLE,
            app=APP,
            stream_arn=fleet.stream.arn,
            worker_id=name,
            consumer_arn=fleet.consumer_arn,
            clock=self.clock,
            rows=fleet.shared_rows,
        )
        kinesis = SimKinesisClient(fleet.stream, self.clock, lambda: fleet.config.kinesis_latency_s, name)
        self.handoff = Handoff(clock=self.clock.now)
        self.coordinator = Coordinator(
            settings=settings,
            stream=fleet.stream_info,
            consumer_arn=fleet.consumer_arn,
            kinesis=kinesis,
            subscriber=kinesis,
            table=table,
            pool=PendingPool.of(settings.pool, clock=self.clock),
            handoff=self.handoff,
            heartbeats=table.with_client(db.client(f"{name}/hb", self.clock, random.Random(self.rng.random()))),
            clock=self.clock,
        )
        self.coordinator.shards.parse_shard = fleet.shard_parses
        self.stop = asyncio.Event()
        self.driver_done = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.driver: asyncio.Task[None] | None = None
        self.killed = False
        self.stopping = False  # asked to stop (SIGTERM): no longer counted as a member
        self.stopped = False
        self.doubt_seen = False
        self.started_at = 0.0

    def start(self) -> None:
        self.started_at = self.clock.now()
        self.task = asyncio.create_task(self._serve(), name=self.name)
        self.driver = asyncio.create_task(self._drive(), name=f"{self.name}-sink")

    async def _serve(self) -> None:
        """``efo run``: the checks before anything runs, then the service. A check that fails for a
        reason that passes (DynamoDB throttled or down) ends the process, and Kubernetes starts it
        again after a back-off, as it does a pod that exits."""
        delay_s = RESTART_BACKOFF_S
        while True:
            try:
                await self.coordinator.check()
                break
            except EfoError as exc:
                if not exc.retriable:
                    raise
                self.fleet.trace.add(self.clock.now(), self.name, "sim.restarting", error=str(exc)[:80])
                await self.clock.sleep(delay_s)
                delay_s = min(2 * delay_s, RESTART_BACKOFF_MAX_S)
        await self.coordinator.run(self.stop, self.driver_done)

    async def _drive(self) -> None:
        """The sink: a batch every ``batch_interval_s``, committed ``sink_s`` later; on a stop, the
        batch in the sink is committed and nothing more is taken once the service reads nothing more
        (the Spark driver's way)."""
        config = self.fleet.config
        batch = self.fleet.settings.batch
        try:
            while not self._intake_over():
                await self.clock.sleep(config.batch_interval_s)
                chunks = self.handoff.take_batch(batch.max_records, batch.max_bytes, 0.0, 0.0)
                if not chunks:
                    continue
                self.coordinator.batch_started()
                await self.clock.sleep(self.rng.uniform(*config.sink_s))
                for chunk in chunks:
                    self.fleet.oracle.committed(chunk.shard_id, list(chunk.sequence_numbers))
                self.coordinator.on_committed([Commit.of(chunk) for chunk in chunks])
        finally:
            self.driver_done.set()

    def _intake_over(self) -> bool:
        """Nothing more is read (a stop's reading on is over, or the service ended)."""
        return self.coordinator.intake_stopped.is_set() or (self.task is not None and self.task.done())

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.killed and not self.stopping

    @property
    def failed(self) -> BaseException | None:
        task = self.task
        if task is not None and task.done() and not task.cancelled() and not self.stopped:
            return task.exception() or RuntimeError("the service ended without an error")
        return None

    def reading(self) -> set[str]:
        return {shard_id for shard_id, owned in self.coordinator.owned.items() if owned.phase.reading}

    async def kill(self) -> None:
        """SIGKILL: nothing released, nothing more written; the heartbeat row stops changing."""
        self.killed = True
        for task in (self.task, self.driver):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self.task, self.driver) if t is not None), return_exceptions=True)

    async def terminate(self) -> None:
        """SIGTERM: hand every lease over and end, within the shutdown timeout."""
        self.stopping = True
        self.stop.set()
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)
        if self.driver is not None:
            await asyncio.gather(self.driver, return_exceptions=True)
        self.stopped = True


class Fleet:
    def __init__(self, config: FleetConfig, seed: int, trace: Trace) -> None:
        self.config = config
        self.seed = seed
        self.rng = random.Random(seed)
        self.trace = trace
        self.clock = SimClock()  # the world's: never late nor paused
        self.db = SimDynamoDB(random.Random(self.rng.random()), config.dynamodb)
        self.shared_rows = SharedLeaseRows()
        self.shard_parses = SharedParses(Shard.from_api)
        self.db.create_table(TABLE)
        self.stream = SimStream(STREAM, config.shards, clock=self.clock)
        self.stream.idle_event_s = config.idle_event_s
        self.stream_info = StreamInfo(
            STREAM, self.stream.arn, datetime(2026, 1, 1, tzinfo=UTC), "ACTIVE", config.shards
        )
        self.consumer_arn = f"{self.stream.arn}/consumer/{APP}:1"
        self.settings = worker_settings(config, self.stream.arn)
        self.oracle = Oracle(seed, self.stream, trace, failover_s=self.settings.lease.failover_s, reads=self.reads)
        self.workers: list[SimWorker] = []
        self.lease_rows: dict[str, dict[str, Any]] = {}  # the table's lease rows as they are now
        #: (worker name or None for every worker, from, until): faults that touch a worker's DynamoDB
        #: path or its time, which excuse its leases going into doubt.
        self._disturbances: list[tuple[str | None, float, float]] = []
        self.db.on_write = self._written
        self.stream.on_subscribe = self._subscribing
        self.stream.on_first_event = lambda shard_id, worker: self.oracle.first_event(self.clock.now(), shard_id)

    # ---- membership ----------------------------------------------------------------------------------

    def live(self) -> list[SimWorker]:
        return [worker for worker in self.workers if worker.alive]

    def stopping(self) -> list[SimWorker]:
        """Workers asked to stop (SIGTERM) and not yet stopped."""
        return [worker for worker in self.workers if worker.stopping and not worker.stopped and not worker.killed]

    async def add(self, count: int) -> list[SimWorker]:
        """``count`` new workers, started at once."""
        added = [SimWorker(self, f"w{len(self.workers) + i + 1:03d}") for i in range(count)]
        self.workers += added
        for worker in added:
            worker.start()
            self.trace.add(self.clock.now(), worker.name, "sim.worker_started")
        self.oracle.membership_changed_at = self.clock.now()
        return added

    async def kill(self, worker: SimWorker) -> None:
        shards = worker.reading()
        await worker.kill()
        self.trace.add(self.clock.now(), worker.name, "sim.worker_killed", shards=len(shards))
        self.oracle.died(self.clock.now(), shards, worker.name)

    async def terminate(self, worker: SimWorker) -> None:
        self.trace.add(self.clock.now(), worker.name, "sim.worker_stopping", shards=len(worker.reading()))
        self.oracle.membership_changed_at = self.clock.now()
        await worker.terminate()
        self.trace.add(self.clock.now(), worker.name, "sim.worker_stopped")
        self.oracle.membership_changed_at = self.clock.now()

    def disturb(self, worker: str | None, start_s: float, end_s: float, *, delays_reading: bool = True) -> None:
        """A fault in ``worker``'s DynamoDB path or time (None: every worker's) from ``start_s`` to
        ``end_s``; ``delays_reading``: the fleet's reading converges after it (not after a pause,
        whose worker's shards are timed as a death's)."""
        self._disturbances.append((worker, start_s, end_s))
        self.oracle.disturbed(end_s, delays_reading=delays_reading)

    def reads(self, name: str, shard_id: str, counter: int) -> bool:
        """The worker reads ``shard_id`` under the claim ``counter`` and may still trust its leases (its
        last heartbeat that landed was sent less than the lease validity ago): taking the lease from it
        now takes it from a live reader."""
        worker = next((w for w in self.workers if w.name == name), None)
        if worker is None or worker.killed or not worker.coordinator.liveness.valid:
            return False
        owned = worker.coordinator.owned.get(shard_id)
        return owned is not None and owned.epoch == counter and owned.phase.reading

    def disturbed(self, worker: SimWorker, now: float) -> bool:
        """A fault touched this worker within the last failover_s."""
        recent = now - self.oracle.failover_s - 2.0
        return any(
            (who is None or who == worker.name) and start <= now and end >= recent
            for who, start, end in self._disturbances
        )

    # ---- what the world sees -----------------------------------------------------------------------

    def _written(
        self,
        client: str,
        table: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        request: dict[str, Any],
    ) -> None:
        row = after if after is not None else before
        if row is None or not row["sk"]["S"].startswith("shard|"):
            return
        shard_id = row["sk"]["S"].removeprefix("shard|")
        held = self.lease_rows.get(shard_id)
        if before is None and after is not None and held is not None and held["pk"]["S"] != after["pk"]["S"]:
            self.oracle.fail(
                self.clock.now(),
                "one lease a shard",
                f"{client} wrote a lease of {shard_id} under {after['pk']['S']}, which has one under {held['pk']['S']}",
                shard_id,
            )
        if after is None:
            self.lease_rows.pop(shard_id, None)
        else:
            self.lease_rows[shard_id] = after
        self.oracle.row_changed(self.clock.now(), client, before, after, request)

    def _subscribing(self, shard_id: str, worker: str) -> None:
        self.oracle.subscribing(self.clock.now(), worker, shard_id, self.lease_rows)

    def finished(self, shard_id: str) -> bool:
        """SHARD_END landed on the shard's lease (which may have been deleted since)."""
        return self.oracle.finished(shard_id)

    def row_sizes_b(self) -> tuple[int, int]:
        """The mean size of the table's lease rows and of its heartbeat rows now, as DynamoDB counts
        them (the simulation's names are shorter than production's: efo.leases.cost.LEASE_ROW_B)."""
        leases = [item_size(row) for row in self.lease_rows.values()]
        heartbeats = [
            version.size
            for partition in self.db.tables[TABLE].partitions.values()
            for key, row in partition.rows.items()
            if key.startswith(WORKER_PREFIX) and (version := row.latest()) is not None and version.item is not None
        ]
        return round(sum(leases) / max(1, len(leases))), round(sum(heartbeats) / max(1, len(heartbeats)))

    def readable(self) -> set[str]:
        """Shards that must be read now: not finished, every parent finished."""
        return {
            shard_id
            for shard_id, shard in self.stream.shards.items()
            if not self.finished(shard_id) and all(self.finished(parent) for parent in shard.parents)
        }

    async def close(self) -> None:
        await asyncio.gather(*(worker.kill() for worker in self.live()), return_exceptions=True)
