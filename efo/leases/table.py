"""The lease and checkpoint table in DynamoDB.

An application on a stream has one control partition, ``pk = <app>|<stream ARN>``, and its lease
rows spread over lease partitions, ``pk = <app>|<stream ARN>#<n>``, so that no partition key carries
every checkpoint write of a large stream. The first start makes ``lease_partitions`` of them (about
64 shards a partition, at least 8): generation 0. When the leases in the newest generation outgrow
it, the worker that lists the stream adds one (:meth:`LeaseTable.grow`), numbered after the
partitions before it (efo.leases.model.Layout). Leases never move: each is written once, in the
partition of its shard (CRC-32 of the shard id modulo the generation's size) in the newest
generation its writer knew, and found by reading every partition. All of it is read with paginated
Queries (never a Scan):

- control ``sk = meta``: the stream's creation time (a stream deleted and recreated under the same
  name has the same ARN but a new creation time), the initial position of the first start, the
  worker that bootstraps it, and ``lease_partitions`` (generation 0's). A grown table's holds the
  sizes of its generations in ``lease_generations``, the newest's number in ``lease_generation``,
  ``layout_format`` (a later format is refused) and every partition's count in ``migrating_to`` (what
  an older release's ``efo checkpoints reset --delete-all`` deletes); its ``lease_partitions`` is a
  string, on which an older release, which would miss the leases of the partitions it does not know,
  fails before it reads or writes a lease.
- control ``sk = version``: one counter per lease partition, ``p<n>``, moved by every change of a
  lease of that partition other than its checkpoint (a claim, a release, SHARD_END, a handover
  request, a reset, a new lease).
- control ``sk = worker|<id>``: one heartbeat row per worker; liveness costs writes per worker, not
  per shard.
- lease partition ``sk = shard|<id>``: owner, lease counter, parents, and the checkpoint (a starting
  position, or :data:`~efo.pipeline.records.SHARD_END` once the sink committed the shard's last record).
- lease partition ``sk = made|<id>``: a shard's reservation, in its partition of generation 0, written
  (conditionally) before its lease: the partition that holds the lease, so that two writers that know
  different generations write one lease, where the first said (a lease without one, written before
  reservations or by a first start, is in that same partition of generation 0).
- lease partition ``sk = version``: the partition's mark, ``changes``, a copy of its version set by every
  change of a lease there after the change and the version's move (efo.leases.cache: an eventually
  consistent read whose mark is below the version read before it answered from before the change).

The version and the heartbeats sort after ``meta``, so :meth:`LeaseTable.read_control` reads just
those (a Query of ``sk > "shard}"``, small whatever the number of shards): a worker reads a lease
partition only when its version moved, after a write of its own there, or as a slow safety net.

A table written by efo before lease partitions (every lease row in the control partition; its
meta row has no ``lease_partitions``) is refused with :class:`~efo.errors.LayoutOutdated` until
``efo checkpoints migrate`` (:func:`efo.leases.admin.migrate`) moves the rows, checkpoints untouched.

Ownership changes and checkpoint writes are conditional on the owner and the lease counter
(fencing): a worker whose lease was taken gets :class:`LeaseLost` instead of writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

import structlog

from efo import __version__
from efo.clock import SYSTEM_CLOCK, Clock
from efo.concurrency import bounded
from efo.errors import ConfigError, LayoutOutdated, LeaseLost, ResourceNotFound, error_code, translate
from efo.leases.codec import (
    AFTER_SHARDS,
    GROWN,
    LEASE_ROWS_AFTER,
    LEAVING_ATTRIBUTE,
    MARK_ATTRIBUTE,
    MARK_KEY,
    MEMBER_CHANGE_MOST_NAMED,
    MEMBERS_ATTRIBUTE,
    META_KEY,
    PARENTS_UNCHECKED_ATTRIBUTE,
    REGISTRY_PK,
    RESERVED_PREFIX,
    RESET_PREFIX,
    SHARD_PREFIX,
    SUBSCRIBED_ATTRIBUTE,
    VERSION_KEY,
    WORKER_PREFIX,
    Update,
    member_change_attribute,
    member_change_value,
    member_changes_of,
    members_of,
    meta_of,
    number_of,
    parse_lease,
    position_item,
    stamp,
    version_attribute,
    worker_of,
)
from efo.leases.model import (
    LAYOUT_FORMAT,
    MIN_LEASE_PARTITIONS,
    Layout,
    Lease,
    Meta,
    TableState,
    WorkerRow,
)
from efo.leases.rows import LeaseRows, PartitionRows
from efo.pipeline.records import SHARD_END, Position

log = structlog.get_logger("efo.leases.table")

#: The lease partitions of one read go out this many at once.
READ_CONCURRENCY = 8


class LeaseTable:
    def __init__(
        self,
        dynamodb: Any,
        *,
        table: str,
        app: str,
        stream_arn: str,
        worker_id: str,
        consumer_arn: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rows: LeaseRows | None = None,
    ) -> None:
        """``rows``: how a lease partition's rows become leases (the simulation shares that work among
        its workers: efo.leases.rows)."""
        self._ddb = dynamodb
        self._clock = clock
        self.table = table
        self.app = app
        self.stream_arn = stream_arn
        self.partition = f"{app}|{stream_arn}"
        self.worker_id = worker_id
        self.consumer_arn = consumer_arn
        #: A digest of every stream this worker reads, in its heartbeat rows: workers that read the
        #: same streams deal their extra shards across them (efo.worker.streams); None with one stream.
        self.reads: str | None = None
        self._heartbeat = 0
        self._started_at = clock.wall().isoformat()
        self.lease_partitions: int | None = None  # every lease partition, of every generation (the meta row's)
        self._layout: Layout | None = None
        #: Shard id -> the lease partition its lease was last read from (or written to): a lease never moves.
        self._where: dict[str, int] = {}
        self._relaid_for = -1  # the highest partition beyond the layout that made read_version read it again
        self._members_read: int | None = None  # the membership counter as this worker last read or moved it
        #: Lease partitions where this client changed a lease, or where a conditional write of it
        #: failed (the lease was not as read), since :meth:`take_changed`: what it read there may be old.
        self._changed_partitions: set[int] = set()
        self._bumps_deferred = 0
        self._bumps_due: set[int] = set()
        self._bumps_failed: set[int] = set()  # versions whose move did not land: moved with the next
        self._bumps_waiting: set[int] = set()  # changed while a version write was under way: the next carries them
        self._bumping = asyncio.Lock()  # one version write under way at a time
        #: Lease partition key -> its rows as the last Query of it found them, parsed.
        self._parsed: dict[str, PartitionRows] = {}
        self._rows = rows or LeaseRows()

    @property
    def dynamodb(self) -> Any:
        """The client this table reads and writes through (efo.leases.admin writes rows no worker does)."""
        return self._ddb

    def _now(self) -> dict[str, Any]:
        return stamp(self._clock.wall())

    def _key(self, sort_key: str) -> dict[str, Any]:
        return {"pk": {"S": self.partition}, "sk": {"S": sort_key}}

    def lease_partition_key(self, partition: int) -> str:
        return f"{self.partition}#{partition}"

    async def layout(self) -> int:
        """The number of lease partitions, of every generation (read from the meta row once, and again
        when the version row names a partition beyond them: :meth:`read_version`); ResourceNotFound
        before the application's first start, LayoutOutdated for a table of a layout this release
        does not read."""
        return (await self.lease_layout()).partitions

    async def lease_layout(self) -> Layout:
        """The lease partitions' generations, as :meth:`layout` reads them."""
        if self._layout is None:
            meta = await self.read_meta()
            if meta is None:
                raise self.not_started()
            self.adopt(meta)
        assert self._layout is not None
        return self._layout

    def forget_layout(self) -> None:
        """Every row is gone (the operator's reset, :func:`efo.leases.admin.delete_all`): the layout
        is read again, and every lease looked for again, at the next use."""
        self.lease_partitions, self._layout, self._where = None, None, {}

    async def migrated(self, partitions: int, *, moved: bool) -> None:
        """The operator's migration (:func:`efo.leases.admin.migrate`) put the leases in ``partitions``
        lease partitions: this client uses them from now on, and if rows ``moved`` every partition's
        version moves (each mark set to it)."""
        self._layout, self.lease_partitions = Layout((partitions,)), partitions
        if moved:
            await self._bump(range(partitions))

    def not_started(self) -> ResourceNotFound:
        """The error of a read of the application's rows before its first start."""
        return ResourceNotFound(
            f"application {self.app!r} has no rows for stream {self.stream_arn} in {self._resource()} "
            "(it has not started yet)"
        )

    def adopt(self, meta: Meta) -> None:
        """Take the lease partitions from ``meta``, or refuse a table of a layout this release does not
        read: the one before lease partitions, or a later format (it would miss leases)."""
        if meta.layout_format > LAYOUT_FORMAT:
            raise LayoutOutdated(
                f"{self._resource()} holds the leases of application {self.app!r} in lease partitions of "
                f"layout_format {meta.layout_format} (its meta row, sk = {META_KEY!r} under pk = {self.partition!r}), "
                f"which a later release of efo wrote; this release reads layout_format {LAYOUT_FORMAT} at most and "
                "would miss leases: run the release that wrote it (or a later one), not this one"
            )
        layout = meta.layout
        if layout is None:
            raise LayoutOutdated(
                f"{self._resource()} holds the leases of application {self.app!r} in the layout of efo before "
                "lease partitions (every row under one partition key): stop every worker of the application, "
                "then run 'efo checkpoints migrate' with the same configuration (it moves the rows; nothing "
                "checkpointed is lost), and start them again"
            )
        self._layout = layout
        self.lease_partitions = layout.partitions

    def partition_of(self, shard_id: str) -> int:
        """The lease partition of ``shard_id``, a lease this client read or wrote (the layout is known:
        :meth:`layout` was awaited; in a table never grown, of any shard)."""
        assert self._layout is not None, "the layout has not been read"
        known = self._where.get(shard_id)
        if known is not None:
            return known
        assert not self._layout.grown, f"the lease of {shard_id} was not read: its partition is not known"
        return self._layout.home(shard_id)

    async def _partition(self, shard_id: str) -> int:
        """The lease partition of ``shard_id``: where it was read, or, in a grown table, where its
        reservation says (none: its partition of generation 0, where a lease written before the
        table grew is)."""
        layout = await self.lease_layout()
        known = self._where.get(shard_id)
        if known is not None:
            return known
        if not layout.grown:
            return layout.home(shard_id)
        reserved = await self._reserved(layout, shard_id)
        partition = layout.home(shard_id) if reserved is None else reserved
        self._where[shard_id] = partition
        return partition

    def _row_key(self, partition: int, shard_id: str) -> dict[str, Any]:
        return {"pk": {"S": self.lease_partition_key(partition)}, "sk": {"S": SHARD_PREFIX + shard_id}}

    async def _lease_key(self, shard_id: str) -> dict[str, Any]:
        return self._row_key(await self._partition(shard_id), shard_id)

    def _reservation_key(self, layout: Layout, shard_id: str) -> dict[str, Any]:
        return {"pk": {"S": self.lease_partition_key(layout.home(shard_id))}, "sk": {"S": RESERVED_PREFIX + shard_id}}

    async def _reserved(self, layout: Layout, shard_id: str) -> int | None:
        """The partition ``shard_id``'s reservation names, strongly consistent (None: no reservation)."""
        try:
            response = await self._ddb.get_item(
                TableName=self.table, Key=self._reservation_key(layout, shard_id), ConsistentRead=True
            )
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None
        return number_of(response.get("Item"), "partition")

    async def _place(self, shard_id: str) -> int:
        """Where a new lease of ``shard_id`` goes: its partition of the newest generation this client
        knows, unless it has a lease already written before reservations (in its partition of
        generation 0) or a reservation (written by a writer that may know other generations): then
        where that is. The reservation is written first, conditionally, so every writer agrees."""
        layout = await self.lease_layout()
        home, newest = layout.home(shard_id), layout.newest(shard_id)
        if newest != home and shard_id in (await self._get_row(self._row_key(home, shard_id))).leases:
            return home  # written before this table grew (or at its first start): no reservation
        reserved = {"partition": {"N": str(newest)}, "updated_at": self._now()}
        if await self._put_new(self._reservation_key(layout, shard_id), reserved):
            return newest
        found = await self._reserved(layout, shard_id)
        return home if found is None else found  # None: deleted meanwhile (the operator's reset)

    def _resource(self) -> str:
        return table_resource(self.table)

    async def ensure_table(self, *, create: bool = True, timeout_s: float = 60.0) -> None:
        """Create the table (PAY_PER_REQUEST) if missing and wait until it is ACTIVE."""
        try:
            description = (await self._ddb.describe_table(TableName=self.table))["Table"]
            self._check_key_schema(description)
            status = description["TableStatus"]
        except ConfigError:
            raise
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
        deadline = self._clock.now() + timeout_s
        while status != "ACTIVE":
            if self._clock.now() > deadline:
                raise ResourceNotFound(f"{self._resource()} did not become ACTIVE (status {status})")
            await self._clock.sleep(0.5)
            status = (await self._ddb.describe_table(TableName=self.table))["Table"]["TableStatus"]

    def _check_key_schema(self, description: dict[str, Any]) -> None:
        """The table must be keyed as efo keys it: ``pk`` (string) HASH, ``sk`` (string) RANGE."""
        kinds = {a["AttributeName"]: a["AttributeType"] for a in description.get("AttributeDefinitions", [])}
        found = [
            (k["AttributeName"], k["KeyType"], kinds.get(k["AttributeName"], "?")) for k in description["KeySchema"]
        ]
        if found != [("pk", "HASH", "S"), ("sk", "RANGE", "S")]:
            keys = ", ".join(f"{name} ({kind}, {type_})" for name, kind, type_ in found)
            raise ConfigError(
                f"{self._resource()} is keyed {keys}, not pk (HASH, S), sk (RANGE, S) as efo's lease tables are: "
                "it belongs to something else (a KCL application's lease table?); set EFO_TABLE (table) to "
                "another name, and efo creates its own"
            )

    async def read(self) -> TableState:
        """Every row of this application and stream, strongly consistent: the meta row, the control
        rows and every lease partition (none before the first start)."""
        meta = await self.read_meta()
        state = await self._read_state(self.partition, after=AFTER_SHARDS)
        state.meta = meta
        if meta is not None:
            self.adopt(meta)
            state.leases = (await self.read_leases()).leases
        return state

    async def read_leases(self, partitions: Collection[int] | None = None, *, consistent: bool = True) -> TableState:
        """The lease rows of ``partitions`` (default: all), also by partition (``parts``), and in
        ``versions`` the mark of each (0: none yet): one paginated Query each, a few at once."""
        count = await self.layout()
        wanted = sorted(range(count) if partitions is None else partitions)
        state = TableState()
        slots = asyncio.Semaphore(READ_CONCURRENCY)

        async def one(partition: int) -> tuple[int, TableState]:
            async with slots:
                key = self.lease_partition_key(partition)
                return partition, await self._read_state(key, after=LEASE_ROWS_AFTER, consistent=consistent)

        for partition, part in await asyncio.gather(*(one(partition) for partition in wanted)):
            state.leases.update(part.leases)
            state.parts[partition] = part.leases
            self._where.update(dict.fromkeys(part.leases, partition))
            state.versions[partition] = part.versions.get(-1, 0)
        return state

    async def read_control(self) -> TableState:
        """The version and every heartbeat row, no lease: one small, strongly consistent Query (an
        eventually consistent one could show a live worker's heartbeat unchanged for long enough to
        call it dead: fencing would keep that safe, but two workers would read its shards)."""
        return await self._read_state(self.partition, after=AFTER_SHARDS)

    async def read_version(self, *, consistent: bool = True) -> TableState:
        """The version row alone: each lease partition's version and the membership counter (one
        small GetItem). A version of a partition beyond the layout known here (the table grew, and a
        lease was written there) reads the meta row again: every partition of it is read from then on."""
        try:
            response = await self._ddb.get_item(
                TableName=self.table, Key=self._key(VERSION_KEY), ConsistentRead=consistent
            )
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None
        state = TableState()
        if "Item" in response:
            self._absorb(state, response["Item"])
        self._members_read = state.members
        beyond = max(state.versions, default=-1)
        if self._layout is not None and beyond >= self._layout.partitions and beyond > self._relaid_for:
            await self.relayout()  # a failed read is made again at the next cycle
            self._relaid_for = beyond  # once for each such partition: never a read of the meta row a cycle
        return state

    async def relayout(self) -> Layout:
        """The meta row read again (the table may have grown since it was read)."""
        meta = await self.read_meta()
        if meta is None:
            raise self.not_started()
        before = self._layout
        self.adopt(meta)
        assert self._layout is not None
        if before is not None and self._layout != before:
            log.info("lease.layout_read", generations=list(self._layout.sizes), partitions=self._layout.partitions)
        return self._layout

    async def read_workers(self, *, consistent: bool = False) -> dict[str, WorkerRow]:
        """Every worker's heartbeat row (one paginated Query; eventually consistent unless told)."""
        return (await self._read_state(self.partition, prefix=WORKER_PREFIX, consistent=consistent)).workers

    async def read_some_workers(
        self, worker_ids: Iterable[str], *, consistent: bool = False
    ) -> dict[str, WorkerRow | None]:
        """These workers' heartbeat rows, one GetItem each (None: no row); eventually consistent
        unless told."""
        rows: dict[str, WorkerRow | None] = {}
        try:
            for worker_id in worker_ids:
                response = await self._ddb.get_item(
                    TableName=self.table, Key=self._key(WORKER_PREFIX + worker_id), ConsistentRead=consistent
                )
                state = TableState()
                if "Item" in response:
                    self._absorb(state, response["Item"])
                rows[worker_id] = state.workers.get(worker_id)
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None
        return rows

    async def members_changed(
        self, *, not_leaving: Iterable[str] = (), about: Iterable[str] = (), stopped: bool = False
    ) -> None:
        """Who is alive changed (this worker started, stopped or recovered, or it found another dead
        or in doubt): every worker reads the heartbeat rows again at its next cycle: those of the
        workers it is ``about`` when the version row names them for every move since that worker's
        last read, else all of them. Named by a write conditional on the counter as this worker last
        read or moved it; one that another worker's move beat is tried once more on the counter that move
        left, if a move or two came first, else (a mass start) the counter moves unnamed.
        ``not_leaving``: workers struck off the version row's stopping ones (stopped, reaped, or
        starting again); ``stopped``: this worker's own stop ends with this move."""
        struck = sorted(set(not_leaving))
        names = sorted(set(about))
        strike = (f" DELETE {LEAVING_ATTRIBUTE} :struck", {":struck": {"SS": struck}}) if struck else ("", {})
        read = self._members_read if 0 < len(names) <= MEMBER_CHANGE_MOST_NAMED else None
        try:
            for attempt in range(2):
                if read is None:
                    break
                moved_to = read + 1
                try:
                    await self._ddb.update_item(
                        TableName=self.table,
                        Key=self._key(VERSION_KEY),
                        UpdateExpression=f"SET {MEMBERS_ATTRIBUTE} = :moved, "
                        f"{member_change_attribute(moved_to)} = :about" + strike[0],
                        ConditionExpression=f"{MEMBERS_ATTRIBUTE} = :read"
                        if read
                        else f"attribute_not_exists({MEMBERS_ATTRIBUTE})",
                        ExpressionAttributeValues={
                            ":moved": {"N": str(moved_to)},
                            ":about": member_change_value(moved_to, names, stopped=self.worker_id if stopped else None),
                            **({":read": {"N": str(read)}} if read else {}),
                            **strike[1],
                        },
                        ReturnValuesOnConditionCheckFailure="ALL_OLD",
                    )
                    self._members_read = moved_to  # a second move before the next read is named too
                    return
                except Exception as exc:
                    if error_code(exc) != "ConditionalCheckFailedException":
                        raise
                    item = getattr(exc, "response", {}).get("Item")
                    now = members_of(item) if item else None
                    read = now if attempt == 0 and now is not None and now - read <= 2 else None
            answer = await self._ddb.update_item(  # unnamed: its readers read every row
                TableName=self.table,
                Key=self._key(VERSION_KEY),
                UpdateExpression=f"ADD {MEMBERS_ATTRIBUTE} :one" + strike[0],
                ExpressionAttributeValues={":one": {"N": "1"}, **strike[1]},
                ReturnValues="UPDATED_NEW",
            )
            # The counter this move set: a second move before the next read is named, unless another
            # worker's move comes first (then it is tried on the counter that move left, as above).
            moved = answer.get("Attributes", {})
            self._members_read = members_of(moved) if MEMBERS_ATTRIBUTE in moved else None
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None

    async def leaving(self) -> None:
        """This worker is stopping: the version row names it, so that every worker's next cycle counts
        no share for it (its leases stay its own until it releases them), with no read more than a
        cycle makes. :meth:`members_changed` strikes the name off once its row is removed."""
        try:
            await self._ddb.update_item(
                TableName=self.table,
                Key=self._key(VERSION_KEY),
                UpdateExpression=f"ADD {LEAVING_ATTRIBUTE} :me",
                ExpressionAttributeValues={":me": {"SS": [self.worker_id]}},
            )
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None

    async def _read_state(
        self, partition: str, *, prefix: str | None = None, after: str | None = None, consistent: bool = True
    ) -> TableState:
        state = TableState()
        try:
            items = await query_partition(self._ddb, self.table, partition, prefix, after=after, consistent=consistent)
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None
        if partition == self.partition:
            for item in items:
                self._absorb(state, item, self._rows.parse)
            return state
        read = self._rows.read(items, self._parsed.get(partition))  # a lease partition's rows, and its mark
        self._parsed[partition] = read  # what this read found: a deleted lease is forgotten
        state.leases = read.leases  # read-only: readers may share it
        if read.mark is not None:
            state.versions = {-1: read.mark}
        return state

    async def read_meta(self) -> Meta | None:
        """The application's meta row (its first start), strongly consistent; None before the first start."""
        item = await self.read_meta_item()
        if item is None:
            return None
        state = TableState()
        self._absorb(state, item)
        return state.meta

    async def read_meta_item(self) -> dict[str, Any] | None:
        """The meta row as DynamoDB holds it, strongly consistent (None: no row): every attribute,
        those of layouts this release refuses too (efo.leases.admin reads them)."""
        try:
            response = await self._ddb.get_item(TableName=self.table, Key=self._key(META_KEY), ConsistentRead=True)
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None
        item = response.get("Item")
        return dict(item) if item is not None else None

    def with_client(self, dynamodb: Any) -> LeaseTable:
        """The same table, application and worker through another client (the heartbeat's own connections)."""
        other = LeaseTable(
            dynamodb,
            table=self.table,
            app=self.app,
            stream_arn=self.stream_arn,
            worker_id=self.worker_id,
            consumer_arn=self.consumer_arn,
            clock=self._clock,
            rows=self._rows,
        )
        other.reads = self.reads
        return other

    async def read_lease(self, shard_id: str) -> Lease | None:
        """One shard's lease, strongly consistent (a subscription asks this before it resubscribes
        after another subscriber took the shard over)."""
        return (await self._get_row(await self._lease_key(shard_id))).leases.get(shard_id)

    async def _get_row(self, key: dict[str, Any]) -> TableState:
        """One row, strongly consistent, as a table state holding it (nothing: no such row)."""
        try:
            response = await self._ddb.get_item(TableName=self.table, Key=key, ConsistentRead=True)
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None
        state = TableState()
        if "Item" in response:
            self._absorb(state, response["Item"])
        return state

    async def holds(self, lease: Lease) -> bool:
        current = await self.read_lease(lease.shard_id)
        return current is not None and current.owner == self.worker_id and current.counter == lease.counter

    @staticmethod
    def _absorb(
        state: TableState, item: dict[str, Any], parse: Callable[[dict[str, Any]], Lease] = parse_lease
    ) -> None:
        """``item`` into ``state`` (a lease row parsed by ``parse``; a lease partition's rows are made
        leases by efo.leases.rows, each only when it changed)."""
        sort_key = item["sk"]["S"]
        if sort_key.startswith(SHARD_PREFIX):  # first: nearly every row read is a lease's
            lease = parse(item)
            state.leases[lease.shard_id] = lease
        elif sort_key == META_KEY:
            state.meta = meta_of(item)
        elif sort_key == MARK_KEY and MARK_ATTRIBUTE in item:  # a lease partition's mark (-1: its own)
            state.versions = {-1: int(item[MARK_ATTRIBUTE]["N"])}
        elif sort_key == VERSION_KEY:
            state.versions = {
                int(name[1:]): int(value["N"])
                for name, value in item.items()
                if name.startswith("p") and name[1:].isdigit() and "N" in value
            }
            state.members = members_of(item)
            state.leaving = frozenset(item.get(LEAVING_ATTRIBUTE, {}).get("SS", ()))
            state.member_changes = member_changes_of(item)
        elif sort_key.startswith(WORKER_PREFIX):
            row = worker_of(item)
            state.workers[row.worker_id] = row

    async def create_meta(
        self,
        stream_created_at: datetime,
        initial_position: str,
        started_at: datetime,
        lease_partitions: int = MIN_LEASE_PARTITIONS,
    ) -> bool:
        """Record the first start, incomplete until :meth:`complete_meta`; False when another worker
        did it first (its start is the one: read it back)."""
        return await self._put_new(
            self._key(META_KEY),
            {
                "lease_partitions": {"N": str(lease_partitions)},
                "stream_created_at": {"N": repr(stream_created_at.timestamp())},
                "initial_position": {"S": initial_position},
                "started_at": {"N": repr(started_at.timestamp())},
                "complete": {"BOOL": False},
                "created_at": self._now(),
                "bootstrapper": {"S": self.worker_id},
            },
        )

    async def complete_meta(self) -> None:
        """Every lease of the first start is written."""
        try:
            await self._ddb.update_item(
                TableName=self.table,
                Key=self._key(META_KEY),
                UpdateExpression="SET complete = :yes",
                ExpressionAttributeValues={":yes": {"BOOL": True}},
            )
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None

    async def create_lease(
        self, shard_id: str, parents: tuple[str, ...], start: Position, *, reserve: bool = True
    ) -> bool:
        """A lease row for a newly seen shard, unowned; ``start=SHARD_END`` marks it finished (never read).
        Where its reservation says (written first: :meth:`_place`); ``reserve=False`` (the first start's
        leases, written before the table can grow): in its partition of generation 0, with none."""
        item: dict[str, Any] = {
            "parents": {"L": [{"S": p} for p in parents]},
            "lease_counter": {"N": "0"},
            "updated_at": self._now(),
            **position_item(start),
        }
        partition = await self._place(shard_id) if reserve else (await self.lease_layout()).home(shard_id)
        self._where[shard_id] = partition
        created = await self._put_new(self._row_key(partition, shard_id), item)
        if created:  # not when another worker created it first (and moved the version)
            await self._changed(partition)
        return created

    def newest_rows(self, shard_ids: Iterable[str]) -> int:
        """How many of these leases (as read) are in the newest generation's partitions."""
        assert self._layout is not None, "the layout has not been read"
        first = self._layout.base(len(self._layout.sizes) - 1)
        return sum(1 for shard_id in shard_ids if self._where.get(shard_id, -1) >= first)

    async def grow(self, layout: Layout, grown: Layout) -> bool:
        """Add ``grown``'s newest generation to the table, if its layout is still ``layout`` (False:
        another worker changed it first; read it again). Nothing moves: the next new leases go there."""
        assert grown.sizes[:-1] == layout.sizes, (layout, grown)
        if layout.grown:
            condition, values = "lease_generation = :was", {":was": {"N": str(len(layout.sizes) - 1)}}
        else:
            condition = "attribute_not_exists(lease_generation) AND lease_partitions = :was"
            values = {":was": {"N": str(layout.sizes[0])}}
        try:
            await self._ddb.update_item(
                TableName=self.table,
                Key=self._key(META_KEY),
                UpdateExpression="SET lease_partitions = :grown, lease_generations = :sizes, "
                "lease_generation = :newest, layout_format = :format, migrating_to = :all",
                ConditionExpression=condition,
                ExpressionAttributeValues={
                    **values,
                    ":grown": {"S": GROWN},
                    ":sizes": {"L": [{"N": str(size)} for size in grown.sizes]},
                    ":newest": {"N": str(len(grown.sizes) - 1)},
                    ":format": {"N": str(LAYOUT_FORMAT)},
                    ":all": {"N": str(grown.partitions)},
                },
            )
        except Exception as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise translate(exc, resource=self._resource()) from None
        self._layout, self.lease_partitions = grown, grown.partitions
        return True

    async def _put_new(self, key: dict[str, Any], attributes: dict[str, Any]) -> bool:
        try:
            await self._ddb.put_item(
                TableName=self.table, Item={**key, **attributes}, ConditionExpression="attribute_not_exists(pk)"
            )
            return True
        except Exception as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise translate(exc, resource=self._resource()) from None

    async def claim(self, lease: Lease) -> Lease:
        """Take the lease as it was read (same owner, same counter, the same steal request if one
        was read), or raise LeaseLost. A pending reset is applied in the same write; a steal
        request (``wanted_by``) is cleared. An asker taking an overdue lease fails once the owner
        declined its request (which moves no counter)."""
        update = Update()
        update.fence(lease)
        if lease.wanted_by is not None:
            update.values[":wanted"] = {"S": lease.wanted_by}
            update.conditions.append("wanted_by = :wanted")
        update.sets.append("lease_owner = :me")
        update.values[":me"] = {"S": self.worker_id}
        update.next_counter()
        update.removes.append("wanted_by")
        update.removes.append(SUBSCRIBED_ATTRIBUTE)  # a held lease's row stays as small as before
        update.removes.append(PARENTS_UNCHECKED_ATTRIBUTE)  # the cycle read them strongly before claiming
        if lease.reset is not None:
            update.apply_reset(lease.reset, self._clock.wall())
        else:
            update.values[":end"] = {"S": SHARD_END.kind}
            update.conditions.append("position_kind <> :end")
        # The row as it is now: its checkpoint may be newer than the one read (checkpoint writes
        # do not move the version, so a worker's last read of the leases may not have it). When its
        # last owner subscribed is as read: the claim is fenced on the counter that release moved.
        taken = parse_lease(await self._update(lease, update, returning=True))
        return replace(taken, subscribed_at=lease.subscribed_at)

    async def apply_reset(self, lease: Lease) -> Lease:
        """Apply the lease's pending reset without taking it: the owner's (a new claim of the same
        owner: the counter moves) or an unowned, finished lease's (so that it is read again)."""
        assert lease.reset is not None
        update = Update()
        update.fence(lease)
        update.next_counter()
        now = self._clock.wall()
        update.apply_reset(lease.reset, now)
        update.sets.append(f"{PARENTS_UNCHECKED_ATTRIBUTE} = :unchecked")
        update.values[":unchecked"] = {"BOOL": True}
        await self._update(lease, update)
        await self._changed(await self._partition(lease.shard_id))
        return replace(
            lease,
            counter=lease.counter + 1,
            checkpoint=lease.reset.position,
            reset=None,
            updated_at=now,  # as written: skip_older_than counts from the reset
            parents_unchecked=True,
        )

    async def checkpoint(self, lease: Lease, position: Position, *, lag_ms: int | None = None) -> Lease:
        """Store where the shard resumes (or SHARD_END), and how far behind the owner's last event
        was. Fenced by owner and counter."""
        update = Update()
        update.fence(lease)
        update.set_position(position)
        update.sets.append("updated_at = :now")
        update.values[":now"] = self._now()
        if lag_ms is not None:
            update.sets.append("lag_ms = :lag")
            update.values[":lag"] = {"N": str(lag_ms)}
        await self._update(lease, update)
        return replace(lease, checkpoint=position)

    async def finish(self, lease: Lease) -> Lease:
        """SHARD_END: the sink committed the shard's last record. A finished lease has no owner, so
        that anyone may apply an operator's reset to it."""
        update = Update()
        update.fence(lease)
        update.set_position(SHARD_END)
        update.sets.append("updated_at = :now")
        update.values[":now"] = self._now()
        update.removes.append("lease_owner")
        update.next_counter()
        await self._update(lease, update)
        await self._changed(await self._partition(lease.shard_id))
        return replace(lease, owner=None, counter=lease.counter + 1, checkpoint=SHARD_END)

    async def delete_finished(self, lease: Lease) -> bool:
        """Delete a finished lease (:mod:`efo.leases.cleanup` says when), if it is still as read: the same
        counter, no owner, SHARD_END, no pending reset. False if it changed (or is gone already)."""
        partition = await self._partition(lease.shard_id)
        deleted = await self._delete_if(
            await self._lease_key(lease.shard_id),
            "lease_counter = :counter AND attribute_not_exists(lease_owner) "
            "AND position_kind = :end AND attribute_not_exists(reset_id)",
            {":counter": {"N": str(lease.counter)}, ":end": {"S": SHARD_END.kind}},
        )
        if deleted:
            await self._changed(partition)
        else:
            self._not_as_read(lease.shard_id, partition)
        return deleted

    async def _delete_if(self, key: dict[str, Any], condition: str, values: dict[str, Any]) -> bool:
        """Delete a row if ``condition`` holds; False if it does not (or the row is gone)."""
        try:
            await self._ddb.delete_item(
                TableName=self.table, Key=key, ConditionExpression=condition, ExpressionAttributeValues=values
            )
        except Exception as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise translate(exc, resource=self._resource()) from None
        return True

    async def release(self, lease: Lease, *, subscribed_at: datetime | None = None) -> None:
        """Give the lease up (a clean stop, a handover), so the next worker takes it at once; a
        steal request stays, so the worker that asked takes it first. ``subscribed_at``: when this
        worker last subscribed to the shard, so that the next owner's first call comes as soon as
        Kinesis takes it (5 s after that), neither sooner (refused) nor later (a backoff)."""
        update = Update()
        update.fence(lease)
        update.removes.append("lease_owner")
        if subscribed_at is not None:
            update.sets.append(f"{SUBSCRIBED_ATTRIBUTE} = :subscribed")
            update.values[":subscribed"] = {"N": f"{subscribed_at.timestamp():.3f}"}
        update.next_counter()
        await self._update(lease, update)
        await self._changed(await self._partition(lease.shard_id))

    async def want(self, lease: Lease) -> None:
        """Ask the owner to hand the lease over (a steal is a request, not a grab)."""
        update = Update()
        update.fence(lease)
        update.sets.append("wanted_by = :me")
        update.values[":me"] = {"S": self.worker_id}
        update.conditions.append("attribute_not_exists(wanted_by)")
        await self._update(lease, update)
        await self._changed(await self._partition(lease.shard_id))

    async def decline(self, lease: Lease) -> None:
        """Clear another worker's handover request for a lease held here, which stays here: the
        asker stops waiting for it (and does not take it once its request is overdue)."""
        assert lease.owner == self.worker_id and lease.wanted_by, lease
        update = Update()
        update.fence(lease)
        update.removes.append("wanted_by")
        update.values[":asker"] = {"S": lease.wanted_by}
        update.conditions.append("wanted_by = :asker")
        await self._update(lease, update)
        await self._changed(await self._partition(lease.shard_id))

    async def request_reset(
        self, shard_ids: Iterable[str], position: Position, *, recreate: Mapping[str, tuple[str, ...]] | None = None
    ) -> str:
        """The operator's reset: written on each shard's row as pending; returns its id.

        ``recreate`` (a reset of every shard: each listed shard with its parents): a row gone since
        the operator's read (a finished lease deleted meanwhile, :mod:`efo.leases.cleanup`) is written
        again at the position, if the shard is still in the stream, and skipped if not; without it,
        such a row ends the reset there (ResourceNotFound)."""
        reset_id = uuid.uuid4().hex
        async with self.changing():  # every partition's version moves once, at the end, together
            for shard_id in shard_ids:
                update = Update()
                update.set_position(position, RESET_PREFIX)
                update.sets.append("reset_id = :reset")
                update.values[":reset"] = {"S": reset_id}
                update.conditions.append("attribute_exists(sk)")
                lease = Lease(shard_id, (), None, 0, position)
                try:
                    await self._update(lease, update, missing=f"no lease for shard {shard_id}")
                except ResourceNotFound:
                    if recreate is None:
                        raise
                    if shard_id not in recreate:
                        continue  # gone from the stream, and its finished lease deleted: nothing to read
                    await self.create_lease(shard_id, recreate[shard_id], position)
                    await self._update(lease, update, missing=f"no lease for shard {shard_id}")
                await self._changed(await self._partition(shard_id))
        return reset_id

    async def _update(
        self, lease: Lease, update: Update, *, missing: str | None = None, returning: bool = False
    ) -> dict[str, Any]:
        """One conditional UpdateItem of the lease's row; with ``returning``, the row as written."""
        key = await self._lease_key(lease.shard_id)
        try:
            response = await self._ddb.update_item(
                TableName=self.table,
                Key=key,
                UpdateExpression=update.expression(),
                ConditionExpression=" AND ".join(update.conditions),
                ExpressionAttributeValues=update.values,
                **({"ReturnValues": "ALL_NEW"} if returning else {}),
            )
        except Exception as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                # The row was not as read: what was read of its partition is out of date.
                self._not_as_read(lease.shard_id, await self._partition(lease.shard_id))
                if missing is not None:
                    raise ResourceNotFound(f"{missing} in {self._resource()}") from None
                raise LeaseLost(f"lease of shard {lease.shard_id} is no longer held by {self.worker_id}") from None
            raise translate(exc, resource=self._resource()) from None
        if returning:
            await self._changed(await self._partition(lease.shard_id))
        return dict(response.get("Attributes", {}))

    # ---- the version ------------------------------------------------------------------------

    async def unseen_change(self, shard_id: str) -> None:
        """``shard_id``'s lease changed, but its partition's version did not move (its writer died in
        between): move it now, so that every worker reads that partition again."""
        await self._changed(await self._partition(shard_id))

    def _not_as_read(self, shard_id: str, partition: int) -> None:
        """A conditional write of ``shard_id``'s lease in ``partition`` failed: that partition is read
        again, and in a grown table where the lease is is asked of its reservation at its next write
        (a read from a replica behind may have shown it where it was deleted, before it was written
        again in another generation: an operator's reset)."""
        self._changed_partitions.add(partition)
        if self._layout is not None and self._layout.grown:
            self._where.pop(shard_id, None)

    def take_changed(self) -> set[int]:
        """The lease partitions changed through this client (or found not as read) since the last call."""
        changed, self._changed_partitions = self._changed_partitions, set()
        return changed

    async def _changed(self, partition: int) -> None:
        """A lease of ``partition`` changed other than by its checkpoint: move its version (now, or
        at the end of :meth:`changing`), so that every worker reads that partition again."""
        self._changed_partitions.add(partition)
        if self._bumps_deferred:
            self._bumps_due.add(partition)
        else:
            await self._bump({partition})

    @contextlib.asynccontextmanager
    async def changing(self, *, cut_short_to_bump_again: bool = False) -> AsyncIterator[None]:
        """Changes made inside move each partition's version once, at the end (a cycle's claims, a
        bootstrap, a stop's releases: one write, not one each). ``cut_short_to_bump_again``: if the
        task is cancelled (a stop's deadline), nothing more is written: the caller's
        :meth:`bump_again` moves the versions, so that no write outlives its deadline. Otherwise
        the versions move even as the task is cancelled (an operator's Ctrl-C: no one would)."""
        self._bumps_deferred += 1
        try:
            yield
        finally:
            self._bumps_deferred -= 1
            if not self._bumps_deferred and self._bumps_due:
                due, self._bumps_due = self._bumps_due, set()
                task = asyncio.current_task()
                if cut_short_to_bump_again and task is not None and task.cancelling():
                    self._bumps_waiting.update(due)
                else:
                    await self._bump(due)

    async def _bump(self, partitions: Collection[int]) -> None:
        """The change itself has landed: the versions move, in one write, then each partition's mark
        is set to its new version. One version write is under way at a time, and it carries every
        change that landed before it started: changes that land meanwhile (a stop's releases, a
        cycle's handovers completing together) wait for it and move in the next write, together,
        so that a burst of changes costs a few writes of the control key, not one each. Each caller
        returns once a write that started after its change landed has moved its partitions (and
        their marks), as if it had written alone.

        If the version's write fails (throttled, an outage, its task cancelled by a stop), it is
        tried again with the next one and at every lease cycle (:meth:`bump_again`) until it lands:
        a release the others never learn of would leave its shard unread. A mark is a copy, not a
        count: written again, or not at all, it is never ahead of its version (an answer would then
        vouch for a change it does not hold), and a mark left behind (a failed write, a writer that
        died after the version, one of a release before marks) costs strong reads until the next
        change there sets it level again."""
        self._bumps_waiting.update(partitions)
        async with self._bumping:
            if not partitions or self._bumps_waiting & set(partitions):  # not carried by the write before
                names, self._bumps_waiting = self._bumps_waiting, set()
                await self._bump_now(names)

    async def _bump_now(self, partitions: Collection[int]) -> None:
        names = sorted(set(partitions) | self._bumps_failed)
        if not names:
            return
        self._bumps_failed = set()
        try:
            answer = await self._ddb.update_item(
                TableName=self.table,
                Key=self._key(VERSION_KEY),
                UpdateExpression="ADD " + ", ".join(f"{version_attribute(p)} :one" for p in names),
                ExpressionAttributeValues={":one": {"N": "1"}},
                ReturnValues="ALL_NEW",
            )
        except asyncio.CancelledError:
            self._bumps_failed.update(names)  # it carried other callers' changes: they move with the next
            raise
        except Exception as exc:
            self._bumps_failed.update(names)
            error = translate(exc, resource=self._resource())
            if not error.retriable:
                raise error from None
            log.warning("version.bump_failed", error=str(error), code=error.code, worker_id=self.worker_id)
            return
        moved = answer.get("Attributes", {})
        versions = {p: int(moved[version_attribute(p)]["N"]) for p in names if version_attribute(p) in moved}
        await bounded(READ_CONCURRENCY, lambda item: self._mark(*item), list(versions.items()))

    async def _mark(self, partition: int, version: int) -> None:
        """Set ``partition``'s mark to ``version`` (just moved there), unless a later one is set already."""
        try:
            await self._ddb.update_item(
                TableName=self.table,
                Key={"pk": {"S": self.lease_partition_key(partition)}, "sk": {"S": MARK_KEY}},
                UpdateExpression=f"SET {MARK_ATTRIBUTE} = :version",
                ConditionExpression=f"attribute_not_exists({MARK_ATTRIBUTE}) OR {MARK_ATTRIBUTE} < :version",
                ExpressionAttributeValues={":version": {"N": str(version)}},
            )
        except Exception as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return  # a later change's mark is there already
            error = translate(exc, resource=self._resource())
            if not error.retriable:
                raise error from None
            log.warning("version.mark_failed", error=str(error), code=error.code, worker_id=self.worker_id)

    async def bump_again(self) -> None:
        """The versions whose move failed, or whose caller was cancelled while it waited, moved now (if any)."""
        if self._bumps_failed or self._bumps_waiting:  # waiting: left by a caller cancelled while it waited
            await self._bump(())

    async def heartbeat(self, *, in_doubt: bool = False, leaving: bool = False) -> bool:
        """This worker's heartbeat row, its counter one more; ``in_doubt``: it does not trust its
        leases now (it reads nothing), so the others take them at once rather than after failover_s;
        ``leaving``: it is stopping, so the others watch its part of the ring.
        Heartbeats may be under way several at once: one lands only over an older counter (False:
        a newer one had landed already)."""
        self._heartbeat += 1
        try:
            await self._ddb.put_item(
                TableName=self.table,
                Item={
                    **self._key(WORKER_PREFIX + self.worker_id),
                    "heartbeat": {"N": str(self._heartbeat)},
                    **({"in_doubt": {"BOOL": True}} if in_doubt else {}),
                    **({"leaving": {"BOOL": True}} if leaving else {}),
                    "updated_at": self._now(),
                    "started_at": {"S": self._started_at},
                    "version": {"S": __version__},
                    "deletes_leases": {"BOOL": True},  # efo.leases.cleanup: no older release runs
                    "reads_generations": {"BOOL": True},  # efo.worker.shardsync: the table may grow
                    **({"consumer_arn": {"S": self.consumer_arn}} if self.consumer_arn else {}),
                    **({"reads": {"S": self.reads}} if self.reads else {}),
                },
                ConditionExpression="attribute_not_exists(heartbeat) OR heartbeat < :beat",
                ExpressionAttributeValues={":beat": {"N": str(self._heartbeat)}},
            )
        except Exception as exc:
            if error_code(exc) == "ConditionalCheckFailedException":
                return False
            raise translate(exc, resource=self._resource()) from None
        return True

    async def register_partition(self) -> None:
        """Name this application's partition in the table's registry partition, once per start (an
        idempotent put), so that the operator CLI finds every application's workers with Queries."""
        try:
            await self._ddb.put_item(
                TableName=self.table,
                Item={
                    "pk": {"S": REGISTRY_PK},
                    "sk": {"S": self.partition},
                    "app": {"S": self.app},
                    "stream_arn": {"S": self.stream_arn},
                },
            )
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None

    async def read_worker(self, worker_id: str) -> WorkerRow | None:
        """One worker's heartbeat row, strongly consistent (None: no row: it stopped, or was reaped)."""
        return (await self._get_row(self._key(WORKER_PREFIX + worker_id))).workers.get(worker_id)

    async def reap_worker(self, worker_id: str, heartbeat: int) -> bool:
        """Delete a dead worker's heartbeat row, if its counter is still ``heartbeat`` (it did not beat
        since it was seen dead): a worker that starts later sees no row, so it takes that worker's
        leases at once instead of watching it for failover_s, and the heartbeat reads stay small.
        False if the row changed or is gone already."""
        return await self._delete_if(
            self._key(WORKER_PREFIX + worker_id), "heartbeat = :seen", {":seen": {"N": str(heartbeat)}}
        )

    async def remove_worker(self) -> None:
        try:
            await self._ddb.delete_item(TableName=self.table, Key=self._key(WORKER_PREFIX + self.worker_id))
        except Exception as exc:
            raise translate(exc, resource=self._resource()) from None


