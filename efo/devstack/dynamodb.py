"""DynamoDB for the local stack: moto's server, with one request at a time.

moto checks a conditional write's condition and applies its update without a lock, so two
concurrent conditional writes on one item can both succeed (measured with moto 5.2.5: in 6 of 200
races of four writers, more than one won). DynamoDB never lets that happen, and lease fencing
depends on it: two workers must never both take a lease at the same counter. This server wraps
moto's WSGI application in a lock, which makes every request atomic, as on AWS. (About 130
conditional writes a second here, what moto managed concurrently anyway.)

It also counts the requests it serves by operation, for the measurements of what efo costs in
DynamoDB: ``GET /_efo/requests`` answers ``{"Query": n, "UpdateItem": n, ...}``.

And it meters what each request would cost on AWS on demand, at the wire: ``GET /_efo/usage``
answers ``{"operations": {"Query": {"requests": n, "read_units": x, "write_units": y, "bytes": b},
...}, "partitions": {"<pk value>": {"requests": n, "read_units": x, "write_units": y}, ...}}``;
``DELETE /_efo/usage`` answers the same and clears it (not the request counts), so that a benchmark
reads each interval exactly. ``efo.devstack.units.usage(endpoint, reset=...)`` reads it as a
:class:`~efo.devstack.units.Usage`. An operation's ``requests`` are all those that reached this
server, ``bytes`` the item bytes its units were computed from; a partition's ``requests`` are those
that spent units on items under that partition key (the table's HASH key, ``pk`` for efo's; a
Query on an index is charged to ``<index>:<its key>``). Scans are charged to ``(scan)``; past
10,000 keys, new keys count together under ``(other)``.

Units follow AWS's billing rules (item sizes and rounding: :mod:`efo.devstack.units`), from item
sizes read in moto's state, in process, under the lock that serializes requests, so exact for what
moto stores:

- GetItem, BatchGetItem, TransactGetItems: each item's whole stored size (a projection does not
  make it cheaper), rounded up to 4 KB per item; at least one step for an item not found.
- Query, Scan: the items the page evaluated, summed, then rounded up to 4 KB once. Those are the
  items returned unless a projection, a FilterExpression or a Select narrowed the answer; then the
  same page is asked of moto again without them (nothing can change in between) and its items are
  counted. Halved without ConsistentRead.
- PutItem, UpdateItem, DeleteItem, BatchWriteItem: per item, the larger of its size before and
  after (and, for a put, of the item offered), rounded up to 1 KB; twice that in
  TransactWriteItems, ConditionCheck included. A write refused by its condition
  (ConditionalCheckFailedException, TransactionCanceledException) still costs, as on AWS.
- Nothing for a request AWS would refuse or throttle (validation errors, missing tables,
  injected faults), nor for the control plane (CreateTable, DescribeTable, ...). PartiQL is not
  metered.

Limits: secondary indexes' own write costs are not counted (efo has none); a failed UpdateItem
costs the stored item only (what it would have written is not known); BatchWriteItem's
UnprocessedItems would be billed (moto leaves none); a number's size is AWS's approximation.

And it injects faults, for the chaos tests: ``POST /_efo/faults`` with a rule of
:mod:`efo.devstack.faults` whose action is ``error`` (``{"operation": "UpdateItem", "action":
"error", "count": 5}`` answers the next five UpdateItem requests with 400
ProvisionedThroughputExceededException, as DynamoDB throttles; ``"status": 500, "error_code":
"InternalServerError"`` for a server error; ``"operation": "*"`` for any request). ``GET`` lists the
rules still to fire, ``DELETE`` clears them. ``efo.devstack.faults.FaultClient`` speaks this API.

It keeps connections open between requests (HTTP/1.1 keep-alive, served by waitress), as
DynamoDB does: a client's calls reuse its pooled connections instead of opening one per call.

Run: ``python -m efo.devstack.dynamodb --port P`` (binds 127.0.0.1 only).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import waitress
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.core.responses import BaseResponse
from moto.dynamodb.models import dynamodb_backends
from moto.iam.models import get_account_id_from
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

from efo.devstack.faults import FaultRule, FaultRules, RuleError, request_resources
from efo.devstack.units import (
    FALLBACK_HASH_KEY,
    REQUESTS_PATH,
    SCAN_PARTITION,
    USAGE_PATH,
    Charge,
    Item,
    UsageCounters,
    item_size,
    partition_label,
    query_partition,
    read_units,
    write_units,
)

LOOPBACK = "127.0.0.1"
FAULTS_PATH = "/_efo/faults"
ERROR_PREFIX = "com.amazonaws.dynamodb.v20120810#"
DEFAULT_ERROR_CODE = "ProvisionedThroughputExceededException"
STREAM_FIELDS = frozenset({"shard_id", "after_events", "stall_s"})  # of SubscribeToShard rules only
# Errors that AWS still bills: the item was read to evaluate the condition.
BILLED_ERRORS = frozenset({"ConditionalCheckFailedException", "TransactionCanceledException"})
# Request fields by which a Query or Scan returns less than it evaluated, yet pays for all of it.
NARROWING = ("ProjectionExpression", "AttributesToGet", "FilterExpression", "QueryFilter", "ScanFilter")
NARROWING_SELECT = frozenset({"COUNT", "SPECIFIC_ATTRIBUTES"})
PLACEHOLDER = re.compile(r"[#:][A-Za-z0-9_]+")

StartResponse = Callable[..., Any]
log = logging.getLogger(__name__)


def _json(
    start_response: StartResponse, status: str, payload: object, headers: Iterable[tuple[str, str]] = ()
) -> list[bytes]:
    body = json.dumps(payload).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *headers])
    return [body]


def _body(environ: dict[str, Any]) -> bytes:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    return bytes(environ["wsgi.input"].read(length)) if length > 0 else b""


def _resources(body: bytes) -> set[str]:
    """The tables a request names (for fault rules with a ``resource``)."""
    try:
        return request_resources(json.loads(body or b"{}"))
    except ValueError:
        return set()


def _dynamodb_error(start_response: StartResponse, rule: FaultRule) -> list[bytes]:
    """An error as DynamoDB answers it (JSON 1.0): botocore raises ClientError with this code."""
    status = f"{rule.status} {'Internal Server Error' if rule.status >= 500 else 'Bad Request'}"
    payload = {"__type": ERROR_PREFIX + rule.error_code, "message": rule.message}
    return _json(start_response, status, payload, [("x-amzn-ErrorType", rule.error_code)])


def _region(environ: Mapping[str, Any], authorization: str) -> str:
    """The request's region, found as moto finds it: host name, user agent, signing scope."""
    url = f"http://{environ.get('HTTP_HOST', '')}{environ.get('PATH_INFO', '')}"
    for pattern, text in (
        (BaseResponse.region_regex, url),
        (BaseResponse.region_from_useragent_regex, str(environ.get("HTTP_USER_AGENT", ""))),
    ):
        match = pattern.search(text)
        if match:
            return str(match.group("region"))
    if "AWS4" in authorization:
        return authorization.split(",")[0].split("/")[2]
    return str(BaseResponse.default_region)


