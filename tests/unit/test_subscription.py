"""ShardSubscription against a scripted fake client, a fake clock and a fake sleep: no network, no waiting."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import botocore.exceptions
import pytest

from efo.config import SubscriptionSettings
from efo.errors import (
    EXIT_NOT_FOUND,
    EXIT_RUNTIME,
    AccessDenied,
    EfoError,
    InvalidRequest,
    KmsUnusable,
    LeaseLost,
    ResourceNotFound,
)
from efo.kinesis.subscription import (
    MIN_CALL_INTERVAL_S,
    Backoff,
    ShardSubscription,
    SubscriptionStopped,
)
from efo.leases.lifecycle import MIN_RENEW_INTERVAL_S
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import Position, RecordChunk, after, shard_key
from efo.sim.clock import EPOCH, SimClock
from efo.sim.loop import run as run_virtual

SHARD = "shardId-000000000001"
STREAM = "orders"
BIG = "49590338271490256608559692538361571095921575989136588898"  # 56 digits, like real Kinesis


# ---- fakes ------------------------------------------------------------------------------


class ScriptExhausted(BaseException):
    """The fake client has nothing more to say (a BaseException, so run() does not retry it)."""


class FakeClock(SimClock):
    """The shared fake clock (virtual time), recording every sleep of the subscription."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []
        self.on_sleep: Callable[[float], None] = lambda seconds: None

    def __call__(self) -> float:
        return self.now()

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.on_sleep(seconds)
        await super().sleep(seconds)


class FakeStream:
    """An async iterator of events; optionally fails after them; records which events were pulled."""

    def __init__(self, events: list[dict[str, Any]], *, error: BaseException | None = None, hang: bool = False) -> None:
        self._events = list(events)
        self._error = error
        self._hang = hang
        self._next = 0
        self.pulled: list[dict[str, Any]] = []
        self.closed = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        await asyncio.sleep(0)
        if self._next < len(self._events):
            event = self._events[self._next]
            self._next += 1
            self.pulled.append(event)
            return event
        if self._error is not None:
            raise self._error
        if self._hang:  # a quiet subscription: nothing more until cancelled
            await asyncio.Event().wait()
        raise StopAsyncIteration

    def close(self) -> None:
        self.closed = True


@dataclass
class Call:
    at: float
    kwargs: dict[str, Any]

    @property
    def start(self) -> dict[str, Any]:
        return dict(self.kwargs["StartingPosition"])


class FakeClient:
    """Each subscribe_to_shard call takes the next script entry: a FakeStream, a list of events or an exception."""

    def __init__(self, clock: FakeClock, script: list[Any]) -> None:
        self._clock = clock
        self._script = list(script)
        self.calls: list[Call] = []
        self.streams: list[FakeStream] = []
        self.successes: list[float] = []

    async def subscribe_to_shard(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(Call(self._clock(), kwargs))
        if not self._script:
            raise ScriptExhausted()
        entry = self._script.pop(0)
        if isinstance(entry, BaseException):
            raise entry
        stream = entry if isinstance(entry, FakeStream) else FakeStream(entry)
        self.streams.append(stream)
        self.successes.append(self._clock())
        return {"EventStream": stream}


@dataclass
class FakeProgress:
    serial: int = 0
    started_at: list[Position] = field(default_factory=list)
    enqueued_at: list[tuple[int, Position]] = field(default_factory=list)
    idled_at: list[Position] = field(default_factory=list)

    def next_serial(self) -> int:
        self.serial += 1
        return self.serial

    def started(self, first: Position) -> None:
        self.started_at.append(first)

    def enqueued(self, serial: int, resume: Position) -> None:
        self.enqueued_at.append((serial, resume))

    def idle(self, resume: Position) -> None:
        self.idled_at.append(resume)


def record(
    sequence_number: str, data: bytes = b"payload", key: str = "pk", at: float = 1_700_000_000.5
) -> dict[str, Any]:
    return {"SequenceNumber": sequence_number, "Data": data, "PartitionKey": key, "ApproximateArrivalTimestamp": at}


def event(*sequence_numbers: str, continuation: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {"Records": [record(s) for s in sequence_numbers], "MillisBehindLatest": 0}
    if continuation is not None:
        payload["ContinuationSequenceNumber"] = continuation
    return {"SubscribeToShardEvent": payload}


def shard_end(*sequence_numbers: str, children: tuple[str, ...] = ("shardId-000000000002",)) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "Records": [record(s) for s in sequence_numbers],
        "MillisBehindLatest": 0,
        "ChildShards": [{"ShardId": c, "ParentShards": [SHARD], "HashKeyRange": {}} for c in children],
    }
    return {"SubscribeToShardEvent": payload}


def client_error(code: str, status: int = 400) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": f"{code} happened"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "SubscribeToShard",
    )


