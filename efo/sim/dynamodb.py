"""An in-memory DynamoDB with the semantics the lease plane depends on, and the faults it must survive.

:class:`SimDynamoDB` holds the tables; each worker talks to it through its own
:class:`SimDynamoDBClient`, which has the aiobotocore client's methods that
:class:`efo.leases.table.LeaseTable` calls (same arguments, same answers, the same
``botocore.exceptions.ClientError`` codes), so the lease plane's own code runs down to the client call.

What it models:

- **conditional writes** (``ConditionExpression``; a failed one raises
  ConditionalCheckFailedException and still costs its write units, with the item as it is when
  asked: ``ReturnValuesOnConditionCheckFailure``), UpdateItem's ``ReturnValues`` (``ALL_NEW``, ``UPDATED_NEW``);
- **Query** with a key condition, ``ExclusiveStartKey``, ``Limit`` and pages of at most 1 MB of items
  read (``LastEvaluatedKey``), ``ProjectionExpression``;
- **consistency**: a strongly consistent read sees every write that landed; an eventually consistent
  one sees the table as it was up to :attr:`Behaviour.stale_read_s` ago (each request draws its own age);
- **capacity**: each partition key serves :data:`KEY_READ_UNITS` read and :data:`KEY_WRITE_UNITS`
  write units a second (a bucket of one second's units, refilled continuously); a request over it is
  throttled (ProvisionedThroughputExceededException), as DynamoDB does with one hot key whatever the
  table's mode. Units are priced as :mod:`efo.devstack.units` prices them, by operation and by key;
- **latency**: each request's time drawn from a log-normal distribution; the request takes effect
  halfway (what it finds is the table then), its answer comes back after the rest;
- **the SDK's retries** (botocore's standard mode, ``max_attempts`` 3, as :func:`efo.aws.dynamodb_config`):
  throttling, 5xx and read timeouts are retried with jittered exponential backoff, then raised;
  a request whose answer takes longer than the client's read timeout raises ReadTimeoutError
  (it may have landed);
- **faults**: throttling of one key, one operation or the whole table; latency spikes; an outage
  (every request fails with a 500) for a while: see :class:`Faults`.

Everything is on the simulation's virtual clock and draws from its seeded random generator.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import botocore.exceptions

from efo.devstack.units import Charge, UsageCounters, item_size, read_units, write_units
from efo.sim import expressions
from efo.sim.clock import SimClock

#: What one partition key serves a second (DynamoDB's per-partition limits).
KEY_READ_UNITS = 3000.0
KEY_WRITE_UNITS = 1000.0
#: A Query page holds at most this many bytes of items read.
PAGE_BYTES = 1 << 20
#: Answers of recent Queries kept a partition key (each of one state of the partition as of a moment).
PARTITION_ANSWERS = 16
#: botocore's standard retry mode, as efo.aws.dynamodb_config sets it.
MAX_ATTEMPTS = 3
MAX_BACKOFF_S = 20.0
READ_TIMEOUT_S = 10.0
RETRY_QUOTA = 500  # botocore's standard mode: the client's retry budget ...
RETRY_COST, TIMEOUT_RETRY_COST, SUCCESS_REFUND = 5, 10, 1  # ... what a retry takes, a success gives back

_THROTTLED = "ProvisionedThroughputExceededException"
_RETRIED_CODES = frozenset({_THROTTLED, "ThrottlingException", "RequestLimitExceeded", "InternalServerError"})


def client_error(operation: str, code: str, message: str, status: int = 400) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation
    )


@dataclass
class Behaviour:
    """How the simulated DynamoDB answers when nothing is wrong."""

    latency_median_s: float = 0.006
    latency_sigma: float = 0.6  # of the log-normal: p99 about 4x the median
    stale_read_s: float = 1.0  # an eventually consistent read sees the table up to this long ago


@dataclass
class Fault:
    """One injected fault, active from ``start_s`` to ``end_s`` (virtual time)."""

    kind: str  # "throttle", "latency", "outage"
    start_s: float
    end_s: float
    operation: str | None = None  # only this operation (throttle, latency)
    key: str | None = None  # only this partition key (throttle, latency): not the keys it begins
    client: str | None = None  # only this client's requests (its worker's name)
    extra_s: float = 0.0  # latency: added to every request
    probability: float = 1.0  # throttle: of each request

    def applies(self, now: float, operation: str, key: str | None, client: str) -> bool:
        if not self.start_s <= now < self.end_s:
            return False
        if self.operation is not None and operation != self.operation:
            return False
        if self.client is not None and client != self.client:
            return False
        return self.key is None or key == self.key


@dataclass
class Faults:
    active: list[Fault] = field(default_factory=list)

    def add(self, fault: Fault) -> None:
        self.active.append(fault)

    def matching(self, kind: str, now: float, operation: str, key: str | None, client: str) -> list[Fault]:
        return [f for f in self.active if f.kind == kind and f.applies(now, operation, key, client)]


class _Bucket:
    """One second's units, refilled continuously."""

    __slots__ = ("at", "capacity", "level")

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.level = capacity
        self.at = 0.0

    def take(self, units: float, now: float) -> bool:
        self.level = min(self.capacity, self.level + (now - self.at) * self.capacity)
        self.at = now
        if units > self.level:
            return False
        self.level -= units
        return True


