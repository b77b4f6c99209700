"""The local stack at the scale the service claims: a 256-shard stream on the stack as ``efo dev up``
starts it (the session fixture uses the same defaults), every shard subscribed at once through the
conformance proxy with a plain aiobotocore client, then ``efo run`` on the same stream.

The measured times are recorded (``record_property``) and printed at the end of the run. A test of
scale, 60-70 s of a process of make test and most of a core for the local Kinesis: it runs in
``make chaos`` (``long``). make test keeps the smaller ones: more than 100 subscriptions through the
proxy (test_conformance_proxy.py), more shards than the HTTP client's default pool (test_service.py).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import ClientError

from efo.devstack.stack import StackEndpoints

from .service import ServiceRun, arrow_env, create_stream, unique

pytestmark = [pytest.mark.integration, pytest.mark.long]

SHARDS = 256
# Generous bounds. Measured on 2 shared cores: all answered, first records in, within 5.6-14 s; ready in 23-38 s.
SUBSCRIBED_WITHIN_S = 60.0
READY_WITHIN_S = 150.0
# The SDK's standard retry mode: the proxy answers 503 ServiceUnavailable to a subscription kinesis-local
# does not answer within 10 s, which happens to a few of 256 opened at the same instant.
SDK_ATTEMPTS = 5
# On a loaded machine a subscription can miss all of them (kinesis-local is one Node process); the
# probe then asks again, as efo does, within SUBSCRIBED_WITHIN_S.
RETRIABLE = {"ServiceUnavailable", "ResourceInUseException", "LimitExceededException"}


def list_all_shards(kinesis: Any, stream: str) -> list[dict[str, Any]]:
    page = kinesis.list_shards(StreamName=stream)
    shards: list[dict[str, Any]] = page["Shards"]
    while page.get("NextToken"):
        page = kinesis.list_shards(NextToken=page["NextToken"])
        shards += page["Shards"]
    return shards


def register_consumer(kinesis: Any, stream_arn: str, name: str) -> str:
    consumer_arn: str = kinesis.register_stream_consumer(StreamARN=stream_arn, ConsumerName=name)["Consumer"][
        "ConsumerARN"
    ]
    deadline = time.monotonic() + 30
    while kinesis.describe_stream_consumer(ConsumerARN=consumer_arn)["ConsumerDescription"]["ConsumerStatus"] != (
        "ACTIVE"
    ):
        assert time.monotonic() < deadline, f"consumer {name} not ACTIVE after 30 s"
        time.sleep(0.1)
    return consumer_arn


async def subscribe_all(stack: StackEndpoints, consumer_arn: str, shard_ids: list[str]) -> dict[str, Any]:
    """Subscribe to every shard at once; per shard the time it was answered, of its first record, its data."""
    config = Config(
        retries={"total_max_attempts": SDK_ATTEMPTS, "mode": "standard"}, max_pool_connections=len(shard_ids) + 10
    )
    answered_s: dict[str, float] = {}
    first_record_s: dict[str, float] = {}
    data: dict[str, bytes] = {}
    retried: list[str] = []
    async with get_session().create_client(
        "kinesis",
        endpoint_url=stack.kinesis_endpoint,
        region_name=stack.region,
        config=config,
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ) as client:
        started = time.monotonic()

        async def one(shard_id: str) -> None:
            while True:  # as a consumer does: a subscription refused for a retriable reason is asked for again
                try:
                    response = await client.subscribe_to_shard(
                        ConsumerARN=consumer_arn, ShardId=shard_id, StartingPosition={"Type": "TRIM_HORIZON"}
                    )
                    break
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") not in RETRIABLE:
                        raise
                    retried.append(shard_id)
                    await asyncio.sleep(1.0)
            answered_s[shard_id] = time.monotonic() - started
            if response["ResponseMetadata"]["RetryAttempts"]:
                retried.append(shard_id)
            async for item in response["EventStream"]:
                records = item["SubscribeToShardEvent"]["Records"]
                if records:
                    first_record_s[shard_id] = time.monotonic() - started
                    data[shard_id] = records[0]["Data"]
                    return

        async with asyncio.timeout(SUBSCRIBED_WITHIN_S):
            await asyncio.gather(*(one(shard_id) for shard_id in shard_ids))
    return {"answered_s": answered_s, "first_record_s": first_record_s, "data": data, "retried": retried}


def test_256_shards_all_subscribed_at_once_through_the_proxy_and_efo_run_gets_ready(
    local_stack: StackEndpoints, kinesis_client: Any, tmp_path: Path, record_property: Any
) -> None:
    stream = unique("scale")
    create_stream(kinesis_client, stream, SHARDS)
    try:
        shards = list_all_shards(kinesis_client, stream)
        assert len(shards) == SHARDS
        # One record per shard, its data naming the shard it was aimed at.
        put = kinesis_client.put_records(
            StreamName=stream,
            Records=[
                {
                    "Data": shard["ShardId"].encode(),
                    "PartitionKey": "k",
                    "ExplicitHashKey": shard["HashKeyRange"]["StartingHashKey"],
                }
                for shard in shards
            ],
        )
        assert put["FailedRecordCount"] == 0
        assert sorted(r["ShardId"] for r in put["Records"]) == sorted(s["ShardId"] for s in shards)
        summary = kinesis_client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
        consumer_arn = register_consumer(kinesis_client, summary["StreamARN"], "scale-probe")

        shard_ids = [shard["ShardId"] for shard in shards]
        probe = asyncio.run(subscribe_all(local_stack, consumer_arn, shard_ids))
        answered, first = probe["answered_s"], probe["first_record_s"]
        figures = {
            "subscriptions_answered_max_s": round(max(answered.values()), 1),
            "subscriptions_answered_p50_s": round(statistics.median(answered.values()), 1),
            "first_records_max_s": round(max(first.values()), 1),
            "subscriptions_retried_after_503": len(set(probe["retried"])),
        }
        assert len(answered) == len(first) == SHARDS, figures
        assert probe["data"] == {shard_id: shard_id.encode() for shard_id in shard_ids}

        run = ServiceRun(
            arrow_env(  # the sink is not what this measures: no JVM to start
                local_stack,
                stream=stream,
                app=unique("scale-app"),
                sink_dir=tmp_path / "out",
                initial_position="TRIM_HORIZON",
            ),
            tmp_path / "efo-run.log",
        )
        started = time.monotonic()
        run.start()
        try:
            ready = run.wait_for_event("service.ready", timeout_s=READY_WITHIN_S)
            figures["efo_run_ready_s"] = round(time.monotonic() - started, 1)
            assert ready["shards"] == SHARDS
        finally:
            figures["efo_run_exit_code"] = run.stop()
        for name, value in figures.items():
            record_property(name, value)
        print(f"{SHARDS} shards: {figures}")
        assert figures["efo_run_exit_code"] == 0, run.tail()
    finally:
        kinesis_client.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)
