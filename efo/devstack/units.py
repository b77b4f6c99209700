"""What DynamoDB requests cost in on-demand units, computed from the sizes of the items they touch.

The arithmetic behind the local DynamoDB's ``/_efo/usage`` (:mod:`efo.devstack.dynamodb`), which
meters every request it serves, and the client side's view of that report (:class:`Usage`).

Item sizes follow "DynamoDB item sizes and formats" (developer guide, CapacityUnitCalculations):
an item's size is the sum over its attributes of the UTF-8 length of the name plus the value's size,

- S: its UTF-8 length; B: its raw length (base64-decoded when it comes off the wire);
- N: one byte per two significant digits (leading and trailing zeros trimmed), plus one byte;
- BOOL, NULL: 1 byte;
- L, M: 3 bytes, plus for each element 1 byte and its size (and for M the UTF-8 length of its name);
- SS, NS, BS: the sum of their elements' sizes.

AWS calls the number rule approximate; the others are exact as documented. The guide says nothing of
sets beyond their elements (no overhead counted here), of a number's sign or exponent (not
counted), or of the 100 bytes of per-item overhead (which count for storage only, not for units).

Units, as "DynamoDB read and write operations" (developer guide) bills them on demand:

- a read unit per 4 KB, rounded up, strongly consistent; half that eventually consistent; twice
  that in a transaction; at least one 4 KB step per item read (or per Query or Scan page), even
  when nothing is found;
- a write unit per 1 KB, rounded up per item; twice that in a transaction; at least one per item.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import re
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

READ_UNIT_BYTES = 4096
WRITE_UNIT_BYTES = 1024
MAX_PARTITIONS = 10_000  # partition keys tracked one by one; the rest are counted together
OTHER_PARTITIONS = "(other)"
USAGE_PATH = "/_efo/usage"
REQUESTS_PATH = "/_efo/requests"
SCAN_PARTITION = "(scan)"  # a Scan's units: not any one partition key's
FALLBACK_HASH_KEY = "pk"  # this project's tables'; used when a table's key schema cannot be learned
EQUALITY = re.compile(r"(#?[A-Za-z0-9_.]+|:[A-Za-z0-9_]+)\s*=\s*(#?[A-Za-z0-9_.]+|:[A-Za-z0-9_]+)")

AttributeValue = Mapping[str, Any]  # DynamoDB JSON: {"S": "x"}, {"N": "1"}, {"M": {...}}, ...
Item = Mapping[str, AttributeValue]


def _utf8(text: str) -> int:
    return len(text.encode("utf-8"))


def _binary(value: str | bytes | bytearray) -> int:
    """Raw length of a binary: bytes as they are, a str as the base64 the wire carries."""
    if isinstance(value, bytes | bytearray):
        return len(value)
    try:
        return len(base64.b64decode(value, validate=False))
    except (binascii.Error, ValueError):
        return _utf8(value)


@functools.lru_cache(maxsize=4096)  # the same counters and sequence numbers are sized again and again
def _number(value: str) -> int:
    """1 byte per two significant digits, plus 1; leading and trailing zeros do not count."""
    mantissa = re.split("[eE]", value.strip().lstrip("+-"))[0].replace(".", "")
    digits = len(mantissa.strip("0")) or 1
    return (digits + 1) // 2 + 1


def attribute_value_size(value: AttributeValue) -> int:
    """The size of one attribute value (its name not included), per DynamoDB's rules."""
    for kind, inner in value.items():
        if kind == "S":
            return _utf8(inner)
        if kind == "N":
            return _number(str(inner))
        if kind == "B":
            return _binary(inner)
        if kind in ("BOOL", "NULL"):
            return 1
        if kind == "SS":
            return sum(_utf8(element) for element in inner)
        if kind == "NS":
            return sum(_number(str(element)) for element in inner)
        if kind == "BS":
            return sum(_binary(element) for element in inner)
        if kind == "L":
            return 3 + sum(1 + attribute_value_size(element) for element in inner)
        if kind == "M":
            return 3 + sum(1 + _utf8(name) + attribute_value_size(element) for name, element in inner.items())
    return 0


def item_size(item: Item | None) -> int:
    """The size of an item in bytes as DynamoDB meters it (0 for no item)."""
    if not item:
        return 0
    return sum(_utf8(name) + attribute_value_size(value) for name, value in item.items())


def read_units(size: int, *, consistent: bool, transactional: bool = False) -> float:
    """Read units for ``size`` bytes read at once (one item, or a Query/Scan page)."""
    steps = max(1, math.ceil(size / READ_UNIT_BYTES))
    if transactional:
        return 2.0 * steps
    return float(steps) if consistent else steps / 2


def write_units(size: int, *, transactional: bool = False) -> float:
    """Write units for writing one item of ``size`` bytes."""
    steps = max(1, math.ceil(size / WRITE_UNIT_BYTES))
    return float(2 * steps if transactional else steps)


def partition_label(value: AttributeValue | None) -> str | None:
    """A partition key value as the usage report names it: S and N as they are, B in base64."""
    if not value:
        return None
    kind, inner = next(iter(value.items()))
    if kind == "B" and isinstance(inner, bytes | bytearray):
        return base64.b64encode(inner).decode()
    return str(inner) if kind in ("S", "N", "B") else None


