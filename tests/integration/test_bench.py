"""``make bench`` keeps working: the quick run of the benchmarks writes a document with every table
(``make test`` runs two light sections; ``make chaos`` runs them all).

Figures are not checked (they mean nothing at these sizes, and speed is measured, never asserted).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: By run_all.py's key: the section's title and its script.
SECTIONS = {
    "ingest": ("## 1. Ingest throughput", "bench/ingest.py"),
    "bridge": ("## 2. Spark bridge overhead", "bench/spark_ingest.py"),
    "latency": ("## 3. Latency, arrival to commit", "bench/latency.py"),
    "memory": ("## 4. Memory with a stalled sink", "bench/memory_bound.py"),
    "workers": ("## 5 and 6. Failover, handoff and DynamoDB cost with two workers", "bench/workers.py"),
    "fleet": ("## 7. A fleet: lease-plane cost, balance and takeover at scale", "bench/fleet.py"),
    "bounded": ("## 8. A bounded run over a backlog", "bench/bounded.py"),
    "service": ("## 9. The whole service's CPU per record", "bench/service_cpu.py"),
    "peer": ("## 10. The peer, side by side: async-kinesis and efo", "bench/peer.py"),
    "streams": ("## 11. Several streams in one deployment", "bench/streams.py"),
    "source": ("## 12. The Spark source beside efo run", "bench/spark_source.py"),
}
#: Scripts whose tables follow the section's own (a Part of run_all's Benchmark).
PARTS = {"## 7. A fleet: lease-plane cost, balance and takeover at scale": "bench/fleet_sim.py"}


#: ``make test`` runs two light sections (the chain of run_all.py, bench/common.py and the document are
#: the same for every section; eight at once, each with its own local stack, cost 105 CPU-s of a suite
#: that is CPU-bound on this machine); the quick run of them all is a long test (``make chaos``).
QUICK = ["ingest", "peer"]


def test_the_quick_benchmark_run_of_two_light_sections_writes_their_tables_with_their_commands(tmp_path: Path) -> None:
    check_quick_run(tmp_path, QUICK, timeout_s=300)


@pytest.mark.long
def test_the_quick_benchmark_run_writes_every_table_with_its_command(tmp_path: Path) -> None:
    check_quick_run(tmp_path, None, timeout_s=420)


def check_quick_run(tmp_path: Path, only: list[str] | None, *, timeout_s: float) -> None:
    out = tmp_path / "benchmarks.md"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run_all.py"), "--quick", "--out", str(out)]
        + (["--only", ",".join(only)] if only else []),
        cwd=ROOT,
        capture_output=True,
        text=True,
        # Every benchmark at once on a shared machine: the slowest (two Spark drivers, bench/spark_source.py)
        # took 216 s of a run whose others ended by 168 s, and a whole run under this test 290-300 s.
        timeout=timeout_s,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    text = out.read_text()
    assert re.search(r"^- commit: [0-9a-f]{12}", text, re.MULTILINE), text[:500]
    assert "## Goals" in text and "| goal | measured | met |" in text
    sections = re.split(r"^(?=## )", text, flags=re.MULTILINE)
    expected = {title: script for key, (title, script) in SECTIONS.items() if only is None or key in only}
    assert expected, only
    for title, script in expected.items():
        section = next((s for s in sections if s.startswith(title + "\n")), None)
        assert section is not None, f"no section {title!r}"
        assert f"command: `python {script}" in section, section[:400]
        tables = re.findall(r"^\|.*\|\n\|[-:| ]+\|\n(?:\|.*\|\n)+", section, re.MULTILINE)
        assert tables, f"no table with rows in {title!r}"
        if title in PARTS:
            part = section.split(f"command: `python {PARTS[title]}", 1)
            assert len(part) == 2, f"no {PARTS[title]} in {title!r}"
            assert re.search(r"^\|.*\|\n\|[-:| ]+\|\n(?:\|.*\|\n)+", part[1], re.MULTILINE), part[1][:400]
            assert " --against " not in part[1], "the command names no temporary file"


def test_the_dynamodb_client_benchmark_prints_its_table_with_its_command() -> None:
    """bench/dynamodb_client.py is run alone, not by ``make bench``: a tiny run keeps it working."""
    completed = subprocess.run(
        [sys.executable, "bench/dynamodb_client.py", "--shards", "4", "--calls", "16", "--rounds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "command: `python bench/dynamodb_client.py --shards 4" in completed.stdout
    rows = re.findall(
        r"^\| (checkpoint|heartbeat|read_leases) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$", completed.stdout, re.M
    )
    assert rows == ["checkpoint", "heartbeat", "read_leases"], completed.stdout
