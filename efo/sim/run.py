"""One simulated run: a fleet, a producer, the faults, the invariants watched every second, a drain.

A run is a function of its :class:`RunConfig` (its seed included): the same config gives the same
events in the same order, to the last request (with ``PYTHONHASHSEED=0``, which ``python -m
efo.sim`` sets for itself).

Phases: every worker starts at once (a mass start), records are put at the configured rate while
the faults happen within ``duration_s``; then the faults end, the producer stops, and the fleet has
``drain_s`` to read everything that was put (**nothing lost**: every record acknowledged by Kinesis is
committed by some sink); then every worker is stopped gracefully.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, MutableMapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import structlog

from efo import gc_tuning
from efo.leases.cost import HEARTBEAT_ROW_B, LEASE_ROW_B, WRITE_PRICE, Cost, busy_shards, steady_state
from efo.sim import faults
from efo.sim.fleet import Fleet, FleetConfig
from efo.sim.invariants import Oracle, Trace, Violation
from efo.sim.loop import run as run_virtual

MONITOR_INTERVAL_S = 1.0
#: Kinesis takes at most 1,000 records a second into a shard.
MAX_RECORDS_PER_SHARD_S = 1000.0
#: An empty event at least this far apart (Kinesis sends one every few seconds; far below, the
#: simulated time would crawl).
MIN_IDLE_EVENT_S = 0.01
PRODUCE_INTERVAL_S = 0.2
DRAIN_POLL_S = 1.0
#: The collector as `efo run` sets it (efo.gc_tuning), but its young generation collected 10 times
#: less often: every worker's leases and lease rows are alive at once, and at a mass start each lease
#: cycle of each worker makes thousands of containers that live on (136 young collections in the first
#: 7 simulated s of 4,096 x 64, 2.9 CPU s; 13 and 1.4 CPU s with this).
SIM_YOUNG_THRESHOLD = 100_000

T = TypeVar("T")


@dataclass
class RunConfig:
    fleet: FleetConfig = field(default_factory=FleetConfig)
    seed: int = 0
    duration_s: float = 180.0
    faults: tuple[str, ...] = ()
    drain_s: float = 90.0
    #: The stretch of simulated time (from, to) whose DynamoDB and ListShards use the report gives
    #: as rates (Report.window); None: none.
    window: tuple[float, float] | None = None

    def check(self) -> None:
        """A size, length or fault the simulation cannot run is refused, naming what is allowed (a
        length that is not a finite number, or an idle event every 0 s, would never let time move)."""
        fleet = self.fleet
        need(1 <= fleet.shards <= 100_000, "shards", fleet.shards, "from 1 to 100,000")
        need(1 <= fleet.workers <= 4096, "workers", fleet.workers, "from 1 to 4,096")
        number("duration_s", self.duration_s, 0, above=True)
        number("drain_s", self.drain_s, 0)
        number("records_per_shard_s", fleet.records_per_shard_s, 0, most=MAX_RECORDS_PER_SHARD_S)
        number("stale_read_s", fleet.dynamodb.stale_read_s, 0)
        number("idle_event_s", fleet.idle_event_s, MIN_IDLE_EVENT_S)
        if self.window is not None:
            allowed = f"TO at most the run's {self.duration_s:g} s of traffic"
            need(self.window[1] <= self.duration_s, "window", self.window, allowed)
        faults.parse(",".join(self.faults))


class BadRunConfig(ValueError):
    """A run the simulation cannot make: which field, its value, and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        super().__init__(f"{field} = {f'{value:g}' if isinstance(value, float) else value}: {allowed}")
        self.field = field
        self.allowed = allowed


def need(ok: bool, field: str, value: object, allowed: str) -> None:
    """``field`` = ``value`` is refused (BadRunConfig) unless ``ok``."""
    if not ok:
        raise BadRunConfig(field, value, allowed)


def number(field: str, value: float, least: float, *, above: bool = False, most: float = math.inf) -> None:
    """``value`` must be a finite number from ``least`` (or ``above`` it) to ``most``: a length that is
    not finite would never let virtual time move, or never end a wait."""
    ok = math.isfinite(value) and (value > least if above else value >= least) and value <= most
    allowed = f"a finite number {'above' if above else 'at least'} {least:g}"
    need(ok, field, value, allowed + (f", at most {most:,g}" if math.isfinite(most) else ""))


