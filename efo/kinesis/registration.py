"""The stream and its Enhanced Fan-Out consumer: describe, find or register, wait until ACTIVE.

Shared by the service and the operator CLI. Deregistration is deliberately an operator action
only (``efo consumers deregister``): a data path that deregisters races other workers' registrations.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from efo.clock import SYSTEM_CLOCK, Clock
from efo.errors import ResourceNotFound, Retriable, error_code, translate

log = structlog.get_logger("efo.kinesis.registration")

CONSUMER_ACTIVE_TIMEOUT_S = 120.0
#: Kinesis's limit of EFO consumers registered on one stream.
CONSUMERS_PER_STREAM = 20
CONSUMER_LIMITS = (
    "Kinesis allows at most 20 consumers per stream, and 5 consumers CREATING at once per account: "
    "see 'efo consumers list' for those no live worker uses and deregister them, "
    "or register again once the others are ACTIVE"
)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    name: str
    arn: str
    created_at: datetime
    status: str
    open_shards: int
    consumers: int = 0  # EFO consumers registered on it (ConsumerCount)


def stream_info(summary: dict[str, Any]) -> StreamInfo:
    """A DescribeStreamSummary's ``StreamDescriptionSummary``, as efo uses it."""
    return StreamInfo(
        name=summary["StreamName"],
        arn=summary["StreamARN"],
        created_at=_as_datetime(summary["StreamCreationTimestamp"]),
        status=summary["StreamStatus"],
        open_shards=int(summary.get("OpenShardCount") or 0),
        consumers=int(summary.get("ConsumerCount") or 0),
    )


def _as_datetime(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return datetime.fromtimestamp(float(value), UTC)


async def describe_stream(kinesis: Any, stream: str) -> StreamInfo:
    key = {"StreamARN": stream} if stream.startswith("arn:") else {"StreamName": stream}
    try:
        summary = (await kinesis.describe_stream_summary(**key))["StreamDescriptionSummary"]
    except Exception as exc:
        raise translate(
            exc,
            resource=f"stream {stream!r}",
            hint="check EFO_STREAM (or EFO_STREAMS) and EFO_REGION, or create the stream",
        ) from None
    return stream_info(summary)


async def describe_consumer(
    kinesis: Any, *, stream_arn: str, name: str | None = None, arn: str | None = None
) -> dict[str, Any] | None:
    """The consumer's description, or None when no consumer of that name is registered."""
    args: dict[str, Any] = {"ConsumerARN": arn} if arn else {"StreamARN": stream_arn, "ConsumerName": name}
    try:
        return dict((await kinesis.describe_stream_consumer(**args))["ConsumerDescription"])
    except Exception as exc:
        if error_code(exc) == "ResourceNotFoundException":
            return None
        raise translate(exc, resource=f"consumer {arn or name!r}") from None


async def ensure_consumer(
    kinesis: Any,
    *,
    stream_arn: str,
    name: str | None = None,
    arn: str | None = None,
    timeout_s: float = CONSUMER_ACTIVE_TIMEOUT_S,
    clock: Clock = SYSTEM_CLOCK,
) -> str:
    """Return the ARN of an ACTIVE consumer: the given ARN, or the named one, registering it if needed."""
    deadline = clock.now() + timeout_s
    delay_s = 0.5
    while True:
        description = await describe_consumer(kinesis, stream_arn=stream_arn, name=name, arn=arn)
        if description is None and arn:
            raise ResourceNotFound(
                f"consumer {arn!r} is not registered; register one with 'efo consumers register' "
                "or set EFO_CONSUMER_NAME instead of EFO_CONSUMER_ARN to have efo register it"
            )
        if description is None:
            description = await register_consumer(kinesis, stream_arn, str(name))
        status = description.get("ConsumerStatus") if description else None
        if description is not None and status == "ACTIVE":
            return str(description["ConsumerARN"])
        if status == "DELETING":  # a restart onto a consumer still being deleted: wait, then register
            log.warning("consumer.deleting", consumer=name or arn)
        if clock.now() > deadline:
            raise ResourceNotFound(
                f"consumer {name or arn!r} did not become ACTIVE within {timeout_s:.0f} s (last status: {status})"
            )
        await clock.sleep(delay_s)
        delay_s = min(delay_s * 1.5, 5.0)  # DescribeStreamConsumer allows 20 TPS per stream


async def register_consumer(kinesis: Any, stream_arn: str, name: str) -> dict[str, Any] | None:
    """Register ``name``; its description (CREATING), or None when it exists already (another worker
    or operator registered it first: describe it). A service limit is explained, and retriable."""
    try:
        response = await kinesis.register_stream_consumer(StreamARN=stream_arn, ConsumerName=name)
    except Exception as exc:
        code = error_code(exc)
        if code == "ResourceInUseException":  # registered concurrently by another worker
            return None
        if code == "LimitExceededException":
            message = getattr(exc, "response", {}).get("Error", {}).get("Message", "")
            raise Retriable(
                f"cannot register consumer {name!r} on stream {stream_arn}: LimitExceededException ({message}); "
                + CONSUMER_LIMITS,
                code=code,
            ) from None
        raise translate(exc, resource=f"consumer {name!r} of stream {stream_arn}") from None
    log.info("consumer.registered", consumer=name, stream=stream_arn)
    return dict(response["Consumer"])


async def list_consumers(kinesis: Any, stream_arn: str) -> list[dict[str, Any]]:
    """Every consumer registered on the stream, in any status (ListStreamConsumers, paginated)."""
    consumers: list[dict[str, Any]] = []
    args: dict[str, Any] = {"StreamARN": stream_arn}
    try:
        while True:
            page = await kinesis.list_stream_consumers(**args)
            consumers.extend(dict(item) for item in page.get("Consumers", []))
            if not page.get("NextToken"):
                return consumers
            args["NextToken"] = page["NextToken"]
    except Exception as exc:
        raise translate(exc, resource=f"consumers of stream {stream_arn}") from None


async def deregister_consumer(kinesis: Any, arn: str) -> None:
    """Start deleting the consumer (DELETING, then gone): an operator's action only."""
    try:
        await kinesis.deregister_stream_consumer(ConsumerARN=arn)
    except Exception as exc:
        raise translate(exc, resource=f"consumer {arn!r}", hint="see 'efo consumers list'") from None
