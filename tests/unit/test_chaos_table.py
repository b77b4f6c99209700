"""The chaos table (tests/chaos/harness.py): one row per scenario in the order they ran, sums over
its iterations, the worst recovery, failed iterations counted; outcomes survive their trip through
a test report as JSON."""

from __future__ import annotations

from tests.chaos.harness import Outcome, markdown_table, page, replay_line, scenario_notes, table_rows


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