@dataclass
class Harness:
    clock: FakeClock
    client: FakeClient
    pool: PendingPool
    handoff: Handoff
    progress: FakeProgress
    subscription: ShardSubscription
    sleeps_after_call: list[tuple[int, float]]

    def chunks(self) -> list[RecordChunk]:
        return self.handoff.close()

    def delivered(self) -> list[str]:
        return [s for c in self.chunks() for s in c.sequence_numbers]

    def backoff_delays(self) -> list[float]:
        """The first sleep after each failed call is the backoff delay (a second one is pacing)."""
        firsts: dict[int, float] = {}
        for calls, seconds in self.sleeps_after_call:
            firsts.setdefault(calls, seconds)
        return [firsts[n] for n in sorted(firsts)]


def harness(
    script: list[Any],
    *,
    start: Position | None = None,
    pool: PendingPool | None = None,
    progress: Any = None,
    rng: Callable[[], float] = lambda: 0.5,
    settings: SubscriptionSettings | None = None,
    **options: Any,
) -> Harness:
    clock = FakeClock()
    client = FakeClient(clock, script)
    handoff = Handoff(clock=clock)
    progress = progress if progress is not None else FakeProgress()
    sleeps_after_call: list[tuple[int, float]] = []
    clock.on_sleep = lambda seconds: sleeps_after_call.append((len(client.calls), seconds))

    pool = pool or PendingPool(1_000_000, 1 << 30)
    subscription = ShardSubscription(
        client=client,
        consumer_arn="arn:aws:kinesis:eu-west-1:123456789012:stream/orders/consumer/app:1",
        stream=STREAM,
        shard_id=SHARD,
        start=start or Position("TRIM_HORIZON"),
        pool=pool,
        handoff=handoff,
        progress=progress,
        settings=settings or SubscriptionSettings(),
        clock=clock,
        rng=rng,
        **options,
    )
    return Harness(clock, client, pool, handoff, progress, subscription, sleeps_after_call)


def run(awaitable: Awaitable[Any]) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(awaitable, 3600)  # virtual seconds: a hang fails at once

    return run_virtual(bounded())


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


# ---- positions and continuations --------------------------------------------------------


def test_first_call_uses_the_start_position_and_names_the_consumer_and_shard() -> None:
    h = harness([[shard_end()]], start=after("41"))
    run(h.subscription.run())
    call = h.client.calls[0]
    assert call.kwargs["ConsumerARN"].endswith("consumer/app:1")
    assert call.kwargs["ShardId"] == SHARD
    assert call.start == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "41"}


def test_resubscribe_after_a_subscription_ends_uses_after_sequence_number_of_the_last_continuation() -> None:
    h = harness(
        [
            [event("1", "2", continuation="3"), event("4", continuation="7")],
            [shard_end()],
        ]
    )
    run(h.subscription.run())
    assert len(h.client.calls) == 2
    assert h.client.calls[1].start == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "7"}
    assert h.client.streams[0].closed


def test_resubscribe_after_a_mid_stream_error_resumes_after_the_last_continuation() -> None:
    h = harness(
        [
            FakeStream(
                [event("10", continuation="11"), event(continuation="15")], error=client_error("InternalFailure", 500)
            ),
            [shard_end()],
        ]
    )
    run(h.subscription.run())
    assert h.client.calls[1].start == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "15"}
    assert h.client.streams[0].closed


