"""Parts outside the lease plane take their time from the one injected clock too (efo/clock.py): a
shard's last-event time and the wait for a consumer to become ACTIVE, so that they run on virtual
time in a test or the simulation as they run on the system clock in production."""

from __future__ import annotations

import asyncio
import collections
import functools
import random
import time
import traceback
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from efo.clock import SYSTEM_CLOCK, SystemClock
from efo.config import load_settings
from efo.errors import ResourceNotFound
from efo.kinesis.registration import StreamInfo, ensure_consumer
from efo.observability import Metrics
from efo.pipeline.handoff import Handoff
from efo.service import Service
from efo.sim.clock import EPOCH, SimClock
from efo.sim.dynamodb import SimDynamoDB
from efo.sim.kinesis import SimKinesisClient, SimStream
from efo.sim.loop import run as run_virtual


def test_a_shard_s_last_event_time_is_the_injected_clock_s_wall_time() -> None:
    async def scenario() -> None:
        clock = SimClock()
        metrics = Metrics.create(CollectorRegistry())
        series = metrics.shard("orders", "shardId-000000000001", clock)
        await clock.sleep(42.0)
        series.event(lag_ms=1500)
        value = metrics.registry.get_sample_value(
            "efo_shard_last_event_timestamp_seconds", {"stream": "orders", "shard_id": "shardId-000000000001"}
        )
        assert value == EPOCH.timestamp() + 42.0

    run_virtual(scenario())