@dataclass(slots=True)
class _Version:
    at: float
    item: dict[str, Any] | None  # None: deleted
    size: int


class _Row:
    """One item's versions within the window an eventually consistent read may see."""

    __slots__ = ("versions",)

    def __init__(self) -> None:
        self.versions: list[_Version] = []

    def latest(self) -> _Version | None:
        return self.versions[-1] if self.versions else None

    def as_of(self, moment: float) -> _Version | None:
        return self.before(self.versions, moment)

    @staticmethod
    def before(versions: list[_Version], moment: float) -> _Version | None:
        """The last of ``versions`` written at or before ``moment``."""
        for version in reversed(versions):
            if version.at <= moment:
                return version
        return None

    def write(self, version: _Version, keep_after: float) -> None:
        self.versions.append(version)
        while len(self.versions) > 1 and self.versions[1].at <= keep_after:
            del self.versions[0]


#: A Query page: its items, their bytes, and the last sort key read when the page is full (None: no page follows).
_Answer = tuple[list[dict[str, Any]], int, str | None]


class _Partition:
    """One partition key's rows, and the answers of its recent Queries: every worker of a fleet reads
    a lease partition again after each change there, and each such read finds one of the few states
    the partition was in within the last ``stale_read_s``, so the answer is worked out once a state."""

    __slots__ = ("answers", "keys", "rows", "write_times", "writes_before")

    def __init__(self) -> None:
        self.keys: list[str] = []  # sort keys, sorted (deleted rows stay while a stale read may see them)
        self.rows: dict[str, _Row] = {}
        self.write_times: list[float] = []  # when each recent write landed, in order
        self.writes_before = 0  # writes older than those in write_times
        self.answers: dict[tuple[int, int, int, int], _Answer] = {}  # by (writes seen, start, stop, limit)

    def row(self, sort_key: str) -> _Row:
        row = self.rows.get(sort_key)
        if row is None:
            row = self.rows[sort_key] = _Row()
            bisect.insort(self.keys, sort_key)
            self.answers.clear()  # their key indexes are of the keys before this one
        return row

    def wrote(self, now: float, forget_before: float) -> None:
        """A write landed ``now``; no read will look at the table as it was before ``forget_before``."""
        times = self.write_times
        times.append(now)
        old = bisect.bisect_left(times, forget_before)
        if old > len(times) // 2:  # forgotten a batch at a time: a write costs O(1) on average
            del times[:old]
            self.writes_before += old

    def writes_seen(self, moment: float) -> int:
        """How many writes a read as of ``moment`` sees (the same count: the same rows, the same answer)."""
        return self.writes_before + bisect.bisect_right(self.write_times, moment)

    def remember(self, key: tuple[int, int, int, int], answer: _Answer) -> None:
        if len(self.answers) >= PARTITION_ANSWERS:
            del self.answers[next(iter(self.answers))]  # the oldest: a state further in the past
        self.answers[key] = answer


