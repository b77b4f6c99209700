"""The source's engine: one query's subscriptions, kept across micro-batches in Spark's reader process.

Spark runs one Python process per streaming query on the driver for the source's planning calls
(``latestOffset``, ``partitions``, ``commit``); the engine lives there, started at the first
``latestOffset`` (never when the reader is made: Spark pickles readers to other processes). Its
event loop runs in a thread of its own; the planning calls reach it through :meth:`Engine.plan`.

Reading is efo's own: a :class:`~efo.kinesis.subscription.ShardSubscription` per shard (KPL
de-aggregation, resubscribes, backoff), the global :class:`~efo.pipeline.pool.PendingPool` (a
subscription waits for budget before it reads its next event, so a full pool stops reading and TCP
pushes back on Kinesis), consumer registration and the shard graph. What the subscriptions hand on
waits in one queue, in arrival order, until a ``latestOffset`` takes it (up to Spark's read limit);
the records taken leave the pool, become the micro-batch and move the offsets on.

Lineage: a shard starts once every parent's end (SHARD_END) is in an offset handed to Spark, so its
records are in a later micro-batch than all of its parents'. A shard found after the query began
starts at TRIM_HORIZON whatever the starting position.

``Trigger.AvailableNow`` (:meth:`Engine.plan` with ``available_now_at_ms``): each shard is read up to
the moment the query started, the rule of ``efo run --until caught-up`` and ``--until TIME`` at once:
a record that arrived at or after that moment is not handed on, nor anything after it in its shard
(the shard is cut), and a shard is done once an event at 0 ms behind was handed on and a listing
asked for afterwards shows it open; a closed shard is read to its end and its children after it by
the same rule. When every shard is done, ``latestOffset`` returns its start and the query stops.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import structlog

from efo.aws import Clients, Endpoints
from efo.config import InitialPosition, SubscriptionSettings
from efo.errors import EfoError, ResourceNotFound, ShardTimeout, StreamRecreated, translate
from efo.health import Health, HealthServer
from efo.kinesis.graph import ShardGraph
from efo.kinesis.registration import describe_stream, ensure_consumer
from efo.kinesis.shards import list_shards
from efo.kinesis.subscription import ShardSubscription
from efo.observability import METRICS, ShardSeries
from efo.pipeline.handoff import Handoff
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import Position, RecordChunk, shard_key
from efo.source.offsets import ShardOffset, SourceOffset, StreamOffset, canonical, origin_of
from efo.source.options import SourceOptions
from efo.worker.shardsync import first_start_position  # LATEST and AT_TIMESTAMP as efo run's first start

log = structlog.get_logger("efo.source")

T = TypeVar("T")

#: How long a planning call may wait on the engine beyond its own deadlines, per stream (registration
#: of a consumer takes up to two minutes; a shard's wait is bounded by ``shardTimeout``).
SETUP_TIMEOUT_S = 180.0
#: Part of the pool kept for each shard (efo's defaults).
RESERVED_RECORDS_PER_SHARD = 1_000
RESERVED_BYTES_PER_SHARD = 1024 * 1024
BACKPRESSURE_TIMEOUT_S = 30.0


class DataLost(EfoError):
    """Records the query should read are gone from Kinesis (``failOnDataLoss``)."""


def initial_offset() -> dict[str, Any]:
    """The offset of a query that has read nothing: no stream yet. Constant (Spark asks for it again
    at every start, and uses it as the start of a first batch it plans again)."""
    return SourceOffset().to_json()


def positions_of(offset: dict[str, Any]) -> str:
    """An offset's positions as text: equal for offsets that differ only in what they report."""
    streams = {
        arn: {key: value for key, value in stream.items() if key != "behindMs"}
        for arn, stream in offset.get("streams", {}).items()
    }
    return canonical({**offset, "streams": streams})


@dataclass
class Planned:
    """What one ``latestOffset`` takes: the chunks of the micro-batch (in order) and its end offset.
    ``end`` is the start itself when nothing moved (Spark then plans no batch)."""

    chunks: list[RecordChunk]
    end: dict[str, Any]
    advanced: bool

    @property
    def rows(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)


@dataclass(frozen=True, slots=True)
class _Marker:
    """A queue entry that is no record: the shard reached its end, or an event at 0 ms behind."""

    kind: str  # "end" or "caught_up"
    key: tuple[str, str]  # (stream ARN, shard id)


