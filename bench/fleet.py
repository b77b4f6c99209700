"""A fleet of workers on one stream: what efo's lease plane costs in DynamoDB, and how fast it
balances and takes over, at 256 x 4, 1,024 x 16 and 4,096 x 64 (shards x workers), idle and busy.
``make bench`` runs it at 1,024 x 16, and the larger sizes in simulated time (bench/fleet_sim.py,
which also compares its counts with this run's).

**What runs.** W real :class:`efo.coordinator.Coordinator` s in this process (one event loop), with
the default lease settings (failover 10 s, heartbeat 2 s, a lease cycle a second, every lease row
read at least every 30 s, checkpoints at most every 5 s a shard, ListShards every 10 s), each with
its own two aiobotocore DynamoDB clients (efo's :class:`efo.aws.Clients`: the lease client and the
heartbeat's) to Amazon DynamoDB Local behind a meter (:mod:`efo.devstack.dynamodb_local`; this
script runs itself again in a private network namespace for it; ``--dynamodb moto`` for the stack's
own), and a driver that commits at once what each worker's handoff holds, so checkpoints are real. Kinesis is
:class:`efo.devstack.fleet_kinesis.FleetKinesis`: S shards listed 1,000 a page as AWS does, each
subscription an event a second, empty when **idle**, one 100-byte record when **busy**.

**Phases, per size**, on a fresh local DynamoDB: the lease rows are bootstrapped by a throwaway
worker (timed apart); then

1. **start**: all W start at once (busy); seconds until *balanced*: every shard read (claimed, and
   its first event in) by exactly one worker, shares within one of each other, nothing being
   handed over, and that for 2 lease cycles in a row (the time is the start of that stretch);
2. **steady, busy** then **idle**: after ``--settle`` seconds, a ``--window`` with the meter reset at
   its start: DynamoDB requests a minute by operation, read and write units a second for the fleet
   and for the busiest partition key, ListShards calls a minute;
3. **join** (busy): one more worker starts; seconds until balanced again;
4. **takeover** (busy): one worker's tasks are cancelled without releasing anything (what SIGKILL
   leaves: a heartbeat row that stops changing, leases still its own); seconds until every shard it
   read is read again by the others. Goal: at most ``lease.failover_s`` + 2 s.

*Leases in doubt* counts the workers' ``lease.in_doubt`` events (a worker whose heartbeat did not
land for ``failover_s - heartbeat_interval_s`` drops every lease) in each phase, and ``lease.lost``
the leases a worker found taken from it.

**Counted at the wire.** Requests and units come from the local DynamoDB's meter
(``efo.devstack.units.usage``), which prices every request it serves in on-demand units by
operation and by partition key. The bench never reads the table's keys itself (it reads the table
only through :class:`~efo.leases.table.LeaseTable`), so the figures hold whatever the key layout.
Which write is a checkpoint is told from the request bodies the clients put on the wire (a botocore
``before-call`` hook: an UpdateItem that sets ``position_kind`` and leaves the lease counter alone),
which also times every request at the client. The **lease plane** is everything but those
checkpoint writes (a lease row is under 1 KB, so each checkpoint is one write unit).

**The models** are the KCL's DynamoDB request patterns at their default settings, derived from the
KCL's code (awslabs/amazon-kinesis-client v2.6.1 and v3.4.3; not run: no JVM jars can be fetched
here), computed for the same S and W (lease rows of about 320 B in 2.x and 340 B in 3.x):

- **KCL 2.x**: every worker renews each lease it holds with a conditional UpdateItem every
  ``failoverTimeMillis / 3 - epsilonMillis`` = 3,308 ms (``DynamoDBLeaseCoordinator``,
  ``CommonCalculations.getRenewerTakerIntervalMillis``); its ``DynamoDBLeaseTaker`` Scans the whole
  table every ``(failoverTimeMillis + epsilonMillis) * 2`` = 20,050 ms; every worker's
  ``DeterministicShuffleShardSyncLeaderDecider`` Scans it every 5 minutes, and the elected leader's
  ``PeriodicShardSyncManager`` every 2 minutes. Units/s: writes ``S / 3.308``; reads
  ``(W / 20.05 + W / 300 + 1 / 120)`` Scans of the table (0.5 unit per 4 KB, eventually consistent).
- **KCL 3.x**: the same renewals (now also fenced on ``checkpointOwner``); no taker: each worker's
  ``DynamoDBLeaseDiscoverer`` Queries the lease-owner index for its own leases every
  ``leaseAssignmentIntervalMillis / 2 - epsilonMillis`` = 9,975 ms; one leader (a DynamoDB lock,
  heartbeat every 30 s; non-leaders read the lock item every 30 s, strongly consistent) runs the
  ``LeaseAssignmentManager`` every 20 s (a Scan of the leases and of the worker-metrics table) and
  the 2-minute audit Scan; every worker writes its ``WorkerMetricStats`` row every 30 s.
- Neither lists shards in steady state (the leader's ``PeriodicShardSyncManager`` calls ListShards
  only for a hole in the hash ranges seen 3 times in a row); checkpoints are the application's, the
  same writes as efo's (the models are given efo's checkpoint writes of the same window).
- Times: a dead worker's lease is seen expired when its counter has not moved for 10 s between two
  of the taker's (2.x) or the assignment manager's (3.x) scans 20 s apart: taken 20 to 40 s after
  the last renewal (3.x: up to ~10 s more until the new owner's discovery Query finds it); a
  joining 2.x worker steals ``maxLeasesToStealAtOneTime`` = 1 lease per taker cycle.

Money: a write unit priced five times a read unit (on-demand list prices), so a cost a second is
``read units + 5 x write units`` in read-unit equivalents.

Goals: at 1,024 x 16 steady state, the lease plane at most 1/10 of the KCL 2.x model's cost and
below the KCL 3.x model's; at 4,096 x 64 busy, the busiest partition key under 1/3 of its limits
(3,000 read and 1,000 write units a second), balanced within 30 s of the start, takeover within
``failover_s`` + 2 s; an idle fleet writes its heartbeats and nothing else.

**Keeping up.** One event loop runs every worker, on one core: every DynamoDB request costs it
the CPU of aiobotocore (signing, serializing, parsing; a few milliseconds), which each pod pays for
its own workers alone on AWS. DynamoDB Local serves requests concurrently but orders writes (about
500 conditional writes a second on an idle machine); moto serves one request at a time (about 130).
Each phase is bounded in time, and for each size the bench reports where the time went: DynamoDB
latency at the client by operation, the most requests in flight at once, the CPU share of the
DynamoDB server and of this process, this process's CPU per request, the machine's load, and how
late this event loop ran its timers. A size that did not keep up is marked so and reported as seen, never
shrunk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from common import command_line, hermetic_aws_environment, percentile, start_dynamodb, write_json

from efo.aws import Clients, Endpoints
from efo.config import Settings, load_settings
from efo.coordinator import Coordinator
from efo.devstack.dynamodb_local import (
    UNPRICED,
    NotIsolated,
    check_isolation_possible,
    interfaces_up,
    isolated,
    isolating_command,
    loopback_up,
)
from efo.devstack.fleet_kinesis import FleetKinesis
from efo.devstack.units import Usage, usage
from efo.kinesis.registration import StreamInfo
from efo.leases.lifecycle import Commit
from efo.leases.table import LeaseTable
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool

REGION = "us-east-1"
STREAM = "fleet"
WRITE_PRICE = 5.0  # a write unit costs five read units (on-demand list prices)
READ_LIMIT, WRITE_LIMIT = 3000.0, 1000.0  # units a second one partition key serves
GOAL_COST_SIZE = (1024, 16)
GOAL_SCALE_SIZE = (4096, 64)
HOLD_CYCLES = 2  # balanced for this many lease cycles in a row
LOOP_TICK_S = 0.1
CORES = os.cpu_count() or 1
DYNAMODB_MODULES = {"local": "efo.devstack.dynamodb_local", "moto": "efo.devstack.dynamodb"}
DYNAMODB_NAMES = {
    "local": "Amazon DynamoDB Local (behind a meter, in a private network namespace)",
    "moto": "the local stack's DynamoDB (moto, one request at a time)",
}
SERVER_SATURATED_CORES = {"local": 0.9 * CORES, "moto": 0.9}  # a server this busy (in cores) is saturated
METER_SATURATED_CORES = 0.9  # DynamoDB Local's meter: one event loop
ISOLATED_ENV = "EFO_FLEET_ISOLATED"  # set in the run inside the private network namespace
WRITES = ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems")

# ---- what the workers log: counted, never printed ------------------------------------------------

EVENTS: Counter[str] = Counter()
TAKEN: list[tuple[float, str | None]] = []  # each lease.taken: when (monotonic), from whom; the takeover's timeline


def _count_event(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    name = str(event.get("event"))
    EVENTS[name] += 1
    if name == "lease.taken":
        TAKEN.append((time.monotonic(), event.get("previous_owner")))
    raise structlog.DropEvent


def quiet_logging() -> None:
    structlog.configure(
        processors=[_count_event],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        cache_logger_on_first_use=True,
    )
    logging.getLogger().setLevel(logging.ERROR)


# ---- the wire, as the clients see it ---------------------------------------------------------------


class Tap:
    """Every DynamoDB request the workers' clients make: its kind (a checkpoint, a heartbeat, the
    rest by operation), its latency at the client (queueing for a connection and retries included),
    how many are in flight; and every HTTP attempt (retries)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.reset()

    def reset(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.latency: dict[str, list[float]] = {}
        self.attempts = 0
        self.errors: Counter[str] = Counter()
        self.busy_s = 0.0

    def attach(self, client: Any) -> None:
        events = client.meta.events
        events.register("before-call.dynamodb", self._before)
        events.register("after-call.dynamodb", self._after)
        events.register("after-call-error.dynamodb", self._failed)
        events.register("before-send.dynamodb", self._send)

    def _before(self, model: Any, params: dict[str, Any], context: dict[str, Any], **kwargs: Any) -> None:
        operation = str(model.name)
        kind = operation
        if operation in ("UpdateItem", "Query"):
            try:
                body = json.loads(params.get("body") or b"{}")
            except ValueError:
                body = {}
            expression = str(body.get("UpdateExpression", ""))
            if "position_kind" in expression and "lease_counter" not in expression:
                kind = "checkpoint"
            elif operation == "Query":
                kind = "Query (consistent)" if body.get("ConsistentRead") else "Query (eventually consistent)"
        elif operation == "PutItem" and b'"heartbeat"' in (params.get("body") or b""):
            kind = "heartbeat"
        context["fleet"] = (operation, kind, time.perf_counter())
        self.in_flight += 1

    def _done(self, context: dict[str, Any], error: str | None) -> None:
        started = context.pop("fleet", None)
        if started is None:
            return
        operation, kind, at = started
        self.in_flight -= 1
        seconds = time.perf_counter() - at
        self.kinds[kind] += 1
        self.latency.setdefault(operation, []).append(seconds)
        self.busy_s += seconds
        if error:
            self.errors[error] += 1

    def _after(self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **kwargs: Any) -> None:
        code = None
        if getattr(http_response, "status_code", 200) >= 300:
            code = str(parsed.get("Error", {}).get("Code") or http_response.status_code)
        self._done(context, code)

    def _failed(self, exception: BaseException, context: dict[str, Any], **kwargs: Any) -> None:
        self._done(context, type(exception).__name__)

    def _send(self, **kwargs: Any) -> None:
        self.attempts += 1


TAP = Tap()


# ---- the fleet -------------------------------------------------------------------------------------


class Worker:
    """One worker: a coordinator with its own DynamoDB clients, pool and handoff."""

    def __init__(self, name: str, fleet: Fleet) -> None:
        self.name = name
        self.fleet = fleet
        self.clients = Clients(Endpoints(REGION, None, fleet.endpoint))
        self.handoff = Handoff()
        self.task: asyncio.Task[None] | None = None
        self.coordinator: Coordinator | None = None
        self.stop = asyncio.Event()
        self.driver_done = asyncio.Event()

    async def prepare(self) -> Coordinator:
        settings = self.fleet.settings
        table = LeaseTable(
            await self.clients.dynamodb(),
            table=settings.table_name,
            app=settings.app,
            stream_arn=self.fleet.stream.arn,
            worker_id=self.name,
            consumer_arn=self.fleet.consumer_arn,
        )
        heartbeats = table.with_client(await self.clients.dynamodb())
        TAP.attach(table._ddb)
        TAP.attach(heartbeats._ddb)
        self.coordinator = Coordinator(
            settings=settings,
            stream=self.fleet.stream,
            consumer_arn=self.fleet.consumer_arn,
            kinesis=self.fleet.kinesis,
            subscriber=self.fleet.kinesis,
            table=table,
            pool=PendingPool.of(settings.pool),
            handoff=self.handoff,
            heartbeats=heartbeats,
        )
        return self.coordinator

    def start(self) -> None:
        assert self.coordinator is not None
        self.task = asyncio.create_task(self.coordinator.run(self.stop, self.driver_done), name=self.name)

    def drive(self) -> None:
        """The sink: commit at once whatever the handoff holds (never blocks)."""
        if self.coordinator is None:
            return
        chunks = self.handoff.take_batch(1 << 30, 1 << 40, 0.0, 0.0)
        if chunks:
            self.coordinator.on_committed([Commit.of(chunk) for chunk in chunks])

    def reading(self) -> tuple[set[str], bool]:
        """The shards this worker reads now, and whether any claim of it is on the move."""
        if self.coordinator is None:
            return set(), False
        shards, moving = set(), bool(self.coordinator.cycle.asked)
        for shard_id, owned in self.coordinator.owned.items():
            if owned.phase.reading and owned.first_event:
                shards.add(shard_id)
            else:
                moving = True
        return shards, moving

    async def kill(self) -> None:
        """What SIGKILL leaves: nothing released, the heartbeat row stops changing."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.clients.close()

    @property
    def failed(self) -> BaseException | None:
        if self.task is not None and self.task.done() and not self.task.cancelled():
            return self.task.exception()
        return None


class Fleet:
    def __init__(self, shards: int, endpoint: str, settings: Settings) -> None:
        self.shards = shards
        self.endpoint = endpoint
        self.settings = settings
        self.kinesis = FleetKinesis(shards)
        arn = f"arn:aws:kinesis:{REGION}:000000000000:stream/{STREAM}"
        self.stream = StreamInfo(STREAM, arn, datetime(2026, 1, 1, tzinfo=UTC), "ACTIVE", shards)
        self.consumer_arn = f"{arn}/consumer/{settings.app}:1"
        self.workers: list[Worker] = []
        self.live: list[Worker] = []
        self._driver: asyncio.Task[None] | None = None

    async def bootstrap(self) -> float:
        """The lease table and a lease for every shard, written by a throwaway worker."""
        started = time.monotonic()
        worker = Worker("bootstrap", self)
        coordinator = await worker.prepare()
        await coordinator.table.ensure_table()
        await coordinator.bootstrap()
        await worker.clients.close()
        return time.monotonic() - started

    async def add(self, count: int) -> list[Worker]:
        """``count`` more workers, prepared first, then started at once."""
        added = [Worker(f"w{len(self.workers) + i + 1:03d}", self) for i in range(count)]
        for worker in added:
            await worker.prepare()
        for worker in added:
            worker.start()
        self.workers += added
        self.live += added
        if self._driver is None:
            self._driver = asyncio.create_task(self._drive())
        return added

    async def _drive(self) -> None:
        while True:
            for worker in self.live:
                worker.drive()
            await asyncio.sleep(0.05)

    async def kill(self, worker: Worker) -> None:
        self.live.remove(worker)
        await worker.kill()

    def check(self) -> None:
        for worker in self.live:
            if worker.failed is not None:
                raise RuntimeError(f"worker {worker.name} failed: {worker.failed!r}")

    def state(self) -> tuple[bool, dict[str, Any]]:
        """Balanced now? With what was seen: shards read, by how many workers, spread, moving."""
        read: Counter[str] = Counter()
        counts = []
        moving = False
        for worker in self.live:
            shards, on_the_move = worker.reading()
            read.update(shards)
            counts.append(len(shards))
            moving = moving or on_the_move
        doubled = sum(1 for n in read.values() if n > 1)
        spread = max(counts) - min(counts) if counts else 0
        seen = {"read": len(read), "doubled": doubled, "spread": spread, "moving": moving, "workers": len(counts)}
        balanced = len(read) == self.shards and not doubled and spread <= 1 and not moving
        return balanced, seen

    async def until_balanced(self, timeout_s: float) -> tuple[float | None, dict[str, Any]]:
        """Seconds until balanced (held for HOLD_CYCLES lease cycles); None after ``timeout_s``.
        ``seen["ready_s"]``: seconds until the last of the live workers was ready (``service.ready``:
        its first lease cycle's claims each delivered a first event), None if one was not: watched
        until every worker is ready, also past the balance (within ``timeout_s``)."""
        started = time.monotonic()
        since: float | None = None
        balanced_s: float | None = None
        hold_s = HOLD_CYCLES * self.settings.lease.sync_interval_s
        seen: dict[str, Any] = {}
        ready_at: dict[str, float] = {}
        while time.monotonic() - started < timeout_s:
            self.check()
            now = time.monotonic()
            for worker in self.live:
                if worker.coordinator is not None and worker.coordinator.ready:
                    ready_at.setdefault(worker.name, now - started)
            ready_s = max(ready_at.values()) if len(ready_at) == len(self.live) else None
            if balanced_s is None:
                balanced, seen = self.state()
                if not balanced:
                    since = None
                elif since is None:
                    since = now
                elif now - since >= hold_s:
                    balanced_s = since - started
            if balanced_s is not None and ready_s is not None:
                break
            await asyncio.sleep(0.2)
        return balanced_s, {**seen, "ready_s": ready_s}

    async def until_read_again(self, shards: set[str], timeout_s: float) -> tuple[float | None, int]:
        """Seconds until every one of ``shards`` is read by a live worker; None after ``timeout_s``."""
        started = time.monotonic()
        left = len(shards)
        while time.monotonic() - started < timeout_s:
            self.check()
            read: set[str] = set()
            for worker in self.live:
                read |= worker.reading()[0]
            left = len(shards - read)
            if not left:
                return time.monotonic() - started, 0
            await asyncio.sleep(0.1)
        return None, left

    async def close(self) -> None:
        """Every worker killed at once: one by one, the last ones kept a saturated loop busy for
        minutes at 4,096 x 64."""
        if self._driver is not None:
            self._driver.cancel()
        workers, self.live = self.live, []
        await asyncio.gather(*(worker.kill() for worker in workers), return_exceptions=True)


# ---- measuring ---------------------------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """CPU seconds a process spent (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds a process and its live descendants spent (the DynamoDB Local meter and its JVM),
    children of every thread of it included."""
    children: list[str] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += (task / "children").read_text().split()
        except OSError:  # gone, or a kernel without task/*/children: the process alone
            pass
    return cpu_s(pid) + sum(tree_cpu_s(int(child)) for child in children)


class Probe:
    """What a phase cost and where its time went: the meter (reset at the start), the tap, ListShards,
    the CPU of the DynamoDB server and of this process, and how late the event loop ran."""

    def __init__(self, endpoint: str, server_pid: int, kinesis: FleetKinesis) -> None:
        self.endpoint = endpoint
        self.server_pid = server_pid
        self.kinesis = kinesis
        self.lags: list[float] = []
        self.in_flight: list[int] = []
        self._ticker: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(LOOP_TICK_S)
            self.lags.append(max(0.0, time.monotonic() - before - LOOP_TICK_S))
            self.in_flight.append(TAP.in_flight)

    def _server_cpu(self) -> tuple[float, float]:
        """The DynamoDB server's CPU seconds, and its own process's alone (DynamoDB Local's meter)."""
        return tree_cpu_s(self.server_pid), cpu_s(self.server_pid)

    async def begin(self) -> None:
        await asyncio.to_thread(usage, self.endpoint, reset=True, timeout_s=300)
        TAP.reset()
        self.lags, self.in_flight = [], []
        self.events = Counter(EVENTS)
        self.lists = self.kinesis.list_calls
        self.cpu = (self._server_cpu(), time.process_time())
        self.started = time.monotonic()
        if self._ticker is None:
            self._ticker = asyncio.create_task(self._tick())

    async def end(self) -> dict[str, Any]:
        seconds = time.monotonic() - self.started
        (server_cpu, meter_cpu), own_cpu = self._server_cpu(), time.process_time() - self.cpu[1]
        server_cpu, meter_cpu = server_cpu - self.cpu[0][0], meter_cpu - self.cpu[0][1]
        spent = await asyncio.to_thread(usage, self.endpoint, reset=True, timeout_s=300)
        return summarize(
            spent,
            seconds,
            events=EVENTS - self.events,
            list_calls=self.kinesis.list_calls - self.lists,
            server_cpu=server_cpu / seconds,
            meter_cpu=meter_cpu / seconds,
            own_cpu=own_cpu / seconds,
            load=os.getloadavg()[0],
            lags=sorted(self.lags),
            in_flight=self.in_flight,
        )

    def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()


def summarize(
    spent: Usage,
    seconds: float,
    *,
    events: Counter[str],
    list_calls: int,
    server_cpu: float,
    meter_cpu: float,
    own_cpu: float,
    load: float,
    lags: list[float],
    in_flight: list[int],
) -> dict[str, Any]:
    minutes = seconds / 60
    operations = {
        name: {
            "requests_per_min": o.requests / minutes,
            "read_units_per_s": o.read_units / seconds,
            "write_units_per_s": o.write_units / seconds,
            "bytes_per_request": o.bytes / o.requests if o.requests else 0,
        }
        for name, o in sorted(spent.operations.items())
    }
    busiest: dict[str, Any] = {}
    for by in ("read_units", "write_units"):
        found = spent.busiest_partition(by)
        if found is not None:
            _, part = found  # which key is not reported: the table's key layout is not this bench's business
            busiest[by] = {
                "read_units_per_s": part.read_units / seconds,
                "write_units_per_s": part.write_units / seconds,
                "requests_per_min": part.requests / minutes,
            }
    latency = {
        op: {"n": len(v), "p50_ms": 1e3 * percentile(v, 50), "p99_ms": 1e3 * percentile(v, 99), "max_ms": 1e3 * v[-1]}
        for op, v in ((op, sorted(values)) for op, values in TAP.latency.items())
    }
    checkpoints = TAP.kinds["checkpoint"]
    writes = sum(spent.operations[op].requests for op in WRITES if op in spent.operations)
    return {
        "seconds": seconds,
        "requests_per_min": spent.requests / minutes,
        "read_units_per_s": spent.read_units / seconds,
        "write_units_per_s": spent.write_units / seconds,
        "write_requests_per_min": writes / minutes,
        "operations": operations,
        "partitions": len(spent.partitions),
        "busiest": busiest,
        "list_shards_per_min": list_calls / minutes,
        "kinds_per_min": {k: n / minutes for k, n in sorted(TAP.kinds.items())},
        "checkpoints_per_s": checkpoints / seconds,
        "heartbeats_per_min": TAP.kinds["heartbeat"] / minutes,
        "client_requests": sum(TAP.kinds.values()),
        "server_requests": spent.requests,
        "attempts": TAP.attempts,
        "errors": dict(TAP.errors),
        "latency": latency,
        "client_busy_s_per_s": TAP.busy_s / seconds,
        "in_flight_max": max(in_flight, default=0),
        "in_flight_mean": sum(in_flight) / len(in_flight) if in_flight else 0.0,
        "server_cpu": server_cpu,
        "meter_cpu": meter_cpu,
        "own_cpu": own_cpu,
        "own_cpu_ms_per_request": 1e3 * own_cpu * seconds / max(1, sum(TAP.kinds.values())),
        "load": load,
        "loop_lag_p50_ms": 1e3 * percentile(lags, 50),
        "loop_lag_p99_ms": 1e3 * percentile(lags, 99),
        "loop_lag_max_ms": 1e3 * (lags[-1] if lags else float("nan")),
        "claims": events["shard.started"],
        "handovers": events["lease.handed_over"],
        "asked": events["lease.asked"],
        "in_doubt": events["lease.in_doubt"],
        "lost": events["lease.lost"],
        "heartbeat_failed": events["lease.heartbeat_failed"],
        "cycle_failed": events["leases.cycle_failed"],
        "checkpoint_failed": events["checkpoint.failed"],
    }


def lease_plane(window: dict[str, Any]) -> dict[str, float]:
    """Everything but the checkpoint writes (one write unit each: a lease row is under 1 KB)."""
    checkpoints_per_s = window["checkpoints_per_s"]
    reads = window["read_units_per_s"]
    writes = max(0.0, window["write_units_per_s"] - checkpoints_per_s)
    return {
        "requests_per_min": window["requests_per_min"] - 60 * checkpoints_per_s,
        "read_units_per_s": reads,
        "write_units_per_s": writes,
        "cost_per_s": reads + WRITE_PRICE * writes,
    }


# ---- the KCL models (see the module's doc) ----------------------------------------------------------


def _scan_units(shards: int, item_bytes: int) -> tuple[int, float]:
    """(pages, read units) of one eventually consistent Scan of ``shards`` lease rows (1 MB pages)."""
    total = shards * item_bytes
    pages = max(1, math.ceil(total / 2**20))
    units = 0.0
    for page in range(pages):
        size = min(2**20, total - page * 2**20)
        units += 0.5 * max(1, math.ceil(size / 4096))
    return pages, units


def kcl_model(version: str, shards: int, workers: int) -> dict[str, Any]:
    """The KCL's lease plane at its defaults for ``shards`` x ``workers``: requests a minute by
    operation and units a second (checkpoints not included)."""
    renew_s = 10.0 / 3 - 0.025  # failoverTimeMillis / 3 - epsilonMillis
    renewals = shards / renew_s  # a second
    if version == "2.x":
        pages, scan_units = _scan_units(shards, 320)
        scans = workers / 20.05 + workers / 300 + 1 / 120  # taker, leader election, hole audit
        ops = {"UpdateItem": 60 * renewals, "Scan": 60 * scans * pages}
        reads, writes = scans * scan_units, renewals
    else:
        pages, scan_units = _scan_units(shards, 340)
        discovery = 0.5 * max(1, math.ceil(shards / workers * 74 / 4096))  # own leases, keys only, from the GSI
        metrics_scan = 0.5 * max(1, math.ceil(workers * 120 / 4096))
        ops = {
            "UpdateItem": 60 * (renewals + workers / 30 + 1 / 30),  # renewals, worker metrics, leader lock
            "Query": 60 * workers / 9.975,
            "GetItem": 60 * (workers - 1) / 30,  # non-leaders read the lock item
            "Scan": 60 * ((1 / 20 + 1 / 120) * pages + 1 / 20),  # assignment + audit; worker metrics
        }
        reads = workers / 9.975 * discovery + (workers - 1) / 30 + (1 / 20 + 1 / 120) * scan_units + metrics_scan / 20
        writes = renewals + workers / 30 + 1 / 30
    return {
        "operations": ops,
        "requests_per_min": sum(ops.values()),
        "read_units_per_s": reads,
        "write_units_per_s": writes,
        "cost_per_s": reads + WRITE_PRICE * writes,
        "busiest_key_write_units_per_s": 1 / renew_s,  # one lease row (leaseKey is the hash key)
    }


def kcl_times(shards: int, workers: int) -> dict[str, str]:
    return {
        "takeover_2x": "20-40 s",
        "takeover_3x": "20-50 s",
        "join_2x": f"~{math.floor(shards / (workers + 1)) * 20.05 / 60:.0f} min",
    }


# ---- one size ------------------------------------------------------------------------------------------


@dataclass
class Case:
    shards: int
    workers: int
    bootstrap_s: float = 0.0
    start: dict[str, Any] = field(default_factory=dict)
    busy: dict[str, Any] = field(default_factory=dict)
    idle: dict[str, Any] = field(default_factory=dict)
    join: dict[str, Any] = field(default_factory=dict)
    takeover: dict[str, Any] = field(default_factory=dict)
    table_agrees: bool | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def size(self) -> str:
        return f"{self.shards:,} × {self.workers}"


def fleet_settings(app: str, failover_s: float) -> Settings:
    lease: dict[str, Any] = {}
    if failover_s != 10.0:
        lease = {"failover_s": failover_s, "heartbeat_interval_s": failover_s / 5}
    return load_settings(
        stream=STREAM, app=app, sink="console", initial_position="TRIM_HORIZON", region=REGION, lease=lease
    )


async def run_case(shards: int, workers: int, endpoint: str, server_pid: int, args: argparse.Namespace) -> Case:
    case = Case(shards, workers)
    settings = fleet_settings(f"fleet-{shards}x{workers}-{uuid.uuid4().hex[:6]}", args.failover_s)
    fleet = Fleet(shards, endpoint, settings)
    probe = Probe(endpoint, server_pid, fleet.kinesis)
    phase_s = args.phase_timeout
    failover_s = settings.lease.failover_s

    def say(text: str) -> None:
        print(f"  {case.size}: {text}", file=sys.stderr, flush=True)

    try:
        case.bootstrap_s = await fleet.bootstrap()
        say(f"bootstrapped {shards} leases in {case.bootstrap_s:.1f} s")

        fleet.kinesis.busy = True
        await probe.begin()
        await fleet.add(workers)
        balanced_s, seen = await fleet.until_balanced(phase_s)
        case.start = {**await probe.end(), "balanced_s": balanced_s, "ready_s": seen.pop("ready_s"), "seen": seen}
        say(f"start: balanced after {balanced_s} s ({seen})")
        if balanced_s is None:
            case.notes.append(f"start: not balanced within {phase_s:g} s: {seen}")
        state = await fleet.live[0].coordinator.table.read()  # type: ignore[union-attr]
        owners = Counter(lease.owner for lease in state.leases.values())
        reading = {w.name: len(w.reading()[0]) for w in fleet.live}
        case.table_agrees = all(owners.get(name, 0) == n for name, n in reading.items())

        for mode in ("busy", "idle"):
            fleet.kinesis.busy = mode == "busy"
            # Idle: the busy window's last checkpoints are written first (at most one interval later).
            await asyncio.sleep(args.settle if mode == "busy" else max(args.settle, settings.checkpoint.interval_s + 1))
            await probe.begin()
            await asyncio.sleep(args.window)
            window = await probe.end()
            setattr(case, mode, window)
            say(
                f"{mode}: {window['requests_per_min']:,.0f} requests/min, {window['read_units_per_s']:.1f} RU/s, "
                f"{window['write_units_per_s']:.1f} WU/s, {window['checkpoints_per_s']:.1f} checkpoints/s"
            )

        fleet.kinesis.busy = True
        await asyncio.sleep(args.settle)
        await probe.begin()
        await fleet.add(1)
        balanced_s, seen = await fleet.until_balanced(phase_s)
        case.join = {**await probe.end(), "balanced_s": balanced_s, "ready_s": seen.pop("ready_s"), "seen": seen}
        say(f"join: balanced after {balanced_s} s ({seen})")
        if balanced_s is None:
            case.notes.append(f"join: not balanced within {phase_s:g} s: {seen}")

        victim = max(fleet.live, key=lambda worker: len(worker.reading()[0]))  # the one that reads the most
        held = victim.reading()[0]
        if not held:
            case.notes.append("takeover: no worker read any shard to be taken over")
        await probe.begin()
        last_beat = victim.coordinator.liveness.landed_at if victim.coordinator is not None else None
        killed_at = time.monotonic()
        taken_before = len(TAKEN)
        await fleet.kill(victim)
        taken_s, left = await fleet.until_read_again(held, 4 * failover_s + 30)
        taken = [at - killed_at for at, previous in TAKEN[taken_before:] if previous == victim.name]
        case.takeover = {
            **await probe.end(),
            "takeover_s": taken_s,
            "shards": len(held),
            "left": left,
            "last_beat_s": None if last_beat is None else last_beat - killed_at,
            "taken_s": (min(taken), max(taken)) if taken else None,
        }
        say(f"takeover of {len(held)} shards after {taken_s} s")
        if taken_s is None:
            case.notes.append(f"takeover: {left} of {len(held)} shards not read again within {4 * failover_s + 30:g} s")
    except Exception as exc:  # report what was seen, and that it broke
        case.notes.append(f"stopped early: {type(exc).__name__}: {exc}")
        say(f"stopped early: {exc!r}")
    finally:
        probe.close()
        await fleet.close()
    return case


# ---- the report ----------------------------------------------------------------------------------------


def _n(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _ops(window: dict[str, Any]) -> str:
    return ", ".join(f"{op} {_n(o['requests_per_min'])}" for op, o in window["operations"].items())


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else "-"


def kept_up(case: Case, dynamodb: str) -> tuple[bool, str, list[str]]:
    """Whether the local stack kept up with this size, and if not, the symptoms and the phases that
    showed them (a steady window that kept up is a measure even where another phase was not)."""
    symptoms = []
    lagging = []
    for name in ("start", "busy", "idle", "join", "takeover"):
        window = getattr(case, name)
        if not window:
            symptoms.append(f"{name}: not measured")
            lagging.append(name)
            continue
        before = len(symptoms)
        if window["server_cpu"] >= SERVER_SATURATED_CORES[dynamodb]:
            symptoms.append(f"{name}: DynamoDB server at {window['server_cpu']:.0%} CPU")
        if dynamodb == "local" and window["meter_cpu"] >= METER_SATURATED_CORES:
            symptoms.append(f"{name}: DynamoDB Local's meter at {window['meter_cpu']:.0%} of a core")
        unpriced = [op for op in window["operations"] if op.endswith(UNPRICED)]
        if unpriced:
            symptoms.append(f"{name}: requests the meter could not price: {', '.join(unpriced)}")
        if window["server_cpu"] + window["own_cpu"] >= 0.9 * CORES:
            symptoms.append(
                f"{name}: the machine's {CORES} cores busy (DynamoDB {window['server_cpu']:.0%}, "
                f"the fleet {window['own_cpu']:.0%})"
            )
        slowest = max((lat["p99_ms"] for lat in window["latency"].values()), default=0.0)
        if slowest >= 1000:
            symptoms.append(f"{name}: DynamoDB p99 {slowest / 1000:.1f} s at the client")
        if window["loop_lag_p99_ms"] >= 500:
            symptoms.append(f"{name}: event loop p99 lag {window['loop_lag_p99_ms'] / 1000:.1f} s")
        if window["in_doubt"]:
            symptoms.append(f"{name}: {window['in_doubt']} leases-in-doubt events")
        if len(symptoms) > before:
            lagging.append(name)
    symptoms += case.notes
    return not symptoms, "; ".join(symptoms), lagging


def report(cases: list[Case], args: argparse.Namespace) -> dict[str, Any]:
    failover_s = args.failover_s
    print(f"command: `{command_line()}`\n")
    print(
        f"W real coordinators in one process against {DYNAMODB_NAMES[args.dynamodb]}, lease "
        f"defaults{'' if failover_s == 10 else f' but failover {failover_s:g} s, heartbeat {failover_s / 5:g} s'}; "
        f"a fake Kinesis with an event a second per shard (busy: one record in it). Steady windows of "
        f"{args.window:g} s after {args.settle:g} s of settling; units from the server's meter, a minute or a "
        "second as said. Model figures: the KCL's request patterns at their defaults, derived from its code "
        "(see `python bench/fleet.py --help`).\n"
    )
    print("**What the fleet spent in DynamoDB and Kinesis** (steady windows, counted at the wire)\n")
    print(
        "| shards × workers | mode | requests/min by operation | read units/s | write units/s | of which "
        "checkpoints | busiest key: read units/s | busiest key: write units/s | ListShards/min |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        for mode in ("idle", "busy"):
            w = getattr(case, mode)
            if not w:
                print(f"| {case.size} | {mode} | not measured | | | | | | |")
                continue
            rb, wb = w["busiest"].get("read_units", {}), w["busiest"].get("write_units", {})
            print(
                f"| {case.size} | {mode} | {_ops(w)} | {_n(w['read_units_per_s'], 1)} | "
                f"{_n(w['write_units_per_s'], 1)} | {_n(w['checkpoints_per_s'], 1)} | "
                f"{_n(rb.get('read_units_per_s'), 1)} ({rb.get('read_units_per_s', 0) / READ_LIMIT:.1%}) | "
                f"{_n(wb.get('write_units_per_s'), 1)} ({wb.get('write_units_per_s', 0) / WRITE_LIMIT:.1%}) | "
                f"{_n(w['list_shards_per_min'])} |"
            )
    print(
        "\n**The lease plane against the KCL models** (everything but checkpoint writes; cost in read-unit "
        "equivalents a second, a write unit = 5 read units; ratio = efo / model, the same S and W)\n"
    )
    print(
        "| shards × workers | mode | efo requests/min | efo read / write units/s | efo cost/s | KCL 2.x requests/min "
        "| KCL 2.x read / write units/s | KCL 2.x cost/s | efo / 2.x | KCL 3.x requests/min | "
        "KCL 3.x read / write units/s | KCL 3.x cost/s | efo / 3.x |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        k2, k3 = kcl_model("2.x", case.shards, case.workers), kcl_model("3.x", case.shards, case.workers)
        case_models = {"2.x": k2, "3.x": k3}
        for mode in ("idle", "busy"):
            w = getattr(case, mode)
            if not w:
                continue
            lp = lease_plane(w)
            w["lease_plane"] = lp
            w["models"] = case_models
            w["ratio_2x"] = lp["cost_per_s"] / k2["cost_per_s"]
            w["ratio_3x"] = lp["cost_per_s"] / k3["cost_per_s"]
            print(
                f"| {case.size} | {mode} | {_n(lp['requests_per_min'])} | {_n(lp['read_units_per_s'], 1)} / "
                f"{_n(lp['write_units_per_s'], 1)} | {_n(lp['cost_per_s'], 1)} | {_n(k2['requests_per_min'])} | "
                f"{_n(k2['read_units_per_s'], 1)} / {_n(k2['write_units_per_s'], 1)} | {_n(k2['cost_per_s'], 1)} | "
                f"{w['ratio_2x']:.3f} | {_n(k3['requests_per_min'])} | {_n(k3['read_units_per_s'], 1)} / "
                f"{_n(k3['write_units_per_s'], 1)} | {_n(k3['cost_per_s'], 1)} | {w['ratio_3x']:.3f} |"
            )
    print(
        "\nThe models' busiest partition key is one lease row: about 0.3 write units a second (a renewal every "
        "3.3 s) plus its checkpoints. With checkpoints, both sides add the same writes (the efo column "
        "'of which checkpoints' above).\n"
    )
    print(f"**Balance and takeover** (seconds; takeover goal: `failover_s` + 2 = {failover_s + 2:g} s)\n")
    print(
        "| shards × workers | bootstrap (S leases) | start → every worker ready | start → balanced | "
        "claims / handovers at start | in doubt / lost at start | join → balanced | claims / handovers at join | "
        "in doubt / lost at join | takeover (shards) | takeover: last beat, leases taken (s from the kill) | "
        "in doubt / lost at takeover | KCL 2.x model: takeover, join | "
        "KCL 3.x model: takeover |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|")
    for case in cases:
        times = kcl_times(case.shards, case.workers)
        s, j, t = case.start, case.join, case.takeover

        def doubt(window: dict[str, Any]) -> str:
            return f"{window['in_doubt']} / {window['lost']}" if window else "-"

        def timeline(window: dict[str, Any]) -> str:
            taken = window.get("taken_s")
            if not window or taken is None:
                return "-"
            return f"{_n(window.get('last_beat_s'), 1)}; {taken[0]:.1f} to {taken[1]:.1f}"

        def moves(window: dict[str, Any]) -> str:
            return f"{window['claims']:,} / {window['handovers']:,}" if window else "-"

        print(
            f"| {case.size} | {case.bootstrap_s:.1f} | {_n(s.get('ready_s'), 1)} | {_n(s.get('balanced_s'), 1)} | "
            f"{moves(s)} | {doubt(s)} | "
            f"{_n(j.get('balanced_s'), 1)} | {moves(j)} | {doubt(j)} | "
            f"{_n(t.get('takeover_s'), 1)} ({t.get('shards', '-')}) | {timeline(t)} | "
            f"{doubt(t)} | {times['takeover_2x']}, {times['join_2x']} | {times['takeover_3x']} |"
        )
    print(
        "\n**Where the time went** (per phase: DynamoDB latency at the client, p50 / p99 ms, for the busiest "
        "operations; requests in flight, mean / max; CPU of the DynamoDB server and of this process, and this "
        "process's CPU-ms per DynamoDB request (all of its work, divided by its requests); the machine's load "
        "average over the last minute (other processes included); this event loop's lateness, p99 ms)\n"
    )
    print(
        "| shards × workers | phase | seconds | requests/min | latency by operation | in flight | server CPU | "
        "bench CPU | bench CPU-ms / request | load | loop lag p99 | retries, errors |"
    )
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")
    verdicts = {}
    for case in cases:
        for name in ("start", "busy", "idle", "join", "takeover"):
            w = getattr(case, name)
            if not w:
                continue
            top = sorted(w["latency"].items(), key=lambda kv: -kv[1]["n"])[:3]
            latency = ", ".join(f"{op} {lat['p50_ms']:.0f} / {lat['p99_ms']:.0f}" for op, lat in top)
            retries = w["attempts"] - w["client_requests"]
            errors = ", ".join(f"{code} {n}" for code, n in w["errors"].items()) or "none"
            print(
                f"| {case.size} | {name} | {w['seconds']:.0f} | {_n(w['requests_per_min'])} | {latency} | "
                f"{w['in_flight_mean']:.1f} / {w['in_flight_max']} | {w['server_cpu']:.0%} | {w['own_cpu']:.0%} | "
                f"{w['own_cpu_ms_per_request']:.1f} | {w['load']:.1f} | "
                f"{w['loop_lag_p99_ms']:.0f} | {max(0, retries)}, {errors} |"
            )
        verdicts[case.size] = kept_up(case, args.dynamodb)
    print()
    for case in cases:
        ok, why, _ = verdicts[case.size]
        agrees = {True: "agreed", False: "DID NOT agree", None: "was not read"}[case.table_agrees]
        print(
            f"- {case.size}: "
            + ("the local stack kept up" if ok else f"**did not keep up**: {why}")
            + f"; the lease table {agrees} with the workers' own view after the start."
        )
    return {
        "failover_s": failover_s,
        "dynamodb": args.dynamodb,
        "cases": [
            {
                "shards": c.shards,
                "workers": c.workers,
                "bootstrap_s": c.bootstrap_s,
                "start": c.start,
                "busy": c.busy,
                "idle": c.idle,
                "join": c.join,
                "takeover": c.takeover,
                "kept_up": verdicts[c.size][0],
                "why": verdicts[c.size][1],
                "lagging": verdicts[c.size][2],
                "notes": c.notes,
            }
            for c in cases
        ],
    }


def isolate() -> None:
    """Go on in a private network namespace (DynamoDB Local listens on every interface): run this
    script again there (same interpreter, flags and arguments), once; exit 2 saying what to do where
    that cannot be done."""
    if not isolated():
        if os.environ.get(ISOLATED_ENV):
            raise SystemExit(f"fleet: still not isolated after unshare ({interfaces_up()} up); use --dynamodb moto")
        try:
            check_isolation_possible()
        except NotIsolated as exc:
            print(f"fleet: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        os.environ[ISOLATED_ENV] = "1"
        command = isolating_command([sys.executable, *sys.orig_argv[1:]])
        os.execv(command[0], command)
    loopback_up()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="256x4,1024x16,4096x64", help="comma-separated SHARDSxWORKERS")
    parser.add_argument("--window", type=float, default=60.0, help="seconds of each steady window (busy, idle)")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds before a window (and before the join)")
    parser.add_argument("--phase-timeout", type=float, default=120.0, help="at most this long to balance")
    parser.add_argument("--failover-s", type=float, default=10.0, help="lease.failover_s (heartbeat: 1/5 of it)")
    parser.add_argument(
        "--dynamodb",
        choices=sorted(DYNAMODB_MODULES),
        default="local",
        help="local: Amazon DynamoDB Local (the jar; this runs itself again in a private network namespace, "
        "since the jar listens on every interface); moto: the local stack's DynamoDB (one request at a time)",
    )
    parser.add_argument("--json", default=None, help="write the figures here (for bench/run_all.py)")
    args = parser.parse_args()
    if args.dynamodb == "local":
        isolate()
    sizes = [tuple(int(n) for n in size.lower().split("x")) for size in args.sizes.split(",") if size]
    hermetic_aws_environment()
    for name in [n for n in os.environ if n.startswith("EFO_")]:
        del os.environ[name]
    quiet_logging()
    workdir = Path(tempfile.mkdtemp(prefix="efo-fleet-"))
    cases = []
    for shards, workers in sizes:
        log = ["--log", str(workdir / f"dynamodb-local-{shards}x{workers}.log")] if args.dynamodb == "local" else []
        server, endpoint = start_dynamodb(workdir, DYNAMODB_MODULES[args.dynamodb], *log)  # fresh: nothing of the last
        try:
            print(f"fleet: {shards} shards x {workers} workers ...", file=sys.stderr, flush=True)
            cases.append(asyncio.run(run_case(shards, workers, endpoint, server.pid, args)))
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    write_json(args.json, report(cases, args))


if __name__ == "__main__":
    main()
