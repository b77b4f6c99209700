"""A fake Kinesis stream for the simulation: shards that hold records, splits and merges, ListShards
with its limit, and SubscribeToShard event streams shaped as botocore parses them.

- **records**: :meth:`SimStream.put` routes a partition key by the MD5 of the key to the open shard
  whose hash range holds it, as Kinesis does; sequence numbers grow across the stream (so within
  each shard), and every record keeps its arrival time (the simulation's wall clock);
- **resharding**: :meth:`SimStream.split` and :meth:`SimStream.merge` close the parent(s) at the
  records they hold and open children that name them (``ParentShardId``, ``AdjacentParentShardId``);
- **ListShards**: every shard (closed ones too), ``MaxResults`` a page (1,000 by default) with
  ``NextToken``; at most :attr:`SimStream.list_limit_per_s` calls a second per stream, then
  LimitExceededException;
- **SubscribeToShard**: from any starting position; an event as soon as records are there (at most
  :data:`MAX_RECORDS_PER_EVENT`), else an empty one every :attr:`SimStream.idle_event_s`, each with its
  ContinuationSequenceNumber and MillisBehindLatest; at the end of a closed shard, once caught up,
  the last event names the children and carries no continuation, and the stream ends; a
  subscription ends after 5 minutes. A second subscription of the same consumer and shard within 5 s
  of the last is refused (ResourceInUseException); after that it takes over, and the older stream
  fails with ResourceInUseException;
- **DescribeStreamConsumer**: the consumer is ACTIVE (unless :attr:`SimStream.consumer_deleted`).

Each worker reaches it through its own :class:`SimKinesisClient`, on its own clock: a paused
worker's events wait for it.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import botocore.exceptions

from efo.sim.clock import SimClock
from efo.sim.dynamodb import client_error

MAX_HASH = 2**128 - 1
MAX_RECORDS_PER_EVENT = 10_000
SUBSCRIPTION_LIFETIME_S = 300.0
TAKEOVER_AFTER_S = 5.0
PUSH_DELAY_S = 0.07  # from a put to the event that carries it (EFO's propagation delay)
#: 56 digits, as Kinesis's are (they make most of a lease row's size: efo.leases.cost.LEASE_ROW_B).
FIRST_SEQUENCE = 49_590_338_271_490_256_608_559_692_538_361_571_095_921_575_989_136_500_000


def hash_key(partition_key: str) -> int:
    return int.from_bytes(hashlib.md5(partition_key.encode()).digest(), "big")


@dataclass
class SimShard:
    shard_id: str
    parents: tuple[str, ...]
    hash_start: int
    hash_end: int
    start_sequence: int  # every record's sequence number is above this
    sequences: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    data: list[bytes] = field(default_factory=list)
    arrival_ms: list[int] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    closed: bool = False
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "ShardId": self.shard_id,
            "HashKeyRange": {"StartingHashKey": str(self.hash_start), "EndingHashKey": str(self.hash_end)},
            "SequenceNumberRange": {"StartingSequenceNumber": str(self.start_sequence)},
        }
        if self.parents:
            answer["ParentShardId"] = self.parents[0]
        if len(self.parents) > 1:
            answer["AdjacentParentShardId"] = self.parents[1]
        if self.closed:
            last = self.sequences[-1] if self.sequences else self.start_sequence
            answer["SequenceNumberRange"]["EndingSequenceNumber"] = str(last)
        return answer

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class SimStream:
    def __init__(self, name: str, shards: int, *, clock: SimClock, region: str = "us-east-1") -> None:
        self.name = name
        self.arn = f"arn:aws:kinesis:{region}:000000000000:stream/{name}"
        self.clock = clock  # the server's
        self.shards: dict[str, SimShard] = {}
        self._sequence = FIRST_SEQUENCE
        self._next_shard = 0
        self.list_limit_per_s = 1000.0
        self.idle_event_s = 5.0
        self.consumer_deleted = False
        self.list_calls = 0
        self.subscribe_calls = 0
        self.events = 0
        self._list_tokens = self.list_limit_per_s
        self._list_at = 0.0
        self._subscriptions: dict[tuple[str, str], SimSubscription] = {}
        #: Called with (shard id, the subscriber's name) for every subscription that starts, and for
        #: the first event each delivers.
        self.on_subscribe: Callable[[str, str], None] = lambda shard_id, subscriber: None
        self.on_first_event: Callable[[str, str], None] = lambda shard_id, subscriber: None
        self._open: list[SimShard] = []  # open shards, by hash_start
        self._open_starts: list[int] = []  # their hash_start, for bisect
        self._description_key: tuple[int, int] | None = None
        self._description: list[dict[str, Any]] = []
        width = (MAX_HASH + 1) // shards
        for index in range(shards):
            start = index * width
            end = MAX_HASH if index == shards - 1 else start + width - 1
            self._add((), start, end)

    # ---- the producer's side -------------------------------------------------------------------------

    def _add(self, parents: tuple[str, ...], start: int, end: int) -> SimShard:
        shard = SimShard(f"shardId-{self._next_shard:012d}", parents, start, end, self._next_sequence())
        self._next_shard += 1
        self.shards[shard.shard_id] = shard
        index = bisect.bisect_left(self._open_starts, start)
        self._open.insert(index, shard)
        self._open_starts.insert(index, start)
        return shard

    def _next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence

    def shard_for(self, partition_key: str) -> SimShard:
        point = hash_key(partition_key)
        return self._open[bisect.bisect_right(self._open_starts, point) - 1]

    def put(self, partition_key: str, data: bytes) -> tuple[str, int]:
        """One record, acknowledged: (its shard, its sequence number)."""
        shard = self.shard_for(partition_key)
        sequence = self._next_sequence()
        shard.sequences.append(sequence)
        shard.keys.append(partition_key)
        shard.data.append(data)
        shard.arrival_ms.append(int(self.clock.wall().timestamp() * 1000))
        shard.wake()
        return shard.shard_id, sequence

    def split(self, shard_id: str) -> tuple[str, str]:
        """Close ``shard_id``; two children take its two halves."""
        parent = self._close(shard_id)
        middle = parent.hash_start + (parent.hash_end - parent.hash_start) // 2
        low = self._add((shard_id,), parent.hash_start, middle)
        high = self._add((shard_id,), middle + 1, parent.hash_end)
        parent.children = [low.shard_id, high.shard_id]
        parent.wake()
        return low.shard_id, high.shard_id

    def merge(self, shard_id: str, adjacent_id: str) -> str:
        """Close two adjacent shards; one child takes both ranges."""
        first, second = sorted((self.shards[shard_id], self.shards[adjacent_id]), key=lambda s: s.hash_start)
        if first.hash_end + 1 != second.hash_start or first.closed or second.closed:
            raise ValueError(f"shards {shard_id} and {adjacent_id} are not open and adjacent")
        self._close(first.shard_id)
        self._close(second.shard_id)
        child = self._add((first.shard_id, second.shard_id), first.hash_start, second.hash_end)
        for parent in (first, second):
            parent.children = [child.shard_id]
            parent.wake()
        return child.shard_id

    def _close(self, shard_id: str) -> SimShard:
        shard = self.shards[shard_id]
        if shard.closed:
            raise ValueError(f"shard {shard_id} is closed already")
        shard.closed = True
        index = self._open.index(shard)
        del self._open[index], self._open_starts[index]
        return shard

    def expire_subscriptions(self, shard_id: str) -> int:
        """Kinesis ends the shard's live subscriptions now, as at their 5 minutes: how many."""
        live = [sub for (_, sid), sub in self._subscriptions.items() if sid == shard_id and not sub.ended]
        for subscription in live:
            subscription.expire()
        return len(live)

    def open_shards(self) -> list[SimShard]:
        return list(self._open)

    def adjacent_pairs(self) -> list[tuple[str, str]]:
        return [(a.shard_id, b.shard_id) for a, b in zip(self._open, self._open[1:], strict=False)]

    # ---- the API -------------------------------------------------------------------------------------

    def list_shards(self, request: dict[str, Any]) -> dict[str, Any]:
        now = self.clock.now()
        self._list_tokens = min(
            self.list_limit_per_s, self._list_tokens + (now - self._list_at) * self.list_limit_per_s
        )
        self._list_at = now
        if self._list_tokens < 1:
            raise client_error("ListShards", "LimitExceededException", "Rate exceeded for stream " + self.name)
        self._list_tokens -= 1
        self.list_calls += 1
        token = request.get("NextToken")
        start = int(token) if token else 0
        limit = int(request.get("MaxResults") or 1000)
        ordered = self._described()
        answer: dict[str, Any] = {"Shards": ordered[start : start + limit]}
        if start + limit < len(ordered):
            answer["NextToken"] = str(start + limit)
        return answer

    def _described(self) -> list[dict[str, Any]]:
        """Every shard as ListShards describes it, built again only when a shard opens or closes
        (a put changes no description): hundreds of workers list often."""
        key = (len(self.shards), len(self._open))
        if self._description_key != key:
            self._description_key = key
            self._description = [shard.describe() for shard in self.shards.values()]
        return self._description

    def describe_consumer(self, request: dict[str, Any]) -> dict[str, Any]:
        arn = request.get("ConsumerARN") or f"{self.arn}/consumer/{request.get('ConsumerName')}:1"
        if self.consumer_deleted:
            raise client_error("DescribeStreamConsumer", "ResourceNotFoundException", f"Consumer {arn} not found")
        return {"ConsumerDescription": {"ConsumerARN": arn, "ConsumerStatus": "ACTIVE", "StreamARN": self.arn}}

    def subscribe(self, request: dict[str, Any], clock: SimClock, subscriber: str = "") -> dict[str, Any]:
        self.subscribe_calls += 1
        shard = self.shards.get(request["ShardId"])
        if shard is None:
            raise client_error("SubscribeToShard", "ResourceNotFoundException", f"Shard {request['ShardId']} not found")
        if self.consumer_deleted:
            raise client_error("SubscribeToShard", "ResourceNotFoundException", "Consumer not found")
        key = (request["ConsumerARN"], shard.shard_id)
        now = self.clock.now()
        current = self._subscriptions.get(key)
        if current is not None:
            if now - current.started_at < TAKEOVER_AFTER_S:  # within 5 s of the last call, ended or not
                raise client_error(
                    "SubscribeToShard", "ResourceInUseException", f"Another active subscription exists for {key[1]}"
                )
            if not current.ended:
                current.taken_over()
        self.on_subscribe(shard.shard_id, subscriber)
        subscription = SimSubscription(self, shard, request["StartingPosition"], clock, subscriber)
        self._subscriptions[key] = subscription
        return {"EventStream": subscription}


