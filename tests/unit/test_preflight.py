"""``efo run``'s read-only consumer check (efo/preflight.py) without a server: a consumer ARN must
be registered; a name is registered already, or will be, and then the stream must have room for
one more under Kinesis's 20, as its description's ConsumerCount says (no ListStreamConsumers)."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions
import pytest

from efo.config import load_settings
from efo.errors import EfoError, ResourceNotFound
from efo.kinesis.registration import StreamInfo
from efo.preflight import Plan, _check_consumer

ARN = "arn:aws:kinesis:eu-west-1:1:stream/orders"


class Kinesis:
    """DescribeStreamConsumer: the consumers ``registered`` (by name), none other; nothing else."""

    def __init__(self, *registered: str) -> None:
        self.registered = registered

    async def describe_stream_consumer(self, **call: Any) -> Any:
        name = call.get("ConsumerName") or call["ConsumerARN"].rsplit("/", 1)[-1].split(":")[0]
        if name in self.registered:
            return {"ConsumerDescription": {"ConsumerName": name, "ConsumerStatus": "ACTIVE"}}
        error = {"Error": {"Code": "ResourceNotFoundException", "Message": f"consumer {name} not found"}}
        raise botocore.exceptions.ClientError(error, "DescribeStreamConsumer")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("EFO_"):
            monkeypatch.delenv(name)


def check(kinesis: Kinesis, consumers: int, **values: Any) -> Plan:
    settings = load_settings(stream="orders", app="billing", sink="console", **values)
    stream = StreamInfo("orders", ARN, datetime.now(UTC), "ACTIVE", 2, consumers)
    plan = Plan()
    asyncio.run(_check_consumer(kinesis, settings, stream, plan))
    return plan


def test_a_consumer_to_register_is_planned_while_the_stream_has_room() -> None:
    plan = check(Kinesis(), 19)
    assert plan.changes() == ["register consumer 'billing' on stream 'orders'"]


def test_a_consumer_to_register_on_a_stream_at_the_limit_is_refused_before_anything_changes() -> None:
    with pytest.raises(EfoError) as refused:
        check(Kinesis(), 20)
    assert "stream 'orders' has 20 consumers, Kinesis's limit: consumer 'billing' cannot be registered" in str(
        refused.value
    )


def test_a_registered_consumer_needs_no_room_and_nothing_is_planned() -> None:
    assert check(Kinesis("billing"), 20).changes() == []


def test_a_consumer_arn_that_is_not_registered_is_not_found() -> None:
    with pytest.raises(ResourceNotFound):
        check(Kinesis(), 1, consumer_arn=f"{ARN}/consumer/gone:1700000000")
