"""The operator's work on a lease table, apart from the gateway the workers run on
(:class:`~efo.leases.table.LeaseTable`): removing every row of an application and stream
(``efo checkpoints reset --delete-all``), moving the leases of a table of the layout before lease
partitions into them (``efo checkpoints migrate``), and reading every worker's heartbeat row of every
application in a table (``efo consumers``). No worker runs any of it; the first two want every
worker of the application stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from efo.concurrency import bounded
from efo.errors import translate
from efo.leases.codec import META_KEY, REGISTRY_PK, SHARD_PREFIX, WORKER_PREFIX, meta_of, number_of, worker_of
from efo.leases.model import WorkerRow, lease_partition_of, lease_partitions_for
from efo.leases.table import READ_CONCURRENCY, LeaseTable, query_partition, table_resource

log = structlog.get_logger("efo.leases.admin")


async def delete_all(table: LeaseTable) -> int:
    """Remove every row of ``table``'s application and stream (the operator's reset). Returns the count."""
    meta = await table.read_meta_item()
    # Every generation's (a grown table's migrating_to), or a migration's cut short.
    count = number_of(meta, "lease_partitions") or number_of(meta, "migrating_to")
    # The meta row, which names the lease partitions, goes last: a removal cut short is run again.
    partitions = [table.lease_partition_key(n) for n in range(count or 0)] + [table.partition]
    deleted = 0
    dynamodb = table.dynamodb
    try:
        for partition in partitions:
            for item in await query_partition(dynamodb, table.table, partition, projection="pk, sk"):
                await dynamodb.delete_item(TableName=table.table, Key={"pk": item["pk"], "sk": item["sk"]})
                deleted += 1
    except Exception as exc:
        raise translate(exc, resource=table_resource(table.table)) from None
    table.forget_layout()
    return deleted


async def migrate(table: LeaseTable) -> int:
    """Move the lease rows of a table of the layout before lease partitions (every row in the
    control partition) to lease partitions; returns how many were copied (0: nothing to move).
    Every worker of the application must be stopped. Safe to run again after a crash at any
    step: the meta row names the partitions to come (``migrating_to``) before any copy, each row
    is copied as it is (its owner cleared: nobody runs), then the meta row names them as the
    partitions (from then on the copies are the leases), then the old rows are deleted."""
    meta = await table.read_meta_item()
    if meta is None:
        raise table.not_started()
    if "lease_generations" in meta:  # grown: in lease partitions since long before
        table.adopt(meta_of(meta))
        return 0
    dynamodb = table.dynamodb
    try:
        old = await query_partition(dynamodb, table.table, table.partition, SHARD_PREFIX)
        copied = 0
        partitions = number_of(meta, "lease_partitions")
        if partitions is None:
            partitions = number_of(meta, "migrating_to") or lease_partitions_for(len(old))
            await _set_meta(table, "SET migrating_to = :n", partitions)
            await bounded(READ_CONCURRENCY, lambda item: _copy_lease(table, item, partitions), old)
            await _set_meta(table, "SET lease_partitions = :n REMOVE migrating_to", partitions)
            copied = len(old)
        for item in old:  # the copies are the leases now
            await dynamodb.delete_item(TableName=table.table, Key={"pk": item["pk"], "sk": item["sk"]})
    except Exception as exc:
        raise translate(exc, resource=table_resource(table.table)) from None
    await table.migrated(partitions, moved=bool(old))
    log.info("table.migrated", table=table.table, app=table.app, leases=len(old), lease_partitions=partitions)
    return copied


async def _copy_lease(table: LeaseTable, item: dict[str, Any], partitions: int) -> None:
    shard_id = item["sk"]["S"].removeprefix(SHARD_PREFIX)
    row = {name: value for name, value in item.items() if name not in ("pk", "lease_owner")}
    row["pk"] = {"S": table.lease_partition_key(lease_partition_of(shard_id, partitions))}
    row["lease_counter"] = {"N": str(int(item.get("lease_counter", {}).get("N", "0")) + 1)}
    await table.dynamodb.put_item(TableName=table.table, Item=row)


async def _set_meta(table: LeaseTable, expression: str, partitions: int) -> None:
    """``expression`` on the meta row, while it names no lease partitions yet."""
    await table.dynamodb.update_item(
        TableName=table.table,
        Key={"pk": {"S": table.partition}, "sk": {"S": META_KEY}},
        UpdateExpression=expression,
        ConditionExpression="attribute_not_exists(lease_partitions)",
        ExpressionAttributeValues={":n": {"N": str(partitions)}},
    )


@dataclass(frozen=True, slots=True)
class TableWorker:
    """A heartbeat row found by :func:`table_workers`, with the application and stream it is of."""

    app: str
    stream_arn: str
    row: WorkerRow


async def table_workers(
    dynamodb: Any, table: str, *, known: tuple[tuple[str, str], ...] = (), hint: str = ""
) -> list[TableWorker]:
    """Every worker's heartbeat row in ``table``, of every application and stream: one Query of
    the registry partition (the partitions of the table), then one Query of each partition's worker
    rows. Never a Scan. ``known``: (app, stream ARN) partitions to read even if not registered (a
    worker of a release before the registry)."""
    found: list[TableWorker] = []
    try:
        partitions = {
            (entry["app"]["S"], entry["stream_arn"]["S"])
            for entry in await query_partition(dynamodb, table, REGISTRY_PK)
        }
        for app, stream_arn in sorted(partitions | set(known)):
            rows: dict[str, WorkerRow] = {}
            for item in await query_partition(dynamodb, table, f"{app}|{stream_arn}", WORKER_PREFIX):
                row = worker_of(item)
                rows[row.worker_id] = row
            found.extend(TableWorker(app, stream_arn, row) for row in rows.values())
    except Exception as exc:
        raise translate(exc, resource=table_resource(table), hint=hint) from None
    return found