def test_resume_uses_the_last_record_when_the_continuation_lags_behind_it() -> None:
    h = harness([[event("5", "9", continuation="8")], [shard_end()]])
    run(h.subscription.run())
    assert h.progress.enqueued_at == [(1, after("9"))]
    assert h.client.calls[1].start == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "9"}


def test_each_chunk_is_enqueued_with_a_new_serial_and_its_resume_position() -> None:
    h = harness([[event("1", continuation="2"), event("3", "4", continuation="6"), shard_end()]])
    run(h.subscription.run())
    assert h.progress.enqueued_at == [(1, after("2")), (2, after("6"))]
    chunks = h.chunks()
    assert [c.serial for c in chunks] == [1, 2]
    assert [c.sequence_numbers for c in chunks] == [["1"], ["3", "4"]]
    assert all(c.shard_id == SHARD and c.stream == STREAM for c in chunks)


def test_chunk_columns_carry_data_keys_and_arrival_in_epoch_milliseconds() -> None:
    ev = {
        "SubscribeToShardEvent": {
            "Records": [record("1", b"abc", "k1", 1_700_000_000.123), record("2", b"de", "k2", 1_700_000_001.0)],
            "ContinuationSequenceNumber": "2",
            "MillisBehindLatest": 0,
        }
    }
    h = harness([[ev, shard_end()]])
    run(h.subscription.run())
    [chunk] = h.chunks()
    assert chunk.data == [b"abc", b"de"]
    assert chunk.partition_keys == ["k1", "k2"]
    assert chunk.arrival_ms == [1_700_000_000_123, 1_700_000_001_000]
    assert chunk.data_bytes == 5
    assert chunk.sub_sequence_numbers == [None, None]
    assert chunk.grant is not None and chunk.grant.records == 2 and chunk.grant.bytes == 5


def test_an_event_without_records_moves_the_position_and_reports_idle() -> None:
    h = harness([[event(continuation="20"), event(continuation="25")], [shard_end()]])
    run(h.subscription.run())
    assert h.progress.idled_at == [after("20"), after("25")]
    assert h.progress.enqueued_at == []
    assert h.client.calls[1].start == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "25"}


# ---- duplicates -------------------------------------------------------------------------


def test_records_at_or_below_the_start_position_are_dropped_comparing_as_integers() -> None:
    # As strings "10" < "9"; as integers 10 > 9 and must be kept.
    h = harness([[event("8", "9", "10", "11", continuation="11"), shard_end()]], start=after("9"))
    run(h.subscription.run())
    assert h.delivered() == ["10", "11"]


def test_at_sequence_number_start_keeps_the_record_at_that_number() -> None:
    h = harness(
        [[event("99", "100", "101", continuation="101"), shard_end()]], start=Position("AT_SEQUENCE_NUMBER", "100")
    )
    run(h.subscription.run())
    assert h.delivered() == ["100", "101"]


def test_fifty_plus_digit_sequence_numbers_are_compared_as_integers() -> None:
    below, above = str(int(BIG) - 1), str(int(BIG) + 1)
    shorter = "9" * 40  # fewer digits, much smaller, but greater as a string
    assert shorter > BIG
    h = harness([[event(shorter, below, BIG, above, continuation=above), shard_end()]], start=after(BIG))
    run(h.subscription.run())
    assert h.delivered() == [above]


def test_records_already_handed_on_are_dropped_when_a_resubscribe_overlaps() -> None:
    h = harness(
        [
            FakeStream([event("9", "10", continuation="8")], error=client_error("InternalFailure", 500)),
            [event("9", "10", "11", continuation="11"), shard_end()],
        ]
    )
    run(h.subscription.run())
    assert h.delivered() == ["9", "10", "11"]


# ---- shard end --------------------------------------------------------------------------


def test_shard_end_returns_shard_ended_with_the_children_and_their_parents() -> None:
    h = harness(
        [[event("1", continuation="1"), shard_end("2", children=("shardId-000000000002", "shardId-000000000003"))]]
    )
    ended = run(h.subscription.run())
    assert ended.child_shard_ids == ("shardId-000000000002", "shardId-000000000003")
    assert ended.child_parents == (("shardId-000000000002", (SHARD,)), ("shardId-000000000003", (SHARD,)))
    assert h.delivered() == ["1", "2"]  # the last event's records still go through
    assert len(h.client.calls) == 1
    assert h.client.streams[0].closed


