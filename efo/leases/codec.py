"""The lease table's items: their keys and attributes, and how a lease, a position and the meta row
are written to and read from DynamoDB's attribute values (the one place that knows them; the layout
of the table is described in :mod:`efo.leases.table`). No client, no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from efo.leases.model import Lease, MemberChange, Meta, PendingReset, WorkerRow
from efo.pipeline.records import Position

META_KEY = "meta"
WORKER_PREFIX = "worker|"
#: The registry partition: one row per application partition of the table (``sk = <app>|<stream ARN>``).
REGISTRY_PK = "efo:partitions"
SHARD_PREFIX = "shard|"
#: A shard's reservation (the partition of its lease), in its lease partition of generation 0.
RESERVED_PREFIX = "made|"
#: A grown table's ``lease_partitions``: a string, which an older release fails to read as a number.
GROWN = "grown: see lease_generations; efo of this table's layout_format or later reads it"
VERSION_KEY = "version"
#: On the version row: moved by every change of who is alive (efo.leases.membership).
MEMBERS_ATTRIBUTE = "members"
#: On the version row: who each of the last moves of the membership counter was about, so that a
#: reader one or a few moves behind reads those heartbeat rows, not all of them (efo.worker.membership):
#: ``c<n mod MEMBER_CHANGE_SLOTS>``, a list of the counter ``n`` the move set, then the workers' names.
MEMBER_CHANGE_PREFIX = "c"
MEMBER_CHANGE_SLOTS = 8
#: A move about more workers than this goes unnamed (every row read: as cheap, for so many).
MEMBER_CHANGE_MOST_NAMED = 16
#: On the version row: the workers stopping now (a string set), so that every worker's next cycle
#: counts no share for them (efo.leases.balance) while they read on and release.
LEAVING_ATTRIBUTE = "leaving"
#: Sorts after ``meta`` and every ``shard|`` key, before ``version`` and ``worker|``: the control rows follow it.
AFTER_SHARDS = "shard}"
#: In a lease partition: the mark, a copy of its version (read with its leases, in the same Query).
MARK_KEY = "version"
MARK_ATTRIBUTE = "changes"
#: Sorts before every ``shard|`` key and the mark of a lease partition: a read of its leases takes what follows.
LEASE_ROWS_AFTER = "shard"
#: On a released lease's row until its next claim: when its last owner last subscribed to its shard
#: (epoch seconds), so that the next owner's first SubscribeToShard comes when Kinesis takes it.
SUBSCRIBED_ATTRIBUTE = "subscribed_at"
#: On a lease's row from a reset applied without a claim until its next claim: the claim reads the
#: parents strongly first (:attr:`efo.leases.model.Lease.parents_unchecked`).
PARENTS_UNCHECKED_ATTRIBUTE = "parents_unchecked"


def version_attribute(partition: int) -> str:
    return f"p{partition}"


POSITION_ATTRIBUTES = ("position_kind", "sequence_number", "sub_sequence_number", "position_timestamp")
RESET_PREFIX = "reset_"


def position_item(position: Position, prefix: str = "") -> dict[str, Any]:
    item: dict[str, Any] = {f"{prefix}position_kind": {"S": position.kind}}
    if position.sequence_number is not None:
        item[f"{prefix}sequence_number"] = {"S": position.sequence_number}
    if position.sub_sequence_number is not None:
        item[f"{prefix}sub_sequence_number"] = {"N": str(position.sub_sequence_number)}
    if position.timestamp is not None:
        item[f"{prefix}position_timestamp"] = {"N": repr(position.timestamp.timestamp())}
    return item


def position_of(item: dict[str, Any], prefix: str = "") -> Position:
    kind = item[f"{prefix}position_kind"]["S"]
    stamp = item.get(f"{prefix}position_timestamp", {}).get("N")
    sub = item.get(f"{prefix}sub_sequence_number", {}).get("N")
    return Position(
        kind,
        item.get(f"{prefix}sequence_number", {}).get("S"),
        int(sub) if sub is not None else None,
        datetime.fromtimestamp(float(stamp), UTC) if stamp is not None else None,
    )


def parse_lease(item: dict[str, Any]) -> Lease:
    reset_id = item.get("reset_id", {}).get("S")
    lag = item.get("lag_ms", {}).get("N")
    subscribed = item.get(SUBSCRIBED_ATTRIBUTE, {}).get("N")
    return Lease(
        shard_id=item["sk"]["S"].removeprefix(SHARD_PREFIX),
        parents=tuple(p["S"] for p in item.get("parents", {}).get("L", [])),
        owner=item.get("lease_owner", {}).get("S"),
        counter=int(item.get("lease_counter", {}).get("N", "0")),
        checkpoint=position_of(item),
        updated_at=datetime_of(item.get("updated_at", {}).get("S")),
        wanted_by=item.get("wanted_by", {}).get("S"),
        reset=PendingReset(reset_id, position_of(item, RESET_PREFIX)) if reset_id else None,
        lag_ms=int(lag) if lag is not None else None,
        subscribed_at=datetime.fromtimestamp(float(subscribed), UTC) if subscribed is not None else None,
        parents_unchecked=item.get(PARENTS_UNCHECKED_ATTRIBUTE, {}).get("BOOL", False),
    )


def stamp(moment: datetime) -> dict[str, Any]:
    return {"S": moment.isoformat()}


def datetime_of(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


@dataclass
class Update:
    """One conditional UpdateItem, built up clause by clause."""

    sets: list[str] = field(default_factory=list)
    removes: list[str] = field(default_factory=list)
    conditions: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)

    def set_position(self, position: Position, prefix: str = "") -> None:
        attributes = position_item(position, prefix)
        for name, value in attributes.items():
            self.sets.append(f"{name} = :{name}")
            self.values[f":{name}"] = value
        self.removes += [prefix + name for name in POSITION_ATTRIBUTES if prefix + name not in attributes]

    def fence(self, lease: Lease) -> None:
        """Only if the lease is still as it was read: the same owner (or none) and counter."""
        self.values[":counter"] = {"N": str(lease.counter)}
        self.conditions.append("lease_counter = :counter")
        if lease.owner is None:
            self.conditions.append("attribute_not_exists(lease_owner)")
        else:
            self.values[":owner"] = {"S": lease.owner}
            self.conditions.append("lease_owner = :owner")

    def next_counter(self) -> None:
        self.sets.append("lease_counter = lease_counter + :one")
        self.values[":one"] = {"N": "1"}

    def apply_reset(self, reset: PendingReset, now: datetime) -> None:
        """The pending reset becomes the checkpoint, if it is still the one that was read."""
        self.set_position(reset.position)
        self.sets.append("updated_at = :now")
        self.values[":now"] = stamp(now)
        self.removes += ["reset_id", *(RESET_PREFIX + name for name in POSITION_ATTRIBUTES)]
        self.values[":reset"] = {"S": reset.reset_id}
        self.conditions.append("reset_id = :reset")

    def expression(self) -> str:
        removes = sorted(set(self.removes))
        clauses = (["SET " + ", ".join(self.sets)] if self.sets else []) + (
            ["REMOVE " + ", ".join(removes)] if removes else []
        )
        return " ".join(clauses)


def meta_of(item: dict[str, Any]) -> Meta:
    """The meta row, parsed (the one place that knows its attributes)."""
    started = item.get("started_at", {}).get("N")
    generations = item.get("lease_generations", {}).get("L", [])
    return Meta(
        stream_created_at=datetime.fromtimestamp(float(item["stream_created_at"]["N"]), UTC),
        initial_position=item["initial_position"]["S"],
        started_at=datetime.fromtimestamp(float(started), UTC) if started else None,
        complete=item.get("complete", {}).get("BOOL", True),
        bootstrapper=item.get("bootstrapper", {}).get("S"),
        lease_partitions=number_of(item, "lease_partitions"),  # a string in a grown table
        lease_generations=tuple(int(size["N"]) for size in generations),
        layout_format=number_of(item, "layout_format") or 0,
    )


def worker_of(item: dict[str, Any]) -> WorkerRow:
    """A worker's heartbeat row (``sk = worker|<id>``), parsed (the one place that knows its attributes)."""
    return WorkerRow(
        worker_id=item["sk"]["S"].removeprefix(WORKER_PREFIX),
        heartbeat=int(item["heartbeat"]["N"]),
        updated_at=datetime_of(item.get("updated_at", {}).get("S")),
        version=item.get("version", {}).get("S"),
        started_at=datetime_of(item.get("started_at", {}).get("S")),
        consumer_arn=item.get("consumer_arn", {}).get("S"),
        reads=item.get("reads", {}).get("S"),
        in_doubt=item.get("in_doubt", {}).get("BOOL", False),
        leaving=item.get("leaving", {}).get("BOOL", False),
        deletes_leases=item.get("deletes_leases", {}).get("BOOL", False),
        reads_generations=item.get("reads_generations", {}).get("BOOL", False),
    )


