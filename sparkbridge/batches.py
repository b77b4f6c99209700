"""One batch, from chunks to a committed sink write: dedupe, Arrow, DataFrame, decoding, sink.

Pure of threads and AWS, so it is tested with a real SparkSession and no service.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pyarrow as pa
import structlog

from efo.errors import ConfigError, SinkFailed
from efo.kinesis.columns import ReusableBlocks
from efo.observability import METRICS
from efo.pipeline.records import MAX_SUB_SEQUENCE, RecordChunk, Row
from sparkbridge.arrow import to_table
from sparkbridge.failures import cause_of
from sparkbridge.session import dataframe_of
from sparkbridge.sinks import BatchInfo, ShardRange, Sink, rows_in_tasks, takes_arrow

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Observation, SparkSession
    from pyspark.sql.types import StructType

log = structlog.get_logger("sparkbridge.batches")

T = TypeVar("T")

CORRUPT_JSON_COLUMN = "_efo_corrupt_json"
INVALID_JSON = "invalid_json"


def describe_batch(batch_id: str, chunks: Sequence[RecordChunk], attempt: int = 1) -> BatchInfo:
    shards: dict[tuple[str, str], ShardRange] = {}
    for chunk in chunks:
        key = (chunk.stream, chunk.shard_id)
        known = shards.get(key)
        first = known.first_sequence_number if known else chunk.sequence_numbers[0]
        count = (known.records if known else 0) + len(chunk)
        shards[key] = ShardRange(first, chunk.sequence_numbers[-1], count)
    return BatchInfo(
        batch_id=batch_id,
        records=sum(len(c) for c in chunks),
        bytes=sum(c.data_bytes for c in chunks),
        shards=shards,
        attempt=attempt,
    )


class DeliveryWatermark:
    """Per shard, the highest (sequence, sub-sequence) handed to the sink. Rows at or below it
    reached the driver twice (a resubscribe overlap) and are dropped. A new epoch of the shard (it
    was restarted at an explicit position) resets it, which may move it backwards on purpose."""

    def __init__(self) -> None:
        self._marks: dict[tuple[str, str], tuple[int, int, int]] = {}  # (stream, shard) -> (epoch, sequence, sub)

    def filter(self, chunk: RecordChunk) -> tuple[RecordChunk, int]:
        if not len(chunk):
            return chunk, 0
        mark = self._marks.get((chunk.stream, chunk.shard_id))
        if mark is not None and mark[0] != chunk.epoch:
            mark = None
        # A chunk is in sequence order: past the mark at its first row, it is past it everywhere.
        if mark is None or self._key(chunk, 0) > mark[1:]:
            keep = range(len(chunk))
        else:
            keep = range(next((i for i in range(len(chunk)) if self._key(chunk, i) > mark[1:]), len(chunk)), len(chunk))
        if keep:
            self._marks[(chunk.stream, chunk.shard_id)] = (chunk.epoch, *self._key(chunk, keep[-1]))
        dropped = len(chunk) - len(keep)
        if not dropped:
            return chunk, 0
        if not keep:
            return RecordChunk(chunk.stream, chunk.shard_id, chunk.serial, chunk.epoch, grant=chunk.grant), dropped
        return chunk.rows(keep.start), dropped

    @staticmethod
    def _key(chunk: RecordChunk, i: int) -> tuple[int, int]:
        sub = chunk.sub_sequence_numbers[i]
        return int(chunk.sequence_numbers[i]), MAX_SUB_SEQUENCE if sub is None else sub


class ValueDecoder:
    """``value_format``: binary (nothing added), utf8 (adds ``value``), json (adds the schema's
    columns; a row that does not parse keeps nulls, gets ``error = invalid_json`` and is counted
    through ``DataFrame.observe``, in the sink's own Spark job). pyspark is imported by the
    methods that use it: the arrow sink's path makes a binary decoder, and never calls it."""

    def __init__(self, value_format: str, json_schema: str | None) -> None:
        self.value_format = value_format
        self._observations = 0
        self.schema: StructType | None = None
        if value_format == "json":
            from pyspark.sql.types import StringType, StructField, StructType

            assert json_schema
            try:
                parsed = StructType.fromDDL(json_schema)
                if not isinstance(parsed, StructType):
                    parsed = StructType([StructField("value", parsed)])
            except Exception as exc:
                raise ConfigError(
                    f"json_schema (EFO_JSON_SCHEMA) = {json_schema!r}: not a Spark DDL schema: {exc}"
                ) from None
            self.schema = StructType([*parsed.fields, StructField(CORRUPT_JSON_COLUMN, StringType())])

    def decode(self, df: DataFrame) -> tuple[DataFrame, Observation | None]:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        if self.value_format == "utf8":
            return df.withColumn("value", F.col("data").cast("string")), None
        if self.schema is None:
            return df, None
        parsed = F.from_json(
            F.col("data").cast("string"),
            self.schema,
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_JSON_COLUMN},
        )
        bad: Column = F.col(f"_parsed.{CORRUPT_JSON_COLUMN}").isNotNull()
        names = [f.name for f in self.schema.fields if f.name != CORRUPT_JSON_COLUMN]
        out = (
            df.withColumn("_parsed", parsed)
            .withColumn("error", F.when(bad, F.lit(INVALID_JSON)).otherwise(F.col("error")))
            .select(
                *[F.col(c) for c in df.columns], *[F.col(f"_parsed.{n}").alias(n) for n in names], bad.alias("_bad")
            )
        )
        self._observations += 1  # a name unique per batch: a sink may run several actions
        observation = Observation(f"efo_json_{self._observations}")
        out = out.observe(observation, F.sum(F.col("_bad").cast("long")).alias("invalid_json"))
        return out.drop("_bad"), observation