def test_shard_end_of_a_merge_parent_lists_the_single_child() -> None:
    h = harness([[shard_end(children=("shardId-000000000009",))]])
    assert run(h.subscription.run()).child_shard_ids == ("shardId-000000000009",)


# ---- retries and backoff ----------------------------------------------------------------


RETRIABLE = [
    pytest.param(client_error("ResourceInUseException"), id="ResourceInUseException"),
    pytest.param(client_error("LimitExceededException"), id="LimitExceededException"),
    pytest.param(client_error("InternalFailure", 500), id="InternalFailure"),
    pytest.param(client_error("SomethingOdd", 500), id="http-500"),
    pytest.param(client_error("SomethingOdd", 503), id="http-503"),
    pytest.param(aiohttp.ClientConnectionError("connection reset"), id="ClientConnectionError"),
    pytest.param(TimeoutError("read timed out"), id="TimeoutError"),
]


#: ResourceInUse at the start is retried at Kinesis's pace first (the 5 s rule), not after a backoff.
BACKED_OFF = [param for param in RETRIABLE if param.id != "ResourceInUseException"]


@pytest.mark.parametrize("error", BACKED_OFF)
def test_retriable_error_is_retried_after_a_backoff_within_bounds(error: BaseException) -> None:
    h = harness([error, [shard_end()]], rng=lambda: 0.5)
    assert run(h.subscription.run()).child_shard_ids == ("shardId-000000000002",)
    assert len(h.client.calls) == 2
    [delay] = h.backoff_delays()
    assert 0.15 <= delay <= 0.3
    assert delay == pytest.approx(0.3 * 0.75)


@pytest.mark.parametrize("error", RETRIABLE)
def test_retriable_error_raised_while_reading_the_stream_is_retried(error: BaseException) -> None:
    h = harness([FakeStream([event("1", continuation="1")], error=error), [shard_end()]])
    run(h.subscription.run())
    assert len(h.client.calls) == 2
    assert h.client.calls[1].start == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "1"}


@pytest.mark.parametrize(("rng_value", "factor"), [(0.0, 0.5), (0.999999, 0.999999 * 0.5 + 0.5)])
def test_backoff_doubles_from_initial_to_max_with_jitter_in_the_upper_half(rng_value: float, factor: float) -> None:
    failures = [client_error("LimitExceededException") for _ in range(8)]
    h = harness([*failures, [shard_end()]], rng=lambda: rng_value)
    run(h.subscription.run())
    ceilings = [0.3, 0.6, 1.2, 2.4, 4.8, 5.0, 5.0, 5.0]
    assert h.backoff_delays() == pytest.approx([c * factor for c in ceilings])
    assert h.subscription.attempt == 9


def test_backoff_delays_never_leave_the_upper_half_of_the_ceiling_or_pass_the_max() -> None:
    values = iter([0.0, 0.25, 0.5, 0.75, 0.9999] * 4)
    backoff = Backoff(0.3, 5.0, rng=lambda: next(values))
    for failures in range(20):
        ceiling = min(5.0, 0.3 * 2**failures)
        delay = backoff.next_delay_s()
        assert ceiling / 2 <= delay <= ceiling <= 5.0


def test_backoff_starts_over_once_an_event_arrives() -> None:
    h = harness(
        [
            client_error("LimitExceededException"),
            client_error("LimitExceededException"),
            FakeStream([event("1", continuation="1")], error=client_error("InternalFailure", 500)),
            client_error("LimitExceededException"),
            [shard_end()],
        ],
        rng=lambda: 0.0,
    )
    run(h.subscription.run())
    # failures 1 and 2 double; the event in subscription 3 resets, so failure 3 is back at the start.
    assert h.backoff_delays() == pytest.approx([0.15, 0.3, 0.15, 0.3])