class _Tables:
    """moto's tables in the account and region of one request, as they are at the moment asked."""

    def __init__(self, environ: Mapping[str, Any]) -> None:
        authorization = str(environ.get("HTTP_AUTHORIZATION", ""))
        account = os.environ.get("MOTO_ACCOUNT_ID") or environ.get("HTTP_X_MOTO_ACCOUNT_ID")
        if not account:
            match = BaseResponse.access_key_regex.search(authorization)
            account = get_account_id_from(match.group("access_key")) if match else DEFAULT_ACCOUNT_ID
        self._backend = dynamodb_backends[str(account)][_region(environ, authorization)]

    def hash_key(self, table: str, index: str | None = None) -> str:
        try:
            if index:
                schema = self._backend.get_schema(table, index)
                return next(str(k["AttributeName"]) for k in schema if k["KeyType"] == "HASH")
            return str(self._backend.get_table(table).hash_key_attr)
        except Exception:  # no such table or index: moto answers the request with the error
            return FALLBACK_HASH_KEY

    def key_of(self, table: str, item: Item) -> dict[str, Any]:
        try:
            found = self._backend.get_table(table)
            names = (found.hash_key_attr, found.range_key_attr)
        except Exception:
            return {}
        return {name: item[name] for name in names if name and name in item}

    def item(self, table: str, key: Mapping[str, Any]) -> Item | None:
        """The whole item stored under ``key``, as DynamoDB JSON (binaries as bytes), or None."""
        try:
            found = self._backend.get_item(table, dict(key))
        except Exception:
            return None
        return None if found is None else found.to_json()["Attributes"]  # type: ignore[no-any-return]


