"""The lease and checkpoint table in DynamoDB.

Every row of one application and stream shares the partition key ``<app>|<stream ARN>``, so the
whole state is read with one paginated, strongly consistent Query (never a Scan):

- ``sk = meta``: the stream's creation time (a stream deleted and recreated under the same name
  has the same ARN but a new creation time) and the initial position of the first start.
- ``sk = worker|<id>``: one heartbeat row per worker; liveness costs writes per worker, not per shard.
- ``sk = shard|<id>``: owner, lease counter, parents, and the checkpoint (a starting position, or
  :data:`~efo.pipeline.records.SHARD_END` once the sink committed the shard's last record).

Ownership changes and checkpoint writes are conditional on the owner and the lease counter
(fencing): a worker whose lease was taken gets :class:`LeaseLost` instead of writing.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import structlog

from efo.errors import LeaseLost, ResourceNotFound, error_code, translate
from efo.pipeline.records import SHARD_END, Position

log = structlog.get_logger("efo.leases.table")

META_KEY = "meta"
WORKER_PREFIX = "worker|"
SHARD_PREFIX = "shard|"


@dataclass(frozen=True, slots=True)
class Lease:
    shard_id: str
    parents: tuple[str, ...]
    owner: str | None
    counter: int  # +1 at every change of owner: the epoch of a claim, and the fence of every write
    checkpoint: Position  # where the shard resumes, or SHARD_END

    @property
    def finished(self) -> bool:
        """The sink committed the shard's last record: its children may start."""
        return self.checkpoint == SHARD_END


@dataclass(frozen=True, slots=True)
class Meta:
    stream_created_at: datetime
    initial_position: str


@dataclass(slots=True)
class TableState:
    meta: Meta | None = None
    heartbeats: dict[str, int] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)


def _position_item(position: Position) -> dict[str, Any]:
    item: dict[str, Any] = {"position_kind": {"S": position.kind}}
    if position.sequence_number is not None:
        item["sequence_number"] = {"S": position.sequence_number}
    if position.sub_sequence_number is not None:
        item["sub_sequence_number"] = {"N": str(position.sub_sequence_number)}
    if position.timestamp is not None:
        item["position_timestamp"] = {"N": repr(position.timestamp.timestamp())}
    return item


def _position_of(item: dict[str, Any]) -> Position:
    kind = item["position_kind"]["S"]
    stamp = item.get("position_timestamp", {}).get("N")
    sub = item.get("sub_sequence_number", {}).get("N")
    return Position(
        kind,
        item.get("sequence_number", {}).get("S"),
        int(sub) if sub is not None else None,
        datetime.fromtimestamp(float(stamp), UTC) if stamp is not None else None,
    )