def test_configured_backoff_settings_are_used() -> None:
    settings = SubscriptionSettings(backoff_initial_s=2.0, backoff_max_s=3.0)
    h = harness([client_error("LimitExceededException")] * 3 + [[shard_end()]], rng=lambda: 0.0, settings=settings)
    run(h.subscription.run())
    assert h.backoff_delays() == pytest.approx([1.0, 1.5, 1.5])


@pytest.mark.parametrize(
    ("error", "kind", "exit_code"),
    [
        (client_error("ResourceNotFoundException"), ResourceNotFound, EXIT_NOT_FOUND),
        (client_error("AccessDeniedException"), AccessDenied, EXIT_RUNTIME),
        (client_error("InvalidArgumentException"), InvalidRequest, EXIT_RUNTIME),
        (client_error("KMSDisabledException"), KmsUnusable, EXIT_RUNTIME),
    ],
    ids=["ResourceNotFound", "AccessDenied", "InvalidArgument", "KMSDisabled"],
)
def test_non_retriable_error_stops_the_subscription_with_its_efo_error(
    error: BaseException, kind: type[EfoError], exit_code: int
) -> None:
    h = harness([error, [shard_end()]])
    with pytest.raises(kind) as info:
        run(h.subscription.run())
    assert type(info.value) is kind
    assert info.value.exit_code == exit_code
    assert not info.value.retriable
    assert SHARD in str(info.value) and STREAM in str(info.value)
    assert len(h.client.calls) == 1
    assert h.backoff_delays() == []


def test_lease_lost_is_never_retried() -> None:
    h = harness([LeaseLost("another worker owns the shard"), [shard_end()]])
    with pytest.raises(LeaseLost):
        run(h.subscription.run())
    assert len(h.client.calls) == 1


def test_attempt_counter_counts_every_call() -> None:
    h = harness(
        [
            client_error("ResourceInUseException"),
            [event("1", continuation="1")],
            client_error("InternalFailure", 500),
            [shard_end()],
        ]
    )
    run(h.subscription.run())
    assert h.subscription.attempt == 4
    assert len(h.client.calls) == 4


# ---- pacing -----------------------------------------------------------------------------


def _assert_paced(h: Harness) -> None:
    times = [c.at for c in h.client.calls]
    for earlier, later in itertools.pairwise(times):
        assert later - earlier >= MIN_CALL_INTERVAL_S - 1e-9, times
    for call in h.client.calls:
        for success in h.client.successes:
            if success < call.at:
                assert call.at - success >= MIN_RENEW_INTERVAL_S - 1e-9, (call.at, success)


def test_calls_are_never_closer_than_one_second_even_with_the_shortest_backoff() -> None:
    h = harness([client_error("LimitExceededException")] * 4 + [[shard_end()]], rng=lambda: 0.0)
    run(h.subscription.run())
    times = [c.at for c in h.client.calls]
    # backoff 0.15, 0.3, 0.6 is raised to the 1 s floor; 1.2 is longer than it
    assert times == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.2])
    _assert_paced(h)


def test_a_renewal_waits_five_seconds_after_the_last_successful_call() -> None:
    h = harness([[event("1", continuation="1")], [event("2", continuation="2")], [shard_end()]])
    run(h.subscription.run())
    assert [c.at for c in h.client.calls] == pytest.approx([0.0, 5.0, 10.0])
    _assert_paced(h)


def test_once_the_worker_stops_no_new_call_is_made() -> None:
    """A stop reads on for up to 5 s (Coordinator._read_on): a renewal or a retry that succeeded
    meanwhile would start another 5 s before Kinesis takes the next owner's call."""
    stopping = asyncio.Event()
    h = harness(
        [[event("1", continuation="1")], [shard_end()]],
        stopping=stopping,
        on_subscribed=lambda at: stopping.set(),  # the stop comes while the first subscription reads
    )
    with pytest.raises(SubscriptionStopped):
        run(h.subscription.run())
    assert len(h.client.calls) == 1
    assert h.delivered() == ["1"]


def test_a_retry_after_a_failure_still_keeps_five_seconds_from_the_last_success() -> None:
    h = harness(
        [
            FakeStream([event("1", continuation="1")], error=client_error("InternalFailure", 500)),
            client_error("ResourceInUseException"),
            [shard_end()],
        ],
        rng=lambda: 0.0,
    )
    run(h.subscription.run())
    times = [c.at for c in h.client.calls]
    assert times[1] >= 5.0
    _assert_paced(h)