def observed(observation: Observation | None) -> dict[str, Any] | None:
    """The observed metrics if the sink ran a Spark action on the DataFrame; never blocks."""
    if observation is None:
        return None
    jo = getattr(observation, "_jo", None)
    if jo is not None:  # classic session: get() would block until an action runs
        if not jo.future().isCompleted():
            return None
        return observation.get
    # Spark Connect: get() returns a dict the client fills in when an action's response carries the
    # metrics; until then it is empty (not an error), and it raises if collecting them failed.
    try:
        metrics = observation.get
    except Exception:
        return None
    return dict(metrics) if metrics else None


@dataclass
class PreparedBatch:
    batch_id: str
    chunks: list[RecordChunk]  # as taken: acknowledged whole once committed
    kept: list[RecordChunk]  # past the delivery watermark
    table: pa.Table | None
    dead: list[RecordChunk]
    dead_table: pa.Table | None
    duplicates: int
    prepare_s: float


@dataclass
class BatchResult:
    info: BatchInfo
    chunks: list[RecordChunk]  # as read: every one of them is acknowledged, kept rows or not
    duplicates: int
    invalid_json: int | None
    duration_s: float


class BatchRunner:
    def __init__(
        self,
        spark: SparkSession | None,
        sink: Sink,
        *,
        max_attempts: int,
        retry_backoff_s: float,
        decoder: ValueDecoder | None = None,
        dead_letter_sink: Sink | None = None,
        give_up_at: Callable[[], float | None] = lambda: None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """``give_up_at`` is a deadline on the ``clock`` (the shutdown's) or None: no sink attempt
        starts after it, and no retry delay runs past it. ``labels`` name the sinks in errors
        (``{"sink": "sink (EFO_SINK) = '...'", "dead_letter_sink": ...}``)."""
        self._labels = dict(labels or {})
        self.spark = spark
        self.sink = sink
        self.dead_letter_sink = dead_letter_sink
        self.max_attempts = max_attempts
        self.retry_backoff_s = retry_backoff_s
        self.decoder = decoder or ValueDecoder("binary", None)
        self.watermark = DeliveryWatermark()
        # The batch in the sink and the next one prepared meanwhile: each batch's payloads are
        # copied into a block whose pages are already mapped (dead letters, rare, are not).
        self.blocks = ReusableBlocks(2)
        self._give_up_at = give_up_at
        self._sleep = sleep
        self._clock = clock

    def run(self, batch_id: str, chunks: list[RecordChunk]) -> BatchResult:
        """Write the batch through the sink (its dead letters first, through the dead-letter sink),
        retrying the same rows; raise SinkFailed when the attempts run out."""
        return self.commit(self.prepare(batch_id, chunks))

    def prepare(self, batch_id: str, chunks: list[RecordChunk]) -> PreparedBatch:
        """The Python and Arrow half of a batch: no Spark call, so it can run on another thread
        while Spark commits the previous batch. Batches must be prepared in order (the watermark)."""
        started = time.monotonic()
        kept: list[RecordChunk] = []
        duplicates = 0
        for chunk in chunks:
            filtered, dropped = self.watermark.filter(chunk)
            duplicates += dropped
            if len(filtered):
                kept.append(filtered)
        if duplicates:
            METRICS.records_duplicate.inc(duplicates)
            log.info("batch.duplicates_dropped", batch_id=batch_id, records=duplicates)
        dead = dead_letter_chunks(chunks)
        return PreparedBatch(
            batch_id=batch_id,
            chunks=chunks,
            kept=kept,
            table=to_table(kept, self.blocks) if kept else None,
            dead=dead,
            dead_table=to_table(dead) if dead else None,
            duplicates=duplicates,
            prepare_s=time.monotonic() - started,
        )

    def commit(self, batch: PreparedBatch, frame_ready: Callable[[], None] = lambda: None) -> BatchResult:
        """The Spark half: DataFrames, decoding, the dead-letter sink, then the sink, with retries.
        ``frame_ready`` is called once the sink's DataFrame is made, before the sink is called
        (for a sink that takes Arrow or a batch without rows, once the dead letters are written):
        from then on, a DataFrame sink mostly waits on the JVM, and the next batch's conversion
        (:class:`Prefetcher`) no longer holds up ``createDataFrame``'s Python work by holding the GIL."""
        started = time.monotonic()
        if batch.dead_table is not None:
            if self.dead_letter_sink is None:
                raise SinkFailed(
                    f"batch {batch.batch_id} has corrupt aggregates to dead-letter but no dead_letter_sink"
                )
            self._write(
                self.dead_letter_sink,
                self._frame(self.dead_letter_sink, batch.dead_table),
                f"{batch.batch_id}-dead-letters",
                batch.dead,
                "dead_letter_sink",
            )
        info = describe_batch(batch.batch_id, batch.kept) if batch.kept else BatchInfo(batch.batch_id, 0, 0)
        invalid_json: int | None = None
        if batch.table is None:
            frame_ready()
        elif takes_arrow(self.sink):
            frame_ready()
            info = self._write(self.sink, batch.table, batch.batch_id, batch.kept, "sink")
        else:
            df, observation = self.decoder.decode(self._frame(self.sink, batch.table))
            frame_ready()
            info = self._write(self.sink, df, batch.batch_id, batch.kept, "sink")
            metrics = observed(observation)
            if metrics is not None:
                invalid_json = int(metrics.get("invalid_json") or 0)
                if invalid_json:
                    METRICS.records_invalid_json.inc(invalid_json)
        duration_s = batch.prepare_s + time.monotonic() - started
        return BatchResult(info, batch.chunks, batch.duplicates, invalid_json, duration_s)

    def _frame(self, sink: Sink, table: pa.Table) -> Any:
        """What the sink is handed: the Arrow table itself, or a DataFrame made from it."""
        if takes_arrow(sink):
            return table
        assert self.spark is not None, "a DataFrame sink needs a Spark session"
        return dataframe_of(self.spark, table, rows_in_tasks=rows_in_tasks(sink))

    def _write(self, sink: Sink, df: Any, batch_id: str, chunks: list[RecordChunk], name: str) -> BatchInfo:
        for attempt in range(1, self.max_attempts + 1):
            give_up_at = self._give_up_at()
            if give_up_at is not None and self._clock() >= give_up_at:
                raise SinkFailed(
                    f"{name}: batch {batch_id} not written: the shutdown deadline passed before attempt {attempt}; "
                    "its records will be read again"
                )
            info = describe_batch(batch_id, chunks, attempt)
            if attempt > 1:
                METRICS.sink_retries.inc()
            try:
                sink.write(df, info)
                return info
            except Exception as exc:
                METRICS.sink_failures.inc()
                cause, label = cause_of(exc), self._labels.get(name, name)
                then = f"{cause}; {cause.advice}; its records will be read again"
                if cause.permanent:  # the same write fails the same way: no retry can help
                    raise SinkFailed(
                        f"{label} failed on batch {batch_id} (attempt {attempt}; not retried: every attempt fails "
                        f"so): {then}"
                    ) from None
                if attempt == self.max_attempts:
                    raise SinkFailed(f"{label} failed on batch {batch_id} after {attempt} attempts: {then}") from None
                delay_s = self.retry_backoff_s * 2 ** (attempt - 1)
                give_up_at = self._give_up_at()
                if give_up_at is not None and self._clock() + delay_s >= give_up_at:
                    raise SinkFailed(
                        f"{label} failed on batch {batch_id} (attempt {attempt}: {cause}) and the "
                        "shutdown deadline leaves no time for another attempt; its records will be read again"
                    ) from None
                log.warning(
                    "sink.retry",
                    sink=name,
                    batch_id=batch_id,
                    attempt=attempt,
                    error=str(cause),
                    delay_s=delay_s,
                )
                self._sleep(delay_s)
        raise AssertionError("unreachable")


def dead_letter_chunks(chunks: Sequence[RecordChunk]) -> list[RecordChunk]:
    """The dead letters of these chunks as chunks of their own, ``error`` naming the reason."""
    out = []
    for chunk in chunks:
        if not chunk.dead_letters:
            continue
        rows = [
            Row(
                letter.sequence_number,
                letter.data,
                letter.partition_key,
                letter.arrival_ms,
                error=f"corrupt_aggregate: {letter.reason}",
            )
            for letter in chunk.dead_letters
        ]
        out.append(RecordChunk.of_rows(chunk.stream, chunk.shard_id, chunk.serial, rows, epoch=chunk.epoch))
    return out


class Prefetcher(Generic[T]):
    """Calls ``produce(turn)`` on one worker thread, one call ahead of the consumer: the call for
    the next result starts as soon as this one is taken, so the driver takes the next batch at
    once (it closes ``max_wait_s`` after its first record, whatever Spark is doing), and
    ``produce`` calls ``turn()`` before its costly part, the conversion: ``turn()`` returns True
    once the consumer calls :meth:`start_next` (the driver does once this batch's DataFrame is
    made: BatchRunner.commit's ``frame_ready``) or asks for that result, and False once the
    prefetcher is closing (the call should then return without converting).

    Why wait for the frame: both the conversion and ``createDataFrame`` (casts, the Arrow stream
    written for the JVM, py4j's calls) run Python, and a thread that wants the GIL back waits up to
    ``sys.getswitchinterval()`` each time. Converting 100,000 records of 1 KiB (about 40 ms, most
    of it holding the GIL) beside ``createDataFrame`` and a no-op sink made the batch +21 % slower;
    started once the DataFrame was made, +10 % (bench/spark_ingest.py, docs/benchmarks.md section 2).
    """

    def __init__(self, produce: Callable[[Callable[[], bool]], T]) -> None:
        self._produce = produce
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="efo-arrow")
        self._closing = False
        self._turn = threading.Event()
        self._turn.set()  # the first call: nothing is being committed
        self._upcoming = self._submit(self._turn)

    def next(self) -> T:
        """The next result, waiting for it (its call's turn given if :meth:`start_next` did not);
        the call for the one after it starts at once."""
        self.start_next()
        result = self._upcoming.result()
        self._turn = threading.Event()
        self._upcoming = self._submit(self._turn)
        return result

    def start_next(self) -> None:
        """Give the call for the next result its turn to convert."""
        self._turn.set()

    def close(self) -> None:
        """Wait for the call under way (its turn, if it still waits for one, is refused; its result
        is dropped) and stop the worker."""
        self._closing = True
        self._turn.set()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _submit(self, turn: threading.Event) -> Future[T]:
        def wait_turn() -> bool:
            turn.wait()  # set by start_next, next or close: the consumer's thread, which the watchdog bounds
            return not self._closing

        return self._executor.submit(self._produce, wait_turn)