@dataclass
class _Slot:
    """One item a request reads or writes, and what is known of its size."""

    table: str
    key: Mapping[str, Any]
    partition: str | None
    write: bool
    consistent: bool = True
    transactional: bool = False
    new_size: int = 0  # the item a Put brings
    before: int = 0  # the stored item's size before the request


class _Meter:
    """What one request costs: the items it targets (and, for writes, their sizes before) are taken
    from the request and moto's state before it is served; :meth:`finish` reads the rest."""

    def __init__(self, operation: str, request: dict[str, Any], environ: dict[str, Any]) -> None:
        self.operation, self.request, self.environ = operation, request, environ
        self.tables = _Tables(environ)
        self.slots = list(self._slots())
        for slot in self.slots:
            if slot.write:
                slot.before = item_size(self.tables.item(slot.table, slot.key))

    def _slot(self, table: str, key: Mapping[str, Any], *, write: bool, **extra: Any) -> _Slot:
        partition = partition_label(key.get(self.tables.hash_key(table)))
        return _Slot(table, key, partition, write, **extra)

    def _slots(self) -> Iterable[_Slot]:
        op, body = self.operation, self.request
        table = str(body.get("TableName", ""))
        if op == "GetItem":
            yield self._slot(table, body.get("Key", {}), write=False, consistent=bool(body.get("ConsistentRead")))
        elif op in ("UpdateItem", "DeleteItem"):
            yield self._slot(table, body.get("Key", {}), write=True)
        elif op == "PutItem":
            yield self._put(table, body.get("Item", {}))
        elif op == "BatchGetItem":
            for name, spec in body.get("RequestItems", {}).items():
                for key in spec.get("Keys", []):
                    yield self._slot(name, key, write=False, consistent=bool(spec.get("ConsistentRead")))
        elif op == "BatchWriteItem":
            for name, requests in body.get("RequestItems", {}).items():
                for request in requests:
                    if "PutRequest" in request:
                        yield self._put(name, request["PutRequest"].get("Item", {}))
                    elif "DeleteRequest" in request:
                        yield self._slot(name, request["DeleteRequest"].get("Key", {}), write=True)
        elif op == "TransactGetItems":
            for action in body.get("TransactItems", []):
                get = action.get("Get", {})
                yield self._slot(str(get.get("TableName", "")), get.get("Key", {}), write=False, transactional=True)
        elif op == "TransactWriteItems":
            for action in body.get("TransactItems", []):
                for kind, spec in action.items():  # Put, Update, Delete or ConditionCheck
                    name = str(spec.get("TableName", ""))
                    if kind == "Put":
                        yield self._put(name, spec.get("Item", {}), transactional=True)
                    else:
                        yield self._slot(name, spec.get("Key", {}), write=True, transactional=True)

    def _put(self, table: str, item: Item, *, transactional: bool = False) -> _Slot:
        key = self.tables.key_of(table, item)
        return self._slot(table, key, write=True, transactional=transactional, new_size=item_size(item))

    def finish(
        self, status: str, headers: Iterable[tuple[str, str]], body: bytes, app: Callable[..., Any]
    ) -> list[Charge]:
        """The charges of the request served with ``status``: none unless AWS would bill it."""
        error = next((v.split(":")[0] for k, v in headers if k.lower() == "x-amzn-errortype"), None)
        if not status.startswith("200") and error not in BILLED_ERRORS:
            return []
        if self.operation in ("Query", "Scan"):
            return [self._page(json.loads(body or b"{}"), app)] if status.startswith("200") else []
        unprocessed: set[tuple[str, str]] = set()
        if self.operation == "BatchGetItem":  # keys left for the client to ask again cost nothing yet
            for name, spec in json.loads(body or b"{}").get("UnprocessedKeys", {}).items():
                unprocessed.update((name, json.dumps(key, sort_keys=True)) for key in spec.get("Keys", []))
        charges = []
        for slot in self.slots:
            if (slot.table, json.dumps(slot.key, sort_keys=True)) in unprocessed:
                continue
            if slot.write:
                after = item_size(self.tables.item(slot.table, slot.key))
                size = max(slot.before, after, slot.new_size)
                units = write_units(size, transactional=slot.transactional)
                charges.append(Charge(slot.partition, write_units=units, bytes=size))
            elif status.startswith("200"):
                size = item_size(self.tables.item(slot.table, slot.key))
                units = read_units(size, consistent=slot.consistent, transactional=slot.transactional)
                charges.append(Charge(slot.partition, read_units=units, bytes=size))
        return charges

    def _page(self, response: Mapping[str, Any], app: Callable[..., Any]) -> Charge:
        """A Query or Scan page pays for every item it evaluated, once rounded. Those are the items
        it returned unless a projection, filter or Select narrowed them: then the same request
        without those (same start key and Limit) is asked again of moto, whose answer is the items
        evaluated; the lock still held, nothing has changed in between."""
        items = response.get("Items", [])
        if any(field in self.request for field in NARROWING) or self.request.get("Select") in NARROWING_SELECT:
            items = self._evaluated(app)
        size = sum(item_size(item) for item in items)
        units = read_units(size, consistent=bool(self.request.get("ConsistentRead")))
        if self.operation == "Scan":
            return Charge(SCAN_PARTITION, read_units=units, bytes=size)
        table = str(self.request.get("TableName", ""))
        index = self.request.get("IndexName")
        hash_key = self.tables.hash_key(table, index)
        if items and hash_key in items[0]:
            partition = partition_label(items[0][hash_key])
        else:
            partition = query_partition(self.request, hash_key)
        if index and partition is not None:
            partition = f"{index}:{partition}"  # an index's keys are not the table's
        return Charge(partition, read_units=units, bytes=size)

    def _evaluated(self, app: Callable[..., Any]) -> list[Item]:
        request = {k: v for k, v in self.request.items() if k not in NARROWING and k != "Select"}
        used = set(PLACEHOLDER.findall(str(request.get("KeyConditionExpression", ""))))
        for field in ("ExpressionAttributeNames", "ExpressionAttributeValues"):
            kept = {k: v for k, v in request.pop(field, {}).items() if k in used}
            if kept:
                request[field] = kept
        data = json.dumps(request).encode()
        environ = {**self.environ, "wsgi.input": io.BytesIO(data), "CONTENT_LENGTH": str(len(data))}
        answered: list[str] = []
        body = b"".join(app(environ, lambda status, headers, exc_info=None: answered.append(status)))
        if not answered or not answered[0].startswith("200"):
            raise RuntimeError(f"the {self.operation} without narrowing failed: {answered} {body[:200]!r}")
        return list(json.loads(body).get("Items", []))


