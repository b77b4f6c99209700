"""``efo workers``: every worker of the application on the stream, live or dead, and what it holds."""

from __future__ import annotations

from typing import Any

import click

from efo.cli.common import (
    Column,
    Connection,
    Scope,
    examples,
    iso,
    json_option,
    now,
    print_json,
    print_table,
    scoped,
    shown,
    with_stream,
)
from efo.cli.status import duration, worker_statuses
from efo.errors import EXIT_OK
from efo.leases.table import TableState


def worker_records(state: TableState, failover_s: float) -> list[dict[str, Any]]:
    """The ``--json`` shape: live workers first, then by id. A lease owner without a heartbeat row
    is listed dead, with null heartbeat fields."""
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
    epilog=examples("efo workers --stream orders --app billing", "efo workers --stream orders --app billing --json"),
)
@scoped(need_app=True)
@json_option
def workers_command(scope: Scope, as_json: bool) -> int:
    """Each worker of the application, live or dead: heartbeat age, leases held, version, consumer.

    A worker is live while its heartbeat row was written less than lease.failover_s ago (on this
    machine's clock). A dead worker's leases are taken over by the live ones.
    """

    async def body(conn: Connection) -> TableState:
        return await conn.table_state()

    records = worker_records(with_stream(scope, body), scope.settings.lease.failover_s)
    if as_json:
        print_json(records)
        return EXIT_OK
    print_table(
        records,
        WORKER_COLUMNS,
        empty=f"no workers of application {scope.app!r} on stream {scope.settings.stream!r} (none running)",
    )
    return EXIT_OK
