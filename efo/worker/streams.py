"""What the lease cycles of one worker's streams tell each other, so that its share is counted over
every stream it reads (the issue's "the share counts every readable shard of every stream").

Each stream's lease cycle balances that stream's leases on its own (its own rows, its own live
workers). Alone, each would give its ``n mod w`` extra shards to the same first workers in name
order: three streams of three shards on two workers would end 6 and 3. Instead, picture every
stream's readable shards in one list, streams in ARN order, dealt to the workers in turn: stream
``s`` starts at position ``S`` (the readable shards of the streams before it), so its extras go to
the workers from rank ``S mod w`` on (:func:`efo.leases.balance.plan`'s ``rank_offset``), and each
worker's total over every stream is within one of every other's. A spread of one in a stream moves
too when its extra is not where the offset puts it (``exact``): one stream alone lets it be, but
spreads of one in the same direction add up over several streams. Every worker reading the same
streams computes the same offsets from the same table; one that reads other streams (a rolling
restart with a new list) could compute others: so the offsets are used strictly (``exact``) only
while every live worker of the stream reads the same streams (a digest in each heartbeat row), and
a lease left free for several cycles is claimable up to the ceiling whatever the shares say
(``stale_free``), so that workers disagreeing for a while never leave a shard unread.

``lease.max_leases_per_worker`` caps the total too: a stream's cycle may hold at most what the
others leave of it (:meth:`StreamShares.room`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field


def streams_digest(stream_arns: Iterable[str]) -> str:
    """Which streams a worker reads, short enough for every heartbeat row: equal digests, equal lists."""
    return hashlib.sha256("\n".join(sorted(stream_arns)).encode()).hexdigest()[:16]


@dataclass
class StreamShares:
    readable: dict[str, int] = field(default_factory=dict)  # stream ARN -> readable shards, as last seen
    held: dict[str, int] = field(default_factory=dict)  # stream ARN -> shards this worker holds there

    def publish(self, stream_arn: str, *, readable: int, held: int) -> None:
        """A stream's cycle saw ``readable`` shards that can be read now, ``held`` of them here."""
        self.readable[stream_arn] = readable
        self.held[stream_arn] = held

    def forget(self, stream_arn: str) -> None:
        """The stream is read here no more (deleted while running): it no longer counts."""
        self.readable.pop(stream_arn, None)
        self.held.pop(stream_arn, None)

    @property
    def several(self) -> bool:
        """This worker reads more than one stream: each stream's extras must go where the offsets put them."""
        return len(self.readable) > 1

    def rank_offset(self, stream_arn: str) -> int:
        """Where ``stream_arn``'s shards start in the one list of every stream's readable shards."""
        return sum(count for arn, count in self.readable.items() if arn < stream_arn)

    def room(self, stream_arn: str, max_leases: int) -> int | None:
        """How many shards ``stream_arn`` may hold here under ``max_leases`` in all (0: no limit)."""
        if max_leases == 0:
            return None
        return max(0, max_leases - sum(count for arn, count in self.held.items() if arn != stream_arn))