class SimSubscription:
    """One SubscribeToShard event stream (an async iterator of botocore-parsed events)."""

    def __init__(
        self, stream: SimStream, shard: SimShard, start: dict[str, Any], clock: SimClock, subscriber: str = ""
    ) -> None:
        self._stream = stream
        self._subscriber = subscriber
        self._shard = shard
        self._clock = clock
        self.started_at = stream.clock.now()
        self.ended = False
        self._error: BaseException | None = None
        self._expired = False
        self._next = self._index_of(start)
        self._last_event_at: float | None = None

    def _index_of(self, start: dict[str, Any]) -> int:
        shard = self._shard
        kind = start["Type"]
        if kind == "TRIM_HORIZON":
            return 0
        if kind == "LATEST":
            return len(shard.sequences)
        if kind in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"):
            number = int(start["SequenceNumber"])
            find = bisect.bisect_left if kind == "AT_SEQUENCE_NUMBER" else bisect.bisect_right
            return find(shard.sequences, number)
        if kind == "AT_TIMESTAMP":
            stamp = start["Timestamp"]
            moment_ms = int((stamp.timestamp() if hasattr(stamp, "timestamp") else float(stamp)) * 1000)
            return bisect.bisect_left(shard.arrival_ms, moment_ms)
        raise client_error("SubscribeToShard", "InvalidArgumentException", f"starting position {kind}")

    def taken_over(self) -> None:
        self._error = botocore.exceptions.EventStreamError(
            {"Error": {"Code": "ResourceInUseException", "Message": "Another subscription took over"}},
            "SubscribeToShard",
        )
        self._shard.wake()

    def expire(self) -> None:
        """Kinesis ends it now, as it does at SUBSCRIPTION_LIFETIME_S (for a test to pick the moment)."""
        self._expired = True
        self._shard.wake()

    def __aiter__(self) -> SimSubscription:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self.ended:
            raise StopAsyncIteration
        shard = self._shard
        stream = self._stream
        while True:
            if self._error is not None:
                self.ended = True
                raise self._error
            now = stream.clock.now()
            if now - self.started_at >= SUBSCRIPTION_LIFETIME_S or self._expired:
                self.ended = True
                raise StopAsyncIteration
            pending = len(shard.sequences) - self._next
            if pending > 0 or shard.closed or self._last_event_at is None:
                break
            due = self._last_event_at + stream.idle_event_s
            if now >= due:
                break
            await self._wait(due - now)
        if pending > 0:
            await self._clock.sleep(PUSH_DELAY_S)  # what arrives meanwhile rides along
        return self._event()

    async def _wait(self, seconds: float) -> None:
        """Until the shard changes (a put, a close, a takeover) or ``seconds`` pass, on the worker's clock."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        self._shard.waiters.append(woken)

        def expire() -> None:  # one turn of the loop after the timer, as an expiring asyncio.timeout wakes its task
            loop.call_soon(_resolve, woken)

        # A timer that resolves the future, not ``async with clock.timeout()`` (a context manager, a
        # Timeout and a cancellation for every idle wait of every subscription): the same wait, the
        # same turns of the loop, a third of the cost.
        timer = self._clock.call_later(seconds, expire)
        try:
            await woken
        finally:
            timer.cancel()
            if woken in self._shard.waiters:
                self._shard.waiters.remove(woken)

    def _event(self) -> dict[str, Any]:
        shard, stream = self._shard, self._stream
        stream.events += 1
        if self._last_event_at is None:
            stream.on_first_event(shard.shard_id, self._subscriber)
        self._last_event_at = stream.clock.now()
        first, last = self._next, min(len(shard.sequences), self._next + MAX_RECORDS_PER_EVENT)
        records = [
            {
                "SequenceNumber": str(shard.sequences[i]),
                "PartitionKey": shard.keys[i],
                "Data": shard.data[i],
                "ApproximateArrivalTimestamp": shard.arrival_ms[i] / 1000,
            }
            for i in range(first, last)
        ]
        self._next = last
        behind_ms = 0
        if last < len(shard.sequences):
            behind_ms = max(0, int(stream.clock.wall().timestamp() * 1000) - shard.arrival_ms[last])
        payload: dict[str, Any] = {"Records": records, "MillisBehindLatest": behind_ms}
        if shard.closed and last == len(shard.sequences):
            payload["ChildShards"] = [
                {
                    "ShardId": child,
                    "ParentShards": list(stream.shards[child].parents),
                    "HashKeyRange": stream.shards[child].describe()["HashKeyRange"],
                }
                for child in shard.children
            ]
            self.ended = True  # the next read ends the stream
        else:
            continuation = shard.sequences[last - 1] if last else shard.start_sequence
            payload["ContinuationSequenceNumber"] = str(continuation)
        return {"SubscribeToShardEvent": payload}

    def close(self) -> None:
        self.ended = True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SimKinesisClient:
    """One worker's Kinesis client (the control plane) and subscriber (SubscribeToShard), on its clock,
    with a small latency for each call."""

    def __init__(self, stream: SimStream, clock: SimClock, latency_s: Callable[[], float], name: str = "") -> None:
        self._stream = stream
        self._clock = clock
        self._latency_s = latency_s
        self.name = name

    async def _answer(self, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        half = self._latency_s() / 2
        await self._clock.sleep(half)
        try:
            return call()
        finally:
            await self._clock.sleep(half)

    async def list_shards(self, **request: Any) -> dict[str, Any]:
        return await self._answer(lambda: self._stream.list_shards(request))

    async def describe_stream_consumer(self, **request: Any) -> dict[str, Any]:
        return await self._answer(lambda: self._stream.describe_consumer(request))

    async def ensure_room(self, shards: int) -> None:
        return None

    async def subscribe_to_shard(self, **request: Any) -> dict[str, Any]:
        return await self._answer(lambda: self._stream.subscribe(request, self._clock, self.name))
