"""What the lease plane asks of DynamoDB and Kinesis at steady state: the README's formula, as code.

The simulation compares what a fleet of the real code asked for in a window of simulated time with
:func:`steady_state` (``python -m efo.sim run --window``), and ``make test`` checks that they agree
within a tenth, so the formula the README gives operators to size a table is the one the code follows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from efo.config import Settings
from efo.leases import cache
from efo.leases.model import lease_partitions_for
from efo.worker import membership

#: Sizes of the rows read, as DynamoDB counts them (measured at the wire: a lease about 181 B).
HEARTBEAT_ROW_B = 250
LEASE_ROW_B = 200
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


def steady_state(settings: Settings, *, workers: int, shards: int) -> Cost:
    """The lease plane's use (everything but the checkpoints) of ``workers`` sharing ``shards`` once
    nothing changes: no worker starts or stops, no lease moves."""
    lease = settings.lease
    partitions = lease_partitions_for(shards)
    watched = min(membership.WATCHED, workers - 1)
    every_cycle = 1 + 0.5 * watched  # the version row, strongly; the watched rows, eventually
    every_row = math.ceil(workers * HEARTBEAT_ROW_B / READ_UNIT_B) / _mean_interval_s(
        membership.ALL_ROWS_EVERY_S, membership.JITTER_FROM
    )
    per_partition = math.ceil(shards / partitions * LEASE_ROW_B / READ_UNIT_B) * 0.5
    safety_net = partitions * per_partition / _mean_interval_s(lease.full_read_interval_s, cache.JITTER_FROM)
    return Cost(
        read_units_per_s=workers * (every_cycle / lease.sync_interval_s + every_row + safety_net),
        write_units_per_s=workers / lease.heartbeat_interval_s,
        list_shards_per_min=60 * math.ceil(shards / SHARDS_PER_LIST_PAGE) / settings.shards.sync_interval_s,
    )
