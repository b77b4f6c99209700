"""Records for a stream, written as a real producer writes them (``efo dev put``): JSON payloads of a
given size, partition keys in turn, at a given rate or as fast as Kinesis takes them, optionally
KPL-aggregated (with the reference aggregator, ``aws-kinesis-agg``), PutRecords of at most 500
records and 5 MiB, and the records Kinesis refused put again after a back-off, a bounded number
of times. Clock and sleep are injected, so pacing and back-off are tested without waiting."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from efo.errors import EfoError, translate

PUT_RECORDS_MAX = 500  # records per PutRecords call
PUT_RECORDS_MAX_BYTES = 5 * 1024 * 1024  # data and partition keys per PutRecords call
RECORD_MAX_BYTES = 1024 * 1024  # one record's data and partition key
#: Attempts of a record Kinesis refuses (ProvisionedThroughputExceeded, InternalFailure) before giving up.
MAX_ATTEMPTS = 8
BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 5.0


@dataclass(frozen=True, slots=True)
class Traffic:
    """What to put: ``count`` records of ``size_bytes`` each, numbered from ``first``, over ``keys``
    partition keys in turn, at ``rate_per_s`` records a second (0: as fast as Kinesis takes them),
    ``aggregate`` records to a KPL aggregate (0: each a Kinesis record of its own)."""

    count: int
    size_bytes: int = 100
    keys: int = 16
    rate_per_s: float = 0.0
    aggregate: int = 0
    first: int = 0

    def problems(self) -> list[str]:
        """Each setting outside what it allows, named as its command-line option."""
        found = []
        if self.count < 1:
            found.append(f"--count {self.count}: allowed: 1 or more")
        if self.keys < 1:
            found.append(f"--keys {self.keys}: allowed: 1 or more")
        if self.rate_per_s < 0:
            found.append(f"--rate {self.rate_per_s:g}: allowed: 0 (as fast as Kinesis takes them) or more")
        if self.aggregate < 0:
            found.append(f"--aggregate {self.aggregate}: allowed: 0 (no aggregation) or more")
        smallest = len(payload(self.first + max(self.count, 1) - 1, f"key-{max(self.keys, 1) - 1}", 0))
        if not smallest <= self.size_bytes <= RECORD_MAX_BYTES - 256:
            found.append(f"--size {self.size_bytes}: allowed: {smallest} to {RECORD_MAX_BYTES - 256} bytes")
        return found

    def key(self, n: int) -> str:
        return f"key-{n % self.keys}"

    def records(self) -> Iterator[tuple[str, bytes]]:
        """``(partition key, data)`` of every record, in order."""
        for n in range(self.first, self.first + self.count):
            key = self.key(n)
            yield key, payload(n, key, self.size_bytes)


def payload(n: int, key: str, size_bytes: int) -> bytes:
    """A JSON object of exactly ``size_bytes`` (or as small as it gets): ``{"n": ..., "key": ...,
    "pad": "..."}``: each record says its number and key, so what arrives can be checked."""
    bare = json.dumps({"n": n, "key": key, "pad": ""}, separators=(",", ":")).encode()
    return bare[:-2] + b"x" * max(0, size_bytes - len(bare)) + b'"}'


@dataclass(frozen=True, slots=True)
class Entry:
    """One Kinesis record of a PutRecords call, and how many of the user's records it holds."""

    request: dict[str, Any]
    records: int

    @property
    def size_bytes(self) -> int:
        return len(self.request["Data"]) + len(self.request["PartitionKey"].encode())


def entries(traffic: Traffic) -> Iterator[Entry]:
    """The Kinesis records of ``traffic``: one per record, or KPL aggregates of ``aggregate``."""
    if not traffic.aggregate:
        for key, data in traffic.records():
            yield Entry({"Data": data, "PartitionKey": key}, 1)
        return
    # The reference aggregator is a development dependency (make install): only --aggregate needs it.
    from aws_kinesis_agg.aggregator import RecordAggregator

    aggregator = RecordAggregator(max_size=RECORD_MAX_BYTES - 1024)
    for key, data in traffic.records():
        full = aggregator.add_user_record(key, data)
        if full is not None:  # the aggregate had no room for this record: it starts the next one
            yield _aggregate(full)
        if aggregator.get_num_user_records() >= traffic.aggregate:
            yield _aggregate(aggregator.clear_and_get())
    last = aggregator.clear_and_get()
    if last is not None:
        yield _aggregate(last)


