"""Fault-injection rules for the conformance proxy (control API: ``/_efo/faults``).

Besides faults, one rule makes the proxy behave as AWS may where kinesis-local does not:
``advance_continuation`` moves the ContinuationSequenceNumber on at every event without records of
a subscription: kinesis-local's number plus how many such events there were so far (kinesis-local
keeps the number of the shard's last record while the shard is idle; whether AWS moves it there is
not documented). The numbers are made up, below the shard's next record (kinesis-local's numbers of
consecutive records are about 10**21 apart): for tests of what a consumer writes, not of where it
resubscribes.
"""

from __future__ import annotations

import itertools
import json
import urllib.request
from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast

Action = Literal["error", "exception_frame", "reset", "stall", "advance_continuation"]
ACTIONS: tuple[Action, ...] = ("error", "exception_frame", "reset", "stall", "advance_continuation")
# Actions that act inside an event stream only make sense for SubscribeToShard.
STREAM_ACTIONS: frozenset[str] = frozenset({"exception_frame", "reset", "stall", "advance_continuation"})
#: The stream action that rewrites events instead of firing once: every event without records
#: from ``after_events`` on, for the whole subscription.
ADVANCE_CONTINUATION: Action = "advance_continuation"
SUBSCRIBE = "SubscribeToShard"


class RuleError(ValueError):
    """A fault rule posted to the control API is invalid."""


@dataclass
class FaultRule:
    id: int
    operation: str  # X-Amz-Target operation name (e.g. "PutRecords"), or "*" for any
    action: Action
    shard_id: str | None = None
    count: int = 1  # remaining firings (a stream action: subscriptions it applies to)
    after_events: int = 0  # stream actions: events forwarded before the fault fires
    status: int = 400  # error
    error_code: str = "InternalFailure"  # error: __type; exception_frame: :exception-type
    message: str = "fault injected by efo devstack proxy"
    stall_s: float | None = None  # stall: None = until the client goes away
    #: Only requests that name this resource (a stream's name or ARN, a consumer's ARN, a table's
    #: name: :func:`request_resources`), as IAM refuses an action on one resource and not another.
    resource: str | None = None

    def matches(self, operation: str, shard_id: str | None, resources: Collection[str] = ()) -> bool:
        if self.operation not in ("*", operation):
            return False
        if self.resource is not None and self.resource not in resources:
            return False
        return self.shard_id is None or self.shard_id == shard_id

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: The fields of a Kinesis or DynamoDB request that name the resource it acts on.
RESOURCE_FIELDS = ("StreamName", "StreamARN", "ConsumerARN", "TableName")


def request_resources(request: object) -> set[str]:
    """The resources a request (its JSON body) names, for rules with a ``resource``."""
    if not isinstance(request, dict):
        return set()
    return {value for key in RESOURCE_FIELDS if isinstance(value := request.get(key), str)}


def _get(raw: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = raw.get(key)
    if value is None:
        return default
    accepted: tuple[type, ...] = (int, float) if kind is float else (kind,)
    if isinstance(value, bool) or not isinstance(value, accepted):
        raise RuleError(f"{key} must be of type {kind.__name__}")
    return float(value) if kind is float else value


class FaultRules:
    def __init__(self) -> None:
        self._rules: list[FaultRule] = []
        self._ids = itertools.count(1)

    def add(self, raw: object) -> FaultRule:
        if not isinstance(raw, dict):
            raise RuleError("rule must be a JSON object")
        unknown = set(raw) - {f for f in FaultRule.__dataclass_fields__ if f != "id"}
        if unknown:
            raise RuleError(f"unknown rule fields: {sorted(unknown)}")
        action = raw.get("action")
        if action not in ACTIONS:
            raise RuleError(f"action must be one of {list(ACTIONS)}")
        operation = _get(raw, "operation", str, None)
        if not operation:
            raise RuleError("operation is required (e.g. 'SubscribeToShard', or '*')")
        if action in STREAM_ACTIONS and operation != SUBSCRIBE:
            raise RuleError(f"action {action!r} only applies to operation {SUBSCRIBE!r}")
        rule = FaultRule(
            id=next(self._ids),
            operation=operation,
            action=cast(Action, action),
            shard_id=_get(raw, "shard_id", str, None),
            count=_get(raw, "count", int, 1),
            after_events=_get(raw, "after_events", int, 0),
            status=_get(raw, "status", int, 400),
            error_code=_get(raw, "error_code", str, "InternalFailure"),
            message=_get(raw, "message", str, FaultRule.message),
            stall_s=_get(raw, "stall_s", float, None),
            resource=_get(raw, "resource", str, None),
        )
        if rule.count < 1 or rule.after_events < 0 or not 400 <= rule.status <= 599:
            raise RuleError("count must be >= 1, after_events >= 0, status in 400..599")
        self._rules.append(rule)
        return rule

    def take(self, operation: str, shard_id: str | None, resources: Collection[str] = ()) -> FaultRule | None:
        """Return the first matching rule and consume one of its firings."""
        for rule in self._rules:
            if rule.matches(operation, shard_id, resources):
                rule.count -= 1
                if rule.count == 0:
                    self._rules.remove(rule)
                return rule
        return None

    def clear(self) -> None:
        self._rules.clear()

    def __len__(self) -> int:
        return len(self._rules)

    def to_json(self) -> list[dict[str, Any]]:
        return [rule.to_json() for rule in self._rules]


class FaultClient:
    """The proxy's control API from a test or a chaos script: ``add``, ``pending``, ``clear``."""

    def __init__(self, proxy_endpoint: str, timeout_s: float = 5.0) -> None:
        self.url = f"{proxy_endpoint.rstrip('/')}/_efo/faults"
        self.timeout_s = timeout_s

    def add(self, **rule: Any) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url, data=json.dumps(rule).encode(), headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            return cast(dict[str, Any], json.load(response))

    def pending(self) -> list[dict[str, Any]]:
        """The rules still waiting to fire (a rule is removed once it fired its count)."""
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:
            return cast(list[dict[str, Any]], json.load(response))

    def clear(self) -> None:
        urllib.request.urlopen(urllib.request.Request(self.url, method="DELETE"), timeout=self.timeout_s).close()
