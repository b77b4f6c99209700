"""The balancing decisions of one worker's cycle: claim, shed, ask (pure, no table)."""

from __future__ import annotations

from collections import Counter

import pytest

from efo.leases.balance import answer_requests, plan, target
from efo.leases.model import Lease
from efo.pipeline.records import Position
from efo.worker.streams import StreamShares


def leases(owners: dict[str, str | None], wanted: dict[str, str] | None = None) -> list[Lease]:
    wanted = wanted or {}
    return [
        Lease(sid, (), owner, 1, Position("TRIM_HORIZON"), wanted_by=wanted.get(sid))
        for sid, owner in sorted(owners.items())
    ]


def shards(n: int, owner: str | None = None) -> dict[str, str | None]:
    return {f"s{i:02d}": owner for i in range(n)}


def test_a_worker_alone_claims_every_free_shard() -> None:
    moves = plan("a", leases(shards(8)), ["a"])
    assert len(moves.claim) == 8 and moves.target == 8 and not moves.shed and not moves.ask


def test_two_workers_starting_together_each_claim_their_share() -> None:
    assert len(plan("a", leases(shards(9)), ["a", "b"]).claim) == 5
    owners = {**shards(9), **dict.fromkeys(["s00", "s01", "s02", "s03", "s04"], "a")}
    assert len(plan("b", leases(owners), ["a", "b"]).claim) == 4


def test_a_worker_holding_everything_sheds_down_to_its_share_when_another_joins() -> None:
    moves = plan("a", leases(shards(8, "a")), ["a", "b"])
    assert moves.claim == [] and len(moves.shed) == 4 and moves.target == 4


def test_the_newcomer_claims_the_shed_leases_and_nobody_steals_at_a_spread_of_one() -> None:
    owners = {**shards(8, "a")}
    for sid in ("s04", "s05", "s06", "s07"):
        owners[sid] = None
    moves = plan("b", leases(owners), ["a", "b"])
    assert sorted(lease.shard_id for lease in moves.claim) == ["s04", "s05", "s06", "s07"]
    settled = {**owners, "s04": "b", "s05": "b", "s06": "b", "s07": "b"}
    for worker in ("a", "b"):
        moves = plan(worker, leases(settled), ["a", "b"])
        assert not moves.claim and not moves.shed and not moves.ask


def test_workers_claiming_at_once_from_the_same_read_pick_different_leases() -> None:
    """A start (or a takeover): every worker sees the same free leases; each takes them from its own
    place in the list, so no claim races another (before, all three tried s00, s01, ... first)."""
    owners = shards(12)
    claims = [{lease.shard_id for lease in plan(w, leases(owners), ["a", "b", "c"]).claim} for w in "abc"]
    assert [len(c) for c in claims] == [4, 4, 4]
    assert len(claims[0] | claims[1] | claims[2]) == 12


def test_the_next_free_leases_are_spares_for_claims_another_worker_wins() -> None:
    """Workers whose reads differ by another's claims collide (simulation seed 882 of 64 x 8: a dead
    worker's last lease went unread a cycle longer): the plan names as many free leases after its
    claims, in the same order, to claim in the same cycle in place of those lost."""
    owners = {**shards(12), "s00": "b", "s01": "b", "s02": "b"}
    moves = plan("a", leases(owners), ["a", "b", "c"])
    claimed, spare = [lease.shard_id for lease in moves.claim], [lease.shard_id for lease in moves.spare]
    assert len(claimed) == 4 and len(spare) == 5  # the rest of the free: up to SPARES_PER_CLAIM a claim
    assert not set(claimed) & set(spare) and not set(spare) & {"s00", "s01", "s02"}
    assert plan("a", leases(shards(2)), ["a"]).spare == []  # nothing beyond what it claims


