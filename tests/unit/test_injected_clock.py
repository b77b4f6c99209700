"""Parts outside the lease plane take their time from the one injected clock too (efo/clock.py): a
shard's last-event time and the wait for a consumer to become ACTIVE, so that they run on virtual
time in a test or the simulation as they run on the system clock in production."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from efo.errors import ResourceNotFound
from efo.kinesis.registration import ensure_consumer
from efo.observability import Metrics
from efo.sim.clock import EPOCH, SimClock
from efo.sim.loop import run as run_virtual


def test_a_shard_s_last_event_time_is_the_injected_clock_s_wall_time() -> None:
    async def scenario() -> None:
        clock = SimClock()
        metrics = Metrics.create(CollectorRegistry())
        series = metrics.shard("orders", "shardId-000000000001", clock)
        await clock.sleep(42.0)
        series.event(lag_ms=1500)
        value = metrics.registry.get_sample_value(
            "efo_shard_last_event_timestamp_seconds", {"stream": "orders", "shard_id": "shardId-000000000001"}
        )
        assert value == EPOCH.timestamp() + 42.0

    run_virtual(scenario())


class CreatingForEver:
    """A consumer that stays CREATING: every DescribeStreamConsumer says so."""

    def __init__(self) -> None:
        self.calls = 0

    async def describe_stream_consumer(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        arn = "arn:aws:kinesis:us-east-1:123456789012:stream/s/consumer/c:1"
        return {"ConsumerDescription": {"ConsumerARN": arn, "ConsumerName": "c", "ConsumerStatus": "CREATING"}}


def test_a_consumer_that_never_becomes_active_times_out_on_the_injected_clock() -> None:
    kinesis = CreatingForEver()

    async def scenario() -> float:
        clock = SimClock()
        with pytest.raises(ResourceNotFound, match="did not become ACTIVE within 120 s"):
            await ensure_consumer(
                kinesis, stream_arn="arn:aws:kinesis:us-east-1:123456789012:stream/s", name="c", clock=clock
            )
        return clock.now()

    waited_s = run_virtual(scenario())
    assert 120.0 < waited_s < 130.0 and kinesis.calls > 20  # backoff from 0.5 s to 5 s, in virtual time
