"""The shard leases of one application and stream, read with a plain boto3 DynamoDB client: what
the benchmarks and the multi-worker tests watch while ``efo run`` processes work (the service
itself reads the table through :class:`efo.leases.table.LeaseTable`)."""

from __future__ import annotations

from typing import Any

from efo.leases.codec import META_KEY, SHARD_PREFIX, meta_of


def shard_leases(dynamodb: Any, table: str, app: str, stream_arn: str) -> dict[str, dict[str, Any]]:
    """Shard id -> its lease row, strongly consistent, all pages, from every lease partition that
    the meta row names (of every generation: efo.leases.model.Layout); {} while the table or the
    application's first start does not exist."""
    control = f"{app}|{stream_arn}"
    try:
        meta = dynamodb.get_item(
            TableName=table, Key={"pk": {"S": control}, "sk": {"S": META_KEY}}, ConsistentRead=True
        ).get("Item")
    except dynamodb.exceptions.ResourceNotFoundException:
        return {}  # the first worker has not created it yet
    layout = meta_of(meta).layout if meta is not None else None
    if layout is None:
        return {}
    items = []
    for partition in range(layout.partitions):
        pages = dynamodb.get_paginator("query").paginate(
            TableName=table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :shard)",
            ExpressionAttributeValues={":pk": {"S": f"{control}#{partition}"}, ":shard": {"S": SHARD_PREFIX}},
            ConsistentRead=True,
        )
        items += [item for page in pages for item in page["Items"]]
    return {item["sk"]["S"].removeprefix(SHARD_PREFIX): item for item in items}
