"""A fake Kinesis for fleets: thousands of shards in one process, cheap in CPU.

What a fleet of in-process coordinators needs from Kinesis and nothing more (bench/fleet.py):

- ``list_shards``: every shard, paged like AWS (``MaxResults`` 1,000 by default, then
  ``NextToken``), each call counted in :attr:`FleetKinesis.list_calls` (a call is a page);
- ``subscribe_to_shard``: a stream shaped as botocore parses SubscribeToShard events (what efo's
  decoder takes from a non-HTTP stream), one event a second per shard: **idle**, an event with no
  records whose continuation moves on; **busy** (:attr:`FleetKinesis.busy`), one small record per
  shard and event. The streams' ticks are spread over the second so that thousands of shards do
  not wake at once;
- ``describe_stream_consumer`` (always registered) and ``ensure_room`` (nothing to grow).

No shard ever closes or splits, and a subscription never ends by itself (no 5-minute renewal).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

DEFAULT_PAGE = 1_000  # ListShards' default MaxResults on AWS
EVENT_INTERVAL_S = 1.0
RECORD = b"x" * 100


class FleetStream:
    """One subscription: an event every ``EVENT_INTERVAL_S`` until closed."""

    def __init__(self, kinesis: FleetKinesis, shard_id: str, interval_s: float) -> None:
        self._kinesis = kinesis
        self.shard_id = shard_id
        self._interval_s = interval_s
        # The first event at once, as AWS sends it; then a tick every interval, spread over the fleet.
        self._next = time.monotonic()
        self._phase_s = random.random() * interval_s
        self.closed = False

    def __aiter__(self) -> FleetStream:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self.closed:
            raise StopAsyncIteration
        delay_s = self._next - time.monotonic()
        self._next = max(self._next + self._interval_s + self._phase_s, time.monotonic())
        self._phase_s = 0.0
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        if self.closed:
            raise StopAsyncIteration
        kinesis = self._kinesis
        sequence = kinesis.next_sequence()
        kinesis.events += 1
        records: list[dict[str, Any]] = []
        if kinesis.busy:
            kinesis.records += 1
            records.append(
                {
                    "SequenceNumber": str(sequence),
                    "PartitionKey": "k",
                    "Data": RECORD,
                    "ApproximateArrivalTimestamp": time.time(),
                }
            )
        payload = {"Records": records, "MillisBehindLatest": 0, "ContinuationSequenceNumber": str(sequence)}
        return {"SubscribeToShardEvent": payload}

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._kinesis.open_streams -= 1


class FleetKinesis:
    """``shards`` open shards ``shardId-000000000000``...; see the module's doc."""

    def __init__(self, shards: int, *, page_size: int = DEFAULT_PAGE, interval_s: float = EVENT_INTERVAL_S) -> None:
        self.shard_ids = [f"shardId-{i:012d}" for i in range(shards)]
        self.page_size = page_size
        self.interval_s = interval_s
        self.busy = False
        self.list_calls = 0  # ListShards calls (pages)
        self.listings = 0  # complete listings (first pages)
        self.subscribe_calls = 0
        self.open_streams = 0
        self.events = 0
        self.records = 0
        self._sequence = 10**20  # 21 digits, as AWS's sequence numbers are long
        self._pages: dict[tuple[int, int], tuple[dict[str, Any], ...]] = {}

    def next_sequence(self) -> int:
        self._sequence += 1
        return self._sequence

    # ---- the control plane -----------------------------------------------------------------------

    async def list_shards(self, **kwargs: Any) -> dict[str, Any]:
        self.list_calls += 1
        token = kwargs.get("NextToken")
        start = int(token) if token else 0
        if not token:
            self.listings += 1
        limit = int(kwargs.get("MaxResults") or self.page_size)
        answer: dict[str, Any] = {"Shards": list(self._page(start, limit))}
        if start + limit < len(self.shard_ids):
            answer["NextToken"] = str(start + limit)
        return answer

    def _page(self, start: int, limit: int) -> tuple[dict[str, Any], ...]:
        """The shards of one page, built once (shards never change here): at 4,096 shards and 64
        workers, building them for every call was a fifth of the fleet benchmark's CPU. Every call
        gets the same dicts: a caller must not change them (efo's listing does not)."""
        key = (start, limit)
        if key not in self._pages:
            self._pages[key] = tuple(
                {
                    "ShardId": shard_id,
                    "HashKeyRange": {"StartingHashKey": str(i), "EndingHashKey": str(i)},
                    "SequenceNumberRange": {"StartingSequenceNumber": "0"},
                }
                for i, shard_id in enumerate(self.shard_ids[start : start + limit], start)
            )
        return self._pages[key]

    async def describe_stream_consumer(self, **kwargs: Any) -> dict[str, Any]:
        arn = kwargs.get("ConsumerARN", "arn:consumer")
        return {"ConsumerDescription": {"ConsumerARN": arn, "ConsumerStatus": "ACTIVE"}}

    # ---- the data plane (efo.aws.SubscriberClient's interface) -----------------------------------

    async def ensure_room(self, shards: int) -> None:
        return None

    async def subscribe_to_shard(self, **kwargs: Any) -> dict[str, Any]:
        self.subscribe_calls += 1
        self.open_streams += 1
        return {"EventStream": FleetStream(self, str(kwargs["ShardId"]), self.interval_s)}
