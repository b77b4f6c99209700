"""A micro-batch read again: the records between two offsets, exactly.

After a restart Spark plans the last batch of its offset log again (it was planned, perhaps written,
but not committed) and reads it on an executor, between the same two offsets. The records are read
with GetShardIterator and GetRecords from each shard's position in the start offset through its
position in the end offset: no Enhanced Fan-Out consumer is involved, so the read never competes with
the query's subscriptions for the consumer's one subscription per shard.

The end offset says how many rows each shard handed on (``rows``); a shard that yields fewer had
records trimmed since (past the stream's retention): that is :class:`~efo.source.engine.DataLost`
naming the shard, unless ``failOnDataLoss`` is false (then it is logged and counted).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from efo.aws import Clients, Endpoints
from efo.errors import EfoError, ResourceNotFound, StreamRecreated, translate
from efo.kinesis.decoder import arrival_ms
from efo.kinesis.kpl import CorruptAggregate, expand
from efo.kinesis.registration import describe_stream
from efo.observability import METRICS
from efo.pipeline.records import MAX_SUB_SEQUENCE, Position, RecordChunk
from efo.source.engine import DataLost, _iso
from efo.source.offsets import ShardOffset, SourceOffset, StreamOffset, origin_position
from efo.source.options import SourceOptions

log = structlog.get_logger("efo.source.replay")

#: GetRecords allows 5 calls a second per shard.
GET_RECORDS_INTERVAL_S = 0.2
GET_RECORDS_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class ShardRange:
    """One shard's part of a batch: from ``start`` (exclusive of what it had delivered) through ``last``."""

    stream: str
    stream_arn: str
    shard_id: str
    start: Position
    delivered: tuple[int, int] | None  # rows at or below it belong to earlier batches
    last: tuple[int, int]  # the batch's last row of this shard
    rows: int  # how many rows the batch holds from this shard


def ranges(start: SourceOffset, end: SourceOffset) -> list[ShardRange]:
    """Each shard's rows between ``start`` and ``end``, by stream ARN and then shard id, the order in
    which the batch held them. A shard the start does not know, or knew
    with another origin (reading began again elsewhere: skipOlderThan), is read from its origin in
    the end offset; its rows are counted since the query began either way."""
    out: list[ShardRange] = []
    for arn in sorted(end.streams):  # the order of a batch's rows (efo.source.engine): streams, then shards
        stream = end.streams[arn]
        before = start.streams.get(arn)
        if before is not None and before.created_ms != stream.created_ms:
            before = None
        for shard_id in sorted(stream.shards):
            last = stream.shards[shard_id]
            first: ShardOffset | None = before.shards.get(shard_id) if before is not None else None
            rows = last.rows - (first.rows if first is not None else 0)  # counted since the query began
            if rows <= 0:
                continue
            through = last.delivered_through()
            assert through is not None, f"shard {shard_id}: rows without a last record"
            if first is not None and first.origin == last.origin and first.sequence_number is not None:
                position, delivered = first.resume(), first.delivered_through()
            else:
                position, delivered = origin_position(last.origin), None
            out.append(ShardRange(stream.name, arn, shard_id, position, delivered, through, rows))
    return out


def read_between(options: SourceOptions, start: SourceOffset, end: SourceOffset) -> list[RecordChunk]:
    """The batch's records, in each shard's order (shards one after another)."""
    if not ranges(start, end):
        return []
    return asyncio.run(_read_all(options, start, end))


async def _read_all(options: SourceOptions, start: SourceOffset, end: SourceOffset) -> list[RecordChunk]:
    async with Clients(Endpoints(options.region, options.endpoint, None)) as clients:
        return await read_with(await clients.kinesis(), options, start, end)


async def read_with(kinesis: Any, options: SourceOptions, start: SourceOffset, end: SourceOffset) -> list[RecordChunk]:
    """:func:`read_between` on a Kinesis client of the caller's: the shards read at once, of the streams
    still the ones the offsets name."""
    wanted = ranges(start, end)
    recreated = {
        arn for arn in {r.stream_arn for r in wanted} if await _recreated(kinesis, options, arn, end.streams[arn])
    }
    results = await asyncio.gather(
        *(ShardReplay(kinesis, options, r).read() for r in wanted if r.stream_arn not in recreated)
    )
    return [chunk for chunks in results for chunk in chunks]


async def _recreated(kinesis: Any, options: SourceOptions, arn: str, planned: StreamOffset) -> bool:
    """Whether the stream was deleted and created again since the batch was planned: its shard ids
    are the old ones, their records others. A stream gone is left to its shards' reads (data lost)."""
    try:
        info = await describe_stream(kinesis, arn)
    except ResourceNotFound:
        return False
    created_ms = int(info.created_at.timestamp() * 1000)
    if created_ms == planned.created_ms:
        return False
    if options.fail_on_data_loss:
        raise StreamRecreated(
            f"efo source: a micro-batch read again after a restart holds records of stream {planned.name!r}, which "
            f"was deleted and created again since (created {_iso(planned.created_ms)} then, {_iso(created_ms)} "
            "now): they are gone. Start the query with a new checkpointLocation, or set failOnDataLoss=false to "
            "go on without them"
        )
    METRICS.positions_expired.labels(stream=planned.name).inc()
    log.warning("source.replay_stream_recreated", stream=planned.name, action="the batch's rows of it are skipped")
    return True