class _Table:
    def __init__(self, name: str, hash_key: str = "pk", range_key: str = "sk") -> None:
        self.name = name
        self.hash_key = hash_key
        self.range_key = range_key
        self.partitions: dict[str, _Partition] = {}
        self.read_buckets: dict[str, _Bucket] = {}
        self.write_buckets: dict[str, _Bucket] = {}

    def description(self) -> dict[str, Any]:
        return {
            "TableName": self.name,
            "TableStatus": "ACTIVE",
            "KeySchema": [
                {"AttributeName": self.hash_key, "KeyType": "HASH"},
                {"AttributeName": self.range_key, "KeyType": "RANGE"},
            ],
            "AttributeDefinitions": [
                {"AttributeName": self.hash_key, "AttributeType": "S"},
                {"AttributeName": self.range_key, "AttributeType": "S"},
            ],
            "BillingModeSummary": {"BillingMode": "PAY_PER_REQUEST"},
        }


class SimDynamoDB:
    """The account's DynamoDB: tables, their items, what each request cost, and the faults."""

    def __init__(self, rng: random.Random, behaviour: Behaviour | None = None) -> None:
        self.rng = rng
        self.behaviour = behaviour or Behaviour()
        self.faults = Faults()
        self.tables: dict[str, _Table] = {}
        self.usage = UsageCounters()
        self.throttled: dict[str, int] = {}  # requests throttled, by operation
        self.clock = SimClock()  # the server's: virtual time, never late nor paused
        #: Called with (client, table, item before, item after, request) for every item written.
        self.on_write: (
            Callable[[str, str, dict[str, Any] | None, dict[str, Any] | None, dict[str, Any]], None] | None
        ) = None
        self._serving: tuple[str, dict[str, Any]] = ("", {})  # the client and request being executed

    def create_table(self, name: str) -> None:
        self.tables.setdefault(name, _Table(name))

    def client(self, name: str, clock: SimClock, rng: random.Random | None = None) -> SimDynamoDBClient:
        return SimDynamoDBClient(self, name, clock, rng or random.Random(self.rng.random()))

    # ---- the server side: one request, at one instant ----------------------------------------------

    def latency_s(self, operation: str, key: str | None, client: str, rng: random.Random) -> float:
        behaviour = self.behaviour
        latency = behaviour.latency_median_s * math.exp(behaviour.latency_sigma * rng.gauss(0.0, 1.0))
        for fault in self.faults.matching("latency", self.clock.now(), operation, key, client):
            latency += fault.extra_s
        return latency

    def execute(self, operation: str, request: dict[str, Any], client: str, rng: random.Random) -> dict[str, Any]:
        """The request takes effect now, or raises the ClientError DynamoDB would answer."""
        now = self.clock.now()
        table = self.tables.get(request.get("TableName", ""))
        key = _partition_of(operation, request, table)
        if self.faults.matching("outage", now, operation, key, client):
            raise client_error(operation, "InternalServerError", "Internal server error (simulated outage)", 500)
        for fault in self.faults.matching("throttle", now, operation, key, client):
            if rng.random() < fault.probability:
                self._throttle(operation)
        if operation == "CreateTable":
            self.create_table(request["TableName"])
            return {"TableDescription": self.tables[request["TableName"]].description()}
        if table is None:
            raise client_error(operation, "ResourceNotFoundException", "Requested resource not found")
        handler = getattr(self, "_" + operation, None)
        if handler is None:
            raise client_error(operation, "UnknownOperationException", f"{operation} is not simulated")
        self._serving = (client, request)
        try:
            response: dict[str, Any] = handler(table, request, now, rng)
        except expressions.UnsupportedExpression as exc:
            raise client_error(operation, "ValidationException", f"not simulated: {exc}") from None
        return response

    def _throttle(self, operation: str) -> None:
        self.throttled[operation] = self.throttled.get(operation, 0) + 1
        raise client_error(operation, _THROTTLED, "The level of configured provisioned throughput was exceeded")

    def _charge(
        self,
        operation: str,
        table: _Table,
        key: str,
        now: float,
        *,
        read: float = 0.0,
        write: float = 0.0,
        size: int = 0,
    ) -> None:
        """Take the units from the key's buckets (or throttle), and meter them."""
        if read and not table.read_buckets.setdefault(key, _Bucket(KEY_READ_UNITS)).take(read, now):
            self._throttle(operation)
        if write and not table.write_buckets.setdefault(key, _Bucket(KEY_WRITE_UNITS)).take(write, now):
            self._throttle(operation)
        if operation == "UpdateItem":
            expression = self._serving[1].get("UpdateExpression", "")
            if "position_kind" in expression and "lease_counter" not in expression:
                operation = "checkpoint"
        self.usage.record(operation, [Charge(key, read, write, size)])

    def _row(self, table: _Table, key: dict[str, Any]) -> tuple[str, str, _Row | None]:
        pk, sk = key[table.hash_key]["S"], key[table.range_key]["S"]
        partition = table.partitions.get(pk)
        return pk, sk, None if partition is None else partition.rows.get(sk)

    def _write(self, table: _Table, pk: str, sk: str, item: dict[str, Any] | None, now: float, size: int) -> None:
        """``item`` (None: deleted) lands; ``size`` is its item_size, which the caller has worked out already."""
        partition = table.partitions.setdefault(pk, _Partition())
        row = partition.row(sk)
        before = _current(row)
        row.write(_Version(now, item, size), now - self.behaviour.stale_read_s)
        partition.wrote(now, now - self.behaviour.stale_read_s)
        if self.on_write is not None:
            client, request = self._serving
            self.on_write(client, table.name, before, item, request)

    def _seen(self, row: _Row | None, consistent: bool, now: float, rng: random.Random) -> _Version | None:
        if row is None:
            return None
        if consistent:
            return row.latest()
        return row.as_of(now - rng.uniform(0.0, self.behaviour.stale_read_s))

    def _check(self, operation: str, request: dict[str, Any], current: dict[str, Any] | None) -> None:
        text = request.get("ConditionExpression")
        if text and not expressions.condition(text)(current, request.get("ExpressionAttributeValues", {})):
            error = client_error(operation, "ConditionalCheckFailedException", "The conditional request failed")
            if request.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD" and current is not None:
                error.response["Item"] = dict(current)
            raise error

    # ---- operations ------------------------------------------------------------------------------------

    def _DescribeTable(self, table: _Table, request: dict[str, Any], now: float, rng: random.Random) -> dict[str, Any]:
        return {"Table": table.description()}

    def _GetItem(self, table: _Table, request: dict[str, Any], now: float, rng: random.Random) -> dict[str, Any]:
        pk, _, row = self._row(table, request["Key"])
        consistent = bool(request.get("ConsistentRead"))
        version = self._seen(row, consistent, now, rng)
        size = version.size if version is not None else 0
        self._charge("GetItem", table, pk, now, read=read_units(size, consistent=consistent), size=size)
        if version is None or version.item is None:
            return {}
        return {"Item": dict(version.item)}

    def _PutItem(self, table: _Table, request: dict[str, Any], now: float, rng: random.Random) -> dict[str, Any]:
        item = dict(request["Item"])
        pk, sk, row = self._row(table, item)
        current = _current(row)
        item_bytes = item_size(item)
        size = max(item_bytes, _current_size(row))
        self._charge("PutItem", table, pk, now, write=write_units(size), size=size)
        self._check("PutItem", request, current)
        self._write(table, pk, sk, item, now, item_bytes)
        return {}

    def _UpdateItem(self, table: _Table, request: dict[str, Any], now: float, rng: random.Random) -> dict[str, Any]:
        key = request["Key"]
        pk, sk, row = self._row(table, key)
        current = _current(row)
        values = request.get("ExpressionAttributeValues", {})
        updated = dict(current) if current is not None else dict(key)
        change = expressions.update(request["UpdateExpression"])
        size_before = _current_size(row)
        try:
            self._check("UpdateItem", request, current)
        except botocore.exceptions.ClientError:
            self._charge("UpdateItem", table, pk, now, write=write_units(size_before), size=size_before)
            raise
        change(updated, values)
        item_bytes = item_size(updated)
        size = max(size_before, item_bytes)
        self._charge("UpdateItem", table, pk, now, write=write_units(size), size=size)
        self._write(table, pk, sk, updated, now, item_bytes)
        if request.get("ReturnValues") == "ALL_NEW":
            return {"Attributes": dict(updated)}
        if request.get("ReturnValues") == "UPDATED_NEW":
            names = expressions.updated(request["UpdateExpression"])
            attributes = {name: value for name, value in updated.items() if name in names}
            return {"Attributes": attributes} if attributes else {}
        return {}

    def _DeleteItem(self, table: _Table, request: dict[str, Any], now: float, rng: random.Random) -> dict[str, Any]:
        pk, sk, row = self._row(table, request["Key"])
        current = _current(row)
        size = _current_size(row)
        self._charge("DeleteItem", table, pk, now, write=write_units(size), size=size)
        self._check("DeleteItem", request, current)
        if current is not None:
            self._write(table, pk, sk, None, now, 0)
        return {}

    def _Query(self, table: _Table, request: dict[str, Any], now: float, rng: random.Random) -> dict[str, Any]:
        values = request.get("ExpressionAttributeValues", {})
        condition = expressions.key_condition(request["KeyConditionExpression"], table.hash_key, table.range_key)
        pk = values[condition.partition_placeholder]["S"]
        consistent = bool(request.get("ConsistentRead"))
        names = expressions.projection(request["ProjectionExpression"]) if "ProjectionExpression" in request else None
        limit = int(request.get("Limit") or 0)
        partition = table.partitions.get(pk)
        keys = partition.keys if partition is not None else []
        start = 0
        if "ExclusiveStartKey" in request:
            start = bisect.bisect_right(keys, request["ExclusiveStartKey"][table.range_key]["S"])
        stop = len(keys)
        sort = condition.sort
        if condition.prefix_placeholder is not None:  # begins_with: the keys that match are one run
            prefix = values[condition.prefix_placeholder]["S"]
            start = stop = max(start, bisect.bisect_left(keys, prefix))
            while stop < len(keys) and keys[stop].startswith(prefix):
                stop += 1
            sort = None
        elif condition.range_bounds is not None:  # a comparison or a BETWEEN: the keys that match are one run too
            run = _key_run(keys, condition.range_bounds, values)
            if run is not None:  # else (a value that is not a string) the predicate decides, key by key
                start, stop = max(start, run[0]), min(stop, run[1])
                stop = max(start, stop)
                sort = None
        moment = now if consistent else now - rng.uniform(0.0, self.behaviour.stale_read_s)
        answer: _Answer = ([], 0, None)
        if partition is not None and sort is None and names is None:  # the lease reads: shared, see _Partition
            key = (partition.writes_seen(moment), start, stop, limit)
            known = partition.answers.get(key)
            if known is None:
                known = _items(partition, keys[start:stop], moment, None, values, table.range_key, None, limit)
                partition.remember(key, known)
            answer = known
        elif partition is not None:
            answer = _items(partition, keys[start:stop], moment, sort, values, table.range_key, names, limit)
        items, read_bytes, last = answer  # one list for every reader of a version: read-only (efo.leases.rows)
        self._charge("Query", table, pk, now, read=read_units(read_bytes, consistent=consistent), size=read_bytes)
        response: dict[str, Any] = {"Items": items, "Count": len(items)}
        if last is not None:
            response["LastEvaluatedKey"] = {table.hash_key: {"S": pk}, table.range_key: {"S": last}}
        return response