class CreatingForEver:
    """A consumer that stays CREATING: every DescribeStreamConsumer says so."""

    def __init__(self) -> None:
        self.calls = 0

    async def describe_stream_consumer(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        arn = "arn:aws:kinesis:us-east-1:123456789012:stream/s/consumer/c:1"
        return {"ConsumerDescription": {"ConsumerARN": arn, "ConsumerName": "c", "ConsumerStatus": "CREATING"}}


def test_a_consumer_that_never_becomes_active_times_out_on_the_injected_clock() -> None:
    kinesis = CreatingForEver()

    async def scenario() -> float:
        clock = SimClock()
        with pytest.raises(ResourceNotFound, match="did not become ACTIVE within 120 s"):
            await ensure_consumer(
                kinesis, stream_arn="arn:aws:kinesis:us-east-1:123456789012:stream/s", name="c", clock=clock
            )
        return clock.now()

    waited_s = run_virtual(scenario())
    assert 120.0 < waited_s < 130.0 and kinesis.calls > 20  # backoff from 0.5 s to 5 s, in virtual time


class SimClients:
    """efo.aws.Clients' methods, answered by the simulation's DynamoDB and Kinesis."""

    def __init__(self, db: SimDynamoDB, stream: SimStream, clock: SimClock) -> None:
        self._db, self._kinesis, self._clock = db, SimKinesisClient(stream, clock, lambda: 0.01), clock

    async def kinesis(self) -> SimKinesisClient:
        return self._kinesis

    async def dynamodb(self) -> Any:
        return self._db.client("w1", self._clock)

    def subscriber(self, read_timeout_s: float) -> SimKinesisClient:
        return self._kinesis


#: What reads time without asking a clock: the system clock's object and the functions a part would
#: keep to call later.
SYSTEM_TIME = (SYSTEM_CLOCK, time.monotonic, time.time, time.perf_counter)


def _system_time_in(root: object) -> tuple[list[str], set[str]]:
    """The paths from ``root``, through efo's objects and the containers they hold, to anything in
    :data:`SYSTEM_TIME` (a default ``clock=`` nobody overrode, or a bound method of one), and the names
    of the classes of efo's objects walked through."""
    found: list[str] = []
    walked: set[str] = set()
    seen: set[int] = set()
    todo: list[tuple[object, str]] = [(root, type(root).__name__)]
    while todo:
        obj, path = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        owner = getattr(obj, "__self__", None)  # a bound method: what it is bound to
        if any(obj is system or owner is system for system in SYSTEM_TIME):
            found.append(path)
            continue
        if isinstance(obj, dict):
            todo.extend((value, f"{path}[{key!r}]") for key, value in obj.items())
        elif isinstance(obj, list | tuple | set | frozenset | collections.deque):
            todo.extend((value, f"{path}[]") for value in obj)
        elif owner is not None:
            todo.append((owner, f"{path}.__self__"))
        elif isinstance(obj, functools.partial):
            todo.extend((part, f"{path}.partial") for part in (obj.func, *obj.args, *obj.keywords.values()))
        elif type(obj).__module__.startswith("efo.") and not isinstance(obj, SimClock | SimDynamoDB | SimStream):
            walked.add(type(obj).__name__)
            attributes = dict(getattr(obj, "__dict__", {}))
            for cls in type(obj).__mro__:
                for name in getattr(cls, "__slots__", ()):
                    if hasattr(obj, name):
                        attributes[name] = getattr(obj, name)
            todo.extend((value, f"{path}.{name}") for name, value in attributes.items())
        elif callable(obj) and getattr(obj, "__closure__", None):  # a lambda or closure: what it holds
            todo.extend((cell.cell_contents, f"{path}.<closure>") for cell in obj.__closure__ if _filled(cell))
    return found, walked


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell
        return False
    return True


def test_a_service_hands_its_clock_to_every_part_it_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Service(clock=...)``: every part it makes, and every part those make while they run (the
    lease cycle, liveness, membership, runner, subscriptions, checkpointer, pool), keeps that clock
    and nothing that reads the system's time. A part built with its default ``clock=`` would run on
    the system clock in the simulation, which builds coordinators itself and so would not notice. The
    handoff is the caller's (the driver thread's: real time in production, efo/clock.py). Two checks:
    no object reached from the service holds the system's time, and no system clock (any instance)
    is asked anything while it runs (a part held only by a task, which the walk cannot reach: a
    subscription built without its clock, found in review)."""
    asked: list[str] = []

    def spying(name: str) -> Any:
        real = getattr(SystemClock, name)

        def spy(self: SystemClock, *args: Any) -> Any:
            caller = traceback.extract_stack(limit=2)[0]
            asked.append(f"{name} from {caller.filename}:{caller.lineno}")
            return real(self, *args)

        return spy

    for name in ("now", "wall", "sleep", "timeout", "call_later"):
        monkeypatch.setattr(SystemClock, name, spying(name))

    async def scenario() -> tuple[list[str], set[str]]:
        clock = SimClock()
        db = SimDynamoDB(random.Random(1))
        stream = SimStream("orders", 4, clock=clock)
        settings = load_settings(
            environment=False, stream=stream.arn, app="a", table="t", sink="console", region="us-east-1"
        )
        service = Service(settings, Handoff(clock=clock.now), clock=clock)
        consumer_arn = f"{stream.arn}/consumer/a:1"
        service._checked = [(StreamInfo("orders", stream.arn, EPOCH, "ACTIVE", 4), consumer_arn)]
        db.create_table("t")
        coordinators = await service._prepare(SimClients(db, stream, clock))  # type: ignore[arg-type]
        stop, driver_done = asyncio.Event(), asyncio.Event()
        for coordinator in coordinators:
            await coordinator.check()
        running = [asyncio.create_task(c.run(stop, driver_done)) for c in coordinators]
        await clock.sleep(30.0)  # leases claimed, shards read, checkpoints due
        assert all(len(c.owned) == 4 for c in coordinators), [len(c.owned) for c in coordinators]
        found = _system_time_in([service, coordinators])
        stop.set()
        driver_done.set()
        await asyncio.gather(*running)
        return found

    found, walked = run_virtual(scenario())
    assert found == [] and asked == [], (found, asked)
    parts = {"LeaseTable", "LeaseCache", "PendingPool", "Checkpointer", "Liveness", "Membership", "LeaseCycle"}
    assert parts <= walked, sorted(parts - walked)
