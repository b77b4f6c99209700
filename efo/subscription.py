"""One shard's self-retrying SubscribeToShard loop.

It reads events, acquires pool budget for each event's records *before* reading the next event
(a full pool stops reading, and TCP pushes back on the server), hands the records on as one
column chunk, and resubscribes when a subscription ends (the 5-minute limit, a server close, an
error) from the last continuation whose records were all handed on. It never touches leases or
checkpoints: it reports progress to a :class:`ShardProgress` the coordinator owns.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from efo.config import SubscriptionSettings
from efo.errors import EfoError, LeaseLost, error_code, translate
from efo.handoff import Handoff
from efo.observability import METRICS
from efo.pool import PendingPool
from efo.records import MAX_SUB_SEQUENCE, Position, RecordChunk, after

log = structlog.get_logger("efo.subscription")

MIN_CALL_INTERVAL_S = 1.0  # SubscribeToShard: at most 1 call per second per consumer and shard
MIN_RENEW_INTERVAL_S = 5.0  # a call within 5 s of the last successful one fails with ResourceInUse


@dataclass(frozen=True, slots=True)
class ShardEnded:
    child_shard_ids: tuple[str, ...]


class ShardProgress(Protocol):
    """What the subscription tells its owner; implemented by the coordinator's shard state."""

    def next_serial(self) -> int: ...

    def started(self, first: Position) -> None:
        """The first event arrived; ``first`` is a concrete position at or before its first record."""

    def enqueued(self, serial: int, resume: Position) -> None:
        """A chunk was handed on; once it is committed the shard may resume from ``resume``."""

    def idle(self, resume: Position) -> None:
        """An event without records moved the continuation forward."""


class Backoff:
    """Exponential backoff with jitter: ``initial_s`` doubling up to ``max_s``, each delay drawn
    from its upper half so retries of many shards spread out but never come sooner than half."""

    def __init__(self, initial_s: float, max_s: float, rng: Callable[[], float] = random.random) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self._rng = rng
        self.failures = 0

    def next_delay_s(self) -> float:
        ceiling = min(self.max_s, self.initial_s * 2.0**self.failures)
        self.failures += 1
        return ceiling * (0.5 + 0.5 * self._rng())

    def reset(self) -> None:
        self.failures = 0


def _is_newer(sequence: int, sub: int, than: tuple[int, int] | None) -> bool:
    return than is None or (sequence, sub) > than


class ShardSubscription:
    def __init__(
        self,
        *,
        client: Any,
        consumer_arn: str,
        stream: str,
        shard_id: str,
        start: Position,
        pool: PendingPool,
        handoff: Handoff,
        progress: ShardProgress,
        settings: SubscriptionSettings,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._client = client
        self._consumer_arn = consumer_arn
        self.stream = stream
        self.shard_id = shard_id
        self.position = start
        self._delivered = start.delivered_through()
        self._pool = pool
        self._handoff = handoff
        self._progress = progress
        self._settings = settings
        self._clock = clock
        self._sleep = sleep
        self._backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s, rng)
        self._last_call_at = -1e9
        self._last_success_at = -1e9
        self._started = False
        self.attempt = 0

    async def run(self) -> ShardEnded:
        """Read the shard until its end; retry every retriable failure, forever."""
        while True:
            await self._pace()
            self.attempt += 1
            try:
                ended = await self._subscribe_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = translate(exc, resource=f"shard {self.shard_id} of stream {self.stream!r}")
                if not error.retriable or isinstance(error, LeaseLost):
                    raise error from None
                delay_s = self._backoff.next_delay_s()
                METRICS.subscription_errors.labels(code=error_code(exc) or type(exc).__name__).inc()
                log.warning(
                    "subscription.retry",
                    shard_id=self.shard_id,
                    attempt=self.attempt,
                    error=str(error),
                    code=error_code(exc),
                    delay_s=round(delay_s, 3),
                )
                await self._sleep(delay_s)
                continue
            if ended is not None:
                return ended
            log.info("subscription.renewing", shard_id=self.shard_id, attempt=self.attempt, position=str(self.position))

    async def _pace(self) -> None:
        now = self._clock()
        wait_s = max(
            self._last_call_at + MIN_CALL_INTERVAL_S - now,
            self._last_success_at + MIN_RENEW_INTERVAL_S - now,
            0.0,
        )
        if wait_s > 0:
            await self._sleep(wait_s)
        self._last_call_at = self._clock()

    async def _subscribe_once(self) -> ShardEnded | None:
        response = await self._client.subscribe_to_shard(
            ConsumerARN=self._consumer_arn,
            ShardId=self.shard_id,
            StartingPosition=self.position.starting_position(),
        )
        self._last_success_at = self._clock()
        METRICS.subscriptions_started.inc()
        stream = response["EventStream"]
        log.info("subscription.started", shard_id=self.shard_id, attempt=self.attempt, position=str(self.position))
        try:
            async for event in stream:
                payload = event.get("SubscribeToShardEvent")
                if payload is None:
                    continue
                self._backoff.reset()
                ended = await self._on_event(payload)
                if ended is not None:
                    return ended
        finally:
            stream.close()
        return None

    async def _on_event(self, event: dict[str, Any]) -> ShardEnded | None:
        chunk = RecordChunk(self.stream, self.shard_id, serial=0)
        delivered = self._delivered
        duplicates = 0
        for record in event.get("Records", ()):
            sequence_number = record["SequenceNumber"]
            sequence = int(sequence_number)
            if not _is_newer(sequence, MAX_SUB_SEQUENCE, delivered):
                duplicates += 1
                continue
            data = record["Data"]
            chunk.sequence_numbers.append(sequence_number)
            chunk.sub_sequence_numbers.append(None)
            chunk.partition_keys.append(record["PartitionKey"])
            chunk.explicit_hash_keys.append(None)
            chunk.arrival_ms.append(int(float(record["ApproximateArrivalTimestamp"]) * 1000))
            chunk.data.append(data)
            chunk.errors.append(None)
            chunk.data_bytes += len(data)
        if duplicates:
            METRICS.records_duplicate.inc(duplicates)
        METRICS.records_received.inc(len(chunk))
        continuation = event.get("ContinuationSequenceNumber")
        if not self._started:
            self._started = True
            first = Position("AT_SEQUENCE_NUMBER", chunk.sequence_numbers[0]) if len(chunk) else None
            self._progress.started(first or (after(continuation) if continuation else self.position))
        if len(chunk):
            last = chunk.sequence_numbers[-1]
            if continuation is None or int(continuation) < int(last):
                resume = after(last)
            else:
                resume = after(continuation)
            chunk.grant = await self._pool.acquire(len(chunk), chunk.data_bytes)
            chunk.serial = self._progress.next_serial()
            self._progress.enqueued(chunk.serial, resume)
            self._handoff.put(chunk)
            self._delivered = (int(last), MAX_SUB_SEQUENCE)
            self.position = resume
        elif continuation is not None:
            self.position = after(continuation)
            self._progress.idle(self.position)
        if continuation is None:
            children = tuple(child["ShardId"] for child in event.get("ChildShards") or ())
            log.info("subscription.shard_end", shard_id=self.shard_id, children=list(children))
            return ShardEnded(children)
        return None


__all__ = ["Backoff", "EfoError", "ShardEnded", "ShardProgress", "ShardSubscription"]