@dataclass
class Report:
    seed: int
    shards: int
    workers: int
    faults: tuple[str, ...]
    simulated_s: float
    wall_s: float
    records_put: int
    records_committed: int
    duplicates: int
    checkpoints: int
    takeovers_s: list[float]
    longest_unread_s: float
    doubts: int
    events: dict[str, int]
    requests: dict[str, int]
    throttled: dict[str, int]
    list_shards_calls: int
    busiest_key: dict[str, Any]
    window: dict[str, Any] | None = None
    violation: str | None = None
    invariant: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Capture:
    """Every worker's log events (info and above) into the trace and a count by name."""

    def __init__(self, trace: Trace, clock: Any) -> None:
        self.trace = trace
        self.clock = clock
        self.counts: Counter[str] = Counter()

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
        name = str(event.pop("event", ""))
        self.counts[name] += 1
        if method in ("info", "warning", "error", "critical", "exception"):
            who = str(event.pop("worker_id", "") or "")
            fields = {k: v for k, v in event.items() if k in _TRACED}
            self.trace.add(self.clock.now(), who or "-", name, **fields)
        raise structlog.DropEvent


_TRACED = frozenset(
    {"shard_id", "epoch", "reason", "position", "checkpoint", "error", "previous_owner", "owner", "asker"}
)


async def produce(fleet: Fleet) -> None:
    rate = fleet.config.records_per_shard_s
    if rate <= 0:
        return
    rng = random.Random(fleet.rng.random())
    owed = 0.0
    counter = 0
    while True:
        await fleet.clock.sleep(PRODUCE_INTERVAL_S)
        shards = len(fleet.stream.open_shards())
        owed += rate * shards * PRODUCE_INTERVAL_S
        keys = 16 * shards
        while owed >= 1.0:
            owed -= 1.0
            counter += 1
            key = f"k{rng.randrange(keys)}"
            fleet.stream.put(key, f"{key}:{counter}".encode())


async def monitor(fleet: Fleet, oracle: Oracle) -> None:
    while True:
        await fleet.clock.sleep(MONITOR_INTERVAL_S)
        oracle.watch(fleet.clock.now(), fleet, fleet.readable())


async def _main(config: RunConfig, trace: Trace, capture: Capture) -> Report:
    wall_started = time.perf_counter()
    random.seed(config.seed)  # what production code draws itself (retry jitter) comes from the seed too
    fleet = Fleet(config.fleet, config.seed, trace)
    capture.clock = fleet.clock
    oracle = fleet.oracle
    violation: Violation | None = None
    tasks: list[asyncio.Task[None]] = []
    window: dict[str, Any] = {}
    try:
        await fleet.add(config.fleet.workers)
        tasks.append(asyncio.create_task(produce(fleet), name="producer"))
        tasks.append(asyncio.create_task(monitor(fleet, oracle), name="monitor"))
        chaos = asyncio.create_task(
            faults.inject(fleet, config.faults, random.Random(fleet.rng.random()), config.duration_s), name="faults"
        )
        tasks.append(chaos)
        if config.window is not None:
            tasks.append(asyncio.create_task(_measure(fleet, config.window, window), name="window"))
        await _until(fleet, oracle, tasks, lambda: fleet.clock.now() >= config.duration_s)
        chaos.cancel()
        tasks[0].cancel()  # the producer stops; faults that are still on end now
        fleet.db.faults.active.clear()
        for worker in fleet.workers:
            worker.clock.late_s = 0.0
        drain_until = fleet.clock.now() + config.drain_s
        await _until(fleet, oracle, tasks, lambda: oracle.unread_records() == 0 or fleet.clock.now() >= drain_until)
        if oracle.unread_records():
            oracle.fail(
                fleet.clock.now(),
                "nothing lost",
                f"{oracle.unread_records()} record(s) put were never committed, "
                f"{config.drain_s:g} s after the last put",
            )
        for worker in fleet.live():
            await fleet.terminate(worker)
    except Violation as found:
        violation = found
    except BaseException:
        if oracle.violation is None:
            raise
        violation = oracle.violation  # a worker's task ended on it, and took others down
    finally:
        if violation is not None:
            violation.fleet = _views(fleet)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await fleet.close()
    meter = fleet.db.usage
    busiest: dict[str, Any] = {}
    if meter.partitions:
        key, totals = max(meter.partitions.items(), key=lambda kv: kv[1].read_units + 5 * kv[1].write_units)
        busiest = {"key": key, "read_units": totals.read_units, "write_units": totals.write_units}
    return Report(
        seed=config.seed,
        shards=config.fleet.shards,
        workers=config.fleet.workers,
        faults=config.faults,
        simulated_s=round(fleet.clock.now(), 3),
        wall_s=round(time.perf_counter() - wall_started, 3),
        records_put=sum(len(shard.sequences) for shard in fleet.stream.shards.values()),
        records_committed=oracle.committed_records,
        duplicates=oracle.duplicate_records,
        checkpoints=oracle.checkpoints,
        takeovers_s=[round(s, 3) for s in oracle.takeovers],
        longest_unread_s=round(oracle.unread_max_s, 3),
        doubts=oracle.doubts,
        events=dict(capture.counts),
        requests={op: totals.requests for op, totals in meter.operations.items()},
        throttled=dict(fleet.db.throttled),
        list_shards_calls=fleet.stream.list_calls,
        busiest_key=busiest,
        window=window or None,
        violation=violation.report() if violation is not None else None,
        invariant=violation.invariant if violation is not None else None,
    )


