"""Two ``efo run`` workers on the local stack: failover, graceful handoff, and what they cost in DynamoDB.

The local stack as ``efo dev up`` starts it (kinesis-local behind efo's conformance proxy; the
local DynamoDB, which counts the requests it serves: ``GET /_efo/requests``). Workers use the
Spark-free ``arrow:sinks:discard`` sink and the lease defaults (failover 10 s, heartbeat 2 s, a
lease cycle a second); a producer keeps every shard busy all along (``--rate`` records a second
per shard).

* **Failover**: with the shards balanced, SIGKILL one worker; seconds until the survivor has had
  the first event of every shard the dead one held. Goal: at most ``lease.failover_s`` + 2 s.
* **Handoff**: SIGTERM one worker; seconds from its ``leases.released`` to the new owner's first
  event of the last of those shards. Goal: at most 2 s. Baseline: ``failover_s``, what a worker that
  does not release its leases on SIGTERM costs (the next owner waits for the lease to expire).
* **DynamoDB cost**: reads and writes a minute at steady state (balanced, ``--window`` seconds),
  counted by the local DynamoDB. Baseline, in the same run, against the same server: a *model* of
  the KCL's request pattern (not the KCL: no JVM jars can be fetched here), replayed for as long:
  per worker, one conditional UpdateItem per held lease every ``failover/3 - 25 ms`` (the KCL's
  DynamoDBLeaseCoordinator renews every ``failoverTimeMillis / 3 - epsilonMillis``), one Scan of
  the lease table every ``(failover + 25 ms) * 2`` (its lease taker's interval), and one
  checkpoint (a conditional UpdateItem) per shard per batch, at the moments efo's workers
  committed their batches in the efo window (what a record processor that checkpoints after each
  batch does). Goal: efo at most 1/3 of the model's writes.
"""

from __future__ import annotations

import argparse
import heapq
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import boto3
from common import EfoProcess, at, command_line, efo_env, write_json

from efo.devstack.leases import shard_leases
from efo.devstack.producer import kinesis_client, put_all, wait_active
from efo.devstack.stack import LocalStack, StackEndpoints

FAILOVER_S = 10.0  # the default; --failover-s changes it (and the heartbeat with it) for quick runs
KCL_EPSILON_S = 0.025
WRITES = ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems")
READS = ("Query", "GetItem", "Scan", "BatchGetItem")


def requests(stack: StackEndpoints) -> Counter[str]:
    with urllib.request.urlopen(f"{stack.dynamodb_endpoint}/_efo/requests", timeout=5) as response:
        return Counter(json.loads(response.read()))


def per_minute(spent: Counter[str], seconds: float) -> tuple[float, float]:
    minutes = seconds / 60
    return sum(spent[op] for op in WRITES) / minutes, sum(spent[op] for op in READS) / minutes


