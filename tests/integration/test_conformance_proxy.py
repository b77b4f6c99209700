"""The conformance proxy makes kinesis-local behave like AWS for SubscribeToShard (aiobotocore client)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiobotocore.session import get_session
from aiohttp import web
from botocore.config import Config
from botocore.exceptions import ClientError

from efo.devstack.eventstream import encode_message
from efo.devstack.faults import FaultClient
from efo.devstack.proxy import ProxyConfig, start_proxy
from efo.devstack.stack import StackEndpoints
from efo.kinesis.decoder import iter_events
from efo.observability import METRICS

from .service import trap_endpoint

pytestmark = pytest.mark.integration

SHARD0 = "shardId-000000000000"
TRIM_HORIZON = {"Type": "TRIM_HORIZON"}
AioFactory = Callable[..., Any]
DUMMY = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
# aiohttp's default connector holds at most 100 connections, and a subscription keeps one for its life.
MORE_SUBSCRIPTIONS_THAN_A_DEFAULT_POOL = 110
# The bound the proxy is configured with where a test waits for it to give up (its default is longer).
SHORT_BOUND_S = 1.0


@dataclass(frozen=True)
class Stream:
    name: str
    arn: str
    consumer_arn: str


def _wait_until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def make_stream(kinesis: Any, shards: int = 1) -> Stream:
    name = f"conf-{uuid.uuid4().hex[:10]}"
    kinesis.create_stream(StreamName=name, ShardCount=shards)

    def summary() -> dict[str, Any]:
        result: dict[str, Any] = kinesis.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
        return result

    _wait_until(lambda: summary()["StreamStatus"] == "ACTIVE", f"stream {name} ACTIVE")
    arn = summary()["StreamARN"]
    consumer_arn = kinesis.register_stream_consumer(StreamARN=arn, ConsumerName="efo-test")["Consumer"]["ConsumerARN"]
    _wait_until(
        lambda: kinesis.describe_stream_consumer(ConsumerARN=consumer_arn)["ConsumerDescription"]["ConsumerStatus"]
        == "ACTIVE",
        "consumer ACTIVE",
    )
    return Stream(name, arn, consumer_arn)


def put(kinesis: Any, stream: Stream, prefix: str, count: int) -> list[tuple[bytes, str]]:
    sent = []
    for i in range(count):
        data, key = f"{prefix}{i}".encode(), f"pk-{prefix}{i}"
        kinesis.put_record(StreamName=stream.name, Data=data, PartitionKey=key)
        sent.append((data, key))
    return sent


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def aio_client(endpoint_url: str, *, attempts: int = 1, connections: int = 10) -> Any:
    """An aiobotocore Kinesis client with ``connections`` in its pool and ``attempts`` tries per call."""
    config = Config(retries={"total_max_attempts": attempts, "mode": "standard"}, max_pool_connections=connections)
    return get_session().create_client(
        "kinesis", endpoint_url=endpoint_url, region_name="us-east-1", config=config, **DUMMY
    )


@asynccontextmanager
async def answer_held_back(upstream: str, hold_s: float) -> AsyncIterator[str]:
    """A TCP relay to ``upstream`` that holds back kinesis-local's answer to the first SubscribeToShard
    passing through it for ``hold_s``, as kinesis-local itself does when many subscriptions open at once."""
    host, port = upstream.removeprefix("http://").rsplit(":", 1)
    held = False

    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        nonlocal held
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        hold = asyncio.Event()

        async def to_upstream() -> None:
            nonlocal held
            while data := await client_reader.read(65536):
                if not held and b"SubscribeToShard" in data:
                    held = True
                    hold.set()
                upstream_writer.write(data)
                await upstream_writer.drain()

        async def to_client() -> None:
            while data := await upstream_reader.read(65536):
                if hold.is_set():
                    hold.clear()
                    await asyncio.sleep(hold_s)
                client_writer.write(data)
                await client_writer.drain()

        tasks = [asyncio.create_task(to_upstream()), asyncio.create_task(to_client())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            upstream_writer.close()
            client_writer.close()

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def records_of(events: list[dict[str, Any]]) -> list[tuple[bytes, str]]:
    return [(r["Data"], r["PartitionKey"]) for e in events for r in e["Records"]]


async def subscribe(client: Any, stream: Stream, position: dict[str, str] = TRIM_HORIZON) -> Any:
    response = await client.subscribe_to_shard(
        ConsumerARN=stream.consumer_arn, ShardId=SHARD0, StartingPosition=position
    )
    return response["EventStream"]


async def read_all(
    event_stream: Any,
    timeout_s: float,
    on_event: Callable[[int, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """All events until the server ends the stream (fails if it does not end within timeout_s)."""
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout_s):
        async for item in event_stream:
            events.append(item["SubscribeToShardEvent"])
            if on_event is not None:
                on_event(len(events), events[-1])
    return events


def add_fault(endpoints: StackEndpoints, rule: dict[str, Any]) -> dict[str, Any]:
    return FaultClient(endpoints.kinesis_endpoint).add(**rule)


def list_faults(endpoints: StackEndpoints) -> list[dict[str, Any]]:
    return FaultClient(endpoints.kinesis_endpoint).pending()


@pytest.fixture(autouse=True)
def _clear_faults(local_stack: StackEndpoints) -> Iterator[None]:
    yield
    FaultClient(local_stack.kinesis_endpoint).clear()


def test_subscribe_gets_initial_response_and_records(kinesis_client: Any, aio_kinesis_client: AioFactory) -> None:
    stream = make_stream(kinesis_client)
    sent = put(kinesis_client, stream, "a", 3)

    async def scenario() -> None:
        async with aio_kinesis_client() as client:
            event_stream = await subscribe(client, stream)
            async with asyncio.timeout(5):
                async for item in event_stream:
                    event = item["SubscribeToShardEvent"]
                    assert records_of([event]) == sent
                    assert "ChildShards" not in event  # AWS omits it mid-shard
                    assert event["ContinuationSequenceNumber"] == event["Records"][-1]["SequenceNumber"]
                    break

    run(scenario())


def test_efo_decodes_the_events_of_small_records_with_msgspec(
    kinesis_client: Any, aio_kinesis_client: AioFactory
) -> None:
    """Every field the emulator sends is one efo's typed decoder knows: no event is parsed twice."""
    stream = make_stream(kinesis_client)
    sent = put(kinesis_client, stream, "a", 3)
    decoded_twice = METRICS.events_decoded_twice._value.get()

    async def scenario() -> None:
        async with aio_kinesis_client() as client:
            event_stream = await subscribe(client, stream)
            async with asyncio.timeout(5):
                async for event in iter_events(event_stream):
                    assert list(zip(event.data, event.partition_keys, strict=True)) == sent
                    break

    run(scenario())
    assert METRICS.events_decoded_twice._value.get() == decoded_twice