async def _measure(fleet: Fleet, window: tuple[float, float], into: dict[str, Any]) -> None:
    """What the fleet asked of DynamoDB and Kinesis from ``window[0]`` to ``window[1]``, as rates."""
    start_s, end_s = window
    await fleet.clock.sleep(max(0.0, start_s - fleet.clock.now()))
    before, lists = fleet.db.usage.to_json(), fleet.stream.list_calls
    peaks: dict[str, float] = {}
    second = before
    while fleet.clock.now() < end_s:  # each second's busiest keys too: the window's mean hides a burst
        await fleet.clock.sleep(min(1.0, end_s - fleet.clock.now()))
        now = fleet.db.usage.to_json()
        rates = usage_rates(second, now, 1.0)
        for name in PEAKS:
            peaks[name] = max(peaks.get(name, 0.0), rates[name])
        second = now
    into.update(usage_rates(before, second, end_s - start_s))
    into["peak_second"] = peaks
    into["list_shards_per_min"] = round(60 * (fleet.stream.list_calls - lists) / (end_s - start_s), 2)
    into["workers"] = len(fleet.live())
    into["row_sizes_b"] = dict(zip(("lease", "heartbeat"), fleet.row_sizes_b(), strict=True))
    into["formula"] = expected(fleet, fleet.config.records_per_shard_s).to_json()


def expected(fleet: Fleet, records_per_shard_s: float, *, rows_here: bool = True) -> Cost:
    """What the README's formula says the fleet as it is now asks for, its shards' records arriving at
    ``records_per_shard_s`` each (the producer's keys fall on shards at random), its rows the size
    they are here (``rows_here``) or the size a production worker's are (longer names)."""
    shards = len(fleet.stream.open_shards())
    busy = busy_shards(shards, records_per_shard_s, fleet.settings.checkpoint.interval_s)
    lease_row_b, heartbeat_row_b = fleet.row_sizes_b() if rows_here else (LEASE_ROW_B, HEARTBEAT_ROW_B)
    return steady_state(
        fleet.settings,
        workers=len(fleet.live()),
        shards=len(fleet.stream.shards),
        busy=busy,
        lease_row_b=lease_row_b,
        heartbeat_row_b=heartbeat_row_b,
    )


#: The figures of :func:`usage_rates` whose largest value over the seconds of a window it gives as well.
PEAKS = (
    "busiest_key_read_units_per_s",
    "busiest_key_write_units_per_s",
    "busiest_lease_key_read_units_per_s",
    "busiest_lease_key_write_units_per_s",
)


