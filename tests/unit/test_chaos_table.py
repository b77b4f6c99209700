"""The chaos table (tests/chaos/harness.py): one row per scenario in the order they ran, sums over
its iterations, the worst recovery, failed iterations counted."""

from __future__ import annotations

from tests.chaos.harness import Outcome, markdown_table, scenario_notes, table_rows
from tests.integration.ledger_check import Verdict


def verdict(produced: int, lost: int = 0, duplicates: int = 0, allowed: int = 0) -> Verdict:
    return Verdict(
        produced=produced,
        committed=produced - lost + duplicates,
        lost=[("shard", str(i)) for i in range(lost)],
        out_of_order=[],
        duplicates=duplicates,
        by_worker={},
        allowed=allowed,
    )


def test_rows_sum_the_iterations_of_each_scenario_and_keep_the_worst_recovery() -> None:
    outcomes = [
        Outcome("SIGKILL, 2 workers", 0, "Kills.", verdict(100, duplicates=7, allowed=9), [("SIGKILL w1", 6.04)]),
        Outcome("sink", 0, "A sink.", verdict(50)),
        Outcome("SIGKILL, 2 workers", 1, "Kills.", verdict(120, duplicates=1, allowed=3), [("SIGKILL w2", 7.26)]),
        Outcome("SIGKILL, 2 workers", 2, "Kills.", verdict(80, lost=2), [("x", 1.0)], failed="no recovery"),
        Outcome("SIGTERM, 3 workers", 0, "Kills.", verdict(10)),
    ]
    assert table_rows(outcomes) == [
        ["SIGKILL, 2 workers", "3 (1 failed)", "300", "2", "0", "8 (allowed 12)", "7.3 s"],
        ["sink", "1", "50", "0", "0", "0 (allowed 0)", "-"],
        ["SIGTERM, 3 workers", "1", "10", "0", "0", "0 (allowed 0)", "-"],
    ]
    table = markdown_table(outcomes).splitlines()
    assert table[0] == "| scenario | iterations | records | lost | out-of-order | duplicates | max recovery |"
    assert len(table) == 2 + 3
    assert scenario_notes(outcomes) == ["- **SIGKILL, 2 workers; SIGTERM, 3 workers**: Kills.", "- **sink**: A sink."]


def test_an_iteration_that_failed_before_its_verdict_adds_no_counts() -> None:
    outcomes = [Outcome("DynamoDB", 0, failed="a worker exited"), Outcome("DynamoDB", 1, verdict=verdict(10))]
    assert table_rows(outcomes) == [["DynamoDB", "2 (1 failed)", "10", "0", "0", "0 (allowed 0)", "-"]]