def test_leases_still_its_own_in_the_table_are_taken_back_before_other_free_ones() -> None:
    """After its leases were in doubt, a worker's rows still name it: claiming those back moves
    nothing, where claiming others' would make it release its own afterwards."""
    owners = shards(12)
    mine = {"s00", "s01", "s02", "s03"}  # 'c' starts two thirds along the list: not at these
    moves = plan("c", leases(owners), ["a", "b", "c"], stranded=mine)
    assert {lease.shard_id for lease in moves.claim} == mine


def test_three_workers_settle_at_three_three_two_and_then_nothing_moves() -> None:
    owners = shards(8)
    cycles(owners, ["a", "b", "c"], 3)
    assert sorted(Counter(owners.values()).values()) == [2, 3, 3]
    assert cycles(owners, ["a", "b", "c"], 3) == 0


def test_a_lease_moved_recently_is_not_shed_again() -> None:
    moves = plan("a", leases(shards(4, "a")), ["a", "b"], moved_recently={"s02", "s03"})
    assert moves.shed == ["s01", "s00"]


def test_a_worker_above_its_share_keeps_it_while_the_spread_is_one() -> None:
    owners = {**shards(4, "b"), "s04": "a", "s05": "a", "s06": "a", "s07": "a", "s08": "b"}  # a 4, b 5 of 9
    assert plan("b", leases(owners), ["a", "b"]).shed == []  # a's share is 5, b's 4: no move for that


def test_an_under_loaded_worker_asks_the_most_loaded_one_for_one_lease_when_nothing_is_free() -> None:
    # a holds 6 of 9 but (say, an older version) does not shed; b and c hold 1 and 2.
    owners = {**shards(6, "a"), "s06": "b", "s07": "c", "s08": "c"}
    moves = plan("b", leases(owners), ["a", "b", "c"])
    assert not moves.claim and not moves.shed
    assert [(lease.shard_id, lease.owner) for lease in moves.ask] == [("s00", "a")]


def test_a_worker_asks_the_one_above_its_share_not_a_one_as_loaded_at_its_share() -> None:
    # 9 shards on 4 workers, the extra one b's (rank offset 1): shares a 2, b 3, c 2, d 2. a and b
    # hold 3 each, but only a is above its share: b would decline the request (see target()).
    owners = {**shards(3, "a"), "s03": "b", "s04": "b", "s05": "b", "s06": "c", "s07": "c", "s08": "d"}
    moves = plan("d", leases(owners), ["a", "b", "c", "d"], rank_offset=1)
    assert [(lease.shard_id, lease.owner) for lease in moves.ask] == [("s00", "a")]
    assert [target(w, 9, ["a", "b", "c", "d"], rank_offset=1) for w in "abcd"] == [2, 3, 2, 2]


@pytest.mark.parametrize("room", [None, 0, 2, 5])
@pytest.mark.parametrize("max_leases", [None, 1, 3])
def test_target_is_the_plan_s_target_for_every_count_offset_and_limit(max_leases: int | None, room: int | None) -> None:
    workers = ["a", "b", "c"]
    for count in range(0, 11):
        for offset in range(0, 4):
            for me in workers:
                planned = plan(
                    me, leases(shards(count)), workers, rank_offset=offset, max_leases=max_leases, room=room
                ).target
                assert target(me, count, workers, rank_offset=offset, max_leases=max_leases, room=room) == planned


def test_no_steal_while_the_spread_is_at_most_one_or_a_request_is_open() -> None:
    owners = {**shards(5, "a"), "s05": "b", "s06": "b", "s07": "b", "s08": "b"}  # 5 / 4
    assert not plan("b", leases(owners), ["a", "b"]).ask
    owners = {**shards(7, "a"), "s07": "b"}  # 7 / 1
    assert not plan("b", leases(owners), ["a", "b"], asked=1).ask
    assert len(plan("b", leases(owners), ["a", "b"], asked=0, max_steals=2).ask) == 2


def test_a_worker_never_asks_itself_nor_for_a_lease_already_asked_for_or_moved_recently() -> None:
    owners = {**shards(6, "a"), "s06": "b"}
    moves = plan("b", leases(owners, wanted={"s00": "c"}), ["a", "b"], moved_recently={"s01"})
    assert [lease.shard_id for lease in moves.ask] == ["s02"]