def _items(
    partition: _Partition,
    keys: list[str],
    moment: float,
    sort: expressions.Predicate | None,
    values: dict[str, Any],
    range_key: str,
    names: tuple[str, ...] | None,
    limit: int,
) -> _Answer:
    """A Query page of ``keys`` as the partition was at ``moment``. The items are the stored ones, not
    copies (the table never changes an item it stored, and nothing that reads them changes them):
    every reader of one version shares one object."""
    items: list[dict[str, Any]] = []
    read_bytes = 0
    rows = partition.rows
    for sort_key in keys:  # the hot loop of every lease read: Row.latest/as_of inlined
        versions = rows[sort_key].versions
        version = versions[-1] if versions else None
        if version is not None and version.at > moment:
            version = _Row.before(versions, moment)
        if version is None or version.item is None:
            continue
        if sort is not None and not sort({range_key: {"S": sort_key}}, values):
            continue
        read_bytes += version.size
        item = version.item
        items.append(item if names is None else {n: item[n] for n in names if n in item})
        if read_bytes >= PAGE_BYTES or (limit and len(items) >= limit):
            return items, read_bytes, sort_key
    return items, read_bytes, None


def _key_run(keys: list[str], bounds: expressions.Bounds, values: dict[str, Any]) -> tuple[int, int] | None:
    """The slice of the sorted sort ``keys`` within ``bounds`` (None: a bound's value is not a string)."""
    low, high = bounds
    start, stop = 0, len(keys)
    if low is not None:
        value = values[low[0]]
        if set(value) != {"S"}:
            return None
        start = (bisect.bisect_left if low[1] else bisect.bisect_right)(keys, value["S"])
    if high is not None:
        value = values[high[0]]
        if set(value) != {"S"}:
            return None
        stop = (bisect.bisect_right if high[1] else bisect.bisect_left)(keys, value["S"])
    return start, stop


