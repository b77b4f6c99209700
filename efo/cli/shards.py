"""``efo shards``: the shard tree across splits and merges; with an application, who reads each
shard, from where, and how far behind."""

from __future__ import annotations

from typing import Any

import click

from efo.cli.common import (
    STREAM_COLUMN,
    Column,
    Connection,
    Scope,
    for_each_stream,
    json_option,
    live_workers,
    print_json,
    print_table,
    scoped_streams,
    streams_text,
)
from efo.cli.group import examples
from efo.cli.status import LEASE_STYLES, hash_share, lag_text, lease_record, tree_order
from efo.kinesis.graph import ShardGraph
from efo.kinesis.shards import list_shards
from efo.leases.model import TableState


def shard_records(stream: str, graph: ShardGraph, state: TableState | None, live: set[str]) -> list[dict[str, Any]]:
    """The ``--json`` shape of one stream (its name): one record per shard in tree order. ``state``
    is ``open``, ``closed`` or ``expired`` (a lease of a shard past the stream's retention); the
    lease fields are null without an application."""
    leases = state.leases if state is not None else {}
    records = []
    for shard_id, depth in tree_order(graph, leases):
        hash_keys: tuple[str | None, str | None] = (None, None)
        shard = graph.shards.get(shard_id)
        lease = leases.get(shard_id)
        if shard is None:
            assert lease is not None  # tree_order adds only shards with a lease
            parents, children, kind = list(lease.parents), [], "expired"
        else:
            parents, children = list(shard.parents), graph.children(shard_id)
            kind = "closed" if graph.is_closed(shard_id) else "open"
            hash_keys = (str(shard.starting_hash_key), str(shard.ending_hash_key))
        record: dict[str, Any] = {
            "stream": stream,
            "shard_id": shard_id,
            "depth": depth,
            "state": kind,
            "parents": parents,
            "children": children,
            "starting_hash_key": hash_keys[0],
            "ending_hash_key": hash_keys[1],
        }
        if state is None:
            record |= dict.fromkeys(lease_record(None, set()), None)
        else:
            record |= lease_record(lease, live)
        records.append(record)
    return records


def _hash_range(record: dict[str, Any]) -> str:
    if record["starting_hash_key"] is None:
        return ""
    return hash_share(int(record["starting_hash_key"]), int(record["ending_hash_key"]))


TREE_COLUMNS = (
    STREAM_COLUMN,
    Column("shard", lambda r: "  " * r["depth"] + ("└ " if r["depth"] else "") + r["shard_id"]),
    Column("state", lambda r: r["state"], lambda r: "green" if r["state"] == "open" else "dim"),
    Column("hash range", _hash_range),
    Column("parents", lambda r: ",".join(r["parents"])),
    Column("children", lambda r: ",".join(r["children"])),
)
LEASE_COLUMNS = (
    Column("owner", lambda r: r["owner"] or ""),
    Column("lease", lambda r: r["lease_state"], lambda r: LEASE_STYLES.get(r["lease_state"], "")),
    Column("lag", lag_text),
    Column("checkpoint", lambda r: r["checkpoint"] or ""),
)


@click.command(
    "shards",
    short_help="The shard tree; with --app, owners, checkpoints, lag.",
    epilog=examples(
        "efo shards --stream orders",
        "efo shards --stream orders --app billing",
        "efo shards --config efo.yaml --app billing",
        "efo shards --stream orders --app billing --json | jq '.[] | select(.lease_state != \"reading\")'",
    ),
)
@scoped_streams(need_app=False)
@json_option
def shards_command(scopes: list[Scope], as_json: bool) -> int:
    """The shard tree of every configured stream (or of the one --stream names): parents, children,
    hash ranges, open or closed. With --app (or EFO_APP), each shard's owner, lease state, lag (the
    MillisBehindLatest its owner last wrote) and checkpoint.

    Lease states: reading (a live worker holds it), owner-dead (its owner's heartbeat is older than
    lease.failover_s), free, finished (SHARD_END), no-lease (not yet seen by a worker).
    """
    with_app = scopes[0].app is not None

    async def body(conn: Connection) -> list[dict[str, Any]]:
        graph = await list_shards(conn.kinesis, conn.stream.arn)
        state = await conn.table_state() if with_app else None
        live = live_workers(state, conn.scope) if state is not None else set()
        return shard_records(conn.stream.name, graph, state, live)

    covered = for_each_stream(scopes, body)
    records = [record for records in covered.results for record in records]
    if as_json:
        print_json(records)
    elif records or not covered.missing:
        columns = TREE_COLUMNS + (LEASE_COLUMNS if with_app else ())
        print_table(records, columns, empty=f"no shards on {streams_text(scopes)}")
    return covered.report_missing()
