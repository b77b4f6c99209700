"""The subscription engine beyond the happy path: backpressure timeout, a takeover in the middle of
a stream, KPL aggregates (with every corrupt-aggregate policy) and shard epochs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aws_kinesis_agg.aggregator import RecordAggregator

from efo.config import SubscriptionSettings
from efo.errors import (
    InvalidRequest,
    LeaseLost,
    Retriable,
)
from efo.kinesis.kpl import CorruptAggregate
from efo.kinesis.subscription import MIN_CALL_INTERVAL_S, ShardEnded
from efo.leases.ledger import CheckpointLedger
from efo.observability import METRICS, Metrics
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import SHARD_END, Position, after

from .test_subscription import SHARD, STREAM, FakeStream, client_error, event, harness, record, run, settle, shard_end


def aggregate(*items: tuple[str, bytes, str | None]) -> bytes:
    aggregator = RecordAggregator()
    for key, data, explicit_hash_key in items:
        aggregator.add_user_record(key, data, explicit_hash_key)
    return bytes(aggregator.clear_and_get().get_contents()[2])


def event_of(*records: dict[str, Any], continuation: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {"Records": list(records), "MillisBehindLatest": 0}
    if continuation is not None:
        payload["ContinuationSequenceNumber"] = continuation
    return {"SubscribeToShardEvent": payload}


def test_backpressure_timeout_closes_the_stream_and_resumes_after_the_last_admitted_event() -> None:
    first = FakeStream([event("1", "2", continuation="2"), event("3", "4", continuation="4")], hang=True)
    h = harness(
        [first, [event("3", "4", continuation="4"), shard_end()]],
        pool=PendingPool(2, 1 << 30),
        backpressure_timeout_s=0.01,
    )

    async def scenario() -> ShardEnded:
        task = asyncio.ensure_future(h.subscription.run())
        while not first.closed:  # the second event waited past the timeout
            await asyncio.sleep(0.005)
        await settle()
        assert len(h.client.calls) == 1, "no resubscribe while the pool is still full"
        (committed,) = [c for c in list(h.handoff._chunks)]
        h.pool.release(committed.grant)  # the sink committed the first event
        return await asyncio.wait_for(task, 5)

    assert run(scenario()).child_shard_ids == ("shardId-000000000002",)
    assert h.client.calls[1].start == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "2"}
    assert h.delivered() == ["1", "2", "3", "4"]


def test_resource_in_use_mid_stream_stops_the_shard_when_the_lease_is_gone() -> None:
    checks: list[bool] = []

    async def lease_check() -> bool:
        checks.append(False)
        return False

    stream = FakeStream([event("1", continuation="1")], error=client_error("ResourceInUseException"))
    h = harness([stream, [shard_end()]], lease_check=lease_check)
    with pytest.raises(LeaseLost, match=SHARD):
        run(h.subscription.run())
    assert checks == [False] and len(h.client.calls) == 1


def test_resource_in_use_mid_stream_resubscribes_while_the_lease_is_still_ours() -> None:
    async def lease_check() -> bool:
        return True

    stream = FakeStream([event("1", continuation="1")], error=client_error("ResourceInUseException"))
    h = harness([stream, [shard_end()]], lease_check=lease_check)
    assert run(h.subscription.run()).child_shard_ids == ("shardId-000000000002",)
    assert h.client.calls[1].start == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "1"}


def test_resource_in_use_at_the_call_is_retried_without_reading_the_lease() -> None:
    async def lease_check() -> bool:
        raise AssertionError("the lease is read only for a takeover in the middle of a stream")

    h = harness([client_error("ResourceInUseException"), [shard_end()]], lease_check=lease_check)
    assert run(h.subscription.run()).child_shard_ids == ("shardId-000000000002",)


def test_aggregated_records_become_one_row_per_sub_record_with_sub_sequence_and_hash_keys() -> None:
    blob = aggregate(("a", b"one", "170141183460469231731687303715884105728"), ("b", b"two", None), ("c", b"", None))
    h = harness([[event_of(record("10", blob), record("11", b"plain"), continuation="11"), shard_end()]], epoch=7)
    run(h.subscription.run())
    (chunk,) = h.chunks()
    assert chunk.sequence_numbers == ["10", "10", "10", "11"]
    assert chunk.sub_sequence_numbers == [0, 1, 2, None]
    assert chunk.partition_keys == ["a", "b", "c", "pk"]
    assert chunk.explicit_hash_keys == ["170141183460469231731687303715884105728", None, None, None]
    assert chunk.data == [b"one", b"two", b"", b"plain"]
    assert chunk.epoch == 7


def test_a_restart_inside_an_aggregate_drops_the_sub_records_already_delivered() -> None:
    blob = aggregate(("a", b"0", None), ("b", b"1", None), ("c", b"2", None))
    start = Position("AT_SEQUENCE_NUMBER", "10", 1)
    h = harness([[event_of(record("10", blob), continuation="10"), shard_end()]], start=start)
    run(h.subscription.run())
    (chunk,) = h.chunks()
    assert (chunk.sub_sequence_numbers, chunk.data) == ([2], [b"2"])


@pytest.mark.parametrize("policy", ["passthrough", "dead_letter"])
def test_a_corrupt_aggregate_never_crashes_the_subscription(policy: str) -> None:
    corrupt = aggregate(("a", b"x" * 50, None))[:-3] + b"\x00\x00\x00"  # MD5 trailer damaged
    h = harness(
        [[event_of(record("20", corrupt), record("21", b"ok"), continuation="21"), shard_end()]],
        on_corrupt_aggregate=policy,
    )
    run(h.subscription.run())
    (chunk,) = h.chunks()
    if policy == "passthrough":
        assert chunk.sequence_numbers == ["20", "21"] and chunk.errors == ["corrupt_aggregate", None]
        assert chunk.data[0] == corrupt
    else:
        assert chunk.sequence_numbers == ["21"]
        (letter,) = chunk.dead_letters
        assert (letter.sequence_number, letter.data) == ("20", corrupt)
    assert h.progress.enqueued_at == [(1, after("21"))]


def test_a_corrupt_aggregate_with_the_fail_policy_stops_naming_the_shard() -> None:
    corrupt = aggregate(("a", b"x", None))[:-1] + b"\xff"
    h = harness([[event_of(record("20", corrupt), continuation="20")]], on_corrupt_aggregate="fail")
    with pytest.raises(CorruptAggregate, match=f"md5.*{SHARD}|{SHARD}"):
        run(h.subscription.run())


def test_an_event_of_dead_letters_only_is_still_handed_on_so_the_checkpoint_can_pass_it() -> None:
    corrupt = b"\xf3\x89\x9a\xc2" + b"\x01" * 40
    h = harness([[event_of(record("30", corrupt), continuation="30"), shard_end()]], on_corrupt_aggregate="dead_letter")
    run(h.subscription.run())
    (chunk,) = h.chunks()
    assert len(chunk) == 0 and len(chunk.dead_letters) == 1
    assert chunk.grant.records == 1
    assert h.progress.enqueued_at == [(1, after("30"))]


# ---- positions are concrete after the first event ----------------------------------------------


def test_latest_is_never_sent_twice_after_a_backpressure_timeout_on_the_first_event() -> None:
    # The first event of a LATEST subscription waits past the backpressure timeout; the resubscribe
    # must start at that event's first record, not at LATEST again (which skips what came between).
    first = FakeStream([event("1", "2", continuation="2")], hang=True)
    pool = PendingPool(2, 1 << 30)
    h = harness(
        [first, [event("1", "2", continuation="2"), shard_end()]],
        pool=pool,
        start=Position("LATEST"),
        backpressure_timeout_s=0.01,
    )

    async def scenario() -> None:
        held = await pool.acquire(2, 2)  # a slow sink holds the whole pool
        task = asyncio.ensure_future(h.subscription.run())
        while not first.closed:
            await asyncio.sleep(0.005)
        pool.release(held)
        await asyncio.wait_for(task, 5)

    run(scenario())
    assert [call.start for call in h.client.calls] == [
        {"Type": "LATEST"},
        {"Type": "AT_SEQUENCE_NUMBER", "SequenceNumber": "1"},
    ]
    assert h.delivered() == ["1", "2"]


def test_an_event_read_again_after_a_backpressure_timeout_is_counted_received_once() -> None:
    metrics = Metrics.create()
    first = FakeStream([event("1", "2", continuation="2")], hang=True)
    pool = PendingPool(2, 1 << 30)
    h = harness(
        [first, [event("1", "2", continuation="2"), shard_end()]],
        pool=pool,
        backpressure_timeout_s=0.01,
        series=metrics.shard(STREAM, SHARD),
    )

    async def scenario() -> None:
        held = await pool.acquire(2, 2)
        task = asyncio.ensure_future(h.subscription.run())
        while not first.closed:
            await asyncio.sleep(0.005)
        pool.release(held)
        await asyncio.wait_for(task, 5)

    def ended() -> dict[str, float | None]:
        return {
            outcome: METRICS.registry.get_sample_value(
                "efo_subscriptions_ended_total", {"stream": STREAM, "outcome": outcome}
            )
            for outcome in ("backpressure", "shard_end")
        }

    before = ended()
    run(scenario())
    assert h.delivered() == ["1", "2"]
    assert metrics.registry.get_sample_value("efo_records_received_total", {"stream": STREAM, "shard_id": SHARD}) == 2
    after = ended()
    assert {outcome: (after[outcome] or 0) - (before[outcome] or 0) for outcome in after} == {
        "backpressure": 1,
        "shard_end": 1,
    }


@pytest.mark.parametrize("start", ["LATEST", "TRIM_HORIZON"])
def test_a_retry_after_an_empty_first_event_starts_after_its_continuation(start: str) -> None:
    h = harness(
        [FakeStream([event(continuation="7")], error=client_error("InternalFailure", 500)), [shard_end()]],
        start=Position(start),  # type: ignore[arg-type]
    )
    run(h.subscription.run())
    assert h.client.calls[1].start == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "7"}


def test_the_budget_of_an_event_left_unread_by_a_backpressure_timeout_is_kept_for_its_re_read() -> None:
    # After the timeout the subscription waits in line for the event's budget and keeps it, so the
    # re-read event gets in at once even while other shards keep the pool busy.
    first = FakeStream([event("1", "2", continuation="2")], hang=True)
    pool = PendingPool(4, 1 << 30)
    h = harness([first, [event("1", "2", continuation="2"), shard_end()]], pool=pool, backpressure_timeout_s=0.01)

    async def scenario() -> None:
        held = await pool.acquire(4, 4, "other")
        task = asyncio.ensure_future(h.subscription.run())
        while not first.closed:
            await asyncio.sleep(0.005)
        pool.release(held)
        other = await pool.acquire(2, 2, "other")  # another shard takes what is left at once
        await asyncio.wait_for(task, 5)
        pool.release(other)

    run(scenario())
    (chunk,) = h.chunks()
    assert chunk.sequence_numbers == ["1", "2"] and chunk.grant.records == 2
    assert pool.records == 2  # the chunk's budget, held until the sink commits it


def test_a_cancel_while_the_budget_is_granted_in_the_same_loop_pass_stops_the_subscription() -> None:
    async def scenario() -> None:
        pool = PendingPool(1, 1 << 30)
        held = await pool.acquire(1, 1)
        h = harness([FakeStream([event("1", continuation="1")], hang=True)], pool=pool, backpressure_timeout_s=30)
        task = asyncio.ensure_future(h.subscription.run())
        await settle()
        pool.release(held)
        task.cancel()
        await settle()
        assert task.cancelled(), "the cancel was swallowed and the subscription kept reading"
        assert pool.records == 0

    run(scenario())


# ---- errors around the stream -------------------------------------------------------------------


def test_a_throttled_lease_read_after_a_takeover_is_retried_not_fatal() -> None:
    checks: list[str] = []

    async def lease_check() -> bool:
        checks.append("read")
        if len(checks) == 1:
            raise Retriable("ProvisionedThroughputExceededException on DynamoDB table 'app'")
        return True

    h = harness(
        [
            FakeStream([event("1", continuation="1")], error=client_error("ResourceInUseException")),
            FakeStream([event("2", continuation="2")], error=client_error("ResourceInUseException")),
            [shard_end()],
        ],
        lease_check=lease_check,
    )
    assert run(h.subscription.run()).child_shard_ids == ("shardId-000000000002",)
    assert checks == ["read", "read"]
    assert h.delivered() == ["1", "2"]


def test_a_position_past_the_retention_restarts_once_at_trim_horizon() -> None:
    h = harness(
        [client_error("InvalidArgumentException"), [event("5", "50", continuation="50"), shard_end()]],
        start=after("10"),
    )
    run(h.subscription.run())
    assert [call.start for call in h.client.calls] == [
        {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "10"},
        {"Type": "TRIM_HORIZON"},
    ]
    assert h.delivered() == ["50"]  # what was at or below the old position stays dropped
    assert h.backoff_delays() == [MIN_CALL_INTERVAL_S]  # no backoff: only the 1 s pacing of calls


def test_without_restart_expired_a_position_past_the_retention_is_the_callers_error() -> None:
    """The Spark source with failOnDataLoss: an expired position is data loss to report, not to skip."""
    h = harness(
        [client_error("InvalidArgumentException"), [event("5", "50", continuation="50"), shard_end()]],
        start=after("10"),
        restart_expired=False,
    )
    with pytest.raises(InvalidRequest):
        run(h.subscription.run())
    assert len(h.client.calls) == 1 and h.delivered() == []


def test_invalid_argument_at_trim_horizon_is_still_fatal() -> None:
    h = harness([client_error("InvalidArgumentException"), client_error("InvalidArgumentException")], start=after("10"))
    with pytest.raises(InvalidRequest):
        run(h.subscription.run())
    assert len(h.client.calls) == 2


def test_invalid_argument_in_the_middle_of_a_stream_is_not_taken_for_an_expired_position() -> None:
    h = harness(
        [FakeStream([event("11", continuation="11")], error=client_error("InvalidArgumentException"))],
        start=after("10"),
    )
    with pytest.raises(InvalidRequest):
        run(h.subscription.run())


def test_a_call_that_does_not_answer_within_the_read_timeout_is_retried() -> None:
    class StuckOnce:
        def __init__(self, then: Any) -> None:
            self.calls = 0
            self.then = then

        async def subscribe_to_shard(self, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == 1:
                await asyncio.Event().wait()  # no free connection in the client's pool
            return await self.then.subscribe_to_shard(**kwargs)

    h = harness([[shard_end()]], settings=SubscriptionSettings(read_timeout_s=0.05))
    stuck = StuckOnce(h.client)
    h.subscription._client = stuck
    assert run(h.subscription.run()).child_shard_ids == ("shardId-000000000002",)
    assert stuck.calls == 2


# ---- the first event, against the real ledger ------------------------------------------------------


@pytest.mark.parametrize("start", ["TRIM_HORIZON", "LATEST"])
def test_a_shard_whose_first_event_is_its_end_ends_cleanly(start: str) -> None:
    # A child split again before any record, or a closed shard past its retention: the first event
    # has neither records nor a continuation. There is nothing to pin; the shard simply ends.
    ledger = CheckpointLedger(Position(start))  # type: ignore[arg-type]
    h = harness([[shard_end()]], start=Position(start), progress=ledger)  # type: ignore[arg-type]
    assert run(h.subscription.run()).child_shard_ids == ("shardId-000000000002",)
    ledger.ended()
    assert ledger.due == SHARD_END


def test_the_pin_of_a_latest_start_is_written_before_the_first_records_are_handed_on() -> None:
    order: list[str] = []

    async def pin(first: Position) -> None:
        order.append(f"pin {first}")

    class Recording(Handoff):
        def put(self, chunk: Any) -> None:
            order.append("handed on")
            super().put(chunk)

    h = harness([[event("5", "6", continuation="6"), shard_end()]], start=Position("LATEST"), on_first_event=pin)
    h.subscription._handoff = Recording()
    run(h.subscription.run())
    assert order == ["pin AT_SEQUENCE_NUMBER:5", "handed on"]


def test_the_pin_covers_a_leading_dead_letter() -> None:
    corrupt = b"\xf3\x89\x9a\xc2" + b"\x01" * 40
    ledger = CheckpointLedger(Position("LATEST"))
    h = harness(
        [[event_of(record("10", corrupt), record("11", b"ok"), continuation="11"), shard_end()]],
        start=Position("LATEST"),
        on_corrupt_aggregate="dead_letter",
        progress=ledger,
    )
    run(h.subscription.run())
    assert ledger.due == Position("AT_SEQUENCE_NUMBER", "10"), "a restart would never dead-letter record 10"
