"""AWS-conformance proxy in front of kinesis-local.

kinesis-local differs from AWS in ways that break real SDK consumers; this proxy fixes them:

* SubscribeToShard gets the leading ``initial-response`` event that botocore requires.
* A refused subscription (exception as the first frame of a 200 response) becomes the HTTP
  error AWS answers with, so the SDK raises ClientError at the call.
* At the end of a closed shard, a final event with ChildShards and no
  ContinuationSequenceNumber is sent and the response ends (kinesis-local never does).
* ``ChildShards: null`` in mid-shard events is dropped (AWS omits the key).
* Optional subscription lifetime (AWS ends subscriptions after 5 minutes).
* Fault injection through ``/_efo/faults`` (see ``efo.devstack.faults``), and on request a
  ContinuationSequenceNumber that moves on every event without records (``advance_continuation``).
* No cap on connections to kinesis-local (each subscription holds one for its life), and every wait
  on it is bounded: a request it does not take or answer in time gets the answer AWS gives when it
  cannot serve one (503 ServiceUnavailable, which the SDKs retry), a subscription it stops feeding
  ends with an InternalFailureException event. Only waits on the client (a full TCP window: backpressure;
  a ``stall`` fault) last as long as the client lets them.

Everything else is passed through unchanged. Run: ``python -m efo.devstack.proxy --port P --upstream URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from multidict import CIMultiDict

from efo.devstack.eventstream import Frame, decode_message, encode_message, frame_length
from efo.devstack.faults import ADVANCE_CONTINUATION, SUBSCRIBE, FaultRule, FaultRules, RuleError, request_resources
from efo.devstack.listings import Shard, ShardListings, StreamKey

log = logging.getLogger("efo.devstack.proxy")

TARGET_PREFIX = "Kinesis_20131202."
EVENTSTREAM_CONTENT_TYPE = "application/vnd.amazon.eventstream"
AWS_JSON_CONTENT_TYPE = "application/x-amz-json-1.1"
LOOPBACK = "127.0.0.1"
DEFAULT_REGION = "us-east-1"
DEFAULT_ACCESS_KEY = "test"
# kinesis-local keeps refusing a consumer+shard for 3-4 s after its subscription connection closes.
# AWS frees it at once when the *service* ended the subscription (or never made it: a 503), so after
# proxy-initiated ends the proxy retries a refused upstream subscribe for up to this long.
RELEASE_GRACE_S = 6.0
RELEASE_RETRY_INTERVAL_S = 0.25
# A new connection to kinesis-local (loopback: instant unless it stopped accepting).
CONNECT_TIMEOUT_S = 5.0
# From sending a request to its response headers; then again for the body of a plain call, the first
# event of a subscription, each ListShards page. Measured with 256 subscriptions opened at once:
# kinesis-local sent the headers within 4-10 s (p50 2-5 s) and the first event 1 s after them; the
# few it keeps waiting longer get 503 and the SDK's retry.
RESPONSE_TIMEOUT_S = 10.0
# kinesis-local sends an event every second on an open subscription, records or not.
STREAM_IDLE_TIMEOUT_S = 30.0
# What kinesis-local can fail with; the caller gets 503 ServiceUnavailable.
_UPSTREAM_ERRORS = (TimeoutError, aiohttp.ClientError, ConnectionError)

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)
_CREDENTIAL_SCOPE = re.compile(r"Credential=([^/,\s]+)/\d{8}/([^/,\s]+)/")

INITIAL_RESPONSE = encode_message(
    {":message-type": "event", ":event-type": "initial-response", ":content-type": "application/json"},
    b"{}",
)


@dataclass(frozen=True)
class ProxyConfig:
    upstream: str
    subscription_lifetime_s: float = 0.0  # 0 = subscriptions last until the client or upstream ends them
    shard_check_interval_s: float = 1.0  # a stream is listed at most this often, for all its subscriptions
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    response_timeout_s: float = RESPONSE_TIMEOUT_S
    stream_idle_timeout_s: float = STREAM_IDLE_TIMEOUT_S


def _event_frame(payload: dict[str, Any]) -> bytes:
    headers = {":message-type": "event", ":event-type": "SubscribeToShardEvent", ":content-type": "application/json"}
    return encode_message(headers, json.dumps(payload, separators=(",", ":")).encode())


def _exception_frame(exception_type: str, message: str) -> bytes:
    headers = {":message-type": "exception", ":exception-type": exception_type, ":content-type": "application/json"}
    return encode_message(headers, json.dumps({"message": message}).encode())


def aws_error(status: int, code: str, message: str) -> web.Response:
    """An error response as AWS JSON-protocol services send it (botocore raises ClientError(code))."""
    body = json.dumps({"__type": code, "message": message}).encode()
    return web.Response(
        status=status,
        body=body,
        headers={"Content-Type": AWS_JSON_CONTENT_TYPE, "x-amzn-ErrorType": code},
    )


def _forward_headers(headers: Any) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _HOP_BY_HOP)


def _credential_scope(authorization: str) -> tuple[str, str]:
    match = _CREDENTIAL_SCOPE.search(authorization)
    if match is None:
        return DEFAULT_ACCESS_KEY, DEFAULT_REGION
    return match.group(1), match.group(2)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _is_exception(frame: Frame) -> bool:
    return frame.headers.get(":message-type") == "exception"


class _FrameReader:
    def __init__(self, content: aiohttp.StreamReader) -> None:
        self._content = content

    async def next(self) -> tuple[bytes, Frame] | None:
        """Next complete upstream frame (raw bytes and decoded), or None at end of stream."""
        try:
            head = await self._content.readexactly(4)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise ConnectionError("upstream ended inside an event-stream frame") from exc
            return None
        rest = await self._content.readexactly(frame_length(head) - 4)
        raw = head + rest
        return raw, decode_message(raw)


@dataclass
class _Subscription:
    """Per-subscription state for closed-shard detection."""

    shard_id: str
    stream: StreamKey
    children: list[Shard] = field(default_factory=list)


class ConformanceProxy:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.faults = FaultRules()
        self._upstream = config.upstream.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._listings = ShardListings(self._list_shards, config.shard_check_interval_s)
        self._active: dict[tuple[str, str], int] = {}
        self._released: dict[tuple[str, str], float] = {}  # (consumer, shard) -> proxy-initiated end time

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/_efo/faults", self._list_faults)
        app.router.add_post("/_efo/faults", self._add_fault)
        app.router.add_delete("/_efo/faults", self._clear_faults)
        app.router.add_route("*", "/_efo/{tail:.*}", self._unknown_control)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_startup.append(self._open_session)
        app.on_cleanup.append(self._close_session)
        return app

    async def _open_session(self, _app: web.Application) -> None:
        self._session = aiohttp.ClientSession(
            # No cap: every subscription holds its connection for its whole life, and aiohttp's default
            # of 100 left the 101st subscription, and every call behind it, waiting with no timeout.
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
            # No total: a subscription's body streams for minutes. The waits on answers are bounded
            # where they happen (response_timeout_s, stream_idle_timeout_s).
            timeout=aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout_s),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )

    async def _close_session(self, _app: web.Application) -> None:
        await self._listings.close()
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("proxy application not started")
        return self._session

    # Control API ---------------------------------------------------------------------------

    async def _list_faults(self, _request: web.Request) -> web.Response:
        return web.json_response(self.faults.to_json())

    async def _add_fault(self, request: web.Request) -> web.Response:
        try:
            rule = self.faults.add(await request.json())
        except (RuleError, ValueError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        log.info("fault rule added: %s", rule.to_json())
        return web.json_response(rule.to_json(), status=201)

    async def _clear_faults(self, _request: web.Request) -> web.Response:
        self.faults.clear()
        return web.json_response([])

    async def _unknown_control(self, _request: web.Request) -> web.Response:
        return web.json_response({"error": "unknown control endpoint"}, status=404)

    # Proxying ------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        body = await request.read()
        target = request.headers.get("X-Amz-Target", "")
        operation = target.removeprefix(TARGET_PREFIX) if target else ""
        request_json = _json_object(body) if operation else {}
        shard_id = request_json.get("ShardId")
        named = request_resources(request_json)
        rule = (
            self.faults.take(operation, shard_id if isinstance(shard_id, str) else None, named) if operation else None
        )
        if rule is not None and rule.action == "error":
            log.info("fault %d: answering %s with %d %s", rule.id, operation, rule.status, rule.error_code)
            return aws_error(rule.status, rule.error_code, rule.message)
        if operation == SUBSCRIBE:
            return await self._subscribe(request, body, request_json, rule, started)
        operation = operation or f"{request.method} {request.path}"
        try:
            async with asyncio.timeout(self.config.response_timeout_s):
                upstream = await self.session.request(
                    request.method,
                    self._upstream + request.rel_url.raw_path_qs,
                    headers=_forward_headers(request.headers),
                    data=body,
                    allow_redirects=False,
                )
        except _UPSTREAM_ERRORS as exc:
            return self._unavailable(operation, started, exc)
        try:
            return await self._passthrough(upstream, operation, started)
        finally:
            upstream.release()

    async def _passthrough(self, upstream: aiohttp.ClientResponse, operation: str, started: float) -> web.Response:
        """The upstream response as it is; its body read within response_timeout_s."""
        try:
            async with asyncio.timeout(self.config.response_timeout_s):
                payload = await upstream.read()
        except _UPSTREAM_ERRORS as exc:
            return self._unavailable(operation, started, exc)
        return web.Response(status=upstream.status, body=payload, headers=_forward_headers(upstream.headers))

    def _unavailable(self, operation: str, started: float, exc: BaseException) -> web.Response:
        """What AWS answers when it cannot serve a request in time: 503 ServiceUnavailable, retried by the SDKs."""
        cause = "no answer in time" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        log.warning(
            "upstream.unavailable operation=%s after=%.1fs cause=%s", operation, time.monotonic() - started, cause
        )
        return aws_error(503, "ServiceUnavailable", f"kinesis-local did not answer {operation} ({cause}); try again")

    async def _subscribe(
        self, request: web.Request, body: bytes, request_json: dict[str, Any], rule: FaultRule | None, started: float
    ) -> web.StreamResponse:
        shard_id = str(request_json.get("ShardId", ""))
        consumer_arn = str(request_json.get("ConsumerARN", ""))
        access_key, region = _credential_scope(request.headers.get("Authorization", ""))
        sub = _Subscription(
            shard_id=shard_id, stream=StreamKey(access_key, region, consumer_arn.split("/consumer/", 1)[0])
        )
        key = (consumer_arn, shard_id)
        try:
            # Before subscribing upstream, so that closure is known before the first event is generated.
            await self._refresh_children(sub)
            upstream, first = await self._open_upstream(request, body, key)
        except _UPSTREAM_ERRORS as exc:
            # On AWS a subscription answered 503 does not exist, but kinesis-local keeps what it got of it in
            # use for seconds after the proxy hangs up: the SDK's retry must not be refused with ResourceInUse.
            self._released[key] = time.monotonic()
            return self._unavailable(SUBSCRIBE, started, exc)
        events = 0
        reason = "client disconnected"
        self._active[key] = self._active.get(key, 0) + 1
        try:
            if upstream.status != 200:
                reason = f"upstream status {upstream.status}"
                return await self._passthrough(upstream, SUBSCRIBE, started)
            if first is None:
                reason = "upstream ended before the first event"
                return aws_error(500, "InternalFailure", "upstream ended the subscription before any event")
            if _is_exception(first[1]):
                code = first[1].headers.get(":exception-type", "InternalFailure")
                reason = f"refused: {code}"
                message = str(_json_object(first[1].payload).get("message", code))
                return aws_error(500 if code == "InternalFailure" else 400, code, message)

            response = web.StreamResponse(
                status=200,
                headers={
                    "Content-Type": EVENTSTREAM_CONTENT_TYPE,
                    "x-amzn-RequestId": upstream.headers.get("x-amzn-RequestId", ""),
                },
            )
            await response.prepare(request)
            await response.write(INITIAL_RESPONSE)
            log.info(
                "subscription start shard=%s consumer=%s position=%s",
                shard_id,
                consumer_arn,
                (request_json.get("StartingPosition") or {}).get("Type"),
            )
            reader = _FrameReader(upstream.content)
            events, reason = await self._pump(request, response, reader, first, sub, rule, started)
            if reason != "reset":
                await response.write_eof()
            self._released[key] = time.monotonic()
            return response
        finally:
            upstream.close()
            self._active[key] -= 1
            if not self._active[key]:
                del self._active[key]
            log.info(
                "subscription end shard=%s consumer=%s events=%d after=%.1fs reason=%s",
                shard_id,
                consumer_arn,
                events,
                time.monotonic() - started,
                reason,
            )

    async def _open_upstream(
        self, request: web.Request, body: bytes, key: tuple[str, str]
    ) -> tuple[aiohttp.ClientResponse, tuple[bytes, Frame] | None]:
        """Subscribe upstream and read the first frame (None if the stream ended or status is not 200)."""
        now = time.monotonic()
        self._released = {k: t for k, t in self._released.items() if now - t < RELEASE_GRACE_S}
        while True:
            upstream, first = await self._subscribe_upstream(request, body)
            if upstream.status != 200:
                return upstream, None
            released = self._released.get(key)
            retry = (
                first is not None
                and first[1].headers.get(":exception-type") == "ResourceInUseException"
                and key not in self._active
                and released is not None
                and time.monotonic() - released < RELEASE_GRACE_S
            )
            if not retry:
                return upstream, first
            upstream.close()
            await asyncio.sleep(RELEASE_RETRY_INTERVAL_S)

    async def _subscribe_upstream(
        self, request: web.Request, body: bytes
    ) -> tuple[aiohttp.ClientResponse, tuple[bytes, Frame] | None]:
        """One upstream SubscribeToShard: its response headers and (status 200) first frame, each within
        response_timeout_s."""
        async with asyncio.timeout(self.config.response_timeout_s):
            upstream = await self.session.post(
                self._upstream + request.rel_url.raw_path_qs,
                headers=_forward_headers(request.headers),
                data=body,
            )
        if upstream.status != 200:
            return upstream, None
        try:
            async with asyncio.timeout(self.config.response_timeout_s):
                return upstream, await _FrameReader(upstream.content).next()
        except BaseException:
            upstream.close()
            raise

    async def _pump(
        self,
        request: web.Request,
        response: web.StreamResponse,
        reader: _FrameReader,
        first: tuple[bytes, Frame],
        sub: _Subscription,
        rule: FaultRule | None,
        started: float,
    ) -> tuple[int, str]:
        """Forward upstream frames until the subscription ends; returns (events forwarded, reason)."""
        lifetime = self.config.subscription_lifetime_s
        deadline = started + lifetime if lifetime > 0 else None
        idle_s = self.config.stream_idle_timeout_s
        events = 0
        advance: FaultRule | None = None  # advance_continuation: applies from rule.after_events on
        advanced = 0  # how far the continuation of empty events was moved on so far
        if rule is not None and rule.action == ADVANCE_CONTINUATION:
            advance, rule = rule, None
        item: tuple[bytes, Frame] | None = first
        while item is not None:
            raw, frame = item
            if _is_exception(frame):
                await response.write(raw)
                return events, f"upstream exception {frame.headers.get(':exception-type')}"
            if frame.headers.get(":event-type") == "SubscribeToShardEvent":
                if rule is not None and events >= rule.after_events:
                    outcome = await self._fire(request, response, raw, rule)
                    if outcome is not None:
                        return events, outcome
                    rule = None
                payload = json.loads(frame.payload)
                if payload.get("ChildShards", ()) is None:
                    del payload["ChildShards"]
                    raw = _event_frame(payload)
                if not payload.get("Records") and await self._shard_finished(sub):
                    await response.write(
                        _event_frame({"Records": [], "MillisBehindLatest": 0, "ChildShards": sub.children})
                    )
                    return events + 1, "shard closed, final event sent"
                continuation = payload.get("ContinuationSequenceNumber")
                if (
                    advance is not None
                    and events >= advance.after_events
                    and not payload.get("Records")
                    and isinstance(continuation, str)
                    and continuation.isdigit()
                ):
                    advanced += 1
                    payload["ContinuationSequenceNumber"] = str(int(continuation) + advanced)
                    raw = _event_frame(payload)
                events += 1
            await response.write(raw)
            remaining = float("inf") if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return events, "subscription lifetime reached"
            try:
                item = await asyncio.wait_for(reader.next(), min(remaining, idle_s))
            except TimeoutError:
                if remaining <= idle_s:
                    return events, "subscription lifetime reached"
                silent = f"kinesis-local sent nothing for {idle_s:g} s"
                await response.write(_exception_frame("InternalFailureException", silent))
                return events, "upstream silent"
        return events, "upstream ended"

    async def _fire(
        self, request: web.Request, response: web.StreamResponse, raw: bytes, rule: FaultRule
    ) -> str | None:
        """Apply a stream fault; returns the end reason, or None if the stream continues."""
        log.info("fault %d: %s on shard stream", rule.id, rule.action)
        if rule.action == "exception_frame":
            await response.write(_exception_frame(rule.error_code, rule.message))
            return f"fault: exception {rule.error_code}"
        if rule.action == "reset":
            await response.write(raw[: max(1, len(raw) // 2)])
            if request.transport is not None:
                request.transport.close()
            return "reset"
        if rule.stall_s is None:
            await asyncio.Event().wait()  # until the client disconnects and the handler is cancelled
        else:
            await asyncio.sleep(rule.stall_s)
        return None

    async def _shard_finished(self, sub: _Subscription) -> bool:
        """True once the shard is known closed; the caller just saw an empty (caught-up) event.

        Closure must be known *before* the empty event arrives: an empty event seen before the
        split could hide parent records written between that event and the split.
        """
        if sub.children:
            return True
        try:
            await self._refresh_children(sub)
        except _UPSTREAM_ERRORS:
            pass  # logged by the listings; the next empty event asks again
        return False

    async def _refresh_children(self, sub: _Subscription) -> None:
        """The shard's children from a listing of its stream at most shard_check_interval_s old.

        Raises what kinesis-local failed with if it did not answer. A refused listing (an unknown
        stream) leaves the children unknown: the subscription's own answer then says what is wrong.
        """
        try:
            sub.children = await self._listings.children(sub.stream, sub.shard_id)
        except ValueError:
            pass  # logged by the listings

    async def _list_shards(self, stream: StreamKey) -> list[Shard]:
        shards: list[Shard] = []
        params: dict[str, Any] = {"StreamARN": stream.stream_arn}
        while True:
            page = await self._call_upstream("ListShards", params, stream)
            shards.extend(page.get("Shards", []))
            token = page.get("NextToken")
            if not token:
                return shards
            params = {"NextToken": token}

    async def _call_upstream(self, operation: str, params: dict[str, Any], stream: StreamKey) -> dict[str, Any]:
        url = self._upstream + "/"
        aws_request = AWSRequest(
            method="POST",
            url=url,
            data=json.dumps(params).encode(),
            headers={"X-Amz-Target": TARGET_PREFIX + operation, "Content-Type": AWS_JSON_CONTENT_TYPE},
        )
        # kinesis-local does not verify signatures but selects the account from the access key id.
        SigV4Auth(Credentials(stream.access_key, "dummy-secret"), "kinesis", stream.region).add_auth(aws_request)
        async with (
            asyncio.timeout(self.config.response_timeout_s),
            self.session.post(url, data=aws_request.body, headers=dict(aws_request.headers.items())) as resp,
        ):
            payload = await resp.read()
            if resp.status != 200:
                raise ValueError(f"{operation} returned {resp.status}: {payload[:200]!r}")
            result = json.loads(payload)
            if not isinstance(result, dict):
                raise ValueError(f"{operation} returned a non-object")
            return result


async def start_proxy(config: ProxyConfig, port: int = 0) -> tuple[web.AppRunner, int]:
    """Start the proxy in the running event loop on 127.0.0.1; returns the runner and bound port."""
    runner = web.AppRunner(ConformanceProxy(config).build_app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, port)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.Server)
    return runner, int(server.sockets[0].getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m efo.devstack.proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="kinesis-local URL, e.g. http://127.0.0.1:4568")
    parser.add_argument("--subscription-lifetime-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = ProxyConfig(upstream=args.upstream, subscription_lifetime_s=args.subscription_lifetime_s)
    web.run_app(
        ConformanceProxy(config).build_app(),
        host=LOOPBACK,
        port=args.port,
        handler_cancellation=True,
        access_log=None,
        print=None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
