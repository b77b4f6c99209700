"""What the lease plane asks of DynamoDB and Kinesis at steady state: the README's formula, as code.

The simulation compares what a fleet of the real code asked for in a window of simulated time with
:func:`steady_state` (``python -m efo.sim run --window``), and ``make test`` checks that they agree
within a tenth, so the formula the README gives operators to size a table is the one the code follows.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache as memoized
from typing import Any

from efo.config import Settings
from efo.leases import cache
from efo.leases.model import lease_partition_of, lease_partitions_for
from efo.worker import membership

#: Sizes of the rows read, as DynamoDB counts them, for a production worker's names (tests/unit/
#: test_cost_rows.py writes them with the lease table's code): a lease, most of it its partition key
#: (the application and the stream's ARN), its owner's name and a 56-digit sequence number; a
#: heartbeat row, with the consumer's ARN; a lease partition's mark, read with every Query of it.
LEASE_ROW_B = 360
HEARTBEAT_ROW_B = 370
MARK_ROW_B = 100
#: The version row's counter of one lease partition (``p<n>``: its name and number), about 8 B.
VERSION_ENTRY_B = 8
#: DynamoDB's read unit (strongly consistent; eventually consistent costs half) and ListShards' page.
READ_UNIT_B = 4096
SHARDS_PER_LIST_PAGE = 1000
#: A Query answers at most this much a page.
QUERY_PAGE_B = 1024 * 1024
#: On-demand list prices: a write unit costs five read units.
WRITE_PRICE = 5.0


@dataclass(frozen=True)
class Cost:
    """The lease plane's use of DynamoDB and Kinesis at steady state, and the checkpoints'."""

    read_units_per_s: float  # the lease plane's (everything but the checkpoints)
    write_units_per_s: float
    list_shards_per_min: float
    requests_per_min: Mapping[str, float]  # the lease plane's, by DynamoDB operation
    checkpoint_write_units_per_s: float  # one unit (a row under 1 KB) a busy shard a checkpoint interval
    control_key_read_units_per_s: float  # the version and heartbeat rows' partition key
    control_key_write_units_per_s: float
    lease_key_read_units_per_s: float  # the largest lease partition's key
    lease_key_write_units_per_s: float  # its checkpoints

    @property
    def per_s(self) -> float:
        """Read-unit equivalents a second (a write priced at five reads)."""
        return self.read_units_per_s + WRITE_PRICE * self.write_units_per_s

    @property
    def busiest_key_read_units_per_s(self) -> float:
        return max(self.control_key_read_units_per_s, self.lease_key_read_units_per_s)

    @property
    def busiest_key_write_units_per_s(self) -> float:
        return max(self.control_key_write_units_per_s, self.lease_key_write_units_per_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "read_units_per_s": round(self.read_units_per_s, 3),
            "write_units_per_s": round(self.write_units_per_s, 3),
            "cost_per_s": round(self.per_s, 3),
            "list_shards_per_min": round(self.list_shards_per_min, 2),
            "requests_per_min": {name: round(rate, 2) for name, rate in sorted(self.requests_per_min.items())},
            "checkpoint_write_units_per_s": round(self.checkpoint_write_units_per_s, 3),
            "busiest_key_read_units_per_s": round(self.busiest_key_read_units_per_s, 3),
            "busiest_key_write_units_per_s": round(self.busiest_key_write_units_per_s, 3),
            "busiest_lease_key_read_units_per_s": round(self.lease_key_read_units_per_s, 3),
            "busiest_lease_key_write_units_per_s": round(self.lease_key_write_units_per_s, 3),
        }


def _mean_interval_s(interval_s: float, jitter_from: float) -> float:
    """The mean of an interval drawn uniformly from ``jitter_from`` × ``interval_s`` to ``interval_s``."""
    return interval_s * (1 + jitter_from) / 2


def busy_shards(shards: int, records_per_shard_s: float, interval_s: float) -> float:
    """Of ``shards`` whose records arrive at random, ``records_per_shard_s`` each, how many have a new
    record to checkpoint at each ``interval_s`` (a Poisson arrival: one less the chance of none)."""
    return shards * -math.expm1(-records_per_shard_s * interval_s)


def steady_state(
    settings: Settings,
    *,
    workers: int,
    shards: int,
    partition_rows: Sequence[int] | None = None,
    busy: float = 0.0,
    lease_row_b: int = LEASE_ROW_B,
    heartbeat_row_b: int = HEARTBEAT_ROW_B,
) -> Cost:
    """The use of ``workers`` sharing ``shards`` once nothing changes: no worker starts or stops, no
    lease moves. ``partition_rows``: the lease rows of each lease partition (a table whose layout grew:
    efo.leases.model.Layout); by default, those of a table whose first start had ``shards`` (as CRC-32
    spreads Kinesis's numbered shard ids). ``busy``: the shards with a new record to checkpoint at
    each ``checkpoint.interval_s`` (:func:`busy_shards`). The rows' sizes: production's by default."""
    lease = settings.lease
    if partition_rows is None:
        partition_rows = spread(shards)
    partitions = len(partition_rows)
    largest = max(partition_rows, default=0)
    read_all = sum(partition_units(rows, lease_row_b) for rows in partition_rows) * 0.5
    read_largest = partition_units(largest, lease_row_b) * 0.5
    watched = min(membership.WATCHED, workers - 1)
    version = math.ceil(partitions * VERSION_ENTRY_B / READ_UNIT_B)  # a counter per lease partition
    every_cycle = version + 0.5 * watched  # the version row, strongly; the watched rows, eventually
    rows_interval_s = _mean_interval_s(membership.ALL_ROWS_EVERY_S, membership.JITTER_FROM)
    every_row = math.ceil(workers * heartbeat_row_b / READ_UNIT_B) / rows_interval_s
    safety_net_interval_s = _mean_interval_s(lease.full_read_interval_s, cache.JITTER_FROM)
    heartbeats = workers / lease.heartbeat_interval_s  # a unit each: a row under 1 KB
    checkpoints = busy / settings.checkpoint.interval_s
    control_reads = workers * (every_cycle / lease.sync_interval_s + every_row)
    queries = _pages(workers * heartbeat_row_b) / rows_interval_s
    queries += sum(_pages(rows * lease_row_b + MARK_ROW_B) for rows in partition_rows) / safety_net_interval_s
    return Cost(
        read_units_per_s=control_reads + workers * read_all / safety_net_interval_s,
        write_units_per_s=heartbeats,
        list_shards_per_min=60 * math.ceil(shards / SHARDS_PER_LIST_PAGE) / settings.shards.sync_interval_s,
        requests_per_min={
            "GetItem": 60 * workers * (1 + watched) / lease.sync_interval_s,
            "PutItem": 60 * heartbeats,
            "Query": 60 * workers * queries,
        },
        checkpoint_write_units_per_s=checkpoints,
        control_key_read_units_per_s=control_reads,
        control_key_write_units_per_s=heartbeats,
        lease_key_read_units_per_s=workers * read_largest / safety_net_interval_s,
        lease_key_write_units_per_s=checkpoints * largest / shards if shards else 0.0,
    )


def partition_units(rows: int, lease_row_b: int = LEASE_ROW_B) -> int:
    """Read units of one strongly consistent Query of a lease partition of ``rows`` leases and its
    mark (DynamoDB rounds a Query's bytes up to 4 KB once; eventually consistent costs half)."""
    return math.ceil((rows * lease_row_b + MARK_ROW_B) / READ_UNIT_B)


def _pages(size_b: int) -> int:
    """Query pages of ``size_b`` bytes (at least one: an empty partition still answers)."""
    return max(1, math.ceil(size_b / QUERY_PAGE_B))


#: The share of eventually consistent answers that come from before the change they follow (read again
#: once more): about none on AWS, whose replicas trail by milliseconds; about half in the simulation,
#: whose eventually consistent reads see the table as of a moment up to a second ago.
BEHIND_ON_AWS = 0.0
BEHIND_AT_MOST = 1.0


@memoized
def spread(shards: int) -> tuple[int, ...]:
    """The lease rows of each lease partition of a stream created with ``shards`` shards (Kinesis
    numbers shard ids in order: CRC-32 spreads them within a few rows of the mean)."""
    partitions = lease_partitions_for(shards)
    rows = Counter(lease_partition_of(f"shardId-{n:012d}", partitions) for n in range(shards))
    return tuple(rows[partition] for partition in range(partitions))


def largest_partition(shards: int) -> int:
    """The lease rows of the largest lease partition of a stream created with ``shards`` shards."""
    return max(spread(shards), default=0)


@dataclass(frozen=True)
class KeyPeak:
    """The busiest lease partition key while its leases change at every cycle (a fleet starting, a
    rebalance): what every other worker's reads of the changes ask of it, a second."""

    rows: int  # in that partition
    read_units_per_s: float
    write_units_per_s: float  # the changes' writes and marks, one worker's each cycle, and its checkpoints


def during_changes(
    settings: Settings, *, workers: int, shards: int, behind: float = BEHIND_ON_AWS, lease_row_b: int = LEASE_ROW_B
) -> KeyPeak:
    """One lease partition changed by one worker at every cycle: that worker reads it again strongly,
    every other eventually consistent, ``1 + behind`` times (efo.leases.cache)."""
    rows = largest_partition(shards)
    units = partition_units(rows, lease_row_b)
    per_cycle = units + (workers - 1) * (1 + behind) * 0.5 * units
    interval_s = settings.lease.sync_interval_s
    return KeyPeak(
        rows=rows,
        read_units_per_s=per_cycle / interval_s,
        write_units_per_s=2 / interval_s + rows / settings.checkpoint.interval_s,
    )
