"""Writing to a stream on the local stack: a plain Kinesis client and PutRecords until Kinesis has
acknowledged every record. Shared by ``make demo``, the benchmarks and the tests."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import botocore.config
import botocore.session

from efo.errors import error_code

PUT_RECORDS_MAX = 500  # records per PutRecords call (the API's limit)


@dataclass(frozen=True)
class Put:
    """One record as Kinesis acknowledged it."""

    shard_id: str
    sequence_number: str
    partition_key: str
    data: bytes


def kinesis_client(endpoint: str, region: str, *, retries: int = 3) -> Any:
    """A botocore Kinesis client for the stack (dummy credentials; requests must be signed)."""
    return botocore.session.get_session().create_client(
        "kinesis",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=botocore.config.Config(retries={"total_max_attempts": retries, "mode": "standard"}),
    )


def wait_active(kinesis: Any, stream: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"] != "ACTIVE":
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {stream} not ACTIVE after {timeout_s} s")
        time.sleep(0.1)


def wait_deleted(kinesis: Any, stream: str, timeout_s: float = 30.0) -> None:
    """Until ``stream`` is gone (Kinesis deletes it some time after DeleteStream answers; it is DELETING
    meanwhile); TimeoutError naming its status if it is not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            summary = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
        except Exception as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return
            raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {stream!r} is still {summary['StreamStatus']} after {timeout_s:g} s")
        time.sleep(0.1)


def put_all(kinesis: Any, stream: str, entries: Iterable[dict[str, Any]]) -> list[Put]:
    """PutRecords ``entries`` (``Data``, ``PartitionKey``, optionally ``ExplicitHashKey``) 500 at a
    time, putting again the ones Kinesis refused; returns what it acknowledged, in that order."""
    acknowledged: list[Put] = []
    for batch in _batches(entries):
        pending = batch
        while pending:
            response = kinesis.put_records(StreamName=stream, Records=pending)
            retry = []
            for entry, result in zip(pending, response["Records"], strict=True):
                if "SequenceNumber" in result:
                    acknowledged.append(
                        Put(result["ShardId"], result["SequenceNumber"], entry["PartitionKey"], entry["Data"])
                    )
                else:
                    retry.append(entry)
            pending = retry
    return acknowledged


def _batches(entries: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for entry in entries:
        batch.append(entry)
        if len(batch) == PUT_RECORDS_MAX:
            yield batch
            batch = []
    if batch:
        yield batch
