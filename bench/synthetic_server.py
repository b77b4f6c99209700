"""A synthetic SubscribeToShard server for benchmarks, on 127.0.0.1 only.

AWS wire format: HTTP 200, ``application/vnd.amazon.eventstream``, an initial-response frame,
then SubscribeToShardEvent frames written as fast as the client reads them (``write`` waits for
the socket to drain). Every subscription gets its own increasing sequence numbers, so a consumer
that de-duplicates never drops a record. The shape of the stream travels in the ConsumerARN:

    arn:aws:kinesis:us-east-1:000000000000:stream/bench/consumer/bench-<record bytes>-<records per event>-<events>:1

``<events>`` 0 means until the client goes away (at most ``--max-subscription-s``).

Run: ``python bench/synthetic_server.py [--port 0]``; it prints ``PORT <n>`` once listening and
exits when its standard input closes (so it never outlives the benchmark that started it).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import re
import sys
import threading
import time
import zlib

from aiohttp import web

from efo.devstack.eventstream import encode_message

EVENT_HEADERS = {":message-type": "event", ":event-type": "SubscribeToShardEvent", ":content-type": "application/json"}
INITIAL_RESPONSE = encode_message(
    {":message-type": "event", ":event-type": "initial-response", ":content-type": "application/json"}, b"{}"
)
ARN_SHAPE = re.compile(rb"bench-(\d+)-(\d+)-(\d+)")
FIRST_SEQUENCE = 49590338271490256608559692538361571095921575989136588898
SEQUENCE_DIGITS = 56


def consumer_arn(record_bytes: int, records_per_event: int, events: int = 0) -> str:
    return (
        "arn:aws:kinesis:us-east-1:000000000000:stream/bench/consumer/"
        f"bench-{record_bytes}-{records_per_event}-{events}:1"
    )


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
            f'{{"SequenceNumber":"{placeholder}","ApproximateArrivalTimestamp":1700000000.123,'
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
        assert len(self._offsets) == records_per_event
        assert self.template[self._continuation : self._continuation + SEQUENCE_DIGITS] == marker

    def buffer(self) -> bytearray:
        return bytearray(self.template)

    def next_event(self, frame: bytearray, first_sequence: int) -> bytearray:
        """Rewrite ``frame`` (from :meth:`buffer`) into the event whose first record is ``first_sequence``."""
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
    def __init__(self, max_subscription_s: float) -> None:
        self._factories: dict[tuple[int, int], EventFactory] = {}
        self._max_subscription_s = max_subscription_s

    def _factory(self, record_bytes: int, records_per_event: int) -> EventFactory:
        key = (record_bytes, records_per_event)
        if key not in self._factories:
            self._factories[key] = EventFactory(record_bytes, records_per_event)
        return self._factories[key]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        target = request.headers.get("X-Amz-Target", "")
        body = await request.read()
        if not target.endswith(".SubscribeToShard"):
            return _error("UnknownOperationException", f"only SubscribeToShard is served, not {target!r}")
        shape = ARN_SHAPE.search(body)
        if shape is None:
            return _error("InvalidArgumentException", "the ConsumerARN must name bench-<bytes>-<records>-<events>")
        record_bytes, records_per_event, events = (int(g) for g in shape.groups())
        factory = self._factory(record_bytes, records_per_event)
        response = web.StreamResponse(
            status=200, headers={"Content-Type": "application/vnd.amazon.eventstream", "x-amzn-RequestId": "bench"}
        )
        await response.prepare(request)
        await response.write(INITIAL_RESPONSE)
        deadline = time.monotonic() + self._max_subscription_s
        sequence = FIRST_SEQUENCE
        frame = factory.buffer()
        sent = 0
        try:
            while (events == 0 or sent < events) and time.monotonic() < deadline:
                await response.write(factory.next_event(frame, sequence))
                sequence += records_per_event
                sent += 1
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away
        return response


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
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    threading.Thread(target=_exit_when_stdin_closes, daemon=True).start()
    threading.Timer(args.max_lifetime_s, lambda: os._exit(0)).start()

    async def serve() -> None:
        server = Server(args.max_subscription_s)
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post("/", server.handle)
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