def test_a_claim_calls_first_five_seconds_after_the_previous_owner_s_call_neither_sooner_nor_later() -> None:
    """Kinesis refuses a call within 5 s of the last successful one (the previous owner's, in a
    handover): the released lease says when that was, and the next owner's first call waits just so
    long. Before, it called at once, was refused, and backed off past the 5 s (issue 37: 6.8 s unread
    in a rolling deploy)."""
    h = harness([[shard_end()]], previous_call_at=EPOCH - timedelta(seconds=2))
    run(h.subscription.run())
    assert [c.at for c in h.client.calls] == pytest.approx([3.0])


@pytest.mark.parametrize(("ago_s", "first_at"), [(30.0, 0.0), (5.0, 0.0), (-60.0, 5.0)])
def test_a_previous_call_long_ago_waits_for_nothing_and_one_ahead_of_the_clock_at_most_five_seconds(
    ago_s: float, first_at: float
) -> None:
    h = harness([[shard_end()]], previous_call_at=EPOCH - timedelta(seconds=ago_s))
    run(h.subscription.run())
    assert [c.at for c in h.client.calls] == pytest.approx([first_at])


def test_resource_in_use_at_the_start_is_retried_every_second_until_kinesis_takes_the_call() -> None:
    """Refused because another subscribed less than 5 s ago (a previous owner whose call the lease
    did not say): the call goes again every second, the pace Kinesis allows, not after a growing
    backoff that overshoots the moment it would be taken."""
    h = harness([client_error("ResourceInUseException")] * 5 + [[shard_end()]], rng=lambda: 0.999999)
    run(h.subscription.run())
    assert [c.at for c in h.client.calls] == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    _assert_paced(h)


def test_resource_in_use_for_longer_than_five_seconds_falls_back_to_the_backoff() -> None:
    """Past 5 s, ResourceInUse is not the 5 s rule (a consumer not ACTIVE, say): back off as for
    any other error, rather than call every second for ever."""
    h = harness([client_error("ResourceInUseException")] * 10 + [[shard_end()]], rng=lambda: 0.999999)
    run(h.subscription.run())
    times = [c.at for c in h.client.calls]
    assert times[:7] == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert times[10] - times[9] > 2.0, times
    _assert_paced(h)


def test_a_successful_call_is_reported_with_its_wall_clock_time() -> None:
    seen: list[datetime] = []
    h = harness([client_error("ResourceInUseException"), [shard_end()]], on_subscribed=seen.append)
    run(h.subscription.run())
    assert seen == [h.clock.wall()] and h.clock.now() == pytest.approx(1.0)


def test_pacing_holds_across_a_long_mixed_script() -> None:
    script: list[Any] = []
    for i in range(1, 8):
        script.append([event(str(i), continuation=str(i))])
        script.append(client_error("LimitExceededException"))
        script.append(client_error("InternalFailure", 500))
    script.append([shard_end()])
    h = harness(script, rng=lambda: 0.3)
    run(h.subscription.run())
    assert len(h.client.calls) == len(script)
    _assert_paced(h)


# ---- pool -------------------------------------------------------------------------------


def test_budget_is_acquired_before_the_next_event_is_read() -> None:
    async def scenario() -> None:
        pool = PendingPool(1, 1 << 30)
        stream = FakeStream(
            [event("1", continuation="1"), event("2", continuation="2"), event("3", continuation="3"), shard_end()]
        )
        h = harness([stream], pool=pool)
        task = asyncio.ensure_future(h.subscription.run())
        await settle()
        # Event 1 took the only record of budget; event 2 was read and waits for budget;
        # event 3 must not be read until then.
        assert [e["SubscribeToShardEvent"]["Records"][0]["SequenceNumber"] for e in stream.pulled] == ["1", "2"]
        assert pool.records == 1 and len(h.handoff._chunks) == 1
        [first] = h.handoff.take_batch(10, 1 << 30, 0, idle_wait_s=0)
        assert first.sequence_numbers == ["1"]
        pool.release(first.grant)
        await settle()
        assert len(stream.pulled) == 3  # event 2 admitted, event 3 read and waiting
        [second] = h.handoff.take_batch(10, 1 << 30, 0, idle_wait_s=0)
        assert second.sequence_numbers == ["2"]
        assert not task.done()
        pool.release(second.grant)
        await settle()
        [third] = h.handoff.take_batch(10, 1 << 30, 0, idle_wait_s=0)
        pool.release(third.grant)
        assert (await task).child_shard_ids == ("shardId-000000000002",)
        assert (pool.records, pool.bytes) == (0, 0)

    run(scenario())