@dataclass
class _Shard:
    stream: _Stream
    shard_id: str
    offset: ShardOffset  # what the next offset says of it
    series: ShardSeries | None = None  # efo's metrics; its lag_ms: MillisBehindLatest of the last event
    task: asyncio.Task[None] | None = None
    serial: int = 0
    cut: bool = False  # AvailableNow: a record at or after the query's start was seen
    caught_up_at: float | None = None  # AvailableNow: an event at 0 ms behind was handed on then
    caught_up_queued: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.stream.arn, self.shard_id)

    @property
    def lag_ms(self) -> int | None:
        return self.series.lag_ms if self.series is not None else None


@dataclass
class _Stream:
    name: str
    arn: str
    created_ms: int
    consumer_arn: str
    shards: dict[str, _Shard] = field(default_factory=dict)
    graph: ShardGraph | None = None
    listed_at: float = 0.0  # monotonic time the last listing was asked for
    sync_now: asyncio.Event = field(default_factory=asyncio.Event)


class _Intake:
    """One shard's subscription hands its chunks here (it is the subscription's ``handoff`` and
    ``progress``): into the engine's queue, and with AvailableNow, after an event at 0 ms behind,
    a marker that says so."""

    def __init__(self, engine: Engine, shard: _Shard) -> None:
        self._engine = engine
        self._shard = shard

    def put(self, chunk: RecordChunk) -> None:
        self._engine._enqueue(chunk)
        self._after_event()

    def next_serial(self) -> int:
        self._shard.serial += 1
        return self._shard.serial

    def started(self, first: Position) -> None:
        pass

    def enqueued(self, serial: int, resume: Position) -> None:
        pass  # positions are the records' own: the chunk follows at once

    def idle(self, resume: Position) -> None:
        self._after_event()

    def _after_event(self) -> None:
        shard = self._shard
        if self._engine.available_now_at_ms is not None and shard.lag_ms == 0 and not shard.caught_up_queued:
            shard.caught_up_queued = True  # once: an idle shard's events (one a second) would each add one
            self._engine._enqueue(_Marker("caught_up", shard.key))