class Producer(threading.Thread):
    """``rate`` records a second into every shard (by explicit hash key) until stopped."""

    def __init__(self, stack: StackEndpoints, stream: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.kinesis = kinesis_client(stack.kinesis_endpoint, stack.region)
        self.stream = stream
        self.rate = rate
        self.stopped = threading.Event()
        shards = self.kinesis.list_shards(StreamName=stream)["Shards"]
        self.keys = [s["HashKeyRange"]["StartingHashKey"] for s in shards]

    def run(self) -> None:
        sent = 0
        started = time.monotonic()
        while not self.stopped.is_set():
            due = int((time.monotonic() - started) * self.rate) + 1 - sent
            if due > 0:
                entries = [
                    {"Data": b"x" * 100, "PartitionKey": "k", "ExplicitHashKey": key}
                    for _ in range(due)
                    for key in self.keys
                ]
                put_all(self.kinesis, self.stream, entries)
                sent += due
            self.stopped.wait(0.2)


class Cluster:
    """The workers of one application on one stream."""

    def __init__(self, stack: StackEndpoints, shards: int, workdir: Path) -> None:
        self.stack = stack
        self.shards = shards
        self.stream = f"bench-{shards}-{uuid.uuid4().hex[:6]}"
        self.app = f"app-{uuid.uuid4().hex[:6]}"
        self.workdir = workdir
        kinesis = kinesis_client(stack.kinesis_endpoint, stack.region)
        kinesis.create_stream(StreamName=self.stream, ShardCount=shards)
        wait_active(kinesis, self.stream, timeout_s=120)
        arn = kinesis.describe_stream_summary(StreamName=self.stream)["StreamDescriptionSummary"]["StreamARN"]
        self.stream_arn = arn
        self.dynamodb = boto3.client(
            "dynamodb",
            endpoint_url=stack.dynamodb_endpoint,
            region_name=stack.region,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        self.env = efo_env(
            EFO_STREAM=self.stream,
            EFO_APP=self.app,
            EFO_SINK="arrow:sinks:discard",
            EFO_REGION=stack.region,
            EFO_KINESIS_ENDPOINT=stack.kinesis_endpoint,
            EFO_DYNAMODB_ENDPOINT=stack.dynamodb_endpoint,
            EFO_INITIAL_POSITION="TRIM_HORIZON",
            EFO_LEASE__FAILOVER_S=f"{FAILOVER_S:g}",
            EFO_LEASE__HEARTBEAT_INTERVAL_S=f"{FAILOVER_S / 5:g}",
            EFO_LEASE__SYNC_INTERVAL_S="1",
        )
        self.workers: dict[str, EfoProcess] = {}
        self.producer: Producer | None = None

    def produce(self, rate: float) -> None:
        self.producer = Producer(self.stack, self.stream, rate)
        self.producer.start()

    def start(self, name: str) -> EfoProcess:
        worker = EfoProcess({**self.env, "EFO_WORKER_ID": name}, self.workdir / f"{self.stream}-{name}.log")
        self.workers[name] = worker
        return worker

    def owners(self) -> dict[str, str | None]:
        leases = shard_leases(self.dynamodb, self.app, self.app, self.stream_arn)
        return {shard_id: item.get("lease_owner", {}).get("S") for shard_id, item in leases.items()}

    def wait_until(self, condition: Any, timeout_s: float, what: str) -> float:
        started = time.monotonic()
        while not condition():
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"no {what} within {timeout_s} s: {Counter(self.owners().values())}")
            time.sleep(0.2)
        return time.monotonic() - started

    def balanced(self, names: list[str]) -> bool:
        held = Counter(self.owners().values())
        share = self.shards // len(names)
        return sum(held.values()) == self.shards and all(held[n] in (share, share + 1) for n in names)

    def first_events_after(
        self, name: str, shard_ids: set[str], since: float, event: str = "shard.first_event"
    ) -> dict[str, float]:
        """When ``name`` had the first event (or ``event``) of each of ``shard_ids`` since ``since`` (epoch s)."""
        return {
            e["shard_id"]: at(e)
            for e in self.workers[name].events(event)
            if e.get("shard_id") in shard_ids and at(e) >= since
        }

    def close(self) -> None:
        if self.producer is not None:
            self.producer.stopped.set()
            self.producer.join(timeout=10)
        for worker in self.workers.values():
            worker.stop(signal.SIGKILL, timeout_s=10)


def steady_state(cluster: Cluster, names: list[str], window_s: float) -> dict[str, Any]:
    """efo's requests a minute over the window, and the batches its workers committed in it."""
    before, started_at, started = requests(cluster.stack), time.time(), time.monotonic()
    time.sleep(window_s)
    spent, seconds, ended_at = requests(cluster.stack) - before, time.monotonic() - started, time.time()
    batches = [
        (at(e) - started_at, name, int(e.get("shards", 0)))
        for name in names
        for e in cluster.workers[name].events("batch.committed")
        if started_at <= at(e) <= ended_at
    ]
    writes, reads = per_minute(spent, seconds)
    return {"seconds": seconds, "requests": dict(spent), "writes": writes, "reads": reads, "batches": batches}


def kcl_model(stack: StackEndpoints, shards: int, workers: int, window_s: float, batches: list[Any]) -> dict[str, Any]:
    """Replay the KCL's request pattern (see the module's doc) against the same DynamoDB."""
    client = boto3.client(
        "dynamodb",
        endpoint_url=stack.dynamodb_endpoint,
        region_name=stack.region,
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )
    table = f"kcl-model-{uuid.uuid4().hex[:6]}"
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    names = [f"w{i + 1}" for i in range(workers)]
    held: dict[str, list[str]] = {name: [] for name in names}
    counters: dict[str, int] = {}
    for i in range(shards):
        shard, owner = f"shardId-{i:012d}", names[i % workers]
        held[owner].append(shard)
        counters[shard] = 1
        client.put_item(
            TableName=table,
            Item={
                "leaseKey": {"S": shard},
                "leaseOwner": {"S": owner},
                "leaseCounter": {"N": "1"},
                "checkpoint": {"S": "TRIM_HORIZON"},
                "ownerSwitchesSinceCheckpoint": {"N": "0"},
            },
        )

    def update(shard: str, owner: str, checkpoint: str | None) -> None:
        expression = "SET leaseCounter = leaseCounter + :one"
        values: dict[str, Any] = {
            ":one": {"N": "1"},
            ":counter": {"N": str(counters[shard])},
            ":owner": {"S": owner},
        }
        if checkpoint is not None:
            expression += ", checkpoint = :checkpoint, ownerSwitchesSinceCheckpoint = :zero"
            values.update({":checkpoint": {"S": checkpoint}, ":zero": {"N": "0"}})
        client.update_item(
            TableName=table,
            Key={"leaseKey": {"S": shard}},
            UpdateExpression=expression,
            ConditionExpression="leaseCounter = :counter AND leaseOwner = :owner",
            ExpressionAttributeValues=values,
        )
        counters[shard] += 1

    renew_s = FAILOVER_S / 3 - KCL_EPSILON_S
    take_s = (FAILOVER_S + KCL_EPSILON_S) * 2
    events: list[tuple[float, int, str, str, int]] = []  # (due, order, kind, worker, shards)
    for w, name in enumerate(names):  # the workers' timers start at different moments
        offset = w * renew_s / workers
        events += [
            (offset + k * renew_s, len(events) + k, "renew", name, 0) for k in range(int(window_s / renew_s) + 1)
        ]
        events += [
            (offset + k * take_s, len(events) + k + 10**6, "take", name, 0) for k in range(int(window_s / take_s) + 1)
        ]
    events += [(due, 2 * 10**6 + i, "checkpoint", name, n) for i, (due, name, n) in enumerate(batches)]
    events = [e for e in events if e[0] < window_s]
    heapq.heapify(events)
    before, started = requests(stack), time.monotonic()
    sequence = 0
    while events:
        due, _, kind, name, count = heapq.heappop(events)
        time.sleep(max(0.0, started + due - time.monotonic()))
        if kind == "renew":
            for shard in held[name]:
                update(shard, name, None)
        elif kind == "take":
            for _ in client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
                pass
        else:
            for shard in held[name][:count]:
                sequence += 1
                update(shard, name, f"{sequence:056d}")
    time.sleep(max(0.0, started + window_s - time.monotonic()))
    spent, seconds = requests(stack) - before, time.monotonic() - started
    client.delete_table(TableName=table)
    writes, reads = per_minute(spent, seconds)
    return {"seconds": seconds, "requests": dict(spent), "writes": writes, "reads": reads}


def failovers(cluster: Cluster, names: list[str], repeats: int) -> dict[str, list[float]]:
    """SIGTERM handoffs, then SIGKILL failovers, ``repeats`` of each; a fresh worker replaces the
    stopped one and the shards are balanced again before the next."""
    handoff_s: list[float] = []
    signalled_s: list[float] = []  # SIGTERM sent -> the new owner's first event: the whole handoff
    failover_s: list[float] = []
    claimed_s: dict[str, list[float]] = {"SIGTERM": [], "SIGKILL": []}
    for kind in ("SIGTERM", "SIGKILL"):
        for i in range(repeats):
            victim, survivor = names[-1], names[0]
            mine = {shard for shard, owner in cluster.owners().items() if owner == victim}
            stopped_at = time.time()
            if kind == "SIGTERM":
                cluster.workers[victim].stop(signal.SIGTERM)
                released = next(iter(cluster.workers[victim].events("leases.released")), None)
                if released is None:
                    raise RuntimeError(f"{victim} logged no leases.released")
                since = at(released)
            else:
                cluster.workers[victim].stop(signal.SIGKILL)
                since = stopped_at
            cluster.wait_until(
                lambda s=since, m=mine, w=survivor: len(cluster.first_events_after(w, m, s)) == len(m),
                FAILOVER_S * 4,
                f"first events of {victim}'s {len(mine)} shards at {survivor} after {kind}",
            )
            last = max(cluster.first_events_after(survivor, mine, since).values())
            (handoff_s if kind == "SIGTERM" else failover_s).append(last - since)
            if kind == "SIGTERM":
                signalled_s.append(last - stopped_at)
            claimed_s[kind].append(
                max(cluster.first_events_after(survivor, mine, since, "shard.started").values()) - since
            )
            print(f"  {kind} {i + 1}: {len(mine)} shards read again after {last - since:.2f} s", file=sys.stderr)
            if kind == "SIGKILL" and i == repeats - 1:
                break  # the last one: nothing to rebalance for
            replacement = f"{victim.split('-')[0]}-{kind.lower()}{i + 1}"
            cluster.start(replacement).wait_for("service.ready")
            names[-1] = replacement
            cluster.wait_until(lambda: cluster.balanced(names), 60, "balance after the replacement started")
    return {
        "handoff_s": handoff_s,
        "handoff_from_signal_s": signalled_s,
        "failover_s": failover_s,
        "handoff_claimed_s": claimed_s["SIGTERM"],
        "failover_claimed_s": claimed_s["SIGKILL"],
    }


def run_case(
    stack: StackEndpoints, args: argparse.Namespace, shards: int, workdir: Path, repeats: int
) -> dict[str, Any]:
    cluster = Cluster(stack, shards, workdir)
    try:
        cluster.produce(args.rate)
        names = ["w1", "w2"]
        for name in names:
            cluster.start(name)
        for name in names:
            cluster.workers[name].wait_for("service.ready")
        cluster.wait_until(lambda: cluster.balanced(names), 120, "two workers balanced")
        time.sleep(args.settle)
        efo = steady_state(cluster, names, args.window)
        print(f"  {shards} shards: efo {efo['requests']}", file=sys.stderr, flush=True)
        result: dict[str, Any] = {"shards": shards, "workers": len(names), "efo": efo}
        if repeats:
            result.update(failovers(cluster, names, repeats))
    finally:
        cluster.close()
    kcl = kcl_model(stack, shards, len(names), args.window, efo["batches"])
    print(f"  {shards} shards: KCL model {kcl['requests']}", file=sys.stderr, flush=True)
    result["kcl"] = kcl
    return result


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})" if values else "-"