def test_split_ends_parent_subscription_with_child_shards(kinesis_client: Any, aio_kinesis_client: AioFactory) -> None:
    stream = make_stream(kinesis_client)
    sent = put(kinesis_client, stream, "before", 3)

    def split_after_first_event(index: int, _event: dict[str, Any]) -> None:
        if index == 1:
            sent.extend(put(kinesis_client, stream, "late", 2))  # still in the parent, just before the split
            kinesis_client.split_shard(StreamName=stream.name, ShardToSplit=SHARD0, NewStartingHashKey=str(2**127))

    async def scenario() -> None:
        async with aio_kinesis_client() as client:
            events = await read_all(await subscribe(client, stream), 15, split_after_first_event)
        assert records_of(events) == sent
        final = events[-1]
        assert final["Records"] == []
        assert "ContinuationSequenceNumber" not in final
        children = {c["ShardId"]: c for c in final["ChildShards"]}
        assert set(children) == {"shardId-000000000001", "shardId-000000000002"}
        assert all(c["ParentShards"] == [SHARD0] for c in children.values())
        assert children["shardId-000000000002"]["HashKeyRange"]["StartingHashKey"] == str(2**127)
        assert all("ChildShards" not in e for e in events[:-1])

    run(scenario())


def test_subscription_lifetime_then_resubscribe_without_loss_or_duplicates(
    local_stack: StackEndpoints, kinesis_client: Any, aio_kinesis_client: AioFactory
) -> None:
    stream = make_stream(kinesis_client)
    sent = put(kinesis_client, stream, "a", 3)

    def put_more(index: int, _event: dict[str, Any]) -> None:
        if index == 1:
            sent.extend(put(kinesis_client, stream, "b", 2))

    async def scenario() -> None:
        runner, port = await start_proxy(
            ProxyConfig(upstream=local_stack.kinesis_upstream_endpoint, subscription_lifetime_s=2.5)
        )
        try:
            async with aio_kinesis_client(f"http://127.0.0.1:{port}") as client:
                started = time.monotonic()
                first = await read_all(await subscribe(client, stream), 10, put_more)
                assert 2.0 <= time.monotonic() - started <= 5.0
                continuation = first[-1]["ContinuationSequenceNumber"]
                sent.extend(put(kinesis_client, stream, "c", 2))
                position = {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": continuation}
                second = await read_all(await subscribe(client, stream, position), 10)
        finally:
            await runner.cleanup()
        assert records_of(first) + records_of(second) == sent

    run(scenario())


def test_concurrent_subscription_is_refused_at_the_call(kinesis_client: Any, aio_kinesis_client: AioFactory) -> None:
    stream = make_stream(kinesis_client)

    async def scenario() -> None:
        async with aio_kinesis_client() as client:
            first = await subscribe(client, stream)
            async with asyncio.timeout(5):
                await anext(aiter(first))
            with pytest.raises(ClientError) as refused:
                await subscribe(client, stream)
            assert refused.value.response["Error"]["Code"] == "ResourceInUseException"

    run(scenario())


def test_disconnect_releases_the_upstream_subscription(kinesis_client: Any, aio_kinesis_client: AioFactory) -> None:
    stream = make_stream(kinesis_client)

    async def scenario() -> None:
        async with aio_kinesis_client() as client:
            event_stream = await subscribe(client, stream)
            async with asyncio.timeout(5):
                await anext(aiter(event_stream))
        await asyncio.sleep(5)
        async with aio_kinesis_client() as client:
            event_stream = await subscribe(client, stream)
            async with asyncio.timeout(5):
                event = (await anext(aiter(event_stream)))["SubscribeToShardEvent"]
            assert event["Records"] == []

    run(scenario())


def test_fault_control_api_lists_and_rejects(local_stack: StackEndpoints) -> None:
    rule = add_fault(local_stack, {"operation": "PutRecord", "action": "error", "count": 2})
    assert rule["count"] == 2
    assert [r["id"] for r in list_faults(local_stack)] == [rule["id"]]
    bad = urllib.request.Request(
        f"{local_stack.kinesis_endpoint}/_efo/faults",
        data=json.dumps({"operation": "PutRecord", "action": "reset"}).encode(),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as rejected:
        urllib.request.urlopen(bad, timeout=5)
    assert rejected.value.code == 400
    with pytest.raises(urllib.error.HTTPError) as unknown:
        urllib.request.urlopen(f"{local_stack.kinesis_endpoint}/_efo/nope", timeout=5)
    assert unknown.value.code == 404


def test_fault_error_on_plain_operation(local_stack: StackEndpoints, kinesis_client: Any) -> None:
    stream = make_stream(kinesis_client)
    add_fault(
        local_stack,
        {"operation": "PutRecord", "action": "error", "error_code": "ProvisionedThroughputExceededException"},
    )
    with pytest.raises(ClientError) as failed:
        put(kinesis_client, stream, "x", 1)
    assert failed.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    put(kinesis_client, stream, "x", 1)  # count=1: fired once, then gone
    assert list_faults(local_stack) == []


def test_fault_error_on_subscribe(
    local_stack: StackEndpoints, kinesis_client: Any, aio_kinesis_client: AioFactory
) -> None:
    stream = make_stream(kinesis_client)
    add_fault(
        local_stack,
        {"operation": "SubscribeToShard", "shard_id": SHARD0, "action": "error", "status": 500, "message": "boom"},
    )

    async def scenario() -> None:
        async with aio_kinesis_client() as client:
            with pytest.raises(ClientError) as failed:
                await subscribe(client, stream)
        assert failed.value.response["Error"] == {"Code": "InternalFailure", "Message": "boom"}

    run(scenario())


def test_fault_exception_frame(
    local_stack: StackEndpoints, kinesis_client: Any, aio_kinesis_client: AioFactory
) -> None:
    stream = make_stream(kinesis_client)
    add_fault(
        local_stack,
        {
            "operation": "SubscribeToShard",
            "action": "exception_frame",
            "after_events": 1,
            "error_code": "ResourceInUseException",
        },
    )

    async def scenario() -> None:
        async with aio_kinesis_client() as client:
            with pytest.raises(ClientError) as failed:
                await read_all(await subscribe(client, stream), 10)
        assert failed.value.response["Error"]["Code"] == "ResourceInUseException"

    run(scenario())


def test_fault_reset_mid_frame(
    local_stack: StackEndpoints, kinesis_client: Any, aio_kinesis_client: AioFactory
) -> None:
    stream = make_stream(kinesis_client)
    put(kinesis_client, stream, "a", 1)
    add_fault(local_stack, {"operation": "SubscribeToShard", "action": "reset", "after_events": 1})
    seen: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with aio_kinesis_client() as client:
            with pytest.raises(aiohttp.ClientPayloadError):
                await read_all(await subscribe(client, stream), 10, lambda _i, e: seen.append(e))

    run(scenario())
    assert len(seen) == 1


def test_fault_stall(local_stack: StackEndpoints, kinesis_client: Any, aio_kinesis_client: AioFactory) -> None:
    stream = make_stream(kinesis_client)
    add_fault(local_stack, {"operation": "SubscribeToShard", "action": "stall", "after_events": 1, "stall_s": 2.5})

    async def scenario() -> None:
        async with aio_kinesis_client() as client:
            event_stream = aiter(await subscribe(client, stream))
            async with asyncio.timeout(10):
                await anext(event_stream)
                started = time.monotonic()
                await anext(event_stream)
                assert time.monotonic() - started >= 2.4

    run(scenario())


def test_advance_continuation_moves_the_continuation_of_every_event_without_records(
    local_stack: StackEndpoints, kinesis_client: Any, aio_kinesis_client: AioFactory
) -> None:
    """kinesis-local keeps an idle shard's continuation at its last record; with the rule, each
    empty event carries a newer one, below the next record, and records pass unchanged."""
    stream = make_stream(kinesis_client)
    sent = put(kinesis_client, stream, "a", 1)
    add_fault(local_stack, {"operation": "SubscribeToShard", "shard_id": SHARD0, "action": "advance_continuation"})
    events: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with aio_kinesis_client() as client:
            event_stream = aiter(await subscribe(client, stream))
            async with asyncio.timeout(15):
                while len(events) < 4:
                    events.append((await anext(event_stream))["SubscribeToShardEvent"])
                sent.extend(put(kinesis_client, stream, "b", 1))
                while not events[-1]["Records"]:
                    events.append((await anext(event_stream))["SubscribeToShardEvent"])

    run(scenario())
    first, *idle, last = events
    assert first["ContinuationSequenceNumber"] == first["Records"][-1]["SequenceNumber"]
    continuations = [int(e["ContinuationSequenceNumber"]) for e in [first, *idle]]
    assert all(not e["Records"] for e in idle) and len(idle) >= 3
    assert continuations == sorted(set(continuations)), f"not moved on at every empty event: {continuations}"
    assert int(last["Records"][0]["SequenceNumber"]) > continuations[-1]
    assert last["ContinuationSequenceNumber"] == last["Records"][-1]["SequenceNumber"]
    assert records_of(events) == sent
    assert list_faults(local_stack) == []  # one subscription: its one firing taken


def test_subscribe_to_already_closed_shard_ends_after_its_records(
    kinesis_client: Any, aio_kinesis_client: AioFactory
) -> None:
    stream = make_stream(kinesis_client)
    sent = put(kinesis_client, stream, "a", 2)
    kinesis_client.split_shard(StreamName=stream.name, ShardToSplit=SHARD0, NewStartingHashKey=str(2**127))
    _wait_until(lambda: len(kinesis_client.list_shards(StreamName=stream.name)["Shards"]) == 3, "split done")

    async def scenario() -> None:
        async with aio_kinesis_client() as client:
            events = await read_all(await subscribe(client, stream), 10)
        assert records_of(events) == sent
        assert len(events[-1]["ChildShards"]) == 2
        assert "ContinuationSequenceNumber" not in events[-1]

    run(scenario())


def test_more_than_100_subscriptions_are_all_answered_and_other_calls_still_pass(
    local_stack: StackEndpoints, kinesis_client: Any
) -> None:
    shards = MORE_SUBSCRIPTIONS_THAN_A_DEFAULT_POOL
    stream = make_stream(kinesis_client, shards)

    async def scenario() -> None:
        # Three attempts, as the SDK's default: a subscription kinesis-local is too busy to answer
        # within the proxy's bound gets 503, which the SDK retries (a loaded machine: 1 of 110).
        async with aio_client(local_stack.kinesis_endpoint, attempts=3, connections=shards + 10) as client:
            async with asyncio.timeout(45):
                answered = await asyncio.gather(
                    *(
                        client.subscribe_to_shard(
                            ConsumerARN=stream.consumer_arn, ShardId=f"shardId-{i:012d}", StartingPosition=TRIM_HORIZON
                        )
                        for i in range(shards)
                    )
                )
            assert len(answered) == shards
            # Every subscription holds its connection through the proxy; other calls do not queue behind them.
            started = time.monotonic()
            async with asyncio.timeout(10):
                summary = await client.describe_stream_summary(StreamName=stream.name)
            assert summary["StreamDescriptionSummary"]["OpenShardCount"] == shards
            assert time.monotonic() - started < 5

    run(scenario())


def test_upstream_that_never_answers_gets_503_within_the_bound_and_the_sdk_retries_it() -> None:
    async def scenario() -> None:
        with trap_endpoint() as (trap, accepted):
            runner, port = await start_proxy(ProxyConfig(upstream=trap, response_timeout_s=SHORT_BOUND_S))
            proxy = f"http://127.0.0.1:{port}"
            consumer_arn = "arn:aws:kinesis:us-east-1:000000000000:stream/trap/consumer/c:1"
            try:
                async with aio_client(proxy) as client:
                    calls = {
                        "DescribeStreamSummary": lambda: client.describe_stream_summary(StreamName="trap"),
                        "SubscribeToShard": lambda: client.subscribe_to_shard(
                            ConsumerARN=consumer_arn, ShardId=SHARD0, StartingPosition=TRIM_HORIZON
                        ),
                    }
                    for operation, call in calls.items():
                        started = time.monotonic()
                        with pytest.raises(ClientError) as failed:
                            async with asyncio.timeout(15):
                                await call()
                        elapsed_s = time.monotonic() - started
                        error = failed.value.response
                        assert error["Error"]["Code"] == "ServiceUnavailable", operation
                        assert error["ResponseMetadata"]["HTTPStatusCode"] == 503, operation
                        assert SHORT_BOUND_S <= elapsed_s < SHORT_BOUND_S + 3, (operation, elapsed_s)
                assert accepted() == 2
                async with aio_client(proxy, attempts=3) as client:
                    with pytest.raises(ClientError) as failed:
                        async with asyncio.timeout(30):
                            await client.describe_stream_summary(StreamName="trap")
                assert failed.value.response["ResponseMetadata"]["RetryAttempts"] == 2
                assert accepted() == 3  # botocore took the 503 as retriable: three attempts reached upstream
            finally:
                await runner.cleanup()

    run(scenario())


def test_upstream_stream_gone_silent_ends_with_internal_failure_exception_within_the_bound() -> None:
    """kinesis-local sends a frame every second; a subscription it stops feeding must not hang the client."""
    one_event = encode_message(
        {":message-type": "event", ":event-type": "SubscribeToShardEvent", ":content-type": "application/json"},
        json.dumps({"Records": [], "ContinuationSequenceNumber": "1", "MillisBehindLatest": 0}).encode(),
    )

    async def silent_upstream(request: web.Request) -> web.StreamResponse:
        if request.headers.get("X-Amz-Target", "").endswith("ListShards"):
            return web.json_response({"Shards": []})
        response = web.StreamResponse(headers={"Content-Type": "application/vnd.amazon.eventstream"})
        await response.prepare(request)
        await response.write(one_event)
        await asyncio.Event().wait()
        return response

    async def scenario() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", silent_upstream)
        upstream = web.AppRunner(app, handler_cancellation=True)
        await upstream.setup()
        site = web.TCPSite(upstream, "127.0.0.1", 0)
        await site.start()
        upstream_port = site._server.sockets[0].getsockname()[1]
        runner, port = await start_proxy(
            ProxyConfig(upstream=f"http://127.0.0.1:{upstream_port}", stream_idle_timeout_s=SHORT_BOUND_S)
        )
        try:
            async with aio_client(f"http://127.0.0.1:{port}") as client:
                response = await client.subscribe_to_shard(
                    ConsumerARN="arn:aws:kinesis:us-east-1:000000000000:stream/s/consumer/c:1",
                    ShardId=SHARD0,
                    StartingPosition=TRIM_HORIZON,
                )
                events = aiter(response["EventStream"])
                async with asyncio.timeout(10):
                    await anext(events)
                    started = time.monotonic()
                    with pytest.raises(ClientError) as failed:
                        await anext(events)
                assert failed.value.response["Error"]["Code"] == "InternalFailureException"
                # The proxy's idle timer starts when it forwards the first event, a little before this
                # client has read it (more so on a loaded machine): allow that much on the lower bound.
                assert SHORT_BOUND_S - 0.25 <= time.monotonic() - started < SHORT_BOUND_S + 3
        finally:
            await runner.cleanup()
            await upstream.cleanup()

    run(scenario())


def test_a_subscription_answered_503_is_not_refused_as_in_use_when_the_sdk_retries_it(
    local_stack: StackEndpoints, kinesis_client: Any
) -> None:
    """On AWS a subscription that got 503 does not exist; kinesis-local keeps the one the proxy gave up
    on in use for seconds after the proxy hangs up, so the proxy must retry the SDK's retry upstream."""
    stream = make_stream(kinesis_client)
    sent = put(kinesis_client, stream, "a", 1)

    bound_s = 2.5  # kinesis-local sends a subscription's first frame (or its refusal) about 1 s after the call

    async def scenario() -> None:
        async with answer_held_back(local_stack.kinesis_upstream_endpoint, 2 * bound_s) as upstream:
            runner, port = await start_proxy(ProxyConfig(upstream=upstream, response_timeout_s=bound_s))
            try:
                async with aio_client(f"http://127.0.0.1:{port}", attempts=3) as client:
                    async with asyncio.timeout(20):
                        response = await subscribe(client, stream)
                        event = (await anext(aiter(response)))["SubscribeToShardEvent"]
                assert records_of([event]) == sent
            finally:
                await runner.cleanup()

    run(scenario())