class Engine:
    """One query's reading. Thread-safe at its public methods; everything else runs on its loop."""

    def __init__(
        self,
        options: SourceOptions,
        *,
        available_now_at_ms: int | None = None,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options
        self.available_now_at_ms = available_now_at_ms
        self._wall_ms = wall_ms
        self._monotonic = monotonic
        self._streams: dict[str, _Stream] = {}  # by ARN, in the options' order
        self._queue: deque[RecordChunk | _Marker] = deque()
        self._pool = PendingPool(
            options.max_pending_records,
            options.max_pending_bytes,
            reserved_records=RESERVED_RECORDS_PER_SHARD,
            reserved_bytes=RESERVED_BYTES_PER_SHARD,
        )
        self._subscription_settings = SubscriptionSettings.model_validate({})  # efo's defaults
        self._setup_done = False
        self._last_end: str | None = None  # positions_of() the last end handed to Spark
        self._activity_at = monotonic()
        self.error: EfoError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._closing: asyncio.Event | None = None
        self._group: asyncio.TaskGroup | None = None
        self._clients: Clients | None = None
        self._kinesis: Any = None
        self._subscriber: Any = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._thread_main, name="efo-source", daemon=True)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._http: HealthServer | None = None  # /metrics with metricsPort, for as long as the engine runs

    # ---- the planning thread's side -----------------------------------------------------------

    def start(self) -> Engine:
        self._thread.start()
        if not self._ready.wait(SETUP_TIMEOUT_S):
            raise EfoError("efo source: its event loop did not start")
        self._raise_error()
        return self

    def plan(self, start: dict[str, Any], max_rows: int | None = None, max_bytes: int | None = None) -> Planned:
        """The next micro-batch from ``start`` (the last end offset, or the checkpoint's after a
        restart): what has been read, up to ``max_rows`` rows and ``max_bytes`` bytes of data.
        With AvailableNow it waits for records (or the end); otherwise it takes what is there."""
        # The first call sets every stream up in turn (its consumer registered and waited for, up to two
        # minutes each): its deadline covers them all, so that their own errors are the ones raised.
        setup_s = SETUP_TIMEOUT_S * max(1, len(self.options.streams))
        wait_s = setup_s + (self.options.shard_timeout_s if self.available_now_at_ms is not None else 0)
        return self._call(self._plan(start, max_rows, max_bytes), wait_s)

    def close(self) -> None:
        """Stop every subscription (nothing to write: Spark's checkpoint holds the positions)."""
        loop = self._loop
        if loop is not None and not loop.is_closed() and self._closing is not None:
            try:
                loop.call_soon_threadsafe(self._closing.set)
            except RuntimeError:
                pass
        if self._thread.is_alive():
            self._thread.join(10.0)

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        if self.error is not None or self._loop is None:
            coroutine.close()
            self._raise_error()
            raise EfoError("efo source: the engine was not started")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise EfoError(f"efo source: planning a micro-batch took longer than {timeout_s:.0f} s") from None

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    # ---- the loop ------------------------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # the loop's own failure (the tasks' is kept in _main)
            if self.error is None:
                self.error = translate(exc, resource="the efo source")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        o = self.options
        try:
            async with Clients(Endpoints(o.region, o.endpoint, None)) as clients:
                self._clients = clients
                self._kinesis = await clients.kinesis()
                self._subscriber = clients.subscriber(self._subscription_settings.read_timeout_s)
                async with asyncio.TaskGroup() as group:
                    self._group = group
                    self._ready.set()
                    await self._closing.wait()
                    for task in list(self._tasks):
                        task.cancel()
        except BaseException as exc:
            error = _first_error(exc)
            if self.error is None:
                self.error = error
            log.error("source.failed", error=str(error), code=error.code)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._group = None
            if self._http is not None:
                self._http.close()
            if self._wake is not None:
                self._wake.set()

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        assert self._group is not None, "the engine is not running"
        task = self._group.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _enqueue(self, item: RecordChunk | _Marker) -> None:
        self._queue.append(item)
        self._activity_at = self._monotonic()
        if self._wake is not None:
            self._wake.set()

    # ---- planning --------------------------------------------------------------------------------

    async def _plan(self, start_json: dict[str, Any], max_rows: int | None, max_bytes: int | None) -> Planned:
        self._raise_error()
        if not self._setup_done:
            await self._setup(SourceOffset.from_json(start_json))
            self._setup_done = True
            self._activity_at = self._monotonic()  # shardTimeout counts from here: set-up is no shard's silence
        elif positions_of(start_json) != self._last_end:
            raise EfoError(
                "efo source: Spark asked for the batch after an offset this reader did not hand out; "
                "restart the query (it resumes from its checkpoint)"
            )
        while True:
            if self.available_now_at_ms is not None:
                await self._wait_for_records()
            chunks = self._take(max_rows, max_bytes)
            end = self._offset().to_json()
            self._start_ready()
            moved = bool(chunks) or positions_of(end) != positions_of(start_json)
            # AvailableNow ends the query when the start comes back: only once every shard is done.
            if moved or self.available_now_at_ms is None or self._all_done():
                break
        if not moved:
            self._last_end = positions_of(start_json)
            return Planned([], start_json, advanced=False)
        self._last_end = positions_of(end)
        return Planned(chunks, end, advanced=True)

    def _offset(self) -> SourceOffset:
        streams = {}
        for stream in self._streams.values():
            lags = [
                shard.lag_ms for shard in stream.shards.values() if shard.task is not None and shard.lag_ms is not None
            ]
            streams[stream.arn] = StreamOffset(
                name=stream.name,
                created_ms=stream.created_ms,
                shards={shard_id: shard.offset for shard_id, shard in stream.shards.items()},
                behind_ms=max(lags) if lags else None,
            )
        return SourceOffset(streams)

    def _take(self, max_rows: int | None, max_bytes: int | None) -> list[RecordChunk]:
        """Chunks off the queue, in order, up to the limits (a chunk is split at the row limit, and
        at the byte limit unless it would be the batch's first row); each moves its shard's offset.
        Returned shard by shard, the order a replay of the batch gives."""
        taken: list[RecordChunk] = []
        rows = nbytes = 0
        until_ms = self.available_now_at_ms
        while self._queue:
            item = self._queue[0]
            if isinstance(item, _Marker):
                self._queue.popleft()
                self._on_marker(item)
                continue
            shard = self._shard_of(item)
            if shard is None or shard.cut:
                self._queue.popleft()
                self._pool.release(item.grant)
                continue
            chunk = item
            cut = False
            if until_ms is not None:
                at = _first_at_or_after(chunk.arrival_ms, until_ms)
                if at < len(chunk):
                    chunk, cut = chunk.rows(0, at), True
            room = len(chunk)
            if max_rows is not None:
                room = min(room, max_rows - rows)
            if max_bytes is not None:
                room = min(room, _rows_within(chunk, max_bytes - nbytes, at_least_one=not taken))
            if room <= 0 and not cut:
                break
            part = chunk if room == len(chunk) else chunk.rows(0, room)
            whole = part is chunk
            if len(part):
                rest_starts_same_record = not whole and chunk.sequence_numbers[room] == part.sequence_numbers[-1]
                shard.offset = _moved(shard.offset, part, partial_record=rest_starts_same_record)
                taken.append(part)
                rows += len(part)
                nbytes += part.data_bytes
            if cut and whole:
                self._queue.popleft()
                self._pool.release(item.grant)
                self._cut(shard)
                continue
            if whole:
                self._queue.popleft()
                self._pool.release(item.grant)
            else:
                self._queue[0] = item.rows(room)  # the rest of the chunk, with its budget, waits
                break
        # Shard after shard (by stream ARN, then shard id), each in its own order: the rows a replay of
        # the batch reads again, in the same order (efo.source.replay.ranges). A sort that keeps order.
        taken.sort(key=lambda part: (self._arn_of(part), part.shard_id))
        return taken

    def _arn_of(self, chunk: RecordChunk) -> str:
        shard = self._shard_of(chunk)
        assert shard is not None, "a chunk taken is of a shard read"
        return shard.stream.arn

    def _shard_of(self, chunk: RecordChunk) -> _Shard | None:
        for stream in self._streams.values():
            if stream.name == chunk.stream:
                return stream.shards.get(chunk.shard_id)
        return None

    def _on_marker(self, marker: _Marker) -> None:
        stream = self._streams.get(marker.key[0])
        shard = stream.shards.get(marker.key[1]) if stream is not None else None
        if shard is None or shard.cut:
            return
        if marker.kind == "end":
            shard.offset = replace(shard.offset, ended=True)
            shard.task = None
            log.info("source.shard_end", stream=shard.stream.name, shard_id=shard.shard_id, rows=shard.offset.rows)
        elif marker.kind == "caught_up" and shard.caught_up_at is None:
            shard.caught_up_at = self._monotonic()
            shard.stream.sync_now.set()  # is it open? a listing asked for from now on says

    def _cut(self, shard: _Shard) -> None:
        shard.cut = True
        log.info("source.shard_at_bound", stream=shard.stream.name, shard_id=shard.shard_id, rows=shard.offset.rows)
        if shard.task is not None:
            shard.task.cancel()
            shard.task = None

    # ---- AvailableNow ------------------------------------------------------------------------------

    async def _wait_for_records(self) -> None:
        """Until the queue holds something, or every shard is done; at most ``shardTimeout`` without
        anything arriving (then the shards short of their end are named)."""
        assert self._wake is not None
        while True:
            self._raise_error()
            if self._queue or self._all_done():
                return
            waiting_s = self._monotonic() - self._activity_at
            if waiting_s >= self.options.shard_timeout_s:
                names = ", ".join(f"{s.stream.name}/{s.shard_id}" for s in self._not_done()) or "none"
                raise ShardTimeout(
                    f"efo source: Trigger.AvailableNow: nothing arrived for {waiting_s:.0f} s (option shardTimeout) "
                    f"from the shards short of the query's start: {names}"
                )
            for stream in self._streams.values():
                if any(self._awaits_listing(shard) for shard in stream.shards.values()):
                    stream.sync_now.set()
            self._wake.clear()
            try:
                async with asyncio.timeout(1.0):  # not wait_for: on 3.11 it can drop a cancellation
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _awaits_listing(self, shard: _Shard) -> bool:
        return shard.caught_up_at is not None and shard.stream.listed_at < shard.caught_up_at

    def _shard_done(self, shard: _Shard) -> bool:
        if shard.offset.ended or shard.cut:
            return True
        stream = shard.stream
        if any(p in stream.shards and stream.shards[p].cut for p in shard.offset.parents):
            return True  # a cut parent's children hold only later records: never read
        graph = stream.graph
        return (
            shard.caught_up_at is not None
            and stream.listed_at >= shard.caught_up_at
            and graph is not None
            and shard.shard_id in graph.shards
            and not graph.is_closed(shard.shard_id)
        )

    def _not_done(self) -> list[_Shard]:
        return [
            shard
            for stream in self._streams.values()
            for shard in stream.shards.values()
            if not self._shard_done(shard)
        ]

    def _all_done(self) -> bool:
        return not self._not_done()

    # ---- set-up and lineage ------------------------------------------------------------------------

    async def _setup(self, start: SourceOffset) -> None:
        o = self.options
        now_ms = self._wall_ms()
        if o.metrics_port:
            self._http = HealthServer(Health(), port=o.metrics_port).start()
        for ref in o.streams:
            stream = await self._open_stream(ref)
            prior = start.streams.get(stream.arn)
            if prior is not None and prior.created_ms != stream.created_ms:
                if o.fail_on_data_loss:
                    raise StreamRecreated(
                        f"efo source: stream {stream.name!r} was deleted and created again since the checkpoint "
                        f"was written (created {_iso(prior.created_ms)} then, {_iso(stream.created_ms)} now): its "
                        "offsets name the old stream's records. Start the query with a new checkpointLocation, or "
                        "set failOnDataLoss=false to read the new stream from its start"
                    )
                log.warning("source.stream_recreated", stream=stream.name, action="reading it from TRIM_HORIZON")
                prior = StreamOffset(stream.name, stream.created_ms)  # every shard new: TRIM_HORIZON
            if prior is None:
                self._first_start(stream, o.starting_position, now_ms)
            else:
                self._resume(stream, prior)
            if o.skip_older_than_s is not None:
                self._skip_old(stream, now_ms - int(o.skip_older_than_s * 1000))
            self._streams[stream.arn] = stream
            log.info(
                "source.stream_ready",
                stream=stream.name,
                consumer_arn=stream.consumer_arn,
                shards=len(stream.shards),
                resumed=prior is not None,
            )
        for arn, gone in start.streams.items():
            if arn not in self._streams:
                log.info("source.stream_dropped", stream=gone.name, reason="not in the option streams any more")
        for stream in self._streams.values():
            self._spawn(self._sync_loop(stream), f"sync:{stream.name}")
        self._start_ready()

    async def _open_stream(self, ref: str) -> _Stream:
        assert self._kinesis is not None
        try:
            info = await describe_stream(self._kinesis, ref)
        except ResourceNotFound:
            raise ResourceNotFound(
                f"efo source: stream {ref!r} not found in region {self.options.region or '(the SDK default)'}: "
                "check the options streams and region (and endpoint), or create the stream"
            ) from None
        o = self.options
        consumer_arn = await ensure_consumer(
            self._kinesis, stream_arn=info.arn, name=o.consumer_name, arn=o.consumer_arn
        )
        graph = await list_shards(self._kinesis, info.arn)
        return _Stream(
            name=info.name,
            arn=info.arn,
            created_ms=int(info.created_at.timestamp() * 1000),
            consumer_arn=consumer_arn,
            graph=graph,
            listed_at=self._monotonic(),
        )

    def _first_start(self, stream: _Stream, initial: InitialPosition, now_ms: int) -> None:
        """Every shard of the listing at the starting position; LATEST is this moment, and a shard
        already closed holds nothing after it (it is ended at once)."""
        graph = stream.graph
        assert graph is not None
        moment = datetime.fromtimestamp(now_ms / 1000, UTC)
        for shard_id, shard in graph.shards.items():
            position = first_start_position(initial, graph, shard_id, moment)
            if position.kind == "SHARD_END":
                offset = ShardOffset(origin_of(Position("AT_TIMESTAMP", timestamp=moment)), shard.parents, ended=True)
            else:
                offset = ShardOffset(origin_of(position), shard.parents)
            stream.shards[shard_id] = _Shard(stream, shard_id, offset)

    def _resume(self, stream: _Stream, prior: StreamOffset) -> None:
        """The checkpoint's shards; those born since it was written start at TRIM_HORIZON. A shard it
        names that the stream no longer has is fine once read to its end (past retention), lost
        otherwise."""
        graph = stream.graph
        assert graph is not None
        for shard_id, offset in prior.shards.items():
            if shard_id not in graph.shards:
                if not offset.ended:
                    self._lost_shard(stream, shard_id, offset)
                continue
            stream.shards[shard_id] = _Shard(stream, shard_id, offset)
        self._add_new(stream, graph)

    def _lost_shard(self, stream: _Stream, shard_id: str, offset: ShardOffset) -> None:
        where = f"after sequence number {offset.sequence_number}" if offset.sequence_number else f"from {offset.origin}"
        if self.options.fail_on_data_loss:
            raise DataLost(
                f"efo source: shard {shard_id} of stream {stream.name!r} is in the checkpoint, not read to its end "
                f"(next: {where}), and the stream no longer has it (past the stream's retention, or the stream was "
                "recreated): its remaining records are lost. Set failOnDataLoss=false to read on without them, or "
                "start the query with a new checkpointLocation"
            )
        METRICS.shards_expired.labels(stream=stream.name).inc()
        log.warning("source.shard_lost", stream=stream.name, shard_id=shard_id, position=where)

    def _add_new(self, stream: _Stream, graph: ShardGraph) -> None:
        for shard_id, shard in graph.shards.items():
            if shard_id not in stream.shards:
                stream.shards[shard_id] = _Shard(stream, shard_id, ShardOffset("TRIM_HORIZON", shard.parents))
                log.info("source.shard_discovered", stream=stream.name, shard_id=shard_id, parents=list(shard.parents))

    def _skip_old(self, stream: _Stream, cutoff_ms: int) -> None:
        for shard in stream.shards.values():
            offset = shard.offset
            if offset.ended or (offset.arrival_ms is not None and offset.arrival_ms >= cutoff_ms):
                continue
            kind, _, ms = offset.origin.partition(":")
            if offset.sequence_number is None and kind == "AT_TIMESTAMP" and int(ms) >= cutoff_ms:
                continue
            shard.offset = replace(
                offset, origin=f"AT_TIMESTAMP:{cutoff_ms}", sequence_number=None, sub_sequence_number=None
            )
            METRICS.positions_skipped.labels(stream=stream.name).inc()
            log.info("shard.skipped_old", stream=stream.name, shard_id=shard.shard_id, position=shard.offset.origin)

    def _start_ready(self) -> None:
        """Start every shard not read yet whose parents' ends are in the offsets (or gone from the stream)."""
        for stream in self._streams.values():
            for shard in stream.shards.values():
                if shard.task is not None or shard.offset.ended or shard.cut or shard.series is not None:
                    continue
                parents = [stream.shards.get(p) for p in shard.offset.parents]
                if all(parent is None or parent.offset.ended for parent in parents):
                    shard.task = self._spawn(self._read(shard), f"shard:{stream.name}/{shard.shard_id}")

    async def _read(self, shard: _Shard) -> None:
        stream = shard.stream
        shard.series = METRICS.shard(stream.name, shard.shard_id)
        owner = shard_key(stream.name, shard.shard_id)
        self._pool.register(owner)
        # One connection per open subscription, of every stream's shards: the pool is the engine's.
        reading = sum(1 for each in self._streams.values() for s in each.shards.values() if s.task is not None)
        intake = _Intake(self, shard)
        try:
            await self._subscriber.ensure_room(reading)
            subscription = ShardSubscription(
                client=self._subscriber,
                consumer_arn=stream.consumer_arn,
                stream=stream.name,
                shard_id=shard.shard_id,
                start=shard.offset.resume(),
                pool=self._pool,
                handoff=cast(Handoff, intake),
                progress=intake,
                settings=self._subscription_settings,
                backpressure_timeout_s=BACKPRESSURE_TIMEOUT_S,
                on_corrupt_aggregate=self.options.on_corrupt_aggregate,
                restart_expired=not self.options.fail_on_data_loss,
                series=shard.series,
                logger=log.bind(stream=stream.name, shard_id=shard.shard_id),
            )
            ended = await subscription.run()
        except EfoError as exc:
            raise self._shard_failed(shard, exc) from None
        finally:
            self._pool.unregister(owner)
        self._enqueue(_Marker("end", shard.key))
        log.info(
            "source.shard_read_to_end",
            stream=stream.name,
            shard_id=shard.shard_id,
            children=list(ended.child_shard_ids),
        )
        stream.sync_now.set()  # learn the children (and a merge's other parent)

    def _shard_failed(self, shard: _Shard, error: EfoError) -> EfoError:
        stream = shard.stream
        if error.code == "InvalidArgumentException" and shard.offset.sequence_number is not None:
            return DataLost(
                f"efo source: shard {shard.shard_id} of stream {stream.name!r}: Kinesis refused to read on after "
                f"sequence number {shard.offset.sequence_number} ({error}): the records after it are past the "
                "stream's retention. Set failOnDataLoss=false to read on from the oldest record left",
                code=error.code,
            )
        if isinstance(error, ResourceNotFound):
            return ResourceNotFound(
                f"efo source: {error}; the stream or the consumer {stream.consumer_arn} is gone (deleted, or the "
                "consumer deregistered). Restart the query to register the consumer again (it reads on from its "
                "checkpoint)",
                code=error.code,
            )
        return error

    async def _sync_loop(self, stream: _Stream) -> None:
        """ListShards every ``shardSyncInterval``, and at once when a shard ended or caught up."""
        while True:
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the inner result and drops a
                # cancellation that comes with it, and the loop would outlive the engine's close.
                async with asyncio.timeout(self.options.shard_sync_interval_s):
                    await stream.sync_now.wait()
            except TimeoutError:
                pass
            stream.sync_now.clear()
            asked_at = self._monotonic()
            try:
                graph = await list_shards(self._kinesis, stream.arn)
            except EfoError as exc:
                if not exc.retriable:
                    if isinstance(exc, ResourceNotFound):
                        raise ResourceNotFound(
                            f"efo source: stream {stream.name!r} is gone (deleted while the query read it): {exc}"
                        ) from None
                    raise
                log.warning("source.list_shards_failed", stream=stream.name, error=str(exc), code=exc.code)
                continue
            self._apply_listing(stream, graph, asked_at)

    def _apply_listing(self, stream: _Stream, graph: ShardGraph, asked_at: float) -> None:
        self._add_new(stream, graph)
        for shard_id in [s for s, shard in stream.shards.items() if s not in graph.shards and shard.offset.ended]:
            del stream.shards[shard_id]  # read to its end and past retention: nothing refers to it any more
        stream.graph, stream.listed_at = graph, asked_at
        self._start_ready()
        if self._wake is not None:
            self._wake.set()