def number_of(item: dict[str, Any] | None, name: str) -> int | None:
    value = (item or {}).get(name, {}).get("N")
    return int(value) if value is not None else None


def members_of(item: Mapping[str, Any]) -> int:
    """The membership counter of a version row (0: none yet)."""
    return int(item.get(MEMBERS_ATTRIBUTE, {}).get("N", "0"))


def member_change_attribute(moved_to: int) -> str:
    """The version row's attribute that names the workers of the move that set the counter to ``moved_to``."""
    return f"{MEMBER_CHANGE_PREFIX}{moved_to % MEMBER_CHANGE_SLOTS}"


def member_change_value(moved_to: int, workers: Iterable[str], *, stopped: str | None = None) -> dict[str, Any]:
    """Its value: the counter, then the workers' names; the name of a worker whose own stop released
    every lease again, as a string set (so the others tell what a read shows it holding from a dead
    worker's leases)."""
    names = [{"S": worker} for worker in workers]
    return {"L": [{"N": str(moved_to)}, *names, *([{"SS": [stopped]}] if stopped else [])]}


def member_changes_of(item: Mapping[str, Any]) -> dict[int, MemberChange]:
    """The moves a version row names: the counter each set -> the workers it was about."""
    changes: dict[int, MemberChange] = {}
    for slot in range(MEMBER_CHANGE_SLOTS):
        entry = item.get(f"{MEMBER_CHANGE_PREFIX}{slot}", {}).get("L")
        if entry and "N" in entry[0]:
            stopped = frozenset(name for value in entry[1:] for name in value.get("SS", ()))
            about = frozenset(value["S"] for value in entry[1:] if "S" in value) | stopped
            changes[int(entry[0]["N"])] = MemberChange(about, stopped)
    return changes
