"""How the source's engine cuts micro-batches out of what its subscriptions read (efo.source.engine
``_take``), with no network: read limits in rows and bytes, a KPL aggregate split between batches,
AvailableNow's cut at the query's start, shard ends, and the pool budget given back."""

from __future__ import annotations

from itertools import groupby
from typing import Any, cast

import pytest

from efo.pipeline.records import RecordChunk, Row
from efo.source.engine import Engine, _Marker, _Shard, _Stream
from efo.source.offsets import ShardOffset
from efo.source.options import parse

ARN = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"


def engine(available_now_at_ms: int | None = None) -> tuple[Engine, _Shard]:
    e = Engine(parse({"streams": "orders", "consumerName": "c"}), available_now_at_ms=available_now_at_ms)
    stream = _Stream("orders", ARN, 1, "consumer")
    shard = _Shard(stream, "shardId-000000000000", ShardOffset("TRIM_HORIZON"))
    stream.shards[shard.shard_id] = shard
    e._streams[ARN] = stream
    return e, shard


def put(e: Engine, *rows: Row) -> RecordChunk:
    chunk = RecordChunk.of_rows("orders", "shardId-000000000000", 0, rows)
    chunk.grant = e._pool.try_acquire(len(chunk), chunk.data_bytes, "orders/shardId-000000000000")
    assert chunk.grant is not None
    e._queue.append(chunk)
    return chunk


def plain(seq: int, size: int = 10, arrival_ms: int = 1000) -> Row:
    return Row(str(seq), b"x" * size, f"k{seq}", arrival_ms)


def sub(seq: int, index: int) -> Row:
    return Row(str(seq), b"s", "k", 1000, sub_sequence_number=index)


def taken(chunks: list[RecordChunk]) -> list[tuple[str, int | None]]:
    return [(s, n) for c in chunks for s, n in zip(c.sequence_numbers, c.sub_sequence_numbers, strict=True)]


def test_a_row_limit_splits_a_chunk_and_the_rest_waits_with_its_budget() -> None:
    e, shard = engine()
    put(e, *(plain(i) for i in range(1, 6)))
    first = e._take(3, None)
    assert taken(first) == [("1", None), ("2", None), ("3", None)]
    assert shard.offset.sequence_number == "3" and shard.offset.rows == 3
    assert e._pool.records == 5, "the budget of a chunk not wholly taken is kept"
    second = e._take(3, None)
    assert taken(second) == [("4", None), ("5", None)]
    assert e._pool.records == 0 and shard.offset.rows == 5


def test_a_byte_limit_takes_at_least_one_row_and_never_more_than_fits_after_it() -> None:
    e, _ = engine()
    put(e, plain(1, 50), plain(2, 50), plain(3, 50))
    assert taken(e._take(None, 20)) == [("1", None)]  # larger than the limit alone: a batch of its own
    assert taken(e._take(None, 120)) == [("2", None), ("3", None)]


def test_a_kpl_aggregate_split_by_the_limit_keeps_its_sub_sequence_in_the_offset() -> None:
    e, shard = engine()
    put(e, sub(7, 0), sub(7, 1), sub(7, 2), plain(8))
    e._take(2, None)
    assert (shard.offset.sequence_number, shard.offset.sub_sequence_number) == ("7", 1)
    assert str(shard.offset.resume()) == "AT_SEQUENCE_NUMBER:7/1", "the aggregate is read again from after sub 1"
    e._take(1, None)
    assert (shard.offset.sequence_number, shard.offset.sub_sequence_number) == ("7", None), "the whole record is in"
    assert str(shard.offset.resume()) == "AFTER_SEQUENCE_NUMBER:7"


def test_available_now_cuts_a_shard_at_the_first_record_of_the_querys_start_and_drops_the_rest() -> None:
    e, shard = engine(available_now_at_ms=2000)
    put(e, plain(1, arrival_ms=1000), plain(2, arrival_ms=1999), plain(3, arrival_ms=2000), plain(4, arrival_ms=2500))
    put(e, plain(5, arrival_ms=3000))
    assert taken(e._take(None, None)) == [("1", None), ("2", None)]
    assert shard.cut and shard.offset.sequence_number == "2"
    assert not e._queue and e._pool.records == 0, "what lies past the cut is dropped and its budget returned"
    assert e._shard_done(shard)


def test_a_shard_end_comes_into_the_offset_with_its_last_record_never_before() -> None:
    e, shard = engine()
    put(e, plain(1), plain(2))
    e._queue.append(_Marker("end", shard.key))
    e._take(1, None)
    assert not shard.offset.ended, "ended while a record of it is not handed on"
    e._take(1, None)  # its last record, and its end with it: the children start after this offset
    assert shard.offset.ended and shard.offset.rows == 2


