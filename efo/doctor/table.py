"""``efo doctor``'s checks of the lease table: each DynamoDB action efo calls, by a harmless call of
it (writes only to the doctor's own item, deleted again); the key schema and capacity mode; the
application's rows on each stream (written for this stream, in the current layout, the lease
partitions the fleet uses); the checkpoints' age against each stream's retention."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime
from typing import Any

from efo.config import Settings
from efo.doctor.findings import Report, probe
from efo.doctor.stream import StreamFacts
from efo.errors import ConfigError, EfoError
from efo.leases.model import MIN_LEASE_PARTITIONS, SHARDS_PER_LEASE_PARTITION, lease_partitions_for
from efo.leases.table import LeaseTable
from efo.worker.shardsync import ShardSync

#: The partition of the items the doctor writes (and deletes) to check the write actions.
DOCTOR_PARTITION = "efo:doctor"
KEY_SCHEMA = [("pk", "HASH", "S"), ("sk", "RANGE", "S")]


def table_resource(settings: Settings) -> str:
    return f"DynamoDB table {settings.table_name!r}"


async def check_table(
    report: Report,
    settings: Settings,
    dynamodb: Any,
    kinesis: Any,
    streams: list[tuple[Settings, StreamFacts]],
    workers: int,
) -> None:
    resource = table_resource(settings)
    name = settings.table_name
    allowed, described = await probe(
        report,
        "dynamodb:DescribeTable",
        resource,
        lambda: dynamodb.describe_table(TableName=name),
        allowed=frozenset({"ResourceNotFoundException"}),
    )
    if not allowed:
        report.add("table", resource, "skip", "not checked: the table could not be described")
        return
    if described is None:
        report.add(
            "table",
            resource,
            "warn",
            "does not exist: the first start creates it (PAY_PER_REQUEST), which needs dynamodb:CreateTable on "
            "it; only creating checks that: drop CreateTable from the policy and create it ahead (keys pk, sk: "
            "strings), or let the first start create it",
        )
        return
    description = described["Table"]
    if not _schema(report, resource, description):
        return
    _capacity(report, resource, description, settings, workers, streams)
    for each, facts in streams:
        await _rows(report, each, dynamodb, kinesis, facts)
    await _writes(report, resource, dynamodb, name, settings.worker_id)


def _schema(report: Report, resource: str, description: dict[str, Any]) -> bool:
    kinds = {a["AttributeName"]: a["AttributeType"] for a in description.get("AttributeDefinitions", [])}
    found = [(k["AttributeName"], k["KeyType"], kinds.get(k["AttributeName"], "?")) for k in description["KeySchema"]]
    status = description.get("TableStatus", "?")
    if found != KEY_SCHEMA:
        keys = ", ".join(f"{name} ({kind}, {type_})" for name, kind, type_ in found)
        report.add(
            "table.keys",
            resource,
            "fail",
            f"keyed {keys}, not pk (HASH, S), sk (RANGE, S): it belongs to something else; set EFO_TABLE (table) to "
            "another name",
        )
        return False
    report.add("table.keys", resource, "ok" if status == "ACTIVE" else "warn", f"pk (HASH, S), sk (RANGE, S); {status}")
    return True


def _capacity(
    report: Report,
    resource: str,
    description: dict[str, Any],
    settings: Settings,
    workers: int,
    streams: list[tuple[Settings, StreamFacts]],
) -> None:
    """On demand fits any fleet; provisioned capacity must carry the heartbeats and checkpoints."""
    mode = (description.get("BillingModeSummary") or {}).get("BillingMode", "PROVISIONED")
    throughput = description.get("ProvisionedThroughput") or {}
    if mode == "PAY_PER_REQUEST":
        report.add("table.capacity", resource, "ok", "PAY_PER_REQUEST (on demand)")
        return
    shards = sum(facts.info.open_shards for _, facts in streams)
    writes_per_s = (
        workers * len(streams) / settings.lease.heartbeat_interval_s + shards / settings.checkpoint.interval_s
    )
    reads_per_s = workers * len(streams) / settings.lease.sync_interval_s
    wcu, rcu = int(throughput.get("WriteCapacityUnits", 0)), int(throughput.get("ReadCapacityUnits", 0))
    need = f"about {math.ceil(writes_per_s)} writes/s and {math.ceil(reads_per_s)} reads/s for {workers} worker(s)"
    if wcu < writes_per_s or rcu < reads_per_s:
        report.add(
            "table.capacity",
            resource,
            "warn",
            f"PROVISIONED {rcu} RCU / {wcu} WCU, below {need} (each 1 KB or less): throttled checkpoints pause "
            "reading; switch it to PAY_PER_REQUEST or raise its capacity",
        )
    else:
        report.add("table.capacity", resource, "ok", f"PROVISIONED {rcu} RCU / {wcu} WCU, {need}")


async def _rows(report: Report, settings: Settings, dynamodb: Any, kinesis: Any, facts: StreamFacts) -> None:
    """The application's rows on this stream: GetItem (the meta row), Query (the control partition),
    their layout, and the checkpoints' age against the stream's retention."""
    table = LeaseTable(
        dynamodb, table=settings.table_name, app=settings.app, stream_arn=facts.info.arn, worker_id="efo-doctor"
    )
    resource = table_resource(settings)
    where = f"application {settings.app!r} on stream {facts.info.name!r}"
    allowed, _ = await probe(report, "dynamodb:GetItem", resource, table.read_meta)
    queried, _ = await probe(report, "dynamodb:Query", resource, table.read_control)
    if not (allowed and queried):
        report.add("table.layout", resource, "skip", f"not checked for {where}: its rows could not be read")
        return
    try:
        meta = await ShardSync(settings=settings, stream=facts.info, kinesis=kinesis, table=table).check()
    except (ConfigError, EfoError) as error:
        report.add("table.layout", resource, "fail", f"{where}: {error}")
        return
    if meta is None:
        partitions = lease_partitions_for(facts.info.open_shards)
        report.add(
            "table.layout",
            resource,
            "ok",
            f"{where}: no rows yet; the first start writes them in {partitions} lease partitions "
            f"(one per {SHARDS_PER_LEASE_PARTITION} shards, at least {MIN_LEASE_PARTITIONS}), "
            f"from {settings.initial_position}",
        )
        return
    started = meta.started_at.isoformat(timespec="seconds") if meta.started_at else "unknown"
    layout = meta.layout
    assert layout is not None  # check() refused a table of the layout before lease partitions
    grown = f" in {len(layout.sizes)} generations ({'+'.join(map(str, layout.sizes))})" if layout.grown else ""
    report.add(
        "table.layout",
        resource,
        "ok",
        f"{where}: written for this stream, {layout.partitions} lease partitions{grown}, first start {started} from "
        f"{meta.initial_position}",
    )
    read, everything = await probe(report, "dynamodb:Query", f"{resource} (lease partitions)", table.read)
    if read and everything is not None:
        _retention(
            report, where, facts, [lease.updated_at for lease in everything.leases.values() if not lease.finished]
        )


def _retention(report: Report, where: str, facts: StreamFacts, written: list[datetime | None]) -> None:
    stamps = [stamp for stamp in written if stamp is not None]
    retention = f"the stream keeps {facts.retention_hours} h"
    if not stamps:
        report.add("stream.retention", facts.info.arn, "ok", f"{where}: no checkpoint yet; {retention}")
        return
    oldest_h = (datetime.now(UTC) - min(stamps)).total_seconds() / 3600
    detail = f"{where}: the oldest checkpoint was written {oldest_h:.1f} h ago; {retention}"
    if oldest_h >= 0.8 * facts.retention_hours:
        report.add(
            "stream.retention",
            facts.info.arn,
            "warn",
            f"{detail}: records written after it are past (or near) retention when the shard starts again (it then "
            "starts at TRIM_HORIZON; an idle shard loses nothing); start the application, or raise the retention",
        )
    else:
        report.add("stream.retention", facts.info.arn, "ok", detail)


async def _writes(report: Report, resource: str, dynamodb: Any, name: str, worker_id: str) -> None:
    """PutItem, UpdateItem, DeleteItem on the doctor's own item (partition ``efo:doctor``), which is
    deleted again. The update only applies to an existing item (it never creates one), and a
    refused condition is an answer that only a permitted call gets."""
    key = {"pk": {"S": DOCTOR_PARTITION}, "sk": {"S": f"{worker_id}-{uuid.uuid4().hex}"}}
    await probe(
        report,
        "dynamodb:PutItem",
        resource,
        lambda: dynamodb.put_item(TableName=name, Item={**key, "doctor": {"S": "a check of efo doctor"}}),
    )
    await probe(
        report,
        "dynamodb:UpdateItem",
        resource,
        lambda: dynamodb.update_item(
            TableName=name,
            Key=key,
            UpdateExpression="SET checked = :now",
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeValues={":now": {"S": datetime.now(UTC).isoformat()}},
        ),
        allowed=frozenset({"ConditionalCheckFailedException"}),
    )
    deleted, _ = await probe(
        report, "dynamodb:DeleteItem", resource, lambda: dynamodb.delete_item(TableName=name, Key=key)
    )
    if not deleted:
        leftover = f"pk {DOCTOR_PARTITION!r}, sk {key['sk']['S']!r}"
        report.add("table.cleanup", resource, "warn", f"the doctor's probe item may be left ({leftover}): delete it")
