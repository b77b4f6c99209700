"""A synthetic SubscribeToShard server for benchmarks, on 127.0.0.1 only.

AWS wire format: HTTP 200, ``application/vnd.amazon.eventstream``, an initial-response frame,
then SubscribeToShardEvent frames written as fast as the client reads them (``write`` waits for
the socket to drain). Every subscription gets its own increasing sequence numbers, so a consumer
that de-duplicates never drops a record. The shape of the stream travels in the ConsumerARN:

    arn:aws:kinesis:us-east-1:000000000000:stream/bench/consumer/bench-<bytes>-<records/event>-<events>[-<per s>]:1

``<bytes>`` per record; ``<events>`` 0 means until the client goes away (at most
``--max-subscription-s``). With ``<per s>``, each subscription sends that many events a second
(paced, not as fast as the client reads) and every record's ApproximateArrivalTimestamp is the
moment its event is written, so a consumer can measure arrival-to-commit latency against this
server's clock (the same host's).

For ``efo run`` it also answers the few control-plane calls the service makes, for a stream
named ``bench-<shards>`` (or ``bench-<shards>-<tag>``: several streams of one size):
DescribeStreamSummary, ListShards, DescribeStreamConsumer (any ARN is ACTIVE) and
RegisterStreamConsumer. Leases and checkpoints stay in a real (local) DynamoDB.

With ``--hold``, every subscription sends only empty events (one a second) until ``POST /_bench/release``:
a consumer becomes ready before any record arrives (bench/memory_bound.py measures its baseline then).

Run: ``python bench/synthetic_server.py [--port 0] [--hold]``; it prints ``PORT <n>`` once listening and
exits when its standard input closes (so it never outlives the benchmark that started it).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import re
import sys
import threading
import time
import zlib
from typing import Any

from aiohttp import web

from efo.devstack.eventstream import encode_message

EVENT_HEADERS = {":message-type": "event", ":event-type": "SubscribeToShardEvent", ":content-type": "application/json"}
INITIAL_RESPONSE = encode_message(
    {":message-type": "event", ":event-type": "initial-response", ":content-type": "application/json"}, b"{}"
)
ARN_SHAPE = re.compile(rb"bench-(\d+)-(\d+)-(\d+)(?:-(\d+(?:\.\d+)?))?:")
STREAM_SHAPE = re.compile(r"bench-(\d+)(?:-[a-z0-9]+)?$")
ACCOUNT_ARN = "arn:aws:kinesis:us-east-1:000000000000"
ARRIVAL_PLACEHOLDER = "1700000000.123"  # epoch seconds, 3 decimals: the same width until 2286
FIRST_SEQUENCE = 49590338271490256608559692538361571095921575989136588898
SEQUENCE_DIGITS = 56


def consumer_arn(record_bytes: int, records_per_event: int, events: int = 0, per_second: float | None = None) -> str:
    pace = "" if per_second is None else f"-{per_second:g}"
    return f"{ACCOUNT_ARN}:stream/bench/consumer/bench-{record_bytes}-{records_per_event}-{events}{pace}:1"


def stream_name(shards: int, tag: str = "") -> str:
    return f"bench-{shards}-{tag}" if tag else f"bench-{shards}"


class EventFactory:
    """SubscribeToShardEvent frames from one pre-encoded template per stream shape.

    Sequence numbers have a fixed width (56 digits, like Kinesis'), so every event of a stream
    has the same length: the prelude and headers never change, and an event is the template with
    its sequence numbers rewritten in place and the message CRC recomputed. ``next_event`` reuses
    one buffer per subscription; aiohttp copies it into the transport before ``write`` returns.
    """

    def __init__(self, record_bytes: int, records_per_event: int) -> None:
        self.records_per_event = records_per_event
        data = base64.b64encode(os.urandom(record_bytes)).decode()
        placeholder = "0" * SEQUENCE_DIGITS
        records = ",".join(
            f'{{"SequenceNumber":"{placeholder}","ApproximateArrivalTimestamp":{ARRIVAL_PLACEHOLDER},'
            f'"Data":"{data}","PartitionKey":"pk-{i}"}}'
            for i in range(records_per_event)
        )
        payload = (
            f'{{"Records":[{records}],"ContinuationSequenceNumber":"{placeholder}","MillisBehindLatest":0}}'
        ).encode()
        self.template = encode_message(EVENT_HEADERS, payload)
        marker = placeholder.encode()
        self._offsets: list[int] = []
        at = self.template.find(b'"SequenceNumber":"')
        while at >= 0:
            self._offsets.append(at + len(b'"SequenceNumber":"'))
            at = self.template.find(b'"SequenceNumber":"', at + 1)
        self._continuation = self.template.rindex(b'"ContinuationSequenceNumber":"') + len(
            b'"ContinuationSequenceNumber":"'
        )
        assert len(self._offsets) == records_per_event  # 0: an empty event (a heartbeat)
        self._arrivals: list[int] = []
        at = self.template.find(b'"ApproximateArrivalTimestamp":')
        while at >= 0:
            self._arrivals.append(at + len(b'"ApproximateArrivalTimestamp":'))
            at = self.template.find(b'"ApproximateArrivalTimestamp":', at + 1)
        assert self.template[self._continuation : self._continuation + SEQUENCE_DIGITS] == marker

    def buffer(self) -> bytearray:
        return bytearray(self.template)

    def next_event(self, frame: bytearray, first_sequence: int, arrival_s: float | None = None) -> bytearray:
        """Rewrite ``frame`` (from :meth:`buffer`) into the event whose first record is
        ``first_sequence``, its records stamped with ``arrival_s`` when given."""
        if arrival_s is not None:
            stamp = b"%14.3f" % arrival_s
            assert len(stamp) == len(ARRIVAL_PLACEHOLDER)
            for offset in self._arrivals:
                frame[offset : offset + len(stamp)] = stamp
        sequence = first_sequence
        for offset in self._offsets:
            frame[offset : offset + SEQUENCE_DIGITS] = b"%056d" % sequence
            sequence += 1
        frame[self._continuation : self._continuation + SEQUENCE_DIGITS] = b"%056d" % (sequence - 1)
        view = memoryview(frame)
        frame[-4:] = zlib.crc32(view[:-4]).to_bytes(4, "big")
        view.release()
        return frame


def _error(code: str, message: str) -> web.Response:
    return web.json_response(
        {"__type": code, "message": message}, status=400, content_type="application/x-amz-json-1.1"
    )


class Server:
    def __init__(self, max_subscription_s: float, hold: bool = False) -> None:
        self._factories: dict[tuple[int, int], EventFactory] = {}
        self._max_subscription_s = max_subscription_s
        self.released = asyncio.Event()
        if not hold:
            self.released.set()

    async def release(self, request: web.Request) -> web.Response:
        self.released.set()
        return web.Response(text="released")

    def _factory(self, record_bytes: int, records_per_event: int) -> EventFactory:
        key = (record_bytes, records_per_event)
        if key not in self._factories:
            self._factories[key] = EventFactory(record_bytes, records_per_event)
        return self._factories[key]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        target = request.headers.get("X-Amz-Target", "")
        body = await request.read()
        operation = target.rsplit(".", 1)[-1]
        if operation != "SubscribeToShard":
            return control_plane(operation, json.loads(body or b"{}"))
        shape = ARN_SHAPE.search(body)
        if shape is None:
            return _error("InvalidArgumentException", "the ConsumerARN must name bench-<bytes>-<records>-<events>")
        record_bytes, records_per_event, events = (int(g) for g in shape.groups()[:3])
        per_second = float(shape.group(4)) if shape.group(4) else None
        factory = self._factory(record_bytes, records_per_event)
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "application/vnd.amazon.eventstream", "x-amzn-RequestId": "bench"}
        )
        started = time.monotonic()
        deadline = started + self._max_subscription_s
        sequence = FIRST_SEQUENCE
        frame = factory.buffer()
        sent = 0
        try:
            await response.prepare(request)
            await response.write(INITIAL_RESPONSE)
            if not self.released.is_set():
                empty = self._factory(record_bytes, 0)
                empty_frame = empty.buffer()
                while not self.released.is_set() and time.monotonic() < deadline:
                    await response.write(empty.next_event(empty_frame, sequence))
                    try:
                        await asyncio.wait_for(self.released.wait(), 1.0)
                    except TimeoutError:
                        pass
                started = time.monotonic()
            while (events == 0 or sent < events) and time.monotonic() < deadline:
                if per_second is None:
                    await response.write(factory.next_event(frame, sequence))
                else:
                    # Paced: event n goes out at started + n / per_second (no drift), stamped then.
                    await asyncio.sleep(max(0.0, started + sent / per_second - time.monotonic()))
                    await response.write(factory.next_event(frame, sequence, time.time()))
                sequence += records_per_event
                sent += 1
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away
        return response


def _json(body: dict[str, Any]) -> web.Response:
    return web.json_response(body, content_type="application/x-amz-json-1.1")


def control_plane(operation: str, body: dict[str, Any]) -> web.Response:
    """The calls ``efo run`` makes besides SubscribeToShard, for a stream ``bench-<shards>``."""
    name = str(body.get("StreamName") or str(body.get("StreamARN", "")).rsplit("/", 1)[-1])
    if operation in ("DescribeStreamConsumer", "RegisterStreamConsumer"):
        arn = body.get("ConsumerARN") or consumer_arn(1024, 100)
        consumer = {
            "ConsumerName": body.get("ConsumerName") or arn.split("/consumer/")[1].split(":")[0],
            "ConsumerARN": arn,
            "ConsumerStatus": "ACTIVE",
            "ConsumerCreationTimestamp": 1700000000.0,
            "StreamARN": f"{ACCOUNT_ARN}:stream/{name or 'bench'}",
        }
        key = "ConsumerDescription" if operation == "DescribeStreamConsumer" else "Consumer"
        return _json({key: consumer})
    shape = STREAM_SHAPE.match(name)
    if shape is None:
        return _error("ResourceNotFoundException", f"only streams named bench-<shards> exist here, not {name!r}")
    shards = int(shape.group(1))
    if operation == "DescribeStreamSummary":
        summary = {
            "StreamName": name,
            "StreamARN": f"{ACCOUNT_ARN}:stream/{name}",
            "StreamStatus": "ACTIVE",
            "StreamCreationTimestamp": 1700000000.0,
            "RetentionPeriodHours": 24,
            "OpenShardCount": shards,
            "ConsumerCount": 1,
            "EnhancedMonitoring": [],
        }
        return _json({"StreamDescriptionSummary": summary})
    if operation == "ListShards":
        width = 2**128 // shards
        items = [
            {
                "ShardId": f"shardId-{i:012d}",
                "HashKeyRange": {
                    "StartingHashKey": str(i * width),
                    "EndingHashKey": str(2**128 - 1 if i == shards - 1 else (i + 1) * width - 1),
                },
                "SequenceNumberRange": {"StartingSequenceNumber": str(FIRST_SEQUENCE)},
            }
            for i in range(shards)
        ]
        return _json({"Shards": items})
    return _error("UnknownOperationException", f"{operation} is not served here")


def _exit_when_stdin_closes() -> None:
    try:
        while sys.stdin.buffer.read(1):
            pass
    finally:
        os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-subscription-s", type=float, default=300.0)
    parser.add_argument("--max-lifetime-s", type=float, default=1800.0, help="exit after this long whatever happens")
    parser.add_argument("--cpu", type=int, default=None, help="pin this process to one CPU")
    parser.add_argument("--hold", action="store_true", help="empty events only until POST /_bench/release")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    threading.Thread(target=_exit_when_stdin_closes, daemon=True).start()
    threading.Timer(args.max_lifetime_s, lambda: os._exit(0)).start()
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # clients that go away mid-answer

    async def serve() -> None:
        server = Server(args.max_subscription_s, args.hold)
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post("/", server.handle)
        app.router.add_post("/_bench/release", server.release)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=1024)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"PORT {port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