def _current(row: _Row | None) -> dict[str, Any] | None:
    version = row.latest() if row is not None else None
    return version.item if version is not None else None


def _current_size(row: _Row | None) -> int:
    version = row.latest() if row is not None else None
    return version.size if version is not None else 0


def _partition_of(operation: str, request: dict[str, Any], table: _Table | None) -> str | None:
    hash_key = table.hash_key if table is not None else "pk"
    if operation == "Query":
        placeholder = request.get("KeyConditionExpression", "").split("=", 1)[-1].split()[0:1]
        value = request.get("ExpressionAttributeValues", {}).get(placeholder[0] if placeholder else "")
        return value.get("S") if value else None
    key = request.get("Key") or request.get("Item") or {}
    value = key.get(hash_key)
    return value.get("S") if value else None


class SimDynamoDBClient:
    """One worker's DynamoDB client: the aiobotocore methods LeaseTable calls, with latency and the
    SDK's retries, on that worker's clock (a paused worker's requests wait for it)."""

    def __init__(self, db: SimDynamoDB, name: str, clock: SimClock, rng: random.Random) -> None:
        self._db = db
        self.name = name
        self._clock = clock
        self._rng = rng
        self._quota = RETRY_QUOTA
        self.calls: dict[str, int] = {}  # attempts, by operation
        self.read_timeout_s = READ_TIMEOUT_S

    async def _call(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._attempt(operation, request)
            except botocore.exceptions.ClientError as exc:
                code = exc.response["Error"]["Code"]
                if code not in _RETRIED_CODES or not self._may_retry(attempt, RETRY_COST):
                    raise
            except botocore.exceptions.ReadTimeoutError:
                if not self._may_retry(attempt, TIMEOUT_RETRY_COST):
                    raise
            else:
                self._quota = min(RETRY_QUOTA, self._quota + SUCCESS_REFUND)
                return response
            await self._clock.sleep(self._rng.random() * min(MAX_BACKOFF_S, 2.0 ** (attempt - 1)))

    def _may_retry(self, attempt: int, cost: int) -> bool:
        if attempt >= MAX_ATTEMPTS or self._quota < cost:
            return False
        self._quota -= cost
        return True

    async def _attempt(self, operation: str, request: dict[str, Any]) -> dict[str, Any]:
        self.calls[operation] = self.calls.get(operation, 0) + 1
        db = self._db
        key = _partition_of(operation, request, db.tables.get(request.get("TableName", "")))
        latency_s = db.latency_s(operation, key, self.name, self._rng)
        if latency_s / 2 >= self.read_timeout_s:  # never arrives in time: may land, or not
            await self._clock.sleep(self.read_timeout_s)
            raise botocore.exceptions.ReadTimeoutError(endpoint_url="sim://dynamodb")
        await self._clock.sleep(latency_s / 2)
        error: botocore.exceptions.ClientError | None = None
        response: dict[str, Any] = {}
        try:
            response = db.execute(operation, request, self.name, self._rng)
        except botocore.exceptions.ClientError as exc:
            error = exc
        if latency_s >= self.read_timeout_s:  # it landed; the answer does not come in time
            await self._clock.sleep(self.read_timeout_s - latency_s / 2)
            raise botocore.exceptions.ReadTimeoutError(endpoint_url="sim://dynamodb")
        await self._clock.sleep(latency_s / 2)
        if error is not None:
            raise error
        return response

    # ---- the aiobotocore client's methods efo calls -------------------------------------------------

    async def get_item(self, **request: Any) -> dict[str, Any]:
        return await self._call("GetItem", request)

    async def put_item(self, **request: Any) -> dict[str, Any]:
        return await self._call("PutItem", request)

    async def update_item(self, **request: Any) -> dict[str, Any]:
        return await self._call("UpdateItem", request)

    async def delete_item(self, **request: Any) -> dict[str, Any]:
        return await self._call("DeleteItem", request)

    async def query(self, **request: Any) -> dict[str, Any]:
        return await self._call("Query", request)

    async def describe_table(self, **request: Any) -> dict[str, Any]:
        return await self._call("DescribeTable", request)

    async def create_table(self, **request: Any) -> dict[str, Any]:
        return await self._call("CreateTable", request)
