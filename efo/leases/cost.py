"""What the lease plane asks of DynamoDB and Kinesis at steady state: the README's formula, as code.

The simulation compares what a fleet of the real code asked for in a window of simulated time with
:func:`steady_state` (``python -m efo.sim run --window``), and ``make test`` checks that they agree
within a tenth, so the formula the README gives operators to size a table is the one the code follows.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache as memoized

from efo.config import Settings
from efo.leases import cache
from efo.leases.model import lease_partition_of, lease_partitions_for
from efo.worker import membership

#: Sizes of the rows read, as DynamoDB counts them (measured at the wire: a lease about 181 B).
HEARTBEAT_ROW_B = 250
LEASE_ROW_B = 200
#: The version row's counter of one lease partition (``p<n>``: its name and number), about 8 B.
VERSION_ENTRY_B = 8
#: DynamoDB's read unit (strongly consistent; eventually consistent costs half) and ListShards' page.
READ_UNIT_B = 4096
SHARDS_PER_LIST_PAGE = 1000
#: On-demand list prices: a write unit costs five read units.
WRITE_PRICE = 5.0


@dataclass(frozen=True)
class Cost:
    read_units_per_s: float
    write_units_per_s: float
    list_shards_per_min: float

    @property
    def per_s(self) -> float:
        """Read-unit equivalents a second (a write priced at five reads)."""
        return self.read_units_per_s + WRITE_PRICE * self.write_units_per_s


def _mean_interval_s(interval_s: float, jitter_from: float) -> float:
    """The mean of an interval drawn uniformly from ``jitter_from`` × ``interval_s`` to ``interval_s``."""
    return interval_s * (1 + jitter_from) / 2


def steady_state(settings: Settings, *, workers: int, shards: int, partition_rows: Sequence[int] | None = None) -> Cost:
    """The lease plane's use (everything but the checkpoints) of ``workers`` sharing ``shards`` once
    nothing changes: no worker starts or stops, no lease moves. ``partition_rows``: the lease rows of
    each lease partition (a table whose layout grew: efo.leases.model.Layout); by default, those of a
    table whose first start had ``shards``, spread evenly."""
    lease = settings.lease
    if partition_rows is None:
        partitions = lease_partitions_for(shards)
        per_partition = math.ceil(shards / partitions * LEASE_ROW_B / READ_UNIT_B) * 0.5
        read_all = partitions * per_partition
    else:
        partitions = len(partition_rows)
        read_all = sum(math.ceil(rows * LEASE_ROW_B / READ_UNIT_B) or 1 for rows in partition_rows) * 0.5
    watched = min(membership.WATCHED, workers - 1)
    version = math.ceil(partitions * VERSION_ENTRY_B / READ_UNIT_B)  # a counter per lease partition
    every_cycle = version + 0.5 * watched  # the version row, strongly; the watched rows, eventually
    every_row = math.ceil(workers * HEARTBEAT_ROW_B / READ_UNIT_B) / _mean_interval_s(
        membership.ALL_ROWS_EVERY_S, membership.JITTER_FROM
    )
    safety_net = read_all / _mean_interval_s(lease.full_read_interval_s, cache.JITTER_FROM)
    return Cost(
        read_units_per_s=workers * (every_cycle / lease.sync_interval_s + every_row + safety_net),
        write_units_per_s=workers / lease.heartbeat_interval_s,
        list_shards_per_min=60 * math.ceil(shards / SHARDS_PER_LIST_PAGE) / settings.shards.sync_interval_s,
    )


#: The share of eventually consistent answers that come from before the change they follow (read again
#: once more): about none on AWS, whose replicas trail by milliseconds; about half in the simulation,
#: whose eventually consistent reads see the table as of a moment up to a second ago.
BEHIND_ON_AWS = 0.0
BEHIND_AT_MOST = 1.0


@memoized
def largest_partition(shards: int) -> int:
    """The lease rows of the largest lease partition of a stream created with ``shards`` shards (Kinesis
    numbers shard ids in order: CRC-32 spreads them within a few rows of the mean)."""
    partitions = lease_partitions_for(shards)
    rows = Counter(lease_partition_of(f"shardId-{n:012d}", partitions) for n in range(shards))
    return max(rows.values(), default=0)


@dataclass(frozen=True)
class KeyPeak:
    """The busiest lease partition key while its leases change at every cycle (a fleet starting, a
    rebalance): what every other worker's reads of the changes ask of it, a second."""

    rows: int  # in that partition
    read_units_per_s: float
    write_units_per_s: float  # the changes' writes and marks, one worker's each cycle, and its checkpoints


def during_changes(settings: Settings, *, workers: int, shards: int, behind: float = BEHIND_ON_AWS) -> KeyPeak:
    """One lease partition changed by one worker at every cycle: that worker reads it again strongly,
    every other eventually consistent, ``1 + behind`` times (efo.leases.cache)."""
    rows = largest_partition(shards)
    units = math.ceil(rows * LEASE_ROW_B / READ_UNIT_B)
    per_cycle = units + (workers - 1) * (1 + behind) * 0.5 * units
    interval_s = settings.lease.sync_interval_s
    return KeyPeak(
        rows=rows,
        read_units_per_s=per_cycle / interval_s,
        write_units_per_s=2 / interval_s + rows / settings.checkpoint.interval_s,
    )
