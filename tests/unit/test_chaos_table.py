"""The chaos table (tests/chaos/harness.py): one row per scenario in the order they ran, sums over
its iterations (and over the streams of a scenario that reads several), the worst recovery, failed
iterations counted; outcomes survive their trip through a test report as JSON."""

from __future__ import annotations

from tests.chaos.harness import Outcome, markdown_table, merged, page, replay_line, scenario_notes, table_rows
from tests.integration.ledger_check import Verdict


def outcome(scenario: str, iteration: int, about: str, records: int, **counts: object) -> Outcome:
    return Outcome(scenario, iteration, 42, "full", about, records, **counts)  # type: ignore[arg-type]


OUTCOMES = [
    outcome("SIGKILL, 2 workers", 0, "Kills.", 100, duplicates=7, allowed=9, recoveries=[("SIGKILL w1", 6.04)]),
    outcome("sink", 0, "A sink.", 50),
    outcome("SIGKILL, 2 workers", 1, "Kills.", 120, duplicates=1, allowed=3, recoveries=[("SIGKILL w2", 7.26)]),
    outcome("SIGKILL, 2 workers", 2, "Kills.", 80, lost=2, recoveries=[("x", 1.0)], failed="no recovery"),
    outcome("SIGTERM, 3 workers", 0, "Kills.", 10),
]


def test_rows_sum_the_iterations_of_each_scenario_and_keep_the_worst_recovery() -> None:
    assert table_rows(OUTCOMES) == [
        ["SIGKILL, 2 workers", "3 (1 failed)", "300", "2", "0", "8 (allowed 12)", "7.3 s"],
        ["sink", "1", "50", "0", "0", "0 (allowed 0)", "-"],
        ["SIGTERM, 3 workers", "1", "10", "0", "0", "0 (allowed 0)", "-"],
    ]
    table = markdown_table(OUTCOMES).splitlines()
    assert table[0] == "| scenario | iterations | records | lost | out-of-order | duplicates | max recovery |"
    assert len(table) == 2 + 3
    assert scenario_notes(OUTCOMES) == ["- **SIGKILL, 2 workers; SIGTERM, 3 workers**: Kills.", "- **sink**: A sink."]


def test_the_page_and_the_summary_name_the_command_that_replays_the_run() -> None:
    assert (
        replay_line(OUTCOMES)
        == "seed 42, full size, 3 iteration(s) per scenario: EFO_CHAOS_SEED=42 make chaos replays it"
    )
    text = page(OUTCOMES)
    assert "`EFO_CHAOS_SEED=42 make chaos` (tests/chaos; full size, 3 iteration(s) per scenario)" in text
    assert markdown_table(OUTCOMES) in text
    assert "- SIGKILL, 2 workers, iteration 2: no recovery" in text


def test_an_outcome_survives_json() -> None:
    for original in OUTCOMES:
        assert Outcome.from_json(original.to_json()) == original


def test_a_scenario_over_several_streams_is_one_row_summed_over_its_streams() -> None:
    orders = Verdict(100, 104, [], [], 4, {"w1": 60, "w2": 44}, allowed=5)
    shard = "shardId-000000000000"  # in both streams: the merged verdict names the stream
    clicks = Verdict(50, 51, [(shard, "9")], ["clicks-001: 3 after 4"], 1, {"w1": 51}, undue=[(shard, "7")])
    both = merged({"orders": orders, "clicks": clicks})
    assert (both.produced, both.committed, both.duplicates, both.allowed) == (150, 155, 5, 5)
    assert (both.lost, both.undue) == ([(f"clicks/{shard}", "9")], [(f"clicks/{shard}", "7")])
    assert both.out_of_order == ["clicks-001: 3 after 4"] and both.by_worker == {"w1": 111, "w2": 44}
    assert merged({"": orders}) is orders  # one stream: its verdict as it is
    run = Outcome("3 streams", 0)
    run.checked(both)
    assert table_rows([run]) == [["3 streams", "1", "150", "1", "1", "5 (allowed 5)", "-"]]
