"""One shard's self-retrying SubscribeToShard loop.

It reads events, acquires pool budget for each event's records *before* reading the next event
(a full pool stops reading, and TCP pushes back on the server), hands the records on as one
column chunk, and resubscribes when a subscription ends (the 5-minute limit, a server close, an
error) from the last continuation whose records were all handed on. It never touches leases or
checkpoints: it reports progress to a :class:`ShardProgress` (the claim's checkpoint ledger) and
its phase (subscribing, reading, backpressured) to its owner.

Positions: LATEST, TRIM_HORIZON and AT_TIMESTAMP name a moment, not a record. Once the first event
has arrived, the position is the first record's sequence number (or the continuation after it), so
a later subscription never sends LATEST again and never skips what was written in between.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import structlog

from efo.clock import SYSTEM_CLOCK, Clock
from efo.config import SubscriptionSettings
from efo.errors import EfoError, LeaseLost, Retriable, translate
from efo.kinesis.decoder import ShardEvent, iter_events
from efo.kinesis.kpl import CorruptAggregate, CorruptPolicy, Expanded, expand
from efo.leases.lifecycle import MIN_RENEW_INTERVAL_S, ShardPhase
from efo.observability import METRICS, ShardSeries
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import Grant, PendingPool
from efo.pipeline.records import MAX_SUB_SEQUENCE, Position, RecordChunk, after, shard_key

log = structlog.get_logger("efo.kinesis.subscription")

MIN_CALL_INTERVAL_S = 1.0  # SubscribeToShard: at most 1 call per second per consumer and shard
START_TIMEOUT_CODE = "StartTimeout"  # the error code of a call that did not answer in time


@dataclass(frozen=True, slots=True)
class ShardEnded:
    child_shard_ids: tuple[str, ...]
    #: Each child with its parents, as the shard's last event names them (a merge's child has two):
    #: enough to create the children's leases without listing the stream.
    child_parents: tuple[tuple[str, tuple[str, ...]], ...] = ()


class ShardProgress(Protocol):
    """What the subscription tells its claim's ledger (:class:`efo.leases.ledger.CheckpointLedger`)."""

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
        epoch: int = 0,
        backpressure_timeout_s: float | None = None,
        on_corrupt_aggregate: CorruptPolicy = "passthrough",
        restart_expired: bool = True,
        lease_check: Callable[[], Awaitable[bool]] | None = None,
        on_phase: Callable[[ShardPhase], None] = lambda phase: None,
        on_first_event: Callable[[Position], Awaitable[None]] | None = None,
        on_subscribed: Callable[[datetime], None] = lambda at: None,
        on_call: Callable[[bool], None] = lambda under_way: None,
        previous_call_at: datetime | None = None,
        stopping: asyncio.Event | None = None,
        series: ShardSeries | None = None,
        logger: Any = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._client = client
        self._consumer_arn = consumer_arn
        self.stream = stream
        self.shard_id = shard_id
        self._pool_owner = shard_key(stream, shard_id)
        self.position = start
        self._delivered = start.delivered_through()
        self._pool = pool
        self._handoff = handoff
        self._progress = progress
        self._settings = settings
        self.epoch = epoch
        self._backpressure_timeout_s = backpressure_timeout_s
        self._on_corrupt: CorruptPolicy = on_corrupt_aggregate
        self._restart_expired_allowed = restart_expired  # False: an expired position is the caller's error
        self._lease_check = lease_check
        self._on_phase = on_phase
        self._on_first_event = on_first_event
        self._series = series if series is not None else METRICS.shard(stream, shard_id, clock)
        self._log = logger if logger is not None else log.bind(shard_id=shard_id)
        self._corrupt_logged = False
        self._streaming = False  # the current attempt's call succeeded: errors now come mid-stream
        self._clock = clock
        self._backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s, rng)
        self._on_subscribed = on_subscribed
        self._on_call = on_call  # True as a SubscribeToShard is sent, False once it is answered or given up
        self._last_call_at = -1e9
        self._last_success_at = -1e9
        self._previous_call_at = previous_call_at  # the previous owner's: Kinesis counts its 5 s from it
        self._stopping = stopping  # set: no new call (SubscriptionStopped)
        self._refused_since: float | None = None  # ResourceInUse at the start of a subscription, since
        self._started = False
        self._expired_restart = False  # restarted at TRIM_HORIZON once after an expired position
        self._held: Grant | None = None  # budget kept for the event a backpressure timeout left unread
        self.attempt = 0

    async def run(self) -> ShardEnded:
        """Read the shard until its end; retry every retriable failure, forever."""
        try:
            return await self._run()
        finally:
            if self._held is not None:  # cancelled while holding budget for a re-read
                self._pool.release(self._held)
                self._held = None

    async def _run(self) -> ShardEnded:
        if self._previous_call_at is not None:  # its 5 s by this worker's clocks; a clock ahead waits 5 s at most
            since_s = (self._clock.wall() - self._previous_call_at).total_seconds()
            self._last_success_at = self._clock.now() - min(max(since_s, 0.0), MIN_RENEW_INTERVAL_S)
        while True:
            await self._pace()
            if self._stopping is not None and self._stopping.is_set():
                raise SubscriptionStopped(self.shard_id)
            self.attempt += 1
            self._streaming = False
            self._on_phase(ShardPhase.SUBSCRIBING)
            try:
                ended = await self._subscribe_once()
            except asyncio.CancelledError:
                if self._streaming:
                    METRICS.subscriptions_ended.labels(stream=self.stream, outcome="stopped").inc()
                raise
            except Backpressure as waited:
                METRICS.subscriptions_ended.labels(stream=self.stream, outcome="backpressure").inc()
                METRICS.backpressure_timeouts.inc()
                # Nothing of the waiting event was admitted. Close the stream rather than hold it
                # open for ever, wait in line for the event's budget and keep it, so the same event
                # read again after the resubscribe is admitted at once.
                self._log.warning(
                    "subscription.backpressure",
                    attempt=self.attempt,
                    records=waited.records,
                    waited_s=self._backpressure_timeout_s,
                    position=str(self.position),
                )
                self._on_phase(ShardPhase.BACKPRESSURED)
                self._held = await self._pool.acquire(waited.records, waited.bytes, self._pool_owner)
                continue
            except Exception as exc:
                if self._streaming:
                    METRICS.subscriptions_ended.labels(stream=self.stream, outcome="error").inc()
                error = translate(exc, resource=self._resource())
                if isinstance(error, LeaseLost):
                    raise error from None
                if self._restart_expired(error):
                    continue
                if not error.retriable:
                    raise error from None
                if self._streaming and error.code == "ResourceInUseException":
                    await self._confirm_lease()
                await self._retry_after(error, paced=self._refused_in_use(error))
                continue
            METRICS.subscriptions_ended.labels(
                stream=self.stream, outcome="renewal" if ended is None else "shard_end"
            ).inc()
            if ended is not None:
                return ended
            self._log.info("subscription.renewing", attempt=self.attempt, position=str(self.position))

    def _resource(self) -> str:
        return f"shard {self.shard_id} of stream {self.stream!r} (consumer {self._consumer_arn})"

    def _refused_in_use(self, error: EfoError) -> bool:
        """The call was refused because another subscribed to the shard less than 5 s ago (the
        previous owner, or this one before a clock's skew): Kinesis takes the next call once those
        5 s are over, so calls go on at its pace of one a second, no backoff, for 5 s; then (the
        consumer not active, say) the backoff."""
        if self._streaming or error.code != "ResourceInUseException":
            return False
        now = self._clock.now()
        if self._refused_since is None:
            self._refused_since = now
        return now - self._refused_since <= MIN_RENEW_INTERVAL_S

    async def _retry_after(self, error: EfoError, *, paced: bool = False) -> None:
        """Wait before the next attempt: the backoff, or (``paced``) nothing but :meth:`_pace`."""
        delay_s = 0.0 if paced else self._backoff.next_delay_s()
        METRICS.subscription_errors.labels(stream=self.stream, code=error.code or type(error).__name__).inc()
        self._log.warning(
            "subscription.retry",
            attempt=self.attempt,
            error=str(error),
            code=error.code,
            delay_s=round(delay_s, 3),
        )
        await self._clock.sleep(delay_s)

    def _restart_expired(self, error: EfoError) -> bool:
        """A sequence number older than the stream's retention is refused at the call
        (InvalidArgumentException): start once at TRIM_HORIZON, the oldest record left, and say so.
        Whatever lay between the position and the trim horizon was lost to retention, not here.
        Unless ``restart_expired`` is False (the Spark source with ``failOnDataLoss``): then the error
        is raised, naming the shard."""
        if (
            not self._restart_expired_allowed
            or error.code != "InvalidArgumentException"
            or self._streaming
            or self._expired_restart
            or self.position.sequence_number is None
        ):
            return False
        self._expired_restart = True
        METRICS.positions_expired.labels(stream=self.stream).inc()
        self._log.warning("subscription.position_expired", position=str(self.position), error=str(error))
        self.position = Position("TRIM_HORIZON")  # records at or below the old position stay dropped
        return True

    async def _confirm_lease(self) -> None:
        """ResourceInUse in the middle of a stream: another subscriber took the shard over. Keep
        going only while the lease is still ours (a strongly consistent read). A read that fails
        for a retriable reason is not an answer: retry the subscription and ask again next time."""
        if self._lease_check is None:
            return
        try:
            holds = await self._lease_check()
        except EfoError as exc:
            if not exc.retriable:
                raise
            self._log.warning("subscription.lease_check_failed", error=str(exc), code=exc.code)
            return
        if not holds:
            raise LeaseLost(f"shard {self.shard_id} was taken over by another subscriber and its lease is gone")

    async def _pace(self) -> None:
        now = self._clock.now()
        wait_s = max(
            self._last_call_at + MIN_CALL_INTERVAL_S - now,
            self._last_success_at + MIN_RENEW_INTERVAL_S - now,
            0.0,
        )
        if wait_s > 0:
            await self._clock.sleep(wait_s)
        self._last_call_at = self._clock.now()

    async def _call(self) -> Any:
        """SubscribeToShard, answered within ``read_timeout_s`` or retried: a call that waits for a
        connection from a full pool, or on a stalled endpoint, is an error, never a silent stall."""
        self._on_call(True)
        try:
            async with self._clock.timeout(self._settings.read_timeout_s):
                return await self._client.subscribe_to_shard(
                    ConsumerARN=self._consumer_arn,
                    ShardId=self.shard_id,
                    StartingPosition=self.position.starting_position(),
                )
        except TimeoutError:
            raise Retriable(
                f"SubscribeToShard for {self._resource()} did not answer within "
                f"{self._settings.read_timeout_s:g} s (no free connection, or the endpoint stalled)",
                code=START_TIMEOUT_CODE,
            ) from None
        finally:
            self._on_call(False)

    async def _subscribe_once(self) -> ShardEnded | None:
        response = await self._call()
        self._last_success_at = self._clock.now()
        self._refused_since = None
        self._on_subscribed(self._clock.wall())
        self._streaming = True
        METRICS.subscriptions_started.labels(stream=self.stream).inc()
        stream = response["EventStream"]
        self._log.info("subscription.started", attempt=self.attempt, position=str(self.position))
        try:
            async with aclosing(iter_events(stream)) as events:
                first = True
                async for event in events:
                    self._backoff.reset()
                    if first:
                        first = False
                        self._on_phase(ShardPhase.READING)
                    ended = await self._on_event(event)
                    if ended is not None:
                        return ended
        finally:
            stream.close()
        return None

    async def _on_event(self, event: ShardEvent) -> ShardEnded | None:
        try:
            rows = expand(
                event.sequence_numbers,
                event.partition_keys,
                event.arrival_ms,
                event.data,
                self._delivered,
                policy=self._on_corrupt,
                data_bytes=event.data_bytes,
            )
        except CorruptAggregate as exc:
            raise CorruptAggregate(f"{exc.reason} in shard {self.shard_id} of stream {self.stream!r}") from None
        chunk = RecordChunk(
            self.stream,
            self.shard_id,
            serial=0,
            epoch=self.epoch,
            sequence_numbers=rows.sequence_numbers,
            sub_sequence_numbers=rows.sub_sequence_numbers,
            partition_keys=rows.partition_keys,
            explicit_hash_keys=rows.explicit_hash_keys,
            arrival_ms=rows.arrival_ms,
            data=rows.data,
            errors=rows.errors,
            data_bytes=rows.data_bytes,
            dead_letters=rows.dead_letters,
        )
        if rows.corrupt:
            METRICS.corrupt_aggregates.labels(stream=self.stream).inc(rows.corrupt)
            if not self._corrupt_logged:  # once per shard: a corrupt producer would flood the log
                self._corrupt_logged = True
                self._log.warning(
                    "records.corrupt_aggregate",
                    sequence_number=_first_corrupt(rows, event),
                    policy=self._on_corrupt,
                    records=rows.corrupt,
                )
        if rows.duplicates:
            METRICS.records_duplicate.inc(rows.duplicates)
        self._series.event(event.millis_behind_latest)
        continuation = event.continuation_sequence_number
        if not self._started:
            self._started = True
            first = self._first_position(event, continuation)
            if first is not None:  # None: the shard ended at once, nothing was (or will be) read
                self._progress.started(first)
                if self._on_first_event is not None:
                    await self._on_first_event(first)  # e.g. LATEST pinned in the table before anything moves on
                if not self.position.is_concrete:
                    self.position = first  # never LATEST (or a timestamp) again for this shard
        last = event.sequence_numbers[-1] if event.sequence_numbers else None
        if last is not None and _is_newer(int(last), MAX_SUB_SEQUENCE, self._delivered):
            resume = after(last) if continuation is None or int(continuation) < int(last) else after(continuation)
            records = len(chunk) + len(chunk.dead_letters)
            nbytes = chunk.data_bytes + sum(len(letter.data) for letter in chunk.dead_letters)
            chunk.grant = await self._admit(records, nbytes)
            chunk.serial = self._progress.next_serial()
            self._progress.enqueued(chunk.serial, resume)
            self._handoff.put(chunk)
            self._series.received(len(chunk), chunk.data_bytes)  # once admitted: a re-read is not counted twice
            self._delivered = (int(last), MAX_SUB_SEQUENCE)  # the whole event, dead letters included
            self.position = resume
        elif continuation is not None:
            self.position = after(continuation)
            self._progress.idle(self.position)
        if continuation is None:
            children = tuple(child["ShardId"] for child in event.child_shards)
            self._log.info("subscription.shard_end", children=list(children))
            parents = tuple(
                (child["ShardId"], tuple(child.get("ParentShards") or (self.shard_id,))) for child in event.child_shards
            )
            return ShardEnded(children, parents)
        return None

    def _first_position(self, event: ShardEvent, continuation: str | None) -> Position | None:
        """A concrete position at or before the first record of the first event not yet delivered
        (the raw record: its rows, or its dead letters, come from it); None when the first event
        is already the shard's end, with nothing in it."""
        for sequence_number in event.sequence_numbers:
            if _is_newer(int(sequence_number), MAX_SUB_SEQUENCE, self._delivered):
                return Position("AT_SEQUENCE_NUMBER", sequence_number)
        if continuation is not None:
            return after(continuation)
        return None

    async def _admit(self, records: int, nbytes: int) -> Grant:
        """Pool budget for an event, before the next event is read; ``Backpressure`` after
        ``backpressure_timeout_s`` (the caller closes the stream and resubscribes later)."""
        held, self._held = self._held, None
        if held is not None:
            if records <= held.records and nbytes <= held.bytes:
                self._pool.shrink(held, records, nbytes)
                return held
            self._pool.release(held)
        grant = self._pool.try_acquire(records, nbytes, self._pool_owner)
        if grant is not None:
            METRICS.pool_wait.observe(0.0)
            return grant
        self._on_phase(ShardPhase.BACKPRESSURED)
        waiting_since = self._clock.now()
        try:
            grant = await self._pool.acquire(records, nbytes, self._pool_owner, timeout_s=self._backpressure_timeout_s)
        except TimeoutError:
            raise Backpressure(records, nbytes) from None
        finally:
            METRICS.pool_wait.observe(self._clock.now() - waiting_since)
        self._on_phase(ShardPhase.READING)
        return grant


class SubscriptionStopped(Exception):
    """The worker is stopping: no new SubscribeToShard (a renewal, a retry) is made, since one that
    succeeded would start another 5 s before Kinesis takes the next owner's call."""


class Backpressure(Exception):
    """An event waited longer than the backpressure timeout for pool budget (not an error)."""

    def __init__(self, records: int, nbytes: int) -> None:
        super().__init__(f"waited for pool budget for {records} records")
        self.records = records
        self.bytes = nbytes


def _first_corrupt(rows: Expanded, event: ShardEvent) -> str | None:
    if rows.dead_letters:
        return rows.dead_letters[0].sequence_number
    for sequence_number, error in zip(rows.sequence_numbers, rows.errors, strict=True):
        if error is not None:
            return sequence_number
    return event.sequence_numbers[0] if event.sequence_numbers else None


__all__ = ["Backoff", "Backpressure", "ShardEnded", "ShardProgress", "ShardSubscription"]