class Serialized:
    """A WSGI application that runs one request at a time (the whole response, body included),
    counts them by operation, meters what each would cost on AWS, and answers with an injected
    error while a fault rule matches."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.usage = UsageCounters()
        self.faults = FaultRules()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        path, method = environ.get("PATH_INFO"), environ.get("REQUEST_METHOD")
        if path == REQUESTS_PATH and method == "GET":
            with self._lock:
                return _json(start_response, "200 OK", dict(self.requests))
        if path == USAGE_PATH:
            return self._usage(str(method), start_response)
        if path == FAULTS_PATH:
            return self._faults(environ, str(method), start_response)
        with self._lock:
            target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
            operation = target.rsplit(".", 1)[-1] or "other"
            self.requests[operation] += 1
            chunked = bool(environ.get("wsgi.input_terminated"))  # no Content-Length: read to the end
            body = bytes(environ["wsgi.input"].read()) if chunked else _body(environ)
            environ["wsgi.input"] = io.BytesIO(body)  # for what serves it, which reads it again
            environ["CONTENT_LENGTH"] = str(len(body))
            rule = self.faults.take(operation, None, _resources(body)) if self.faults else None
            if rule is not None:
                self.usage.record(operation, [])  # throttled or failed: AWS bills nothing
                return _dynamodb_error(start_response, rule)
            return self._metered(operation, body, environ, start_response)

    def _metered(
        self, operation: str, body: bytes, environ: dict[str, Any], start_response: StartResponse
    ) -> list[bytes]:
        """Serve the request (``body``, which ``environ`` holds again for moto) and record its cost.
        Metering never fails a request: if it cannot make sense of one, the request counts at no
        cost and the server's log says why."""
        meter: _Meter | None = None
        try:
            request = json.loads(body or b"{}")
            meter = _Meter(operation, request, dict(environ)) if isinstance(request, dict) else None
        except Exception:
            log.warning("dynamodb.meter.failed operation=%s (before)", operation, exc_info=True)
        answer: list[Any] = []

        def capture(status: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            answer[:] = [status, headers]
            return start_response(status, headers, *exc_info)

        chunks = list(self._app(environ, capture))
        charges: list[Charge] = []
        if meter is not None and answer:
            try:
                charges = meter.finish(answer[0], answer[1], b"".join(chunks), self._app)
            except Exception:
                log.warning("dynamodb.meter.failed operation=%s (after)", operation, exc_info=True)
        self.usage.record(operation, charges)
        return chunks

    def _usage(self, method: str, start_response: StartResponse) -> list[bytes]:
        with self._lock:
            if method not in ("GET", "DELETE"):
                return _json(start_response, "405 Method Not Allowed", {"error": "GET or DELETE"})
            report = self.usage.to_json()
            if method == "DELETE":
                self.usage.clear()
            return _json(start_response, "200 OK", report)

    def _faults(self, environ: dict[str, Any], method: str, start_response: StartResponse) -> list[bytes]:
        with self._lock:
            if method == "GET":
                return _json(start_response, "200 OK", self.faults.to_json())
            if method == "DELETE":
                self.faults.clear()
                return _json(start_response, "200 OK", [])
            if method != "POST":
                return _json(start_response, "405 Method Not Allowed", {"error": "GET, POST or DELETE"})
            try:
                raw = json.loads(_body(environ) or b"null")
                if not isinstance(raw, dict) or raw.get("action") != "error":
                    raise RuleError("DynamoDB faults take action 'error' only")
                meaningless = sorted(STREAM_FIELDS & set(raw))
                if meaningless:
                    raise RuleError(f"DynamoDB faults have no {meaningless}")
                raw.setdefault("error_code", DEFAULT_ERROR_CODE)
                rule = self.faults.add(raw)
            except ValueError as exc:  # RuleError too
                return _json(start_response, "400 Bad Request", {"error": str(exc)})
            return _json(start_response, "200 OK", rule.to_json())


#: Client connections held open at once (waitress stops accepting past it): a fleet of workers on
#: one machine, each with its own connection pool, stays well under it.
CONNECTION_LIMIT = 1000


def make_server(port: int) -> Any:
    """This server on 127.0.0.1:``port``, not yet running (``.run()``): waitress, which speaks
    HTTP/1.1 with keep-alive as DynamoDB does. werkzeug's development server, moto's own, closes
    every connection after its answer, so each call of a client opened a new one: an aiobotocore
    UpdateItem cost 1.6-1.9 ms of client CPU here against 1.3-1.5 ms on a kept connection."""
    app = DomainDispatcherApplication(create_backend_app)
    return waitress.create_server(Serialized(app), host=LOOPBACK, port=port, connection_limit=CONNECTION_LIMIT)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    make_server(args.port).run()


if __name__ == "__main__":
    main()
