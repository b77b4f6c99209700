"""A simulated fleet taken through the phases ``make bench``'s fleet section measures (bench/fleet_sim.py).

The same phases as bench/fleet.py runs against DynamoDB Local, plus a rolling deploy, one after the
other on one fleet, in virtual time, with every invariant of :mod:`efo.sim.invariants` checked as it
goes and no fault injected. A run is a function of its :class:`PhasesConfig` (its seed included).

1. **start** (busy): every worker starts at once on an empty table (the lease rows are written by
   the fleet itself); seconds until *balanced*, as bench/fleet.py defines it: every shard read (its
   claim's first event in) by exactly one live worker, shares within one of each other, nothing
   being handed over or asked for, and that for :data:`HOLD_CYCLES` lease cycles in a row (the time
   is the start of that stretch); and until every worker is ready (``service.ready``);
2. **busy**, then **idle** (the producer stopped): after ``settle_s`` (idle: at least a checkpoint
   interval and a second, so the last checkpoints land first), a ``window_s`` window: DynamoDB
   requests a minute by operation, the lease plane's read and write units a second (everything but
   checkpoints), the busiest partition key's, ListShards calls a minute, and every write request by
   kind (a heartbeat, a checkpoint, or its operation), refused ones included;
3. **join** (busy): one more worker; seconds until balanced again;
4. **takeover** (busy): the worker that reads the most is killed (SIGKILL: nothing released);
   seconds until every shard it read is read again (the oracle's own count, from the kill to the
   last of them delivering a first event), then until balanced;
5. **rolling** (busy): ``roll`` of the workers (all by default) replaced one by one as Kubernetes
   replaces the chart's pods (a RollingUpdate with maxSurge 1 and maxUnavailable 0): a new one
   starts; once it is ready and has stayed ready for ``min_ready_s`` (minReadySeconds), an old one
   is stopped gracefully (SIGTERM: every lease handed over) and, as that stop begins, the next new
   one starts (Kubernetes does not count a terminating pod). A worker starts at once (a pod starts
   Spark first, 10-20 s) and its readiness is seen as soon as it holds (Kubernetes' probe sees it
   up to a period later): a roll here is no slower than the real one.
   The longest any shard went unread (sampled every :data:`POLL_S`, a stopping worker's shards
   counted as read while its subscription runs), then seconds until balanced.

Each phase also counts its claims, handovers, leases in doubt and leases lost. A violated invariant
ends the run: the phases before it are reported, the others are not measured.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from efo.sim.fleet import Fleet, FleetConfig, SimWorker
from efo.sim.invariants import Oracle, Trace, Violation
from efo.sim.run import Capture, RunConfig, expected, in_virtual_time, monitor, number, produce, usage_rates

PHASES = ("start", "busy", "idle", "join", "takeover", "rolling")


def finished(phases: dict[str, dict[str, Any]]) -> list[str]:
    """The phases of a report run to their end (one cut short shows what it measured, ``partial``)."""
    return [name for name in PHASES if name in phases and not phases[name].get("partial")]


HOLD_CYCLES = 2  # balanced for this many lease cycles in a row (bench/fleet.py's HOLD_CYCLES)
POLL_S = 0.25  # how often balance and unread shards are looked at
#: helm/efo/values.yaml's minReadySeconds (tests/unit/test_chart.py holds them equal).
MIN_READY_S = 10.0
WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
EVENTS = {
    "claims": "shard.started",
    "handovers": "lease.handed_over",
    "in_doubt": "lease.in_doubt",
    "lost": "lease.lost",
}


@dataclass
class PhasesConfig:
    fleet: FleetConfig = field(default_factory=FleetConfig)
    seed: int = 1
    settle_s: float = 10.0
    window_s: float = 60.0
    #: At most this long for a balance, a takeover, a new worker's readiness.
    timeout_s: float = 120.0
    #: Workers replaced one by one in the rolling deploy; None: every one.
    roll: int | None = None
    #: The Deployment's minReadySeconds in the rolling deploy (the chart's, by default).
    min_ready_s: float = MIN_READY_S

    def check(self) -> None:
        """A size or phase length the simulation cannot run is refused, naming what is allowed."""
        RunConfig(fleet=self.fleet, seed=self.seed).check()
        number("window_s", self.window_s, 0, above=True)
        number("timeout_s", self.timeout_s, 0, above=True)
        number("settle_s", self.settle_s, 0)
        number("min_ready_s", self.min_ready_s, 0)
        if self.roll is not None and self.roll < 0:
            raise ValueError(f"roll = {self.roll}: at least 0 (None: every worker)")


@dataclass
class PhasesReport:
    seed: int
    shards: int
    workers: int
    simulated_s: float = 0.0
    wall_s: float = 0.0
    #: Each phase that ran to its end, by name (PHASES), with what it measured; one cut short (a
    #: rolling deploy stopped by a budget) with what it measured until then and ``partial`` (:func:`finished`).
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    violation: str | None = None
    invariant: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class WriteTap:
    """Every write request the fleet sends DynamoDB (refused ones too), by kind: a heartbeat (a
    PutItem of a heartbeat row), a checkpoint (as the meter tells one), or its operation."""

    def __init__(self, fleet: Fleet) -> None:
        self.counts: Counter[str] = Counter()
        self._execute = fleet.db.execute
        fleet.db.execute = self  # type: ignore[method-assign]

    def __call__(self, operation: str, request: dict[str, Any], client: str, rng: Any) -> dict[str, Any]:
        if operation in WRITES:
            self.counts[_kind(operation, request)] += 1
        return self._execute(operation, request, client, rng)


def _kind(operation: str, request: dict[str, Any]) -> str:
    if operation == "PutItem" and "heartbeat" in request.get("Item", {}):
        return "heartbeat"
    expression = request.get("UpdateExpression", "")
    if operation == "UpdateItem" and "position_kind" in expression and "lease_counter" not in expression:
        return "checkpoint"
    return operation


def reading(worker: SimWorker) -> set[str]:
    """The shards ``worker`` reads now: claimed, subscribed, its first event in."""
    return {
        shard_id for shard_id, owned in worker.coordinator.owned.items() if owned.phase.reading and owned.first_event
    }


def balance(fleet: Fleet) -> tuple[bool, dict[str, Any]]:
    """Balanced now (bench/fleet.py's definition, over the live workers)? With what was seen."""
    read: Counter[str] = Counter()
    counts = []
    moving = False
    for worker in fleet.live():
        coordinator = worker.coordinator
        moving = moving or bool(coordinator.cycle.asked)
        held = reading(worker)
        moving = moving or len(held) != len(coordinator.owned)
        read.update(held)
        counts.append(len(held))
    readable = fleet.readable()
    doubled = sum(1 for n in read.values() if n > 1)
    spread = max(counts) - min(counts) if counts else 0
    unread = len(readable - set(read))
    seen = {"read": len(read), "unread": unread, "doubled": doubled, "spread": spread, "moving": moving}
    return not unread and not doubled and spread <= 1 and not moving and bool(counts), seen


class Unread:
    """How long readable shards go unread, sampled: a shard read by any worker whose subscription
    runs (one stopping gracefully included) is read. The longest stretch is named: its shard, when,
    and the workers that read the shard last before it and first after it."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.since: dict[str, float] = {}
        self.reader: dict[str, str] = {}  # shard -> the worker that read it at the last sample it was read
        self.longest_s = 0.0
        self.longest: dict[str, Any] | None = None

    async def sample_every(self, seconds: float = POLL_S) -> None:
        """:meth:`sample` every ``seconds`` of the fleet's clock, until cancelled."""
        while True:
            await self.fleet.clock.sleep(seconds)
            self.sample()

    def sample(self) -> None:
        now = self.fleet.clock.now()
        read: dict[str, str] = {}
        for worker in self.fleet.workers:
            if worker.task is not None and not worker.killed and not worker.stopped:
                read.update(dict.fromkeys(reading(worker), worker.name))
        readable = self.fleet.readable()
        for shard_id in readable.difference(read):
            self.since.setdefault(shard_id, now)
        for shard_id in [s for s in self.since if s in read or s not in readable]:
            self._ended(shard_id, now, read.get(shard_id))
        self.reader.update(read)

    def _ended(self, shard_id: str, now: float, after: str | None) -> None:
        since = self.since.pop(shard_id)
        if now - since > self.longest_s:
            self.longest_s = now - since
            self.longest = self._stretch(shard_id, since, now, after)

    def _stretch(self, shard_id: str, since: float, until: float | None, after: str | None) -> dict[str, Any]:
        return {
            "shard": shard_id,
            "from_s": round(since, 3),
            "to_s": None if until is None else round(until, 3),
            "before": self.reader.get(shard_id),
            "after": after,
        }

    def restart(self) -> None:
        """From now: stretches unread so far count from now."""
        now = self.fleet.clock.now()
        self.since = dict.fromkeys(self.since, now)
        self.longest_s = 0.0
        self.longest = None

    def longest_until_now(self) -> float:
        now = self.fleet.clock.now()
        return max([self.longest_s, *(now - since for since in self.since.values())])

    def named(self) -> dict[str, Any] | None:
        """The longest stretch until now: a shard still unread counts as unread until now."""
        now = self.fleet.clock.now()
        open_ = max(self.since.items(), key=lambda item: now - item[1], default=None)
        if open_ is not None and now - open_[1] > self.longest_s:
            return self._stretch(*open_, None, None)
        return self.longest


class _Scenario:
    def __init__(self, config: PhasesConfig, trace: Trace, capture: Capture) -> None:
        self.config = config
        self.fleet = Fleet(config.fleet, config.seed, trace)
        capture.clock = self.fleet.clock
        self.capture = capture
        self.oracle: Oracle = self.fleet.oracle
        self.writes = WriteTap(self.fleet)
        self.unread = Unread(self.fleet)
        self.tasks: list[asyncio.Task[None]] = []
        self.producer: asyncio.Task[None] | None = None
        #: What a phase measured so far, shown before its end (a rolling deploy's workers replaced, its
        #: longest unread) with ``partial``: a run stopped by a budget still reports it.
        self.progress: Callable[[str, dict[str, Any]], None] = lambda name, found: None

    # ---- plumbing ------------------------------------------------------------------------------------

    def now(self) -> float:
        return self.fleet.clock.now()

    def check(self) -> None:
        """A task of the simulation failed, or an invariant was violated: the run ends on it."""
        if self.oracle.violation is not None:
            raise self.oracle.violation
        for task in [*self.tasks, *([self.producer] if self.producer else [])]:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def wait(self, seconds: float) -> None:
        end = self.now() + seconds
        while self.now() < end:
            await self.fleet.clock.sleep(min(POLL_S, end - self.now()))
            self.check()

    async def until(self, done: Callable[[], bool], timeout_s: float) -> float | None:
        """Seconds until ``done()``, looked at every POLL_S; None after ``timeout_s``."""
        started = self.now()
        while not done():
            if self.now() - started >= timeout_s:
                return None
            await self.fleet.clock.sleep(POLL_S)
            self.check()
        return self.now() - started

    def busy(self, on: bool) -> None:
        if on and self.producer is None:
            self.producer = asyncio.create_task(produce(self.fleet), name="producer")
        elif not on and self.producer is not None:
            self.producer.cancel()
            self.producer = None

    def counted(self) -> tuple[Counter[str], int]:
        return Counter(self.capture.counts), self.oracle.doubts

    def events(self, before: tuple[Counter[str], int]) -> dict[str, int]:
        counts, doubts = before
        spent = {key: self.capture.counts[name] - counts[name] for key, name in EVENTS.items()}
        spent["doubts_seen"] = self.oracle.doubts - doubts
        return spent

    async def until_balanced(self) -> dict[str, Any]:
        """Seconds until balanced (held HOLD_CYCLES lease cycles; None after the timeout), and until
        every live worker is ready (watched past the balance, within the timeout)."""
        started = self.now()
        hold_s = HOLD_CYCLES * self.fleet.settings.lease.sync_interval_s
        since: float | None = None
        balanced_s: float | None = None
        ready_at: dict[str, float] = {}
        seen: dict[str, Any] = {}
        ready_s: float | None = None
        while self.now() - started < self.config.timeout_s:
            now = self.now()
            live = self.fleet.live()
            for worker in live:
                if worker.coordinator.ready:
                    ready_at.setdefault(worker.name, now - started)
            ready_s = max(ready_at.values()) if len(ready_at) >= len(live) else None
            if balanced_s is None:
                balanced, seen = balance(self.fleet)
                if not balanced:
                    since = None
                elif since is None:
                    since = now
                elif now - since >= hold_s:
                    balanced_s = since - started
            if balanced_s is not None and ready_s is not None:
                break
            await self.fleet.clock.sleep(POLL_S)
            self.check()
        return {"balanced_s": balanced_s, "ready_s": ready_s, "seen": seen}

    async def window(self) -> dict[str, Any]:
        """What the fleet asked of DynamoDB and Kinesis for ``window_s`` from now, as rates."""
        fleet = self.fleet
        seconds = self.config.window_s
        before, lists, writes = fleet.db.usage.to_json(), fleet.stream.list_calls, Counter(self.writes.counts)
        await self.wait(seconds)
        rates = usage_rates(before, fleet.db.usage.to_json(), seconds)
        rates["lease_plane_requests_per_min"] = round(
            sum(rate for name, rate in rates["requests_per_min"].items() if name != "checkpoint"), 2
        )
        rates["list_shards_per_min"] = round(60 * (fleet.stream.list_calls - lists) / seconds, 2)
        kinds = self.writes.counts - writes
        rates["writes_per_min"] = {kind: round(60 * n / seconds, 2) for kind, n in sorted(kinds.items())}
        rates["heartbeats_per_min"] = round(60 * kinds["heartbeat"] / seconds, 2)
        rates["other_writes_per_min"] = round(60 * (sum(kinds.values()) - kinds["heartbeat"]) / seconds, 2)
        rates["workers"] = len(fleet.live())
        rate = fleet.config.records_per_shard_s if self.producer else 0.0
        rates["formula"] = expected(fleet, rate).to_json()
        # What a window this soon after the start cannot show: every worker's first read of every lease
        # partition (the safety net) comes 150-300 s after its start. The formula at steady state, with
        # a production worker's row sizes, is what the bench judges the cost by as well.
        rates["steady_state"] = expected(fleet, rate, rows_here=False).to_json()
        return rates

    # ---- the phases ------------------------------------------------------------------------------------

    async def start(self) -> dict[str, Any]:
        self.busy(True)
        await self.fleet.add(self.config.fleet.workers)
        return await self.until_balanced()

    async def steady(self, busy: bool) -> dict[str, Any]:
        self.busy(busy)
        settle_s = self.config.settle_s
        if not busy:  # the last checkpoints of the busy stretch land first
            settle_s = max(settle_s, self.fleet.settings.checkpoint.interval_s + 1)
        await self.wait(settle_s)
        return await self.window()

    async def join(self) -> dict[str, Any]:
        self.busy(True)
        await self.wait(self.config.settle_s)
        self.unread.restart()
        await self.fleet.add(1)
        found = await self.until_balanced()
        return {**found, "longest_unread_s": self.unread.longest_until_now(), "longest_unread": self.unread.named()}

    async def takeover(self) -> dict[str, Any]:
        fleet = self.fleet
        victim = max(fleet.live(), key=lambda worker: len(worker.reading()))
        held = victim.reading()
        done = len(self.oracle.takeovers)
        failover_s = fleet.settings.lease.failover_s
        await fleet.kill(victim)
        waited = await self.until(lambda: len(self.oracle.takeovers) > done, 4 * failover_s + 30)
        takeover_s = self.oracle.takeovers[done] if waited is not None and held else None
        found = await self.until_balanced()
        return {"takeover_s": takeover_s, "shards": len(held), "victim": victim.name, **found}

    async def rolling(self) -> dict[str, Any]:
        fleet = self.fleet
        old = fleet.live()
        count = len(old) if self.config.roll is None else min(self.config.roll, len(old))
        started = self.now()
        self.unread.restart()
        ready_s: list[float] = []
        stop_s: list[float] = []

        async def stop(worker: SimWorker) -> None:
            stopping = self.now()
            await fleet.terminate(worker)
            stop_s.append(self.now() - stopping)

        stops: list[asyncio.Task[None]] = []
        if count:
            (new,) = await fleet.add(1)
        for replaced, worker in enumerate(old[:count], 1):
            ready = await self.until(lambda new=new: new.coordinator.ready, self.config.timeout_s)  # type: ignore[misc]
            if ready is not None:
                ready_s.append(ready)
            await self.wait(self.config.min_ready_s)
            stops.append(asyncio.create_task(stop(worker), name=f"stop-{worker.name}"))
            self.tasks.append(stops[-1])  # a failure surfaces in check(); cancelled if the run ends early
            await asyncio.sleep(0)  # its stop has begun
            self.progress(
                "rolling",
                {
                    "replaced": len(stop_s),  # stopped so far
                    "of": len(old),
                    "seconds": self.now() - started,
                    "not_ready": replaced - len(ready_s),
                    "longest_unread_s": self.unread.longest_until_now(),
                    "longest_unread": self.unread.named(),
                },
            )
            if replaced < count:
                (new,) = await fleet.add(1)
        await self.until(lambda: all(task.done() for task in stops), self.config.timeout_s)
        rolled_s = self.now() - started
        found = await self.until_balanced()
        return {
            **found,
            "replaced": count,
            "of": len(old),
            "seconds": rolled_s,
            "not_ready": count - len(ready_s),
            "ready_s_max": max(ready_s, default=None),
            "stop_s_max": max(stop_s, default=None),
            "longest_unread_s": self.unread.longest_until_now(),
            "longest_unread": self.unread.named(),
        }

    async def run(self, report: PhasesReport, progress: Callable[[PhasesReport], None] | None) -> None:
        wall_started = time.perf_counter()
        self.tasks.append(asyncio.create_task(monitor(self.fleet, self.oracle), name="monitor"))
        self.tasks.append(asyncio.create_task(self.unread.sample_every(), name="unread"))
        steps: dict[str, Callable[[], Any]] = {
            "start": self.start,
            "busy": lambda: self.steady(True),
            "idle": lambda: self.steady(False),
            "join": self.join,
            "takeover": self.takeover,
            "rolling": self.rolling,
        }
        violation: Violation | None = None
        before, began = self.counted(), self.now()

        def partial(name: str, found: dict[str, Any]) -> None:
            report.phases[name] = {**found, **self.events(before), "from_s": round(began, 3), "partial": True}
            report.simulated_s = round(self.now(), 3)
            report.wall_s = round(time.perf_counter() - wall_started, 3)
            if progress is not None:
                progress(report)

        self.progress = partial
        try:
            for name in PHASES:
                before, began = self.counted(), self.now()
                found = await steps[name]()
                report.phases[name] = {
                    **found,
                    **self.events(before),
                    "from_s": round(began, 3),
                    "to_s": round(self.now(), 3),
                }
                report.simulated_s = round(self.now(), 3)
                report.wall_s = round(time.perf_counter() - wall_started, 3)
                if progress is not None:
                    progress(report)
        except Violation as found:
            violation = found
        except BaseException:
            if self.oracle.violation is None:
                raise
            violation = self.oracle.violation  # a worker's task ended on it, and took others down
        finally:
            self.busy(False)
            for task in self.tasks:
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await self.fleet.close()
        if violation is not None:
            report.violation = violation.report()
            report.invariant = violation.invariant
        report.simulated_s = round(self.now(), 3)
        report.wall_s = round(time.perf_counter() - wall_started, 3)


def run_phases(config: PhasesConfig, progress: Callable[[PhasesReport], None] | None = None) -> PhasesReport:
    """Every phase of PHASES on one fresh simulated fleet; ``progress(report)`` after each phase."""
    config.check()
    report = PhasesReport(config.seed, config.fleet.shards, config.fleet.workers)

    async def main(trace: Trace, capture: Capture) -> PhasesReport:
        random.seed(config.seed)  # what production code draws itself (retry jitter) comes from the seed too
        await _Scenario(config, trace, capture).run(report, progress)
        return report

    return in_virtual_time(main)