def table_resource(table: str) -> str:
    """A lease table as errors name it."""
    return f"DynamoDB table {table!r}"


async def query_partition(
    dynamodb: Any,
    table: str,
    partition: str,
    prefix: str | None = None,
    projection: str | None = None,
    *,
    after: str | None = None,
    consistent: bool = True,
) -> list[dict[str, Any]]:
    """Every item of ``partition`` whose sort key starts with ``prefix`` (or sorts after ``after``),
    only the ``projection`` attributes if given, strongly consistent unless told, all pages."""
    condition, values = "pk = :pk", {":pk": {"S": partition}}
    if prefix:
        condition += " AND begins_with(sk, :prefix)"
        values[":prefix"] = {"S": prefix}
    elif after:
        condition += " AND sk > :after"
        values[":after"] = {"S": after}
    args: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": condition,
        "ExpressionAttributeValues": values,
        "ConsistentRead": consistent,
        **({"ProjectionExpression": projection} if projection else {}),
    }
    items: list[dict[str, Any]] = []
    while True:
        page = await dynamodb.query(**args)
        if "LastEvaluatedKey" not in page:
            # One page (a lease partition's rows always are): its list as answered, not a copy.
            last: list[dict[str, Any]] = page.get("Items", [])
            return last if not items else items + last
        items.extend(page.get("Items", []))
        args["ExclusiveStartKey"] = page["LastEvaluatedKey"]