def query_partition(request: Mapping[str, Any], hash_key: str) -> str | None:
    """The partition key value a Query names: ``hash = :value`` in its KeyConditionExpression (or
    its legacy KeyConditions)."""
    names = request.get("ExpressionAttributeNames", {})
    values = request.get("ExpressionAttributeValues", {})
    for left, right in EQUALITY.findall(str(request.get("KeyConditionExpression", ""))):
        for name, value in ((left, right), (right, left)):
            if value.startswith(":") and names.get(name, name) == hash_key:
                return partition_label(values.get(value))
    legacy = request.get("KeyConditions", {}).get(hash_key, {}).get("AttributeValueList") or [None]
    return partition_label(legacy[0])


@dataclass
class Charge:
    """What one request costs, or the part of it spent in one partition (``None``: in none, such
    as a control-plane request)."""

    partition: str | None = None
    read_units: float = 0.0
    write_units: float = 0.0
    bytes: int = 0  # item bytes the units were computed from, before rounding


@dataclass
class _Totals:
    requests: int = 0
    read_units: float = 0.0
    write_units: float = 0.0
    bytes: int = 0

    def add(self, read: float, write: float, size: int, *, requests: int = 1) -> None:
        self.requests += requests
        self.read_units += read
        self.write_units += write
        self.bytes += size


class UsageCounters:
    """The server's tally: requests, units and item bytes by operation and by partition key. At
    most ``max_partitions`` keys are tracked one by one; later keys count under ``(other)``."""

    def __init__(self, max_partitions: int = MAX_PARTITIONS) -> None:
        self.max_partitions = max_partitions
        self.operations: dict[str, _Totals] = {}
        self.partitions: dict[str, _Totals] = {}

    def record(self, operation: str, charges: Iterable[Charge]) -> None:
        """One request of ``operation``: its charges, one per partition it touched (or none)."""
        charges = list(charges)
        self.operations.setdefault(operation, _Totals()).add(
            sum(c.read_units for c in charges), sum(c.write_units for c in charges), sum(c.bytes for c in charges)
        )
        touched: dict[str, _Totals] = {}
        for charge in charges:
            if charge.partition is not None:
                touched.setdefault(charge.partition, _Totals()).add(
                    charge.read_units, charge.write_units, charge.bytes, requests=0
                )
        counted: set[str] = set()
        for partition, part in touched.items():
            key = self._key(partition)
            self.partitions.setdefault(key, _Totals()).add(
                part.read_units, part.write_units, 0, requests=0 if key in counted else 1
            )
            counted.add(key)

    def _key(self, partition: str) -> str:
        if partition in self.partitions or len(self.partitions) < self.max_partitions:
            return partition
        return OTHER_PARTITIONS

    def clear(self) -> None:
        self.operations.clear()
        self.partitions.clear()

    def to_json(self) -> dict[str, Any]:
        return {
            "operations": {name: {**self._units(t), "bytes": t.bytes} for name, t in self.operations.items()},
            "partitions": {key: self._units(t) for key, t in self.partitions.items()},
        }

    @staticmethod
    def _units(totals: _Totals) -> dict[str, Any]:
        return {"requests": totals.requests, "read_units": totals.read_units, "write_units": totals.write_units}


@dataclass(frozen=True)
class OperationUsage:
    requests: int = 0
    read_units: float = 0.0
    write_units: float = 0.0
    bytes: int = 0


@dataclass(frozen=True)
class PartitionUsage:
    requests: int = 0
    read_units: float = 0.0
    write_units: float = 0.0


@dataclass(frozen=True)
class Usage:
    """``GET /_efo/usage`` as read by :func:`usage`: units by operation and by partition key."""

    operations: dict[str, OperationUsage] = field(default_factory=dict)
    partitions: dict[str, PartitionUsage] = field(default_factory=dict)

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> Usage:
        return cls(
            operations={k: OperationUsage(**v) for k, v in payload.get("operations", {}).items()},
            partitions={k: PartitionUsage(**v) for k, v in payload.get("partitions", {}).items()},
        )

    @property
    def requests(self) -> int:
        return sum(o.requests for o in self.operations.values())

    @property
    def read_units(self) -> float:
        return sum(o.read_units for o in self.operations.values())

    @property
    def write_units(self) -> float:
        return sum(o.write_units for o in self.operations.values())

    def busiest_partition(self, by: str = "write_units") -> tuple[str, PartitionUsage] | None:
        """The partition key that spent the most ``read_units`` or ``write_units`` (None if none)."""
        if by not in ("read_units", "write_units"):
            raise ValueError("by is 'read_units' or 'write_units'")
        if not self.partitions:
            return None
        return max(self.partitions.items(), key=lambda kv: float(getattr(kv[1], by)))


def usage(endpoint: str, *, reset: bool = False, timeout_s: float = 5.0) -> Usage:
    """The local DynamoDB's usage report (``endpoint``: its ``http://127.0.0.1:port``). With
    ``reset``, the counters are read and cleared at once (``DELETE /_efo/usage``), so that the next
    call reports only what came after and nothing falls between the two."""
    request = urllib.request.Request(endpoint.rstrip("/") + USAGE_PATH, method="DELETE" if reset else "GET")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return Usage.from_json(json.loads(response.read()))