def _rows_within(chunk: RecordChunk, room_bytes: int, *, at_least_one: bool) -> int:
    """How many of the chunk's first rows fit in ``room_bytes`` of data (one at least, if asked)."""
    total = 0
    for index, payload in enumerate(chunk.data):
        total += len(payload)
        if total > room_bytes:
            return max(index, 1 if at_least_one else 0)
    return len(chunk)


def _first_at_or_after(arrivals: Sequence[int], until_ms: int) -> int:
    """The index of the first arrival at or after ``until_ms`` (the length when none is): a scan, as
    efo run's ``--until`` cut, since ApproximateArrivalTimestamp may step back between records."""
    return next((index for index, arrival_ms in enumerate(arrivals) if arrival_ms >= until_ms), len(arrivals))


def _moved(offset: ShardOffset, part: RecordChunk, *, partial_record: bool) -> ShardOffset:
    """The shard's offset once ``part`` (its next rows, in order) is handed on. ``partial_record``:
    the next row is a later sub-record of the same KPL aggregate."""
    sub = part.sub_sequence_numbers[-1] if partial_record else None
    return replace(
        offset,
        sequence_number=part.sequence_numbers[-1],
        sub_sequence_number=sub,
        rows=offset.rows + len(part),
        arrival_ms=part.arrival_ms[-1],
    )


def _first_error(exc: BaseException) -> EfoError:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc if isinstance(exc, EfoError) else translate(exc, resource="the efo source")


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


__all__ = ["DataLost", "Engine", "Planned", "initial_offset", "positions_of"]