def test_the_subscribers_connections_are_sized_for_the_shards_of_every_stream_read() -> None:
    """Each open subscription holds a connection of the subscriber's pool: with several streams the
    pool must grow for all their shards, not for the largest stream's (the others' subscriptions
    would wait for a connection, time out and retry, and their shards be read in turns)."""
    import asyncio

    from efo.errors import EfoError

    class Subscriber:
        def __init__(self) -> None:
            self.rooms: list[int] = []

        async def ensure_room(self, shards: int) -> None:
            self.rooms.append(shards)
            raise EfoError("no further: the subscription is not what this test is about")

    e = Engine(parse({"streams": "orders,clicks", "consumerName": "c"}))
    for name in ("orders", "clicks"):
        stream = _Stream(name, f"arn:aws:kinesis:eu-west-1:123456789012:stream/{name}", 1, "consumer")
        for index in range(3):
            shard = _Shard(stream, f"shardId-00000000000{index}", ShardOffset("TRIM_HORIZON"))
            shard.task = cast(Any, object())  # started, as _start_ready does before the subscription runs
            stream.shards[shard.shard_id] = shard
        e._streams[stream.arn] = stream
    e._subscriber = subscriber = Subscriber()
    last = e._streams["arn:aws:kinesis:eu-west-1:123456789012:stream/clicks"].shards["shardId-000000000002"]
    with pytest.raises(EfoError):
        asyncio.run(e._read(last))
    assert subscriber.rooms == [6]


def test_a_batch_holds_its_rows_in_the_order_a_replay_of_it_reads_them() -> None:
    """A replay reads shard after shard (efo.source.replay.ranges); the batch must be the same rows
    in the same order, not its shards' chunks as they arrived, or a sink that writes rows in order
    (a file, foreachBatch) gets another batch when Spark plans it again after a restart."""
    from efo.source.offsets import SourceOffset
    from efo.source.replay import ranges

    e, first = engine()
    stream = first.stream
    second = _Shard(stream, "shardId-000000000001", ShardOffset("TRIM_HORIZON"))
    stream.shards[second.shard_id] = second
    start = e._offset().to_json()
    for shard_id, seqs in (
        ("shardId-000000000001", (21, 22)),
        ("shardId-000000000000", (1, 2)),
        ("shardId-000000000001", (23,)),
    ):
        chunk = RecordChunk.of_rows("orders", shard_id, 0, [plain(seq) for seq in seqs])
        chunk.grant = e._pool.try_acquire(len(chunk), chunk.data_bytes, f"orders/{shard_id}")
        e._queue.append(chunk)
    batch = [(c.shard_id, s) for c in e._take(None, None) for s in c.sequence_numbers]
    replay = ranges(SourceOffset.from_json(start), SourceOffset.from_json(e._offset().to_json()))
    assert [shard for shard, _ in groupby(shard for shard, _ in batch)] == [r.shard_id for r in replay]
    assert batch == [("shardId-000000000000", "1"), ("shardId-000000000000", "2")] + [
        ("shardId-000000000001", seq) for seq in ("21", "22", "23")
    ]


def test_skip_older_than_moves_only_shards_whose_next_record_is_older_than_the_cutoff() -> None:
    e, _ = engine()
    stream = next(iter(e._streams.values()))
    stream.shards.clear()
    offsets = {
        "behind": ShardOffset("TRIM_HORIZON", sequence_number="40", rows=10, arrival_ms=1_000),
        "recent": ShardOffset("TRIM_HORIZON", sequence_number="50", rows=4, arrival_ms=95_000),
        "ended": ShardOffset("TRIM_HORIZON", sequence_number="60", rows=2, arrival_ms=1_000, ended=True),
        "unread": ShardOffset("TRIM_HORIZON", ("behind",)),
        "from_later": ShardOffset("AT_TIMESTAMP:92000"),
    }
    for shard_id, offset in offsets.items():
        stream.shards[shard_id] = _Shard(stream, shard_id, offset)
    e._skip_old(stream, 90_000)
    moved = {shard_id: shard.offset for shard_id, shard in stream.shards.items() if shard.offset != offsets[shard_id]}
    assert set(moved) == {"behind", "unread"}
    assert moved["behind"] == ShardOffset("AT_TIMESTAMP:90000", rows=10, arrival_ms=1_000), "rows kept, record cleared"
    assert moved["unread"] == ShardOffset("AT_TIMESTAMP:90000", ("behind",))


