"""efo's AWS clients against a server on loopback that records what reaches it: every call ends
its User-Agent with efo's name, and a DynamoDB request botocore would have refused before sending (it no
longer checks them: efo builds every one) goes to the service, whose ValidationException comes
back as efo's InvalidRequest naming the table."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
import pytest
from aiohttp import web
from botocore.exceptions import ClientError

from efo.aws import USER_AGENT_EXTRA, Clients, Endpoints
from efo.errors import InvalidRequest
from efo.leases.table import LeaseTable

from .loopback import serving

pytestmark = pytest.mark.integration

VALIDATION = (
    "1 validation error detected: Value 'ab' at 'tableName' failed to satisfy constraint: "
    "Member must have length greater than or equal to 3"
)


@asynccontextmanager
async def recording_server(seen: list[dict[str, str]]) -> AsyncIterator[str]:
    """Answers every request as DynamoDB answers an invalid one (400, ValidationException)."""

    async def answer(request: web.Request) -> web.Response:
        seen.append({"target": request.headers.get("X-Amz-Target", ""), "agent": request.headers["User-Agent"]})
        body = orjson.dumps({"__type": "com.amazon.coral.validate#ValidationException", "message": VALIDATION})
        return web.Response(status=400, body=body, content_type="application/x-amz-json-1.0")

    app = web.Application()
    app.router.add_post("/", answer)
    async with serving(app) as url:
        yield url


def test_a_dynamodb_request_goes_to_the_service_which_rejects_it_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SDK_UA_APP_ID", "lake-team")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    seen: list[dict[str, str]] = []

    async def run() -> None:
        async with recording_server(seen) as endpoint, Clients(Endpoints("us-east-1", endpoint, endpoint)) as clients:
            # 'ab' is shorter than a table name may be: botocore's own check would have raised
            # ParamValidationError without a request.
            table = LeaseTable(await clients.dynamodb(), table="ab", app="app", stream_arn="arn:s", worker_id="w")
            with pytest.raises(InvalidRequest) as raised:
                await table.read_meta()
            assert "table 'ab'" in str(raised.value) and "ValidationException" in str(raised.value)
            kinesis = await clients.kinesis()
            with pytest.raises(ClientError):
                await kinesis.describe_stream_summary(StreamName="orders")

    asyncio.run(run())
    targets = [request["target"] for request in seen]
    assert targets == ["DynamoDB_20120810.GetItem", "Kinesis_20131202.DescribeStreamSummary"]
    for request in seen:  # botocore's own User-Agent (your app id in it), then efo's name
        assert request["agent"].startswith("aiobotocore/") and request["agent"].endswith(" " + USER_AGENT_EXTRA)
        assert " app/lake-team " in request["agent"], request["agent"]
    assert USER_AGENT_EXTRA.startswith("efo/")