def test_a_free_lease_another_live_worker_asked_for_is_left_to_it_unless_the_request_is_stale() -> None:
    owners = {**shards(2, None)}
    mine = plan("a", leases(owners, wanted={"s00": "b"}), ["a", "b"], reserved_for_others={"s00"})
    assert [lease.shard_id for lease in mine.claim] == ["s01"]
    theirs = plan("b", leases(owners, wanted={"s00": "b"}), ["a", "b"], reserved_for_others=set())
    assert [lease.shard_id for lease in theirs.claim] == ["s00"]


def test_leases_of_dead_workers_are_free() -> None:
    owners = {**shards(4, "dead")}
    moves = plan("a", leases(owners), ["a", "b"])
    assert len(moves.claim) == 2


@pytest.mark.parametrize(("limit", "expected"), [(3, 3), (0, 0), (None, 8)])
def test_max_leases_per_worker_caps_claims(limit: int | None, expected: int) -> None:
    assert len(plan("a", leases(shards(8)), ["a"], max_leases=limit).claim) == expected


def test_the_rank_offset_moves_the_extra_shards_to_the_next_workers_in_turn() -> None:
    free = leases(shards(3))
    assert [plan(w, free, ["a", "b"]).target for w in "ab"] == [2, 1]
    assert [plan(w, free, ["a", "b"], rank_offset=1).target for w in "ab"] == [1, 2]
    assert [plan(w, free, ["a", "b"], rank_offset=3).target for w in "ab"] == [1, 2]


def test_three_streams_of_three_shards_on_two_workers_end_five_and_four_not_six_and_three() -> None:
    """Each stream balanced alone would give its extra shard to the first worker each time."""
    shares = {"a": StreamShares(), "b": StreamShares()}
    arns = ["arn:clicks", "arn:orders", "arn:payments"]
    owners: dict[str, dict[str, str | None]] = {arn: {**shards(3, "a")} for arn in arns}  # "a" started first
    for _ in range(4):  # a few cycles: each worker publishes what it saw, then claims
        for worker in "ab":
            for arn in arns:
                readable = leases(owners[arn])
                held = sum(1 for lease in readable if lease.owner == worker)
                shares[worker].publish(arn, readable=len(readable), held=held)
                moves = plan(worker, readable, ["a", "b"], rank_offset=shares[worker].rank_offset(arn), exact=True)
                for lease in moves.claim:
                    owners[arn][lease.shard_id] = worker
                for shard_id in moves.shed:
                    owners[arn][shard_id] = None
    totals = Counter(owner for arn in arns for owner in owners[arn].values())
    assert sorted(totals.values()) == [4, 5], totals


def test_one_stream_keeps_its_hysteresis_a_spread_of_one_moves_nothing() -> None:
    owners = {"s00": "b", "s01": "b", "s02": "a"}  # b holds the extra that rank order would give a
    assert plan("b", leases(owners), ["a", "b"]).shed == []
    assert plan("b", leases(owners), ["a", "b"], exact=True).shed == ["s01"]


def test_max_leases_per_worker_counts_every_stream() -> None:
    shares = StreamShares()
    shares.publish("arn:orders", readable=8, held=3)
    shares.publish("arn:payments", readable=8, held=2)
    assert shares.room("arn:payments", 4) == 1 and shares.room("arn:orders", 4) == 2
    assert shares.room("arn:clicks", 4) == 0 and shares.room("arn:clicks", 0) is None


def cycles(owners: dict[str, str | None], live: list[str], rounds: int) -> int:
    """Every worker plans in turn against the table as it is; claims, sheds and asks (honoured by
    the owner at once) are applied. Returns how many leases changed owner."""
    wanted: dict[str, str] = {}
    moved = 0
    for _ in range(rounds):
        for worker in live:
            moves = plan(worker, leases(owners, wanted), live, asked=sum(1 for w in wanted.values() if w == worker))
            for lease in moves.claim:
                owners[lease.shard_id] = worker
                wanted.pop(lease.shard_id, None)
                moved += 1
            for sid in moves.shed:
                owners[sid] = None
            for lease in moves.ask:
                owners[lease.shard_id] = None  # the owner hands it over, kept for the asker
                wanted[lease.shard_id] = worker
    return moved


