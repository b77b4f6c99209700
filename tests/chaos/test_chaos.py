"""Chaos scenarios on the local stack, each checked by the invariant checker: nothing lost, per-key
order kept, and every duplicate accounted for by a kill or an outage (tests/chaos/harness.py). Each
reads one stream, but for the last: three streams of one application (issue 20), kills and a
reshard, each stream checked on its own.

``make test`` runs one iteration of the reduced size of three (the sink that fails and hangs,
DynamoDB throttled then paused, backpressure); ``make chaos`` runs three of the full size, including
the scenarios marked ``chaos_full``, and writes the table to docs/chaos.md. Two are ``chaos_full``
only to keep ``make test`` within its time: a worker killed at random (make test keeps
test_workers_processes.py's SIGKILL takeover) and several streams with kills and a reshard (make
test keeps test_streams.py's three streams with a split and a kill).
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from efo.errors import EXIT_NOT_FOUND, EXIT_RUNTIME
from tests.integration.service import operator_lines
from tests.integration.workers import at

from .conftest import ChaosFactory
from .harness import SIZE, Chaos

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.mark.parametrize(
    ("sig", "workers"),
    [
        pytest.param(signal.SIGKILL, 2, id="SIGKILL-2", marks=pytest.mark.chaos_full),
        pytest.param(signal.SIGKILL, 3, id="SIGKILL-3", marks=pytest.mark.chaos_full),
        pytest.param(signal.SIGTERM, 2, id="SIGTERM-2", marks=pytest.mark.chaos_full),
        pytest.param(signal.SIGTERM, 3, id="SIGTERM-3", marks=pytest.mark.chaos_full),
    ],
)
def test_workers_killed_at_random_points(chaos: ChaosFactory, sig: signal.Signals, workers: int) -> None:
    """A random worker killed at a random moment while records flow; in the full size twice, each
    time restarted a moment later under its own worker id (it takes its leases back at once) or a
    new one. SIGKILL may repeat what the victim had committed and not checkpointed, SIGTERM nothing."""
    with chaos(f"{sig.name}, {workers} workers", shards=4) as run:
        names = [f"w{i}" for i in range(1, workers + 1)]
        run.start(*names)
        with run.traffic():
            run.wait_committing(*names)
            for kill in range(SIZE.pick(1, 2)):
                run.sleep(0, 2)
                victim = run.rng.choice(run.live())
                sent_at = run.kill(victim, sig)
                if not SIZE.full:
                    run.recovered(sent_at, f"{sig.name} {victim}")
                    continue
                run.sleep(0, 2)  # an orchestrator restarts it
                same_id = run.rng.random() < 0.5
                restarted = f"{victim.split('.')[0]}.{kill + 2}" if same_id else f"w{workers + kill + 1}"
                run.start(restarted)
                run.recovered(sent_at, f"{sig.name} {victim}")
                run.wait_ready(restarted)  # and a SIGTERM at the end finds its handlers installed
        verdict = run.finish()
        if sig is signal.SIGTERM:
            assert verdict.duplicates == 0, verdict


@pytest.mark.parametrize(
    "initial_position",
    [
        pytest.param("LATEST", id="LATEST", marks=pytest.mark.chaos_full),
        pytest.param("TRIM_HORIZON", id="TRIM_HORIZON", marks=pytest.mark.chaos_full),
    ],
)
def test_reshards_while_two_workers_read(chaos: ChaosFactory, initial_position: str) -> None:
    """Splits, merges and UpdateShardCount at random moments, of random shards, while records flow:
    nothing is lost or repeated, and per key nothing is committed out of order (parents before
    children). kinesis-local sends a shard's whole backlog in its next event, so a parent is seldom
    behind when it closes: a child started too early would seldom show here (tried: with children
    started at once, no iteration failed)."""
    with chaos(f"reshards, {initial_position}", shards=2, initial_position=initial_position) as run:
        run.start("w1", "w2")
        run.wait_ready("w1", "w2")
        with run.traffic():
            for _ in range(SIZE.pick(1, 3)):
                run.sleep(0.5, 2.5)
                what = run.reshard()
                run.recovered(time.time(), what)
        verdict = run.finish()
        assert verdict.duplicates == 0, verdict


@pytest.mark.chaos_full
def test_faults_of_the_subscriptions_through_the_proxy(chaos: ChaosFactory) -> None:
    """Connection resets in the middle of an event, stalls, ResourceInUse, throttling, 500 and an
    InternalFailure event in the stream, each on a random shard after a random number of events;
    none kills a worker, so nothing is read twice (resubscribe overlaps are dropped). One worker: a
    rule is taken by the next subscription of its shard, and a handover could end that subscription
    before the rule fired."""
    with chaos("proxy faults", shards=4) as run:
        shards = [s["ShardId"] for s in run.kinesis.list_shards(StreamName=run.w.stream)["Shards"]]
        faults: list[dict[str, Any]] = [
            {"action": "reset"},
            {"action": "error", "status": 400, "error_code": "ResourceInUseException"},
            {"action": "error", "status": 400, "error_code": "LimitExceededException"},
            {"action": "error", "status": 500, "error_code": "InternalFailure"},
            {"action": "exception_frame", "error_code": "InternalFailureException"},
        ] * SIZE.pick(1, 2)
        run.rng.shuffle(faults)
        # Stalls last and each on a shard of its own: the resubscribe right after a stall may be
        # refused by kinesis-local (ResourceInUse, 3-4 s after a disconnect), and a refused
        # subscription uses up the next rule of its shard without firing it.
        stalls = [({"action": "stall"}, shard) for shard in run.rng.sample(shards, SIZE.pick(1, 2))]
        ids = set()
        for fault, shard in [(fault, run.rng.choice(shards)) for fault in faults] + stalls:
            after = {"after_events": run.rng.randint(0, 3)} if fault["action"] != "error" else {}
            ids.add(run.add_proxy_fault(operation="SubscribeToShard", shard_id=shard, **fault, **after))
        run.start("w1")
        with run.traffic():
            fired_at = run.wait_for_proxy_faults(ids, 90)
            run.recovered(fired_at, "the last fault")
        verdict = run.finish()
        assert verdict.duplicates == 0, verdict
        retried = {e["shard_id"] for e in run.events("subscription.retry")}
        assert retried, "no subscription was retried: the faults did not reach the workers"


DYNAMODB_FAULTS: list[dict[str, Any]] = [
    {"operation": "UpdateItem"},  # checkpoints, claims, releases: ProvisionedThroughputExceeded
    # The lease cycles: the version row and the watched heartbeat rows, every cycle (a Query of every
    # heartbeat row or lease partition comes only after a change, or every minute or so: a fault of
    # it might not fire within the scenario's 30 s).
    {"operation": "GetItem"},
    {"operation": "*"},
    {"operation": "*", "status": 500, "error_code": "InternalServerError"},
    {"operation": "UpdateItem", "status": 500, "error_code": "InternalServerError"},
]


def test_dynamodb_throttled_then_paused(chaos: ChaosFactory) -> None:
    """Bursts of throttled requests and 500s of random operations at random moments: retried where
    they happen, no lease is lost over them, nothing is read twice. Then the server stopped
    (SIGSTOP) for longer than a worker trusts its leases and resumed: every worker stops reading
    until its heartbeat lands again and claims again; only what was committed and not checkpointed
    before the pause is read twice."""
    pause_s = SIZE.pick(5.0, 30.0)  # longer than the 4 s a worker trusts its leases
    with chaos(f"DynamoDB throttled, 500s, paused {pause_s:g} s", shards=3) as run:
        run.start("w1", "w2")
        with run.traffic():
            run.wait_committing("w1", "w2")
            for _ in range(SIZE.pick(2, 6)):
                run.sleep(0, 1.5)
                fault = run.rng.choice(DYNAMODB_FAULTS)
                run.dynamodb_faults.add(action="error", count=run.rng.randint(1, 4), **fault)
            fired_at = run.wait_for(lambda: not run.dynamodb_faults.pending(), 30, "every DynamoDB fault fired")
            run.recovered(fired_at, "the last throttle or 500")
            assert not run.events("lease.in_doubt"), "a worker lost its leases over a burst of throttles"
            assert run.verdict().duplicates == 0, run.verdict()
            run.sleep(0, 1)
            run.pause_dynamodb()
            time.sleep(pause_s)
            run.recovered(run.resume_dynamodb(), "DynamoDB paused")
        run.finish()
        assert run.events("lease.in_doubt"), "no worker noticed that its heartbeats did not land"


def test_a_sink_that_fails_now_and_then_and_one_that_hangs(chaos: ChaosFactory) -> None:
    """Every n-th sink call of each worker fails (n random): the same batch is retried and committed
    once, nothing moves past a batch that failed. One worker's sink also never returns after a random
    number of batches: past batch.stall_timeout_s that worker stops (exit 1), its leases released
    with what it committed checkpointed, and the other reads on from there. Recovery: from a failed
    attempt to the commit of its batch, and from the hang until everything is committed."""
    with chaos(
        "sink fails now and then, and hangs",
        shards=3,
        EFO_SINK_RETRY__RETRY_BACKOFF_S="0.2",
        EFO_BATCH__STALL_TIMEOUT_S="3",
        EFO_SHUTDOWN_TIMEOUT_S="2",
    ) as run:
        fail_every = run.rng.randint(2, 4)
        hang_after = fail_every + run.rng.randint(0, SIZE.pick(2, 8))  # after one failure at least
        run.start("w1", EFO_TEST_SINK_FAIL_EVERY=str(fail_every), EFO_TEST_SINK_HANG_AFTER=str(hang_after))
        run.start("w2", EFO_TEST_SINK_FAIL_EVERY=str(run.rng.randint(2, 4)))
        run.expect_exit("w1")
        hung = run.w.runs["w1"]
        with run.traffic():
            assert hung.process is not None
            code = hung.process.wait(60)
            assert code == EXIT_RUNTIME and "batch.stall_timeout_s" in hung.tail(), hung.tail()
            (hanging,) = run.w.events("w1", "test_sink.hanging")
            run.recovered(at(hanging), "the sink hung")
        verdict = run.finish()
        assert verdict.duplicates == 0, verdict
        for name in ("w1", "w2"):
            committed = {e["batch_id"]: at(e) for e in run.w.events(name, "batch.committed")}
            for retry in run.w.events(name, "sink.retry"):
                if retry["batch_id"] in committed:  # not the batch w1 hung on
                    seconds = round(committed[retry["batch_id"]] - at(retry), 2)
                    run.outcome.recoveries.append((f"{name} sink retry", seconds))
        assert {name for name in ("w1", "w2") if run.w.events(name, "sink.retry")} == {"w1", "w2"}, (
            "a worker's sink never failed"
        )


@pytest.mark.chaos_full
def test_the_consumer_deregistered_while_running(chaos: ChaosFactory) -> None:
    """The EFO consumer deregistered at a random moment: each worker exits 3 naming it, and no
    checkpoint lies beyond what its sink committed; registered again (a worker started), everything
    is read, nothing twice. kinesis-local keeps feeding open subscriptions of a deregistered
    consumer (AWS ends them), so every subscription here is cut after a few events: the renewal
    meets the deregistration. Recovery: from the deregistration to the last worker's exit."""
    with chaos("consumer deregistered", shards=3) as run:
        run.add_proxy_fault(
            operation="SubscribeToShard",
            action="exception_frame",
            error_code="InternalFailureException",
            after_events=run.rng.randint(1, 3),
            count=10_000,
        )
        run.start("w1", "w2")
        with run.traffic():
            run.wait_committing("w1", "w2")
            run.sleep(0, 3)
            run.expect_exit("w1", "w2")
            arn = run.kinesis.describe_stream_summary(StreamName=run.w.stream)["StreamDescriptionSummary"]["StreamARN"]
            (consumer,) = run.kinesis.list_stream_consumers(StreamARN=arn)["Consumers"]
            run.kinesis.deregister_stream_consumer(ConsumerARN=consumer["ConsumerARN"])
            deregistered_at = time.time()
            for name in ("w1", "w2"):
                worker = run.w.runs[name]
                assert worker.process is not None
                assert worker.process.wait(60) == EXIT_NOT_FOUND, worker.tail()
                (line,) = operator_lines(worker.log_path.read_text())
                assert "consumer" in line and "no longer registered" in line, line
            run.outcome.recoveries.append(("deregistration to exit 3", round(time.time() - deregistered_at, 2)))
            assert_no_checkpoint_beyond_the_sink(run)
            run.proxy_faults.clear()
            run.start("w3")  # registers the consumer again
        verdict = run.finish()
        assert verdict.duplicates == 0, verdict