def _aggregate(record: Any) -> Entry:
    key, explicit_hash_key, data = record.get_contents()
    request = {"Data": data, "PartitionKey": key}
    if explicit_hash_key:
        request["ExplicitHashKey"] = explicit_hash_key
    return Entry(request, record.get_num_user_records())


@dataclass
class PutReport:
    """What Kinesis acknowledged."""

    records: int = 0  # the user's records
    kinesis_records: int = 0  # Kinesis records (aggregates count once)
    bytes: int = 0  # data of the Kinesis records
    calls: int = 0
    retried: int = 0  # Kinesis records refused and put again
    seconds: float = 0.0
    shards: Counter[str] = field(default_factory=Counter)  # the user's records by shard

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "kinesis_records": self.kinesis_records,
            "bytes": self.bytes,
            "calls": self.calls,
            "retried": self.retried,
            "duration_s": round(self.seconds, 3),
            "shards": dict(sorted(self.shards.items())),
        }


class Producer:
    """PutRecords to one stream, paced and retried; ``put`` returns what Kinesis acknowledged."""

    def __init__(
        self,
        kinesis: Any,
        stream: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        self.kinesis = kinesis
        self.stream = stream
        self._clock = clock
        self._sleep = sleep
        self.max_attempts = max_attempts

    def put(self, traffic: Traffic, on_progress: Callable[[int], None] = lambda records: None) -> PutReport:
        """Put every record of ``traffic``; ``on_progress(records)`` after each call with the
        records acknowledged so far."""
        report = PutReport()
        started = self._clock()
        pending = entries(traffic)
        carried: Entry | None = None
        while True:
            batch: list[Entry] = []
            batch_bytes = 0
            due = self._due(traffic, started, report.records)
            while len(batch) < PUT_RECORDS_MAX:
                entry = carried if carried is not None else next(pending, None)
                carried = None
                if entry is None:
                    break
                holding = report.records + sum(e.records for e in batch)
                if batch and (batch_bytes + entry.size_bytes > PUT_RECORDS_MAX_BYTES or holding + entry.records > due):
                    carried = entry
                    break
                batch.append(entry)
                batch_bytes += entry.size_bytes
            if not batch:
                break
            self._put_batch(batch, report)
            on_progress(report.records)
        report.seconds = self._clock() - started
        return report

    def _due(self, traffic: Traffic, started: float, sent: int) -> float:
        """How many records may have been put by now at ``rate_per_s``, waiting until at least one more is."""
        if not traffic.rate_per_s:
            return float("inf")
        while True:
            due = int((self._clock() - started) * traffic.rate_per_s) + 1
            if due > sent:
                return due
            self._sleep(started + sent / traffic.rate_per_s - self._clock())

    def _put_batch(self, batch: list[Entry], report: PutReport) -> None:
        pending = batch
        delay_s = BACKOFF_INITIAL_S
        for attempt in range(1, self.max_attempts + 1):
            try:
                response = self.kinesis.put_records(StreamName=self.stream, Records=[e.request for e in pending])
            except Exception as exc:  # the SDK retried throttling and 5xx already
                raise translate(
                    exc, resource=f"stream {self.stream!r}", hint="create it: efo dev stream create"
                ) from None
            report.calls += 1
            refused: list[tuple[Entry, str]] = []
            for entry, result in zip(pending, response["Records"], strict=True):
                if "SequenceNumber" in result:
                    report.records += entry.records
                    report.kinesis_records += 1
                    report.bytes += len(entry.request["Data"])
                    report.shards[result["ShardId"]] += entry.records
                else:
                    refused.append((entry, str(result.get("ErrorCode", "refused"))))
            if not refused:
                return
            if attempt == self.max_attempts:
                codes = Counter(code for _, code in refused)
                raise EfoError(
                    f"stream {self.stream!r} refused {len(refused)} record(s) {attempt} times "
                    f"({', '.join(f'{code}: {n}' for code, n in codes.items())}); put fewer records a second "
                    "(--rate) or add shards"
                )
            report.retried += len(refused)
            pending = [entry for entry, _ in refused]
            self._sleep(delay_s)
            delay_s = min(delay_s * 2, BACKOFF_MAX_S)