class ShardReplay:
    """One shard's rows between two positions, by GetRecords."""

    def __init__(
        self,
        kinesis: Any,
        options: SourceOptions,
        shard: ShardRange,
        *,
        sleep: Callable[[float], Any] = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kinesis = kinesis
        self._options = options
        self._shard = shard
        self._sleep = sleep
        self._monotonic = monotonic

    def _where(self) -> str:
        return f"shard {self._shard.shard_id} of stream {self._shard.stream!r}"

    async def read(self) -> list[RecordChunk]:
        shard = self._shard
        chunks: list[RecordChunk] = []
        delivered = shard.delivered
        rows = 0
        iterator: str | None = await self._iterator()
        deadline = self._monotonic() + self._options.shard_timeout_s
        done = False
        while iterator is not None and not done:
            page = await self._get_records(iterator)
            records = page.get("Records") or []
            iterator = page.get("NextShardIterator")
            if records:
                deadline = self._monotonic() + self._options.shard_timeout_s
                chunk = self._chunk(records, delivered)
                if chunk is not None:
                    keep = _through(chunk, shard.last)
                    done = keep < len(chunk) or _key(chunk, len(chunk) - 1) == shard.last
                    if keep:
                        part = chunk if keep == len(chunk) else chunk.rows(0, keep)
                        chunks.append(part)
                        rows += keep
                        delivered = _key(part, keep - 1)
                    if rows >= shard.rows:
                        done = True
                continue
            if page.get("MillisBehindLatest") == 0 or self._monotonic() > deadline:
                break  # at the tip of the shard, and the batch's last row not reached
            await self._sleep(GET_RECORDS_INTERVAL_S)
        if rows != shard.rows:
            self._short(rows, "reached the end of what the shard holds" if iterator is None else "at its newest record")
        log.info("source.replayed", stream=shard.stream, shard_id=shard.shard_id, rows=rows)
        return chunks

    def _short(self, rows: int, where: str) -> None:
        message = (
            f"efo source: a micro-batch read again after a restart holds {self._shard.rows} rows of "
            f"{self._where()}, but Kinesis gave {rows} ({where}) from {self._shard.start}: records were trimmed "
            "since (past the stream's retention)"
        )
        if self._options.fail_on_data_loss:
            raise DataLost(message + "; set failOnDataLoss=false to go on without them")
        METRICS.positions_expired.labels(stream=self._shard.stream).inc()
        log.warning(
            "source.replay_short",
            stream=self._shard.stream,
            shard_id=self._shard.shard_id,
            rows=rows,
            expected=self._shard.rows,
        )

    async def _iterator(self) -> str | None:
        start = self._shard.start
        while True:
            args: dict[str, Any] = {
                "StreamARN": self._shard.stream_arn,
                "ShardId": self._shard.shard_id,
                "ShardIteratorType": start.kind,
            }
            if start.sequence_number is not None:
                args["StartingSequenceNumber"] = start.sequence_number
            if start.timestamp is not None:
                args["Timestamp"] = start.timestamp
            try:
                response = await self._kinesis.get_shard_iterator(**args)
            except Exception as exc:
                error = translate(exc, resource=self._where())
                expired = error.code == "InvalidArgumentException" and start.sequence_number is not None
                if expired and not self._options.fail_on_data_loss:
                    # Past the stream's retention: the query's subscription read on from the oldest
                    # record left (ShardSubscription's restart_expired), and so does the batch's replay;
                    # the rows at or below the start stay dropped (delivered).
                    log.warning("source.replay_position_expired", shard_id=self._shard.shard_id, position=str(start))
                    start = Position("TRIM_HORIZON")
                    continue
                if error.code in ("ResourceNotFoundException", "InvalidArgumentException"):
                    self._short(0, f"GetShardIterator refused {start}: {error.code}")
                    return None
                raise error from None
            return response.get("ShardIterator")  # type: ignore[no-any-return]

    async def _get_records(self, iterator: str) -> dict[str, Any]:
        attempts = 0
        while True:
            try:
                return dict(await self._kinesis.get_records(ShardIterator=iterator, Limit=GET_RECORDS_LIMIT))
            except Exception as exc:
                error = translate(exc, resource=self._where())
                attempts += 1
                if not error.retriable or attempts >= 10:
                    raise error from None
                await self._sleep(min(5.0, 0.3 * 2**attempts))

    def _chunk(self, records: list[dict[str, Any]], delivered: tuple[int, int] | None) -> RecordChunk | None:
        try:
            rows = expand(
                [r["SequenceNumber"] for r in records],
                [r["PartitionKey"] for r in records],
                [arrival_ms(r["ApproximateArrivalTimestamp"]) for r in records],
                [bytes(r["Data"]) for r in records],
                delivered,
                policy=self._options.on_corrupt_aggregate,
            )
        except CorruptAggregate as exc:
            raise EfoError(f"efo source: {exc} in {self._where()}") from None
        if not len(rows):
            return None
        return RecordChunk(
            self._shard.stream,
            self._shard.shard_id,
            serial=0,
            sequence_numbers=rows.sequence_numbers,
            sub_sequence_numbers=rows.sub_sequence_numbers,
            partition_keys=rows.partition_keys,
            explicit_hash_keys=rows.explicit_hash_keys,
            arrival_ms=rows.arrival_ms,
            data=rows.data,
            errors=rows.errors,
            data_bytes=rows.data_bytes,
        )


def _key(chunk: RecordChunk, index: int) -> tuple[int, int]:
    sub = chunk.sub_sequence_numbers[index]
    return (int(chunk.sequence_numbers[index]), MAX_SUB_SEQUENCE if sub is None else sub)


def _through(chunk: RecordChunk, last: tuple[int, int]) -> int:
    """How many of the chunk's first rows are at or before ``last``."""
    for index in range(len(chunk)):
        if _key(chunk, index) > last:
            return index
    return len(chunk)


__all__ = ["ShardRange", "ShardReplay", "ranges", "read_between", "read_with"]
