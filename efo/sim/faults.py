"""The faults a simulated run injects, each drawn from the run's seed.

Every fault is a coroutine that waits for its moment on the world's clock, acts on the fleet, and
tells the oracle what it disturbs (so the liveness invariants count from its end):

=================  ===================================================================================
``kill``           a worker dies (SIGKILL: nothing released); another joins a while later
``zombie``         a worker is paused past its failover (a stopped VM, a long GC), then resumes
``late``           one worker's event loop runs 1-4 s late for up to a minute
``throttle-key``   one partition key (the control partition or a lease partition) is throttled
``throttle-op``    one operation (UpdateItem, Query, PutItem) is throttled
``throttle-table`` every request to the table is throttled, some of the time
``latency``        every DynamoDB request takes 1-5 s longer, for one worker or all of them
``outage``         every DynamoDB request fails (500) for 30 s
``reshard``        a storm of splits and merges within seconds
``rolling``        a rolling deploy: every worker replaced one by one, each stopped gracefully
``churn``          workers join, leave gracefully and die at random
=================  ===================================================================================

``all`` is every one of them, at random moments of the run.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

from efo.sim.dynamodb import Fault
from efo.sim.fleet import APP, Fleet

FAULTS = (
    "kill",
    "zombie",
    "late",
    "throttle-key",
    "throttle-op",
    "throttle-table",
    "latency",
    "outage",
    "reshard",
    "rolling",
    "churn",
)

Injection = Callable[[Fleet, random.Random, float], Awaitable[None]]


def parse(names: str) -> tuple[str, ...]:
    """``"kill,outage"``, ``"all"`` or ``""``; an unknown name is refused, naming the known ones."""
    if names.strip() == "all":
        return FAULTS
    chosen = tuple(name.strip() for name in names.split(",") if name.strip())
    unknown = [name for name in chosen if name not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}: the faults are {', '.join(FAULTS)} (or all)")
    return chosen


async def _at(fleet: Fleet, moment_s: float) -> None:
    await fleet.clock.sleep(max(0.0, moment_s - fleet.clock.now()))


def _someone(fleet: Fleet, rng: random.Random, *, keep: int = 1) -> str | None:
    live = fleet.live()
    if len(live) <= keep:
        return None
    return rng.choice(live).name


def _worker(fleet: Fleet, name: str):  # type: ignore[no-untyped-def]
    return next(worker for worker in fleet.workers if worker.name == name)


async def kill(fleet: Fleet, rng: random.Random, window_s: float) -> None:
    await _at(fleet, rng.uniform(0.2, 0.6) * window_s)
    name = _someone(fleet, rng)
    if name is None:
        return
    await fleet.kill(_worker(fleet, name))
    await fleet.clock.sleep(rng.uniform(15.0, 40.0))
    await fleet.add(1)


async def zombie(fleet: Fleet, rng: random.Random, window_s: float) -> None:
    await _at(fleet, rng.uniform(0.2, 0.6) * window_s)
    name = _someone(fleet, rng)
    if name is None:
        return
    worker = _worker(fleet, name)
    seconds = fleet.settings.lease.failover_s + rng.uniform(2.0, 20.0)
    now = fleet.clock.now()
    fleet.trace.add(now, name, "sim.paused", seconds=round(seconds, 3))
    fleet.disturb(name, now, now + seconds, delays_reading=False)  # its shards are taken over as a death's
    fleet.oracle.died(now, worker.reading(), name)
    worker.clock.pause(seconds)


async def late(fleet: Fleet, rng: random.Random, window_s: float) -> None:
    await _at(fleet, rng.uniform(0.1, 0.5) * window_s)
    name = _someone(fleet, rng, keep=0)
    if name is None:
        return
    worker = _worker(fleet, name)
    late_s, seconds = rng.uniform(1.0, 4.0), rng.uniform(20.0, 60.0)
    now = fleet.clock.now()
    fleet.trace.add(now, name, "sim.late", late_s=round(late_s, 3), seconds=round(seconds, 3))
    fleet.disturb(name, now, now + seconds + late_s)
    worker.clock.late_s = late_s
    await fleet.clock.sleep(seconds)
    worker.clock.late_s = 0.0


def _inject(fleet: Fleet, fault: Fault, who: str | None = None) -> None:
    fleet.db.faults.add(fault)
    fleet.disturb(who, fault.start_s, fault.end_s)
    fleet.trace.add(
        fault.start_s,
        "sim",
        f"sim.{fault.kind}",
        operation=fault.operation,
        key=fault.key,
        client=fault.client,
        until=round(fault.end_s, 3),
        extra_s=round(fault.extra_s, 3) or None,
        probability=round(fault.probability, 3),
    )


async def throttle_key(fleet: Fleet, rng: random.Random, window_s: float) -> None:
    await _at(fleet, rng.uniform(0.1, 0.6) * window_s)
    control = f"{APP}|{fleet.stream.arn}"
    partitions = fleet.workers[0].coordinator.table.lease_partitions or 1
    key = rng.choice([control, f"{control}#{rng.randrange(partitions)}"])
    now = fleet.clock.now()
    _inject(fleet, Fault("throttle", now, now + rng.uniform(10.0, 60.0), key=key, probability=rng.uniform(0.5, 1.0)))


async def throttle_op(fleet: Fleet, rng: random.Random, window_s: float) -> None:
    await _at(fleet, rng.uniform(0.1, 0.6) * window_s)
    now = fleet.clock.now()
    operation = rng.choice(["UpdateItem", "Query", "PutItem", "GetItem"])
    _inject(
        fleet,
        Fault("throttle", now, now + rng.uniform(10.0, 60.0), operation=operation, probability=rng.uniform(0.5, 1.0)),
    )


async def throttle_table(fleet: Fleet, rng: random.Random, window_s: float) -> None:
    await _at(fleet, rng.uniform(0.1, 0.6) * window_s)
    now = fleet.clock.now()
    _inject(fleet, Fault("throttle", now, now + rng.uniform(10.0, 30.0), probability=rng.uniform(0.3, 1.0)))


async def latency(fleet: Fleet, rng: random.Random, window_s: float) -> None:
    await _at(fleet, rng.uniform(0.1, 0.6) * window_s)
    now = fleet.clock.now()
    who = _someone(fleet, rng, keep=0) if rng.random() < 0.5 else None
    fault = Fault("latency", now, now + rng.uniform(10.0, 30.0), client=who, extra_s=rng.uniform(1.0, 5.0))
    if who is not None:  # its heartbeat's client too
        _inject(fleet, Fault("latency", fault.start_s, fault.end_s, client=f"{who}/hb", extra_s=fault.extra_s), who)
    _inject(fleet, fault, who)


async def outage(fleet: Fleet, rng: random.Random, window_s: float) -> None:
    await _at(fleet, rng.uniform(0.2, 0.6) * window_s)
    now = fleet.clock.now()
    _inject(fleet, Fault("outage", now, now + 30.0))


async def reshard(fleet: Fleet, rng: random.Random, window_s: float) -> None:
    await _at(fleet, rng.uniform(0.1, 0.5) * window_s)
    changes = rng.randint(2, 6)
    for _ in range(changes):
        stream = fleet.stream
        pairs = stream.adjacent_pairs()
        if pairs and rng.random() < 0.4:
            first, second = rng.choice(pairs)
            child = stream.merge(first, second)
            fleet.trace.add(fleet.clock.now(), "sim", "sim.merged", parents=f"{first},{second}", child=child)
        else:
            parent = rng.choice(stream.open_shards()).shard_id
            children = stream.split(parent)
            fleet.trace.add(fleet.clock.now(), "sim", "sim.split", parent=parent, children=",".join(children))
        await fleet.clock.sleep(rng.uniform(0.0, 3.0))


async def rolling(fleet: Fleet, rng: random.Random, window_s: float) -> None:
    await _at(fleet, rng.uniform(0.1, 0.3) * window_s)
    for worker in list(fleet.live()):
        await fleet.add(1)
        await fleet.terminate(worker)
        await fleet.clock.sleep(rng.uniform(5.0, 15.0))


async def churn(fleet: Fleet, rng: random.Random, window_s: float) -> None:
    end_s = fleet.clock.now() + window_s * 0.8
    await fleet.clock.sleep(rng.uniform(5.0, 20.0))
    while fleet.clock.now() < end_s:
        action = rng.random()
        if action < 0.4 or len(fleet.live()) <= 2:
            await fleet.add(1)
        elif action < 0.7:
            name = _someone(fleet, rng, keep=2)
            if name is not None:
                await fleet.terminate(_worker(fleet, name))
        else:
            name = _someone(fleet, rng, keep=2)
            if name is not None:
                await fleet.kill(_worker(fleet, name))
        await fleet.clock.sleep(rng.uniform(10.0, 40.0))


INJECTIONS: dict[str, Injection] = {
    "kill": kill,
    "zombie": zombie,
    "late": late,
    "throttle-key": throttle_key,
    "throttle-op": throttle_op,
    "throttle-table": throttle_table,
    "latency": latency,
    "outage": outage,
    "reshard": reshard,
    "rolling": rolling,
    "churn": churn,
}
assert set(INJECTIONS) == set(FAULTS)


async def inject(fleet: Fleet, names: tuple[str, ...], rng: random.Random, window_s: float) -> None:
    """Every named fault, each at its own random moment within ``window_s``."""
    await asyncio.gather(*(INJECTIONS[name](fleet, random.Random(rng.random()), window_s) for name in names))