class LeaseTable:
    def __init__(self, dynamodb: Any, *, table: str, app: str, stream_arn: str, worker_id: str) -> None:
        self._ddb = dynamodb
        self.table = table
        self.partition = f"{app}|{stream_arn}"
        self.worker_id = worker_id
        self._heartbeat = 0

    def _key(self, sort_key: str) -> dict[str, Any]:
        return {"pk": {"S": self.partition}, "sk": {"S": sort_key}}

    def _resource(self) -> str:
        return f"DynamoDB table {self.table!r}"

    async def ensure_table(self, *, create: bool = True, timeout_s: float = 60.0) -> None:
        """Create the table (PAY_PER_REQUEST) if missing and wait until it is ACTIVE."""
        try:
            status = (await self._ddb.describe_table(TableName=self.table))["Table"]["TableStatus"]
        except Exception as exc:
            if error_code(exc) != "ResourceNotFoundException":
                raise translate(exc, resource=self._resource()) from None
            if not create:
                raise ResourceNotFound(f"{self._resource()} does not exist") from None
            try:
                await self._ddb.create_table(
                    TableName=self.table,
                    BillingMode="PAY_PER_REQUEST",
                    AttributeDefinitions=[
                        {"AttributeName": "pk", "AttributeType": "S"},
                        {"AttributeName": "sk", "AttributeType": "S"},
                    ],
                    KeySchema=[
                        {"AttributeName": "pk", "KeyType": "HASH"},
                        {"AttributeName": "sk", "KeyType": "RANGE"},
                    ],
                )
                log.info("table.created", table=self.table)
            except Exception as create_exc:
                if error_code(create_exc) != "ResourceInUseException":  # created concurrently
                    raise translate(
                        create_exc,
                        resource=self._resource(),
                        hint="create it yourself or grant dynamodb:CreateTable",
                    ) from None
            status = "CREATING"
        deadline = time.monotonic() + timeout_s
        while status != "ACTIVE":
            if time.monotonic() > deadline:
                raise ResourceNotFound(f"{self._resource()} did not become ACTIVE (status {status})")
            await asyncio.sleep(0.5)
            status = (await self._ddb.describe_table(TableName=self.table))["Table"]["TableStatus"]

    async def read(self) -> TableState:
        """Every row of this application and stream: one paginated, strongly consistent Query."""
        state = TableState()
        args: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": self.partition}},
            "ConsistentRead": True,
        }
        try:
            while True:
                page = await self._ddb.query(**args)
                for item in page.get("Items", []):
                    self._absorb(state, item)
                if "LastEvaluatedKey" not in page:
                    return state
                args["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None

    async def read_lease(self, shard_id: str) -> Lease | None:
        """One shard's lease, strongly consistent (a subscription asks this before it resubscribes
        after another subscriber took the shard over)."""
        try:
            response = await self._ddb.get_item(
                TableName=self.table, Key=self._key(SHARD_PREFIX + shard_id), ConsistentRead=True
            )
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None
        if "Item" not in response:
            return None
        state = TableState()
        self._absorb(state, response["Item"])
        return state.leases.get(shard_id)

    async def holds(self, lease: Lease) -> bool:
        current = await self.read_lease(lease.shard_id)
        return current is not None and current.owner == self.worker_id and current.counter == lease.counter

    @staticmethod
    def _absorb(state: TableState, item: dict[str, Any]) -> None:
        sort_key = item["sk"]["S"]
        if sort_key == META_KEY:
            state.meta = Meta(
                stream_created_at=datetime.fromtimestamp(float(item["stream_created_at"]["N"]), UTC),
                initial_position=item["initial_position"]["S"],
            )
        elif sort_key.startswith(WORKER_PREFIX):
            state.heartbeats[sort_key.removeprefix(WORKER_PREFIX)] = int(item["heartbeat"]["N"])
        elif sort_key.startswith(SHARD_PREFIX):
            shard_id = sort_key.removeprefix(SHARD_PREFIX)
            state.leases[shard_id] = Lease(
                shard_id=shard_id,
                parents=tuple(p["S"] for p in item.get("parents", {}).get("L", [])),
                owner=item.get("lease_owner", {}).get("S"),
                counter=int(item.get("lease_counter", {}).get("N", "0")),
                checkpoint=_position_of(item),
            )

    async def create_meta(self, stream_created_at: datetime, initial_position: str) -> bool:
        """Record the first start; False when another worker did it first."""
        return await self._put_new(
            META_KEY,
            {
                "stream_created_at": {"N": repr(stream_created_at.timestamp())},
                "initial_position": {"S": initial_position},
                "created_at": {"S": datetime.now(UTC).isoformat()},
            },
        )

    async def create_lease(self, shard_id: str, parents: tuple[str, ...], start: Position) -> bool:
        """A lease row for a newly seen shard, unowned; ``start=SHARD_END`` marks it finished (never read)."""
        item: dict[str, Any] = {
            "parents": {"L": [{"S": p} for p in parents]},
            "lease_counter": {"N": "0"},
            **_position_item(start),
        }
        return await self._put_new(SHARD_PREFIX + shard_id, item)

    async def _put_new(self, sort_key: str, attributes: dict[str, Any]) -> bool:
        try:
            await self._ddb.put_item(
                TableName=self.table,
                Item={**self._key(sort_key), **attributes},
                ConditionExpression="attribute_not_exists(pk)",
            )
            return True
        except Exception as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise translate(exc, resource=self._resource()) from None

    async def claim(self, lease: Lease) -> Lease:
        """Take the lease as it was read (same owner, same counter), or raise LeaseLost."""
        condition = "lease_counter = :counter AND position_kind <> :end AND " + (
            "lease_owner = :previous" if lease.owner else "attribute_not_exists(lease_owner)"
        )
        values: dict[str, Any] = {
            ":counter": {"N": str(lease.counter)},
            ":end": {"S": SHARD_END.kind},
            ":me": {"S": self.worker_id},
            ":one": {"N": "1"},
        }
        if lease.owner:
            values[":previous"] = {"S": lease.owner}
        await self._update(lease, "SET lease_owner = :me, lease_counter = lease_counter + :one", condition, values)
        return replace(lease, owner=self.worker_id, counter=lease.counter + 1)

    async def checkpoint(self, lease: Lease, position: Position) -> Lease:
        """Store where the shard resumes (or SHARD_END). Fenced by owner and counter."""
        attributes = _position_item(position)
        sets = [f"{name} = :{name}" for name in attributes]
        values: dict[str, Any] = {f":{name}": value for name, value in attributes.items()}
        removes = [
            name for name in ("sequence_number", "sub_sequence_number", "position_timestamp") if name not in attributes
        ]
        sets.append("updated_at = :now")
        values[":now"] = {"S": datetime.now(UTC).isoformat()}
        values[":me"] = {"S": self.worker_id}
        values[":counter"] = {"N": str(lease.counter)}
        expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
        await self._update(lease, expression, "lease_owner = :me AND lease_counter = :counter", values)
        return replace(lease, checkpoint=position)

    async def release(self, lease: Lease) -> None:
        """Give the lease up after a clean stop, so the next worker takes it at once."""
        values = {":me": {"S": self.worker_id}, ":counter": {"N": str(lease.counter)}, ":one": {"N": "1"}}
        await self._update(
            lease,
            "REMOVE lease_owner SET lease_counter = lease_counter + :one",
            "lease_owner = :me AND lease_counter = :counter",
            values,
        )

    async def _update(self, lease: Lease, expression: str, condition: str, values: dict[str, Any]) -> None:
        try:
            await self._ddb.update_item(
                TableName=self.table,
                Key=self._key(SHARD_PREFIX + lease.shard_id),
                UpdateExpression=expression,
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
            )
        except Exception as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                raise LeaseLost(f"lease of shard {lease.shard_id} is no longer held by {self.worker_id}") from None
            raise translate(exc, resource=self._resource()) from None

    async def heartbeat(self) -> None:
        self._heartbeat += 1
        try:
            await self._ddb.put_item(
                TableName=self.table,
                Item={
                    **self._key(WORKER_PREFIX + self.worker_id),
                    "heartbeat": {"N": str(self._heartbeat)},
                    "updated_at": {"S": datetime.now(UTC).isoformat()},
                },
            )
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None

    async def remove_worker(self) -> None:
        try:
            await self._ddb.delete_item(TableName=self.table, Key=self._key(WORKER_PREFIX + self.worker_id))
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None

    async def delete_all(self) -> int:
        """Remove every row of this application and stream (the operator's reset). Returns the count."""
        state_keys: list[str] = []
        args: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": {"S": self.partition}},
            "ProjectionExpression": "sk",
            "ConsistentRead": True,
        }
        try:
            while True:
                page = await self._ddb.query(**args)
                state_keys.extend(item["sk"]["S"] for item in page.get("Items", []))
                if "LastEvaluatedKey" not in page:
                    break
                args["ExclusiveStartKey"] = page["LastEvaluatedKey"]
            for sort_key in state_keys:
                await self._ddb.delete_item(TableName=self.table, Key=self._key(sort_key))
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None
        return len(state_keys)