def test_available_now_fails_naming_the_shards_short_of_their_bound_after_shard_timeout_of_nothing() -> None:
    import asyncio

    from efo.errors import ShardTimeout

    now = [100.0]
    e = Engine(
        parse({"streams": "orders", "consumerName": "c", "shardTimeout": "30s"}),
        available_now_at_ms=2000,
        monotonic=lambda: now[0],
    )
    stream = _Stream("orders", ARN, 1, "consumer")
    stream.shards["shardId-000000000000"] = _Shard(stream, "shardId-000000000000", ShardOffset("TRIM_HORIZON"))
    e._streams[ARN] = stream

    async def wait() -> None:
        e._wake = asyncio.Event()
        now[0] += 29.0
        with pytest.raises(TimeoutError):  # 29 s without anything: still waiting
            await asyncio.wait_for(e._wait_for_records(), 0.05)
        now[0] += 1.0
        await e._wait_for_records()

    with pytest.raises(
        ShardTimeout, match=r"nothing arrived for 30 s \(option shardTimeout\).*orders/shardId-000000000000"
    ):
        asyncio.run(wait())


def test_available_now_counts_shard_timeout_from_when_reading_began_not_from_the_engines_set_up() -> None:
    """The first batch sets the engine up first (a consumer registered and waited for, the streams
    listed): that time is no shard giving nothing, and must not count against shardTimeout."""
    import asyncio

    from efo.source.engine import initial_offset

    now = [100.0]
    e = Engine(
        parse({"streams": "orders", "consumerName": "c", "shardTimeout": "30s"}),
        available_now_at_ms=2000,
        monotonic=lambda: now[0],
    )

    async def slow_setup(start: Any) -> None:
        now[0] += 45.0  # the consumer's registration, waited for until ACTIVE
        stream = _Stream("orders", ARN, 1, "consumer")
        stream.shards["shardId-000000000000"] = _Shard(stream, "shardId-000000000000", ShardOffset("TRIM_HORIZON"))
        e._streams[ARN] = stream

    e._setup = slow_setup  # type: ignore[method-assign]

    async def first_batch() -> None:
        e._wake = asyncio.Event()
        await asyncio.wait_for(e._plan(initial_offset(), None, None), 0.05)

    with pytest.raises(TimeoutError):  # waiting for the shard's records, not failed at once
        asyncio.run(first_batch())


def test_available_now_cuts_at_the_first_record_at_or_after_the_start_even_when_arrival_times_go_back() -> None:
    """ApproximateArrivalTimestamp is approximate: in sequence-number order it may step back. The cut
    is efo run's --until rule, the first record at or after the bound (efo.worker.bound), not a
    bisection that assumes the times sorted and may step past it."""
    e, shard = engine(available_now_at_ms=2000)
    put(e, plain(1, arrival_ms=1000), plain(2, arrival_ms=2500), plain(3, arrival_ms=1900), plain(4, arrival_ms=1950))
    assert taken(e._take(None, None)) == [("1", None)]
    assert shard.cut and shard.offset.sequence_number == "1"


def test_a_streams_shard_sync_stops_when_cancelled_even_as_a_listing_is_asked_for_at_that_moment() -> None:
    """The engine's close cancels every task and waits for them: a sync loop that went on (Python
    3.11's asyncio.wait_for returns the inner result and drops a cancellation that comes with it)
    would keep the engine's thread and its clients alive past the query's stop."""
    import asyncio

    class Kinesis:
        listings = 0

        async def list_shards(self, **args: Any) -> dict[str, Any]:
            Kinesis.listings += 1
            return {"Shards": []}

    e, shard = engine()
    e._kinesis = Kinesis()
    stream = shard.stream
    shard.offset = ShardOffset("TRIM_HORIZON", ended=True)  # nothing for a listing to start

    async def stop_while_asked() -> None:
        task = asyncio.create_task(e._sync_loop(stream))
        await asyncio.sleep(0.01)  # waiting for the next interval
        stream.sync_now.set()  # a shard ended: a listing is asked for ...
        task.cancel()  # ... as the engine closes
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), 1.0)

    asyncio.run(stop_while_asked())
    assert Kinesis.listings == 0


def test_the_first_batch_waits_long_enough_for_each_streams_consumer_registration_in_turn() -> None:
    """The first latestOffset registers the consumer of every stream, one after another, each waited
    for until ACTIVE up to its own deadline: the planning call's deadline must cover them all, or a
    slow registration ends as 'planning took longer than 180 s' instead of the consumer's own error."""
    from efo.kinesis.registration import CONSUMER_ACTIVE_TIMEOUT_S
    from efo.source.engine import initial_offset

    e = Engine(parse({"streams": "orders,clicks,views", "consumerName": "c"}))
    budgets: list[float] = []

    def call(coroutine: Any, timeout_s: float) -> Any:
        coroutine.close()
        budgets.append(timeout_s)

    e._call = call  # type: ignore[method-assign]
    e.plan(initial_offset())
    assert budgets[0] > 3 * CONSUMER_ACTIVE_TIMEOUT_S