def assert_no_checkpoint_beyond_the_sink(run: Chaos) -> None:
    """Every record at or before a shard's checkpoint was committed."""
    committed = run.committed()
    for shard_id, checkpoint in run.checkpoints().items():
        passed = [
            p
            for p in run.w.producer.acknowledged
            if p.shard_id == shard_id and not checkpoint.reads_again(p.sequence_number)
        ]
        missing = [p for p in passed if (p.shard_id, p.sequence_number) not in committed]
        assert not missing, f"{shard_id}: checkpoint {checkpoint} passes {len(missing)} records never committed"


def test_a_pool_far_smaller_than_the_traffic_and_a_slow_sink_under_latest(chaos: ChaosFactory) -> None:
    """A pool of 50 records for events of about a hundred, a sink that takes a second per batch (a
    batch holds one event or more: an event is never split) while each shard brings an event a
    second: subscriptions time out waiting for budget, close their streams and resubscribe from the
    position they pinned (never LATEST again). Recovery: from the end of the traffic until the
    backlog is committed."""
    with chaos(
        "backpressure: small pool, slow sink, LATEST",
        shards=2,
        initial_position="LATEST",
        EFO_POOL__MAX_PENDING_RECORDS="50",
        EFO_POOL__RESERVED_RECORDS_PER_SHARD="5",
        EFO_POOL__BACKPRESSURE_TIMEOUT_S="1",
        EFO_BATCH__MAX_RECORDS="25",
        EFO_TEST_SINK_DELAY_S="1",
    ) as run:
        run.start("w1")
        run.wait_ready("w1")
        with run.traffic(records=48, every_s=0.2):
            run.sleep(*SIZE.pick((2, 3), (8, 12)))
        run.recovered(time.time(), "the end of the traffic")
        verdict = run.finish()
        assert verdict.duplicates == 0, verdict
        assert run.events("subscription.backpressure"), "no subscription timed out waiting for budget"