def test_balanced_holdings_for_any_count_of_shards_and_workers_and_then_no_moves() -> None:
    for shard_count in range(0, 20):
        for worker_count in range(1, 6):
            owners = shards(shard_count)
            live = [f"w{i}" for i in range(worker_count)]
            cycles(owners, live, 4)
            held = Counter(owner for owner in owners.values() if owner)
            counts = [held[worker] for worker in live]
            assert sum(counts) == shard_count
            assert max(counts) - min(counts) <= 1, (shard_count, worker_count, counts)
            assert cycles(owners, live, 3) == 0, "a balanced table must stay as it is"


def test_a_worker_joining_and_one_leaving_rebalance_in_a_cycle_or_two() -> None:
    owners = shards(8)
    cycles(owners, ["a"], 1)
    assert Counter(owners.values()) == {"a": 8}
    cycles(owners, ["a", "b"], 2)
    assert Counter(owners.values()) == {"a": 4, "b": 4}
    cycles(owners, ["a", "b", "c"], 2)
    assert sorted(Counter(owners.values()).values()) == [2, 3, 3]
    for sid, owner in owners.items():  # c stops and releases its leases
        if owner == "c":
            owners[sid] = None
    cycles(owners, ["a", "b"], 1)
    assert Counter(owners.values()) == {"a": 4, "b": 4}


def test_a_worker_short_of_its_share_asks_only_once_the_others_had_their_time_to_shed() -> None:
    owners = {**shards(7, "a"), "s07": "b"}  # 7 / 1: a sheds on its own when it sees b
    waiting = plan("b", leases(owners), ["a", "b"], may_ask=False)
    assert waiting.short and not waiting.ask
    assert plan("b", leases(owners), ["a", "b"], may_ask=True).ask
    assert not plan("b", leases({**shards(4, "a"), "s04": "b", "s05": "b", "s06": "b"}), ["a", "b"]).short


def test_a_stream_read_no_more_leaves_the_offsets_of_the_others() -> None:
    shares = StreamShares()
    shares.publish("arn:a", readable=3, held=2)
    shares.publish("arn:b", readable=4, held=2)
    assert shares.rank_offset("arn:b") == 3 and shares.several
    shares.forget("arn:a")
    assert shares.rank_offset("arn:b") == 0 and not shares.several and shares.room("arn:b", 3) == 3


def test_room_caps_what_this_worker_claims_and_sheds_what_is_above_it() -> None:
    assert len(plan("a", leases(shards(8)), ["a"], room=2).claim) == 2
    assert len(plan("a", leases(shards(8)), ["a"], room=0).claim) == 0
    held = plan("a", leases(shards(3, "a")), ["a"], room=2)
    assert (held.claim, len(held.shed)) == ([], 1)


def test_max_leases_per_worker_holds_over_two_streams_claimed_as_the_cycles_claim() -> None:
    """Each stream's cycle publishes what it will hold before it claims (no await in between), so
    the next stream's room sees it: one worker, two streams of 4 shards, a limit of 4 in all."""
    shares = StreamShares()
    owners = {arn: shards(4) for arn in ("arn:a", "arn:b")}
    for _ in range(5):
        for arn, owned in owners.items():
            readable = leases(owned)
            held = sum(1 for lease in readable if lease.owner == "x")
            shares.publish(arn, readable=len(readable), held=held)
            moves = plan("x", readable, ["x"], room=shares.room(arn, 4), rank_offset=shares.rank_offset(arn))
            shares.publish(arn, readable=len(readable), held=held + len(moves.claim) - len(moves.shed))
            for lease in moves.claim:
                owned[lease.shard_id] = "x"
            for shard_id in moves.shed:
                owned[shard_id] = None
    assert sum(1 for owned in owners.values() for owner in owned.values() if owner == "x") == 4


