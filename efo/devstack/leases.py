"""The shard leases of one application and stream, read with a plain boto3 DynamoDB client: what
the benchmarks and the multi-worker tests watch while ``efo run`` processes work (the service
itself reads the table through :class:`efo.leases.table.LeaseTable`)."""

from __future__ import annotations

from typing import Any

from efo.leases.table import SHARD_PREFIX


def shard_leases(dynamodb: Any, table: str, app: str, stream_arn: str) -> dict[str, dict[str, Any]]:
    """Shard id -> its lease row, strongly consistent, all pages; {} while the table does not exist."""
    pages = dynamodb.get_paginator("query").paginate(
        TableName=table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": f"{app}|{stream_arn}"}},
        ConsistentRead=True,
    )
    try:
        items = [item for page in pages for item in page["Items"]]
    except dynamodb.exceptions.ResourceNotFoundException:
        return {}  # the first worker has not created it yet
    return {
        item["sk"]["S"].removeprefix(SHARD_PREFIX): item for item in items if item["sk"]["S"].startswith(SHARD_PREFIX)
    }