def usage_rates(before: dict[str, Any], after: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The use between two readings of the meter: requests a minute by operation; the lease plane's
    read and write units a second (everything but the checkpoints) and its cost in read-unit
    equivalents; the checkpoints'; and the busiest partition key's units a second (all of it)."""

    def delta(kind: str, name: str, field: str) -> float:
        return float(after[kind].get(name, {}).get(field, 0)) - float(before[kind].get(name, {}).get(field, 0))

    operations = {name: delta("operations", name, "requests") * 60 / seconds for name in after["operations"]}
    plane = [name for name in after["operations"] if name != "checkpoint"]
    reads = sum(delta("operations", name, "read_units") for name in plane) / seconds
    writes = sum(delta("operations", name, "write_units") for name in plane) / seconds
    keys = {
        name: (delta("partitions", name, "read_units") / seconds, delta("partitions", name, "write_units") / seconds)
        for name in after["partitions"]
    }
    busiest_read = max(keys.items(), key=lambda kv: kv[1][0], default=("", (0.0, 0.0)))
    busiest_write = max(keys.items(), key=lambda kv: kv[1][1], default=("", (0.0, 0.0)))
    leases = [rates for name, rates in keys.items() if "#" in name]  # the lease partitions' keys (efo.leases.table)
    return {
        "seconds": seconds,
        "requests_per_min": {name: round(rate, 2) for name, rate in sorted(operations.items()) if rate},
        "read_units_per_s": round(reads, 3),
        "write_units_per_s": round(writes, 3),
        "cost_per_s": round(reads + WRITE_PRICE * writes, 3),
        "checkpoint_write_units_per_s": round(delta("operations", "checkpoint", "write_units") / seconds, 3),
        "busiest_key_read_units_per_s": round(busiest_read[1][0], 3),
        "busiest_key_write_units_per_s": round(busiest_write[1][1], 3),
        "busiest_lease_key_read_units_per_s": round(max((r for r, _ in leases), default=0.0), 3),
        "busiest_lease_key_write_units_per_s": round(max((w for _, w in leases), default=0.0), 3),
        "busiest_read_key": busiest_read[0],
        "busiest_write_key": busiest_write[0],
    }


def _views(fleet: Fleet) -> list[str]:
    """Each live worker as it sees itself: its trust, what it reads, who it sees live, its share."""
    lines = []
    for worker in fleet.live():
        coordinator = worker.coordinator
        cycle = coordinator.cycle
        state = cycle.state
        held = sorted(coordinator.owned)
        live = sorted(cycle.view.live)
        free = 0
        if state is not None:
            free = sum(
                1 for lease in state.leases.values() if not lease.finished and lease.owner not in cycle.view.live
            )
        lines.append(
            f"{worker.name}: {coordinator.liveness.trust.value}, holds {len(held)}, sees {len(live)} live "
            f"({','.join(live)}), {free} free or dead-owned in its last read"
            + (" (paused)" if worker.clock.paused else "")
        )
    return lines


async def _until(fleet: Fleet, oracle: Oracle, tasks: list[asyncio.Task[None]], done: Any) -> None:
    """Wait (checking every second that no task of the simulation failed) until ``done()``."""
    while not done():
        await fleet.clock.sleep(MONITOR_INTERVAL_S)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        if oracle.violation is not None:
            raise oracle.violation


def simulate(config: RunConfig) -> Report:
    """Run ``config`` on a fresh virtual-time loop; the workers' logs go to the trace only."""
    config.check()
    return in_virtual_time(lambda trace, capture: _main(config, trace, capture))


def in_virtual_time(main: Callable[[Trace, Capture], Coroutine[Any, Any, T]]) -> T:
    """``main(trace, capture)`` on a fresh virtual-time loop, the workers' log events going to the
    trace and counted by name (``capture.counts``), nowhere else (efo.sim.phases runs its own main)."""
    trace = Trace()
    capture = Capture(trace, None)
    previous = structlog.get_config()
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, capture],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        cache_logger_on_first_use=False,
    )
    logging.getLogger("efo").setLevel(logging.ERROR)
    try:
        with gc_tuning.tuned(SIM_YOUNG_THRESHOLD):
            return run_virtual(main(trace, capture))
    finally:
        structlog.configure(**previous)