def test_a_lease_free_for_long_is_claimed_by_workers_that_disagree_on_the_shares() -> None:
    """Two workers whose offsets differ (their lists of streams differ during a rolling restart)
    each leave the free lease to the other; once it is stale, either takes it."""
    free = leases({"s0": "X", "s1": None, "s2": "Y"})
    assert plan("X", free, ["X", "Y"], rank_offset=3).claim == []
    assert plan("Y", free, ["X", "Y"], rank_offset=2).claim == []
    assert [lease.shard_id for lease in plan("X", free, ["X", "Y"], rank_offset=3, stale_free={"s1"}).claim] == ["s1"]
    assert [lease.shard_id for lease in plan("Y", free, ["X", "Y"], rank_offset=2, stale_free={"s1"}).claim] == ["s1"]


def test_a_stale_lease_claimed_above_the_share_is_not_paid_for_by_shedding_another() -> None:
    """7 shards on a, b, c (shares 3, 2, 2); b is live but short and does not claim (its room over
    its other streams, leases in doubt): c takes the stale leases and sheds nothing for b."""
    owners = {"s0": "a", "s1": "a", "s2": "a", "s3": "c", "s4": "c", "s5": None, "s6": None}
    moves = plan("c", leases(owners), ["a", "b", "c"], stale_free={"s5", "s6"})
    (taken,) = moves.claim  # up to the ceiling, 3
    assert moves.shed == []
    # The next cycles, while the cycle keeps shed_for_short off, it does not hand it back to b either.
    owners[taken.shard_id] = "c"
    assert plan("c", leases(owners), ["a", "b", "c"], shed_for_short=False).shed == []
    assert plan("c", leases(owners), ["a", "b", "c"]).shed != []  # (b short: shed, once the quiet time is over)


def test_requests_are_honoured_down_to_the_share_then_declined_while_this_worker_gave_lately() -> None:
    # Above the share: honoured until the share, the rest declined (it gave just now).
    assert answer_requests(["s1", "s2", "s3"], held=5, target=3, gave_lately=True) == (["s1", "s2"], ["s3"])
    # At the share, having given nothing lately: workers that disagree on the shares move leases
    # only this way, so one is honoured; a second in the same cycle is declined (it just gave one).
    assert answer_requests(["s1", "s2"], held=4, target=4, gave_lately=False) == (["s1"], ["s2"])
    assert answer_requests(["s1", "s2"], held=5, target=4, gave_lately=False) == (["s1"], ["s2"])
    # At or below the share, having shed or given lately: the asker read the table before that.
    assert answer_requests(["s1"], held=4, target=4, gave_lately=True) == ([], ["s1"])
    assert answer_requests(["s1"], held=2, target=4, gave_lately=True) == ([], ["s1"])
    assert answer_requests([], held=9, target=1, gave_lately=False) == ([], [])


def test_a_free_lease_this_worker_asked_for_is_claimed_even_once_it_reached_its_share() -> None:
    """Found by the simulation (seed 398 of 64 x 8, every fault): a worker asked for a dead worker's
    lease, reached its share with another lease meanwhile, and left the one it asked for free; the
    others leave a lease asked for to its asker until the request is failover_s old, so its shard
    went unread 12.8 s after the death (limit 12). What it asked for and is free is claimed, up to
    the ceiling."""
    owners = {f"s{i:02d}": "a" if i < 7 else "b" if i < 13 else "c" if i < 19 else None for i in range(20)}
    moves = plan("c", leases(owners, {"s19": "c"}), ["a", "b", "c"])  # shares 7, 7, 6; c holds 6
    assert moves.target == 6
    assert [lease.shard_id for lease in moves.claim] == ["s19"], moves


