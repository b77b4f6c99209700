"""``efo workers``: every worker of the application on the stream, live or dead, and what it holds."""

from __future__ import annotations

from typing import Any

import click

from efo.cli.common import (
    STREAM_COLUMN,
    Column,
    Connection,
    Scope,
    for_each_stream,
    iso,
    json_option,
    now,
    print_json,
    print_table,
    scoped_streams,
    shown,
    streams_text,
)
from efo.cli.group import examples
from efo.cli.status import duration, worker_statuses
from efo.leases.model import TableState


def worker_records(stream: str, state: TableState, failover_s: float) -> list[dict[str, Any]]:
    """The ``--json`` shape of one stream (its name): live workers first, then by id. A lease owner
    without a heartbeat row is listed dead, with null heartbeat fields."""
    held: dict[str, list[str]] = {}
    for lease in state.leases.values():
        if lease.owner:
            held.setdefault(lease.owner, []).append(lease.shard_id)
    records = []
    for status in worker_statuses(state, now(), failover_s).values():
        row = status.row
        age = status.heartbeat_age_s
        records.append(
            {
                "stream": stream,
                "worker_id": status.worker_id,
                "live": status.live,
                "heartbeat_age_s": None if age is None else round(age, 3),
                "heartbeat_at": iso(row.updated_at) if row else None,
                "started_at": iso(row.started_at) if row else None,
                "version": row.version if row else None,
                "consumer_arn": row.consumer_arn if row else None,
                "leases": len(held.get(status.worker_id, [])),
                "shard_ids": sorted(held.get(status.worker_id, [])),
            }
        )
    return sorted(records, key=lambda r: (not r["live"], r["worker_id"]))


def consumer_name(arn: str | None) -> str:
    """``billing`` of ``arn:aws:kinesis:...:stream/orders/consumer/billing:1700000000``."""
    return "" if not arn else arn.rsplit("/consumer/", 1)[-1].rsplit(":", 1)[0]


WORKER_COLUMNS = (
    STREAM_COLUMN,
    Column("worker", lambda r: r["worker_id"]),
    Column("state", lambda r: "live" if r["live"] else "dead", lambda r: "green" if r["live"] else "red"),
    Column(
        "heartbeat", lambda r: duration(r["heartbeat_age_s"]) + (" ago" if r["heartbeat_age_s"] is not None else "")
    ),
    Column("leases", lambda r: str(r["leases"])),
    Column("version", lambda r: r["version"] or ""),
    Column("started", lambda r: shown(r["started_at"])),
    Column("consumer", lambda r: consumer_name(r["consumer_arn"])),
)


@click.command(
    "workers",
    short_help="Live and dead workers: heartbeats, leases, versions.",
    epilog=examples(
        "efo workers --stream orders --app billing",
        "efo workers --config efo.yaml --app billing",
        "efo workers --stream orders --app billing --json",
    ),
)
@scoped_streams(need_app=True)
@json_option
def workers_command(scopes: list[Scope], as_json: bool) -> int:
    """Each worker of the application on every configured stream (or on the one --stream names),
    live or dead: heartbeat age, leases held, version, consumer.

    A worker is live while its heartbeat row was written less than lease.failover_s ago (on this
    machine's clock). A dead worker's leases are taken over by the live ones.
    """

    async def body(conn: Connection) -> list[dict[str, Any]]:
        state = await conn.table_state()
        return worker_records(conn.stream.name, state, conn.scope.settings.lease.failover_s)

    covered = for_each_stream(scopes, body)
    records = [record for records in covered.results for record in records]
    if as_json:
        print_json(records)
    elif records or not covered.missing:
        print_table(
            records,
            WORKER_COLUMNS,
            empty=f"no workers of application {scopes[0].app!r} on {streams_text(scopes)} (none running)",
        )
    return covered.report_missing()