#: The streams of the several-streams scenario, short name -> shards (each stream's keys start with it).
STREAMS = {"orders": 3, "payments": 2, "clicks": 2}


@pytest.mark.chaos_full
def test_several_streams_with_kills_and_a_reshard(chaos: ChaosFactory) -> None:
    """Three streams of one application read by two workers (three in the full size) that share
    the shards of every stream: orders from TRIM_HORIZON with a backlog written before the first
    start, payments and clicks from LATEST with one too. While records flow to every stream, a
    random worker is SIGKILLed at a random moment and restarted a moment later under its own
    worker id or a new one (in the full size twice), and one random stream is resharded at random,
    in random order. Each stream is checked on its own (shard ids repeat across streams): nothing
    lost, per-key order kept, every duplicate a kill's; nothing of the LATEST streams' backlog read."""
    workers = SIZE.pick(2, 3)
    with chaos(
        f"3 streams, {workers} workers: SIGKILL and a reshard",
        streams=STREAMS,
        initial_position="LATEST",
        initial_positions={"orders": "TRIM_HORIZON"},
    ) as run:
        run.put_before_start(SIZE.pick(48, 120))
        names = [f"w{i}" for i in range(1, workers + 1)]
        run.start(*names)
        run.wait_ready(*names)  # every stream's leases exist: LATEST is pinned from here
        with run.traffic():
            run.wait_committing(*names)
            steps = ["kill"] * SIZE.pick(1, 2) + ["reshard"]
            run.rng.shuffle(steps)
            kills = 0
            for step in steps:
                run.sleep(0, 2)
                if step == "reshard":
                    what = run.reshard(run.rng.choice(list(STREAMS)))
                    run.recovered(time.time(), what)
                    continue
                victim = run.rng.choice(run.live())
                sent_at = run.kill(victim, signal.SIGKILL)
                kills += 1
                run.sleep(0, 2)  # an orchestrator restarts it
                same_id = run.rng.random() < 0.5
                restarted = f"{victim.split('.')[0]}.{kills + 1}" if same_id else f"w{workers + kills}"
                run.start(restarted)
                run.recovered(sent_at, f"SIGKILL {victim}")
                run.wait_ready(restarted)  # and a SIGTERM at the end finds its handlers installed
        run.finish()
        assert run.committed_before_start() == {"payments": 0, "clicks": 0}, "a LATEST stream read its backlog"
