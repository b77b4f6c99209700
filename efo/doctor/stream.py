"""``efo doctor``'s checks of one stream: each Kinesis action efo calls, on the resource IAM
authorises it on, by a harmless call of it; the stream (status, mode, shards against the workers
and the pool, encryption); its consumer (registered, ACTIVE, room for one more)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from efo.config import Settings
from efo.doctor.findings import POLICY, Report, probe
from efo.kinesis.registration import CONSUMERS_PER_STREAM, StreamInfo, stream_info

#: How long the SubscribeToShard probe waits for its answer.
SUBSCRIBE_TIMEOUT_S = 15.0
#: The shard the SubscribeToShard probe names: one no stream has (shards are numbered from 0). IAM
#: authorises the call on the consumer's ARN before Kinesis looks for the shard, so a permitted call
#: is answered ResourceNotFoundException and a refused one AccessDeniedException; a shard of the
#: stream would be taken over from the worker reading it (a call 5 s or more after its own).
PROBE_SHARD_ID = "shardId-999999999999"


@dataclass(frozen=True, slots=True)
class StreamFacts:
    """What the stream's checks learned, for the table's checks."""

    info: StreamInfo
    retention_hours: int
    consumer_arn: str | None  # registered (in any status); None: the first start registers it


def stream_resource(settings: Settings) -> str:
    return f"stream {settings.stream_ref!r}"


async def check_stream(
    report: Report, settings: Settings, kinesis: Any, subscriber: Any, workers: int
) -> StreamFacts | None:
    """Every check of the stream of ``settings``; None when it could not be described (the checks
    that need it are skipped, saying so)."""
    ref = settings.stream_ref
    key = {"StreamARN": ref} if ref.startswith("arn:") else {"StreamName": ref}
    _, described = await probe(
        report,
        "kinesis:DescribeStreamSummary",
        stream_resource(settings),
        lambda: kinesis.describe_stream_summary(**key),
        holds="allowed: the stream exists",
    )
    if described is None:
        report.add("stream", stream_resource(settings), "skip", "not checked: the stream could not be described")
        return None
    summary = described["StreamDescriptionSummary"]
    info = stream_info(summary)
    arn = info.arn
    await probe(
        report,
        "kinesis:ListShards",
        arn,
        lambda: kinesis.list_shards(StreamARN=arn, ShardFilter={"Type": "AT_LATEST"}),
    )
    _stream_state(report, settings, summary, info, workers)
    consumer_arn, active = await _consumer(report, settings, kinesis, info)
    await _subscribe(report, subscriber, consumer_arn if active else None)
    _encryption(report, summary, arn)
    return StreamFacts(info, int(summary.get("RetentionPeriodHours") or 24), consumer_arn)


def _stream_state(report: Report, settings: Settings, summary: dict[str, Any], info: StreamInfo, workers: int) -> None:
    """Status, capacity mode, and the open shards against the workers and the pool."""
    if info.status == "DELETING":
        report.add("stream.status", info.arn, "fail", "DELETING: the stream is being deleted")
    elif info.status == "CREATING":
        report.add("stream.status", info.arn, "warn", "CREATING: wait until it is ACTIVE")
    else:
        report.add("stream.status", info.arn, "ok", info.status)
    mode = str((summary.get("StreamModeDetails") or {}).get("StreamMode", "PROVISIONED"))
    shards = info.open_shards
    per_worker = math.ceil(shards / workers) if shards else 0
    lease, pool = settings.lease, settings.pool
    facts = f"{mode}, {shards} open shard(s), {per_worker} per worker over {workers} worker(s) (--workers)"
    if lease.max_leases_per_worker and lease.max_leases_per_worker * workers < shards:
        unread = shards - lease.max_leases_per_worker * workers
        report.add(
            "stream.shards",
            info.arn,
            "fail",
            f"{facts}: lease.max_leases_per_worker = {lease.max_leases_per_worker} leaves {unread} shard(s) unread; "
            "raise it or run more workers",
        )
        return
    short = []
    if pool.reserved_records_per_shard * per_worker > pool.max_pending_records:
        short.append(
            f"pool.reserved_records_per_shard ({pool.reserved_records_per_shard}) x {per_worker} shards is more than "
            f"pool.max_pending_records ({pool.max_pending_records})"
        )
    if pool.reserved_bytes_per_shard * per_worker > pool.max_pending_bytes:
        short.append(
            f"pool.reserved_bytes_per_shard ({pool.reserved_bytes_per_shard}) x {per_worker} shards is more than "
            f"pool.max_pending_bytes ({pool.max_pending_bytes})"
        )
    if short:
        report.add(
            "stream.shards",
            info.arn,
            "warn",
            f"{facts}: {'; '.join(short)}: the per-shard reserves cannot all be kept; raise the pool or the workers",
        )
    else:
        report.add("stream.shards", info.arn, "ok", f"{facts}; the pool keeps every shard's reserve")


async def _consumer(report: Report, settings: Settings, kinesis: Any, info: StreamInfo) -> tuple[str | None, bool]:
    """The consumer: registered and ACTIVE; or to be registered at the first start, with room for it.
    Returns its ARN (None: not registered) and whether it is ACTIVE."""
    consumers = info.consumers
    by_arn = settings.consumer_arn
    resource = by_arn or f"{info.arn}/consumer/{settings.consumer}"
    args: dict[str, Any] = (
        {"ConsumerARN": by_arn} if by_arn else {"StreamARN": info.arn, "ConsumerName": settings.consumer}
    )
    allowed, described = await probe(
        report,
        "kinesis:DescribeStreamConsumer",
        resource,
        lambda: kinesis.describe_stream_consumer(**args),
        # Only a permitted call gets these: the shard is not found (AWS), another subscription to the
        # probe shard is still open (the local stack, for 3-4 s after one), or calls come too often.
        allowed=frozenset({"ResourceNotFoundException", "ResourceInUseException", "LimitExceededException"}),
    )
    if not allowed:
        report.add("consumer", resource, "skip", "not checked: the consumer could not be described")
        return None, False
    if described is None:
        if by_arn:
            report.add(
                "consumer",
                by_arn,
                "fail",
                "not registered: register one with 'efo consumers register' and set its ARN, or set "
                "EFO_CONSUMER_NAME instead of EFO_CONSUMER_ARN to have efo register it",
            )
            return None, False
        if consumers >= CONSUMERS_PER_STREAM:
            report.add(
                "consumer",
                resource,
                "fail",
                f"not registered, and the stream has {consumers} consumers, Kinesis's limit: deregister one "
                "no worker uses ('efo consumers list')",
            )
            return None, False
        report.add(
            "consumer",
            resource,
            "warn",
            f"not registered: the first start registers {settings.consumer!r} ({consumers} of "
            f"{CONSUMERS_PER_STREAM} consumers now; it needs kinesis:RegisterStreamConsumer on {info.arn}, which only "
            "registering checks: 'efo consumers register --wait' does it now, then run efo doctor again)",
        )
        return None, False
    description = described["ConsumerDescription"]
    arn, status = str(description["ConsumerARN"]), str(description["ConsumerStatus"])
    if status == "ACTIVE":
        report.add("consumer", arn, "ok", f"registered, ACTIVE ({consumers} of {CONSUMERS_PER_STREAM} consumers)")
        return arn, True
    report.add("consumer", arn, "warn", f"registered, {status}: the SubscribeToShard check needs it ACTIVE")
    return arn, False


async def _subscribe(report: Report, subscriber: Any, consumer_arn: str | None) -> None:
    """kinesis:SubscribeToShard, authorised on the consumer's ARN: one call naming a shard the
    stream does not have (:data:`PROBE_SHARD_ID`), so no worker's subscription is taken over and
    nothing is read. ResourceNotFoundException (AWS), a subscription (closed at once: the local
    stack), ResourceInUseException (another doctor's, just before) or LimitExceededException answers
    a permitted call."""
    if consumer_arn is None:
        report.add(
            "kinesis:SubscribeToShard",
            "the consumer",
            "skip",
            "not checked: no ACTIVE consumer to subscribe through yet",
        )
        return

    async def call() -> None:
        async with asyncio.timeout(SUBSCRIBE_TIMEOUT_S):
            response = await subscriber.subscribe_to_shard(
                ConsumerARN=consumer_arn, ShardId=PROBE_SHARD_ID, StartingPosition={"Type": "LATEST"}
            )
        response["EventStream"].close()

    await probe(
        report,
        "kinesis:SubscribeToShard",
        consumer_arn,
        call,
        # Only a permitted call gets these: the shard is not found (AWS), another subscription to the
        # probe shard is still open (the local stack, for 3-4 s after one), or calls come too often.
        allowed=frozenset({"ResourceNotFoundException", "ResourceInUseException", "LimitExceededException"}),
        holds=f"allowed (asked for {PROBE_SHARD_ID}, a shard no stream has: no subscription taken over)",
    )


def _encryption(report: Report, summary: dict[str, Any], arn: str) -> None:
    if summary.get("EncryptionType") != "KMS":
        report.add("kms:Decrypt", arn, "ok", "the stream is not encrypted: no KMS key needed")
        return
    key = str(summary.get("KeyId") or "its key")
    report.add(
        "kms:Decrypt",
        key,
        "warn",
        f"the stream is encrypted with {key}: the role needs kms:Decrypt on it ({POLICY}); not checked here, "
        "since only a record read shows it (a refusal stops efo run with KMSAccessDeniedException)",
    )