def main() -> None:
    global FAILOVER_S
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", default="8,64", help="comma-separated; failover runs on the first")
    parser.add_argument("--window", type=float, default=60.0, help="steady-state seconds measured per case")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after balancing before measuring")
    parser.add_argument("--rate", type=float, default=2.0, help="records a second into every shard")
    parser.add_argument("--repeats", type=int, default=3, help="SIGTERM handoffs and SIGKILL failovers each")
    parser.add_argument("--failover-s", type=float, default=FAILOVER_S, help="lease.failover_s (heartbeat: 1/5 of it)")
    parser.add_argument("--json", default=None, help="write the figures here (for bench/run_all.py)")
    args = parser.parse_args()
    FAILOVER_S = args.failover_s
    shard_counts = [int(s) for s in args.shards.split(",") if s]
    workdir = Path(tempfile.mkdtemp(prefix="efo-workers-"))
    results = []
    with LocalStack(log_dir=workdir / "stack") as stack:
        for i, shards in enumerate(shard_counts):
            results.append(run_case(stack, args, shards, workdir, args.repeats if i == 0 else 0))

    print(f"command: `{command_line()}`\n")
    print(
        f"Two `efo run` workers (Spark-free sink, failover {FAILOVER_S:g} s, heartbeat {FAILOVER_S / 5:g} s, "
        "lease cycle 1 s: the defaults unless --failover-s) on the local stack; a producer writes "
        f"{args.rate:g} records/s into every shard all along. Logs' timestamps; medians (min-max).\n"
    )
    first = results[0]
    handoff, failover = first.get("handoff_s", []), first.get("failover_s", [])
    print(f"**Failover and handoff** ({first['shards']} shards, {len(failover)} runs each)\n")
    print("| what | seconds, median (min-max) | of which: until claimed | baseline: failover_s | ratio | goal | met |")
    print("|---|---:|---:|---:|---:|---|---|")
    rows = (
        ("SIGKILL → every shard of the killed worker read again", failover, "failover_claimed_s", FAILOVER_S + 2),
        ("SIGTERM: `leases.released` → new owner's first event (last shard)", handoff, "handoff_claimed_s", 2.0),
    )
    for what, values, claimed, goal in rows:
        if values:
            median = statistics.median(values)
            print(
                f"| {what} | {summary(values)} | {summary(first[claimed])} | {FAILOVER_S:g} | "
                f"{median / FAILOVER_S:.2f} | ≤ {goal:g} s | {'yes' if median <= goal else 'NO'} |"
            )
    whole = first.get("handoff_from_signal_s", [])
    if whole:
        print(
            f"| SIGTERM sent → new owner's first event (last shard): the whole handoff | {summary(whole)} | | "
            f"{FAILOVER_S:g} | {statistics.median(whole) / FAILOVER_S:.2f} | (no goal) | |"
        )
    print(f"\n**DynamoDB requests a minute at steady state** (2 workers, {args.window:g} s per case)\n")
    print(
        "| shards | efo writes/min | efo reads/min | efo batches/min | KCL model writes/min | KCL model reads/min "
        "| efo/KCL writes | goal ≤ 0.33 |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        e, k = r["efo"], r["kcl"]
        ratio = e["writes"] / k["writes"] if k["writes"] else float("nan")
        r["write_ratio"] = ratio
        batches_per_min = len(e["batches"]) / (e["seconds"] / 60)
        print(
            f"| {r['shards']} | {e['writes']:,.0f} | {e['reads']:,.0f} | {batches_per_min:,.0f} | {k['writes']:,.0f} "
            f"| {k['reads']:,.0f} | {ratio:.2f} | {'yes' if ratio <= 1 / 3 else 'NO'} |"
        )
    print(
        "\nBy operation (requests in the window): "
        + "; ".join(
            f"{r['shards']} shards: efo {dict(sorted(r['efo']['requests'].items()))}, "
            f"KCL model {dict(sorted(r['kcl']['requests'].items()))}"
            for r in results
        )
    )
    for r in results:
        r["efo"]["batches"] = len(r["efo"]["batches"])
    write_json(
        args.json,
        {"cases": results, "failover_s": FAILOVER_S, "failover_goal_s": FAILOVER_S + 2, "handoff_goal_s": 2.0},
    )


if __name__ == "__main__":
    main()