def test_a_free_lease_asked_for_by_a_worker_at_its_share_is_not_kept_for_it() -> None:
    """Found in review: the asker at its share and at the ceiling cannot claim what it asked for,
    and every other worker kept it for the asker until the request was failover_s old."""
    owners = {f"s{i:02d}": "a" if i < 9 else "c" if i < 19 else None for i in range(20)}
    moves = plan("a", leases(owners, {"s19": "c"}), ["a", "c"], reserved_for_others={"s19"})
    assert [lease.shard_id for lease in moves.claim] == ["s19"], moves
    owners["s18"] = None  # c below its share now: the lease stays its own to claim
    moves = plan("a", leases(owners, {"s19": "c"}), ["a", "c"], reserved_for_others={"s19"})
    assert "s19" not in [lease.shard_id for lease in moves.claim], moves


def test_a_stopping_worker_counts_no_share_and_its_leases_stay_its_own_until_released() -> None:
    """A rolling deploy's step: ``c`` stops as ``d`` starts. Counted among the shares, ``c`` made
    every share too small and the others shed to ``d`` what they would claim back once ``c``
    was gone. Leaving, it counts none: nobody sheds, nobody asks it, its leases are not free."""
    owners = {**shards(4, "a"), **{f"s{i:02d}": "b" for i in range(4, 8)}, **{f"s{i:02d}": "c" for i in range(8, 12)}}
    live = ["a", "b", "c", "d"]
    before = [plan(w, leases(owners), live) for w in "abd"]
    assert before[0].shed and before[1].shed, "counted, c makes a and b shed to d"
    for worker in "abd":
        moves = plan(worker, leases(owners), live, leaving={"c"})
        assert not moves.claim and not moves.shed and not moves.ask, (worker, moves)
        assert moves.target == 4 == target(worker, 12, live, leaving={"c"})
    # a and b hold 5 each, c 2: what c will release no longer covers what d misses (4).
    uncovered = {**owners, "s08": "a", "s09": "b"}
    assert plan("d", leases(uncovered), live, leaving={"c"}).ask, "asks once what c releases does not cover it"
    assert not plan("d", leases(owners), live, leaving={"c"}).ask
    released = {**owners, **{f"s{i:02d}": None for i in range(8, 12)}}
    claimed = plan("d", leases(released), live, leaving={"c"}).claim
    assert sorted(lease.shard_id for lease in claimed) == ["s08", "s09", "s10", "s11"]
    assert not plan("a", leases(released), live, leaving={"c"}).claim


def test_a_free_lease_a_stopping_worker_asked_for_is_not_kept_for_it() -> None:
    owners = {"s00": None, "s01": "a", "s02": "a", "s03": "b", "s04": "b", "s05": "c"}
    moves = plan("a", leases(owners, wanted={"s00": "c"}), ["a", "b", "c"], reserved_for_others={"s00"})
    assert not moves.claim, "kept for c while c is not leaving"
    moves = plan("a", leases(owners, wanted={"s00": "c"}), ["a", "b", "c"], reserved_for_others={"s00"}, leaving={"c"})
    assert [lease.shard_id for lease in moves.claim] == ["s00"]


def test_nobody_asks_while_what_stopping_workers_hold_and_what_is_free_cover_what_is_missing() -> None:
    """Found in review: c stops with 4, d starts with none, and s07 is free, kept for b's request.
    What c holds alone (4) is less than d and b miss (5), so d asked a, at its share, for a lease:
    a would then claim one of c's back. s07 goes to b: nothing needs asking."""
    owners = {**shards(4, "a"), "s04": "b", "s05": "b", "s06": "b", "s07": None}
    owners.update({f"s{i:02d}": "c" for i in range(8, 12)})
    moves = plan("d", leases(owners, {"s07": "b"}), ["a", "b", "c", "d"], reserved_for_others={"s07"}, leaving={"c"})
    assert not moves.ask and not moves.claim and moves.short


def test_a_request_of_a_stopping_worker_is_declined_whatever_the_share() -> None:
    honour, decline = answer_requests(["s1", "s2", "s3"], held=10, target=4, gave_lately=False, from_leaving={"s2"})
    assert honour == ["s1", "s3"] and decline == ["s2"]