def test_budget_is_acquired_for_the_records_and_bytes_of_the_event() -> None:
    async def scenario() -> None:
        pool = PendingPool(1_000, 1 << 30)
        h = harness([FakeStream([event("1", "2", "3", continuation="3")], hang=True)], pool=pool)
        task = asyncio.ensure_future(h.subscription.run())
        await settle()
        assert (pool.records, pool.bytes) == (3, 3 * len(b"payload"))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())


def test_a_quiet_shard_is_admitted_from_its_reserve_while_another_shard_waits_for_shared_budget() -> None:
    async def scenario() -> None:
        pool = PendingPool(100, 1 << 30, reserved_records=10, reserved_bytes=1 << 20)
        pool.register("hot")
        pool.register(shard_key(STREAM, SHARD))  # the pool names a shard by its stream too
        hot = await pool.acquire(85, 85, "hot")
        hot_waiter = asyncio.ensure_future(pool.acquire(10, 10, "hot"))
        h = harness([FakeStream([event("1", continuation="1"), event("2", continuation="2")], hang=True)], pool=pool)
        task = asyncio.ensure_future(h.subscription.run())
        await settle()
        try:
            assert len(h.chunks()) == 2, "the quiet shard's records were not admitted from its reserve"
        finally:
            task.cancel()
            hot_waiter.cancel()
            await asyncio.gather(task, hot_waiter, return_exceptions=True)
            pool.release(hot)

    run(scenario())


# ---- started() --------------------------------------------------------------------------


def test_started_is_reported_once_with_at_sequence_number_of_the_first_record() -> None:
    h = harness(
        [
            [event("12", "13", continuation="13"), event("14", continuation="14")],
            [event("15", continuation="15")],
            [shard_end()],
        ],
        start=Position("LATEST"),
    )
    run(h.subscription.run())
    assert h.progress.started_at == [Position("AT_SEQUENCE_NUMBER", "12")]


def test_started_reports_the_first_record_actually_delivered_after_duplicates() -> None:
    h = harness([[event("5", "6", continuation="6"), shard_end()]], start=after("5"))
    run(h.subscription.run())
    assert h.progress.started_at == [Position("AT_SEQUENCE_NUMBER", "6")]


def test_started_reports_after_the_continuation_when_the_first_event_is_empty() -> None:
    h = harness([[event(continuation="77"), event("78", continuation="78"), shard_end()]], start=Position("LATEST"))
    run(h.subscription.run())
    assert h.progress.started_at == [after("77")]


def test_started_is_not_reported_again_after_a_retry() -> None:
    h = harness(
        [
            FakeStream([event(continuation="3")], error=client_error("ServiceUnavailable", 503)),
            [event("4", continuation="4"), shard_end()],
        ]
    )
    run(h.subscription.run())
    assert h.progress.started_at == [after("3")]


def test_started_is_not_reported_when_the_first_event_is_the_shards_end() -> None:
    h = harness([[shard_end()]], start=Position("TRIM_HORIZON"))
    run(h.subscription.run())
    assert h.progress.started_at == []  # nothing was read: there is no position to pin


def test_events_of_other_types_are_ignored() -> None:
    h = harness([[{"SomethingElse": {}}, event("1", continuation="1"), shard_end()]])
    run(h.subscription.run())
    assert h.delivered() == ["1"]
    assert h.progress.started_at == [Position("AT_SEQUENCE_NUMBER", "1")]
