"""The held claims' uncheckpointed records, kept as a running sum (``OwnedLeases.backlog``), against
summing every held claim's ledger, over random claims, hand-ons, commits, writes, losses and
re-claims of the same shard."""

from __future__ import annotations

import random

from efo.leases.lifecycle import Commit, OwnedShard
from efo.leases.model import Lease
from efo.pipeline.pool import PendingPool
from efo.pipeline.records import Position, after
from efo.worker.owned import OwnedLeases


def _full(owned: OwnedLeases) -> int:
    return sum(claim.ledger.uncheckpointed_records for claim in owned.values())


def test_the_running_backlog_equals_the_sum_over_every_held_claim() -> None:
    nonzero = 0
    for seed in range(200):
        rng = random.Random(seed)
        owned = OwnedLeases("me", PendingPool(1000, 1 << 20))
        claims: list[OwnedShard] = []  # held or not: a forgotten claim's ledger may still change
        epoch = 0
        serials: dict[int, int] = {}  # by claim epoch: chunks handed on
        ended: set[int] = set()  # claim epochs whose shard end was handed on
        for _step in range(120):
            match rng.randrange(7):
                case 0:  # a claim (a shard held already is claimed again: the newer claim replaces it)
                    epoch += 1
                    lease = Lease(f"s{rng.randrange(6)}", (), "me", epoch, Position("TRIM_HORIZON"))
                    claims.append(owned.own(lease))
                case 1 if claims:  # a chunk handed on
                    claim = rng.choice(claims)
                    if claim.epoch not in ended:
                        serial = serials[claim.epoch] = claim.ledger.next_serial()
                        claim.ledger.enqueued(serial, after(str(serial)))
                case 2 if claims:  # the sink commits a chunk, in any order
                    claim = rng.choice(claims)
                    serial = rng.randint(1, max(1, serials.get(claim.epoch, 0)))
                    commit = Commit(claim.shard_id, claim.epoch, serial, rng.randrange(1, 50))
                    claim.committed(commit)
                case 3 if claims:  # a checkpoint write of what is due, counting the records read before
                    claim = rng.choice(claims)
                    due, records = claim.ledger.due, claim.ledger.uncheckpointed_records
                    if due is not None:
                        claim.ledger.wrote(due, records)
                case 4 if claims:  # lost or released: the claim leaves the set
                    owned.lose(rng.choice(claims), "taken")
                case 5 if claims:  # forgotten (a second forget of the same claim changes nothing)
                    owned.forget(rng.choice(claims))
                case 6 if claims:  # the shard's end was handed on
                    claim = rng.choice(claims)
                    if claim.epoch not in ended:
                        ended.add(claim.epoch)
                        claim.ledger.ended()
                case _:
                    pass
            assert owned.backlog.records == _full(owned), (seed, _step)
            nonzero += owned.backlog.records > 0
    assert nonzero > 1000  # the random operations do build a backlog
