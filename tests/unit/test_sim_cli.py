"""``python -m efo.sim``: one seed, many seeds, and a clear refusal of what it cannot simulate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "efo.sim", *args], capture_output=True, text=True, timeout=120)


def test_an_impossible_size_or_fault_is_refused_naming_what_is_allowed() -> None:
    too_big = _sim("run", "--shards", "0")
    assert too_big.returncode == 2 and "--shards 0: from 1 to 100,000" in too_big.stderr
    unknown = _sim("run", "--faults", "kill,meteor")
    assert unknown.returncode == 2 and "unknown fault(s) meteor" in unknown.stderr and "throttle-key" in unknown.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("--idle-event-s", "0"),
            "--idle-event-s 0: a finite number at least 0.01",
        ),  # hung: events every 0 s, time never moved
        (("--idle-event-s", "-1"), "--idle-event-s -1: a finite number at least 0.01"),
        (("--minutes", "nan"), "--minutes nan: a finite number above 0"),  # hung
        (("--minutes", "inf"), "--minutes inf: a finite number above 0"),
        (("--stale-read-s", "-1"), "--stale-read-s -1: a finite number at least 0"),  # was run as if 0
        (("--drain-s", "-5"), "--drain-s -5: a finite number at least 0"),
        (("--records-per-shard-s", "-0.5"), "--records-per-shard-s -0.5: a finite number at least 0, at most 1,000"),
        (("--idle-event-s", "1e-9"), "--idle-event-s 1e-09: a finite number at least 0.01"),  # crawled
        (("--records-per-shard-s", "1e12"), "--records-per-shard-s 1e+12: a finite number at least 0, at most 1,000"),
        (("--minutes", "1", "--window", "30:90"), "--window 30:90: TO at most the run's 60 s of traffic"),
    ],
)
def test_a_flag_out_of_its_range_is_refused_naming_the_flag_its_value_and_what_is_allowed(
    args: tuple[str, ...], said: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "efo.sim", "run", "--shards", "8", "--workers", "2", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and said in done.stderr, (done.returncode, done.stderr)


def test_seeds_refuses_a_count_of_none() -> None:
    done = _sim("seeds", "--count", "0", "--shards", "8", "--workers", "2")
    assert done.returncode == 2 and "--count 0: at least 1" in done.stderr, done.stderr


def test_a_run_prints_its_report_and_the_same_seed_gives_the_same_run() -> None:
    args = ("run", "--shards", "8", "--workers", "2", "--minutes", "0.5", "--faults", "kill", "--seed", "3", "--json")
    first, second = _sim(*args), _sim(*args)
    assert first.returncode == 0, first.stderr
    reports = [json.loads(done.stdout) for done in (first, second)]
    for report in reports:
        report.pop("wall_s")
    assert reports[0] == reports[1] and reports[0]["violation"] is None and reports[0]["records_put"] > 0


def test_seeds_runs_one_line_each() -> None:
    done = _sim(
        "seeds",
        "--count",
        "2",
        "--first",
        "5",
        "--shards",
        "8",
        "--workers",
        "2",
        "--minutes",
        "0.5",
        "--faults",
        "none",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["seed 5", "seed 6"] and all(line.endswith("ok") for line in lines)
