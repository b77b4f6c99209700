"""Every benchmark, one after the other, into one markdown file (``make bench``; ``make bench-quick``).

Each benchmark is its own script that prints its markdown (its command line first) on standard
output and its figures as JSON (``--json``); this runs them as child processes with the sizes
below, checks the figures against the goals of issue 12, and writes ``docs/benchmarks.md``: the
date, the machine, the git commit, a summary of the goals, then one section per benchmark, and
last the table of the last ``make chaos`` run (``docs/chaos.md``, written by that run).

``--quick`` runs tiny sizes (about a minute, several benchmarks at once) to check that the whole
chain works; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
PHASES = ("start", "busy", "idle", "join", "takeover", "rolling")  # efo.sim.phases.PHASES: what fleet_sim.py runs
CHECKPOINT_INTERVAL_S = 5.0  # checkpoint.interval_s's default: a busy shard's checkpoints a second are 1 / this
#: Wall minutes for the fleet's simulated sizes together (bench/fleet_sim.py --budget-min): a size that
#: does not finish in it is reported as not measured.
FLEET_SIM_BUDGET_MIN = 120
#: The simulation's goal sizes (issue 37); a quick run judges the largest size it ran instead.
FLEET_SIM_GOAL_SIZES = ((4096, 64), (16384, 256))
ROOT = BENCH.parent


@dataclass(frozen=True)
class Part:
    """A script run after its benchmark's own, in the same section, given that one's figures
    (``--against``); its figures go under ``key`` in the benchmark's."""

    key: str
    script: str
    full: list[str]
    quick: list[str]


@dataclass(frozen=True)
class Benchmark:
    key: str
    title: str
    script: str
    full: list[str]
    quick: list[str]
    about: str
    parts: tuple[Part, ...] = ()


BENCHMARKS = [
    Benchmark(
        "ingest",
        "1. Ingest throughput",
        "ingest.py",
        ["--shards", "1,8,64,256", "--record-size", "100,1024,10240", "--repeats", "3", "--seconds", "1.2"],
        ["--shards", "2", "--record-size", "1024", "--repeats", "1", "--seconds", "0.3", "--warmup", "0.2"],
        "Records/s of efo's subscription path (decode, pool admission, handoff, a no-op drain that acknowledges) "
        "against stock aiobotocore, a boto3 thread per shard, and the parse limit (botocore's framing and efo's "
        "decoding of the same bytes in a tight loop, no socket, pool or handoff; also on efo's own framing, "
        "efo.kinesis.framing, which efo reads with and which checks each message's CRC with zlib-ng's CRC-32, "
        "several times zlib's speed), on the synthetic SubscribeToShard server. efo decodes events "
        "of records up to 1,350 B with msgspec (JSON and base64 in one pass), larger ones with orjson and pybase64. "
        "Goals: at 64 shards x 1 KiB at least 7x stock and 70 % of the parse limit (reported against both); at "
        "256 shards x 10 KiB at least 3x stock; the 100 B rows have none.",
    ),
    Benchmark(
        "bridge",
        "2. Spark bridge overhead",
        "spark_ingest.py",
        # 21 repeats: one repeat's figure wanders by ten points and more (the middle half of 21 at
        # 100,000 rows with the no-op sink: +3 % to +41 % around +12.7 %), and the median of 9
        # moved by 7 points between blocks of one run (docs/benchmarks.md section 2).
        ["--sizes", "10000,100000", "--sinks", "parquet,noop", "--repeats", "21"],
        [
            *("--sizes", "1000", "--sinks", "parquet,noop", "--repeats", "1"),
            *("--batches", "1", "--run-rows", "1000", "--master", "local[1]"),
        ],
        "The whole bridge (handoff, watermark, Arrow, createDataFrame, sink, acknowledgement) against Spark alone "
        "(createDataFrame + the same sink) on the identical Arrow tables, built before timing; the bridge as a "
        "driver that is behind runs it, each batch committed while the next is taken and converted. Goal: "
        "overhead at most 15 % with the Parquet sink and with a no-op sink.",
    ),
    Benchmark(
        "latency",
        "3. Latency, arrival to commit",
        "latency.py",
        ["--shards", "64", "--seconds", "15", "--warmup", "5"],
        ["--shards", "2", "--seconds", "2", "--warmup", "1", "--windows", "1"],
        "Kinesis arrival to sink commit, per record, of the real `efo run` at half of its ceiling measured in the "
        "same run. Goals: p50 at most `max_wait_s` + 0.3 s, p99 at most `max_wait_s` + 1.5 s.",
    ),
    Benchmark(
        "memory",
        "4. Memory with a stalled sink",
        "memory_bound.py",
        ["--shards", "64,256", "--pools-mib", "4", "--seconds", "60"],
        [
            "--shards",
            "2",
            "--pools-mib",
            "1",
            "--seconds",
            "3",
            "--settle-s",
            "1",
            "--data-factor",
            "1",
            "--sink",
            "arrow",
        ],
        "RSS of `efo run` (the Python process, leases in the local DynamoDB) with a sink that never returns, "
        "against the README's bound, with the margin left.",
    ),
    Benchmark(
        "workers",
        "5 and 6. Failover, handoff and DynamoDB cost with two workers",
        "workers.py",
        ["--shards", "8,64", "--window", "40", "--repeats", "3"],
        ["--shards", "2", "--window", "4", "--settle", "0", "--repeats", "1", "--failover-s", "3"],
        "Two `efo run` workers on the local stack. Goals: SIGKILL to every shard read again at most "
        "`failover_s` + 2 s; SIGTERM release to the new owner's first event at most 2 s; DynamoDB writes at "
        "most 1/3 of a KCL-style request pattern measured against the same server.",
    ),
    Benchmark(
        "fleet",
        "7. A fleet: lease-plane cost, balance and takeover at scale",
        "fleet.py",
        ["--sizes", "1024x16", "--window", "60", "--settle", "10"],
        ["--sizes", "16x2", "--window", "5", "--settle", "2", "--failover-s", "3", "--phase-timeout", "30"],
        "W real coordinators in one process against the local DynamoDB, with a fake Kinesis of S shards, idle "
        "and busy: DynamoDB requests and units at the wire (fleet and busiest partition key), ListShards calls, "
        "time to balance after the start and after a join, takeover after a worker dies, leases in doubt; beside "
        "the KCL 2.x and 3.x request models at their defaults. Then the same phases and a rolling deploy in "
        "simulated time (bench/fleet_sim.py: the real code of every worker against efo/sim's DynamoDB and "
        "Kinesis) at 1,024 x 16, 4,096 x 64 and 16,384 x 256, within a wall-time budget (a size that does not "
        "finish in it is not measured), and the simulation's requests and units beside DynamoDB Local's at "
        "1,024 x 16. Goals: at 1,024 x 16 on DynamoDB Local the lease plane at most 1/10 of the KCL 2.x model's "
        "cost and below the KCL 3.x model's (a write unit = 5 read units), and the simulation within 10 % of its "
        "requests and units; at 4,096 x 64 and 16,384 x 256 in simulation, balanced within 30 s of a mass start "
        "and of a join, takeover within `failover_s` + 2 s, no shard unread longer than 5 s in a rolling deploy, "
        "no lease in doubt (no fault is injected), the lease plane at most 1/10 of the KCL 3.x model's cost, the "
        "busiest partition key under 1/3 of its limits; an idle fleet writes its heartbeats and nothing else.",
        (
            Part(
                "simulation",
                "fleet_sim.py",
                [
                    *("--sizes", "1024x16,4096x64,16384x256", "--window", "60", "--settle", "10"),
                    *("--budget-min", str(FLEET_SIM_BUDGET_MIN)),
                ],
                [
                    *("--sizes", "16x2", "--window", "5", "--settle", "2", "--failover-s", "3"),
                    *("--phase-timeout", "30", "--roll", "2"),
                ],
            ),
        ),
    ),
    Benchmark(
        "bounded",
        "8. A bounded run over a backlog",
        "bounded.py",
        ["--shards", "64", "--records", "20000", "--repeats", "3"],
        ["--shards", "2", "--records", "100"],
        "`efo run --until caught-up` over a backlog on the local stack, wall time from start to exit and "
        "records/s, beside a continuous `efo run` over the same backlog stopped (SIGTERM) the moment its metrics "
        "show it caught up. No goal: what a scheduled job costs against a perfectly watched one.",
    ),
    Benchmark(
        "service",
        "9. The whole service's CPU per record",
        "service_cpu.py",
        ["--sinks", "noop,parquet", "--warmup", "30", "--seconds", "30", "--repeats", "2"],
        [
            *("--shards", "2", "--rate", "400", "--records-per-event", "10", "--sinks", "noop"),
            *("--warmup", "1", "--seconds", "4", "--env", "EFO_BATCH__MAX_WAIT_S=1"),
        ],
        "CPU-seconds per 10,000 records of the whole `efo run` (its Python threads and Spark's JVM), split into "
        "subscription, bridge and Spark, with the arrow no-op sink and the Parquet sink, at 64 shards x 1 KiB "
        "offered at one fixed rate; beside the commit before issue 21 (f8b2ae8, bench/service_cpu.py BASELINE) "
        "measured in the same run. Goal: "
        "with the Parquet sink at most half of the baseline's.",
    ),
    Benchmark(
        "peer",
        "10. The peer, side by side: async-kinesis and efo",
        "peer.py",
        ["--shards", "4", "--records", "20000", "--repeats", "3"],
        ["--shards", "1", "--records", "200", "--repeats", "1"],
        "CPU-seconds per 10,000 records to drain one stream of the local stack with async-kinesis (the Python "
        "library a user would otherwise pick, GetRecords) and with efo's subscription layer (SubscribeToShard), "
        "each in a process of its own. No goal: the comparison a user would make.",
    ),
    Benchmark(
        "source",
        "12. The Spark source beside efo run",
        "spark_source.py",
        ["--shards", "8", "--sinks", "noop,parquet", "--warmup", "20", "--seconds", "30", "--repeats", "2"],
        [
            "--shards",
            "1",
            "--sinks",
            "noop",
            "--repeats",
            "1",
            "--warmup",
            "1",
            "--seconds",
            "3",
            "--latency-rate",
            "0",
        ],
        '`spark.readStream.format("efo")` (a query with the default trigger and maxRecordsPerTrigger 50,000) '
        "and `efo run` (batch.max_records 50,000) reading the same synthetic shards as fast as each takes them, "
        "into Spark's noop format and into Parquet, each in a process of its own with Spark local[2]: rows/s and "
        "CPU-s per 10,000 rows of the whole process tree; then arrival-to-visible latency in a "
        "`processingTime(\"1 second\")` query. Goal: the source's rows/s at least 0.8x efo run's on the same sink.",
    ),
    Benchmark(
        "streams",
        "11. Several streams in one deployment",
        "streams.py",
        [
            "--streams",
            "3",
            "--shards",
            "64",
            "--rate",
            "2000",
            "--sink",
            "parquet",
            "--warmup",
            "20",
            "--seconds",
            "30",
        ],
        [
            *("--streams", "2", "--shards", "2", "--rate", "200", "--records-per-event", "10", "--sink", "noop"),
            *("--warmup", "1", "--seconds", "12"),
        ],
        "One `efo run` reading 3 streams x 64 shards (1 KiB records at one fixed offered rate, the synthetic "
        "server, the Parquet sink) against three deployments of one stream each: ready time, RSS of every process "
        "and its JVM together, CPU-seconds per 10,000 records. No goal: what a team saves by reading its streams "
        "in one deployment.",
    ),
]


def run(benchmark: Benchmark, quick: bool, workdir: Path) -> dict[str, Any]:
    """One benchmark as a child process (then its parts): its markdown, its figures, how long it took."""
    started = time.monotonic()
    result = _run_script(
        benchmark.key, benchmark.title, benchmark.script, benchmark.quick if quick else benchmark.full, workdir
    )
    if "failed" not in result:
        against = workdir / f"{benchmark.key}.json"
        for part in benchmark.parts:
            args = [*(part.quick if quick else part.full), "--against", str(against)]
            done = _run_script(
                f"{benchmark.key}-{part.key}", f"{benchmark.title} ({part.script})", part.script, args, workdir
            )
            if "failed" in done:
                result["figures"][part.key] = {"failed": done["failed"]}
                result["markdown"] += f"\n`{part.script}` failed ({done['failed']}):\n\n```\n{done['tail']}\n```\n"
            else:
                result["figures"][part.key] = done["figures"]
                result["markdown"] += "\n" + done["markdown"].replace(f" --against {against}", "")
    result["seconds"] = time.monotonic() - started
    return result


def _run_script(key: str, title: str, script: str, args: list[str], workdir: Path) -> dict[str, Any]:
    json_path = workdir / f"{key}.json"
    command = [sys.executable, str(BENCH / script), *args, "--json", str(json_path)]
    log = workdir / f"{key}.log"
    started = time.monotonic()
    print(f"bench: {title} ...", file=sys.stderr, flush=True)
    with log.open("w") as stderr:
        completed = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True, check=False)
    seconds = time.monotonic() - started
    print(f"bench: {title}: exit {completed.returncode} after {seconds:.0f} s", file=sys.stderr, flush=True)
    if completed.returncode != 0 or not json_path.exists():  # reported in the document; the others still run
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        print(f"bench: {script} failed (exit {completed.returncode}):\n{tail}", file=sys.stderr)
        return {"failed": f"exit {completed.returncode}", "tail": tail, "seconds": seconds}
    figures = json.loads(json_path.read_text())
    # The command as one would type it, without the --json (and --against) of this run's temporary directory.
    figures["command"] = figures["command"].split(" --json ")[0].split(" --against ")[0]
    markdown = completed.stdout.replace(f" --json {json_path}", "")
    return {"markdown": markdown, "figures": figures, "seconds": seconds}


# ---- the goals -----------------------------------------------------------------------------


@dataclass
class Verdict:
    goal: str
    measured: str
    met: bool
    why: str = ""


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b else float("nan")


def ingest_goals(figures: dict[str, Any]) -> list[Verdict]:
    cells = figures["cells"]
    shards = 64 if any(c["shards"] == 64 for c in cells) else max(c["shards"] for c in cells)

    # Issue 21's goals: 64 shards x 1 KiB, and 256 shards x 10 KiB (the largest run, in a quick one).
    large_shards = 256 if any(c["shards"] == 256 for c in cells) else max(c["shards"] for c in cells)

    def cell(size: int, at: int) -> dict[str, float] | None:
        return next((c["median"] for c in cells if c["shards"] == at and c["record_bytes"] == size), None)

    verdicts = []
    small, large = cell(1024, shards), cell(10240, large_shards)
    if small:
        ratio = _ratio(small["efo"], small["stock"])  # nan when a baseline counted nothing (a starved quick run)
        verdicts.append(
            Verdict(f"ingest {shards} shards x 1 KiB: >= 7x stock aiobotocore", f"{ratio:.2f}x", ratio >= 7)
        )
        share = _ratio(small["efo"], small["parse"])
        verdicts.append(
            Verdict(f"ingest {shards} shards x 1 KiB: >= 70 % of the parse limit", f"{share:.0%}", share >= 0.7)
        )
        if small.get("parse-efo"):
            share = _ratio(small["efo"], small["parse-efo"])
            verdicts.append(
                Verdict(
                    f"ingest {shards} shards x 1 KiB: >= 70 % of the parse limit on efo's framing",
                    f"{share:.0%}",
                    share >= 0.7,
                )
            )
    if large:
        ratio = _ratio(large["efo"], large["stock"])
        verdicts.append(
            Verdict(f"ingest {large_shards} shards x 10 KiB: >= 3x stock aiobotocore", f"{ratio:.2f}x", ratio >= 3)
        )
    return verdicts


def bridge_goals(figures: dict[str, Any]) -> list[Verdict]:
    return [
        Verdict(
            f"bridge overhead, {c['sink']} sink, {c['rows']:,}-row batches: <= 15 %",
            f"{c['overhead']:+.0%} (middle half of the repeats {c['overhead_quartiles'][0]:+.0%} to "
            f"{c['overhead_quartiles'][1]:+.0%})",
            c["overhead"] <= 0.15,
        )
        for c in figures["cases"]
    ]


def service_goals(figures: dict[str, Any]) -> list[Verdict]:
    cases = {(c["sink"], c["variant"]): c["per_10k"] for c in figures["cases"]}
    verdicts = []
    for sink in ("parquet", "noop"):
        if (sink, "this") not in cases:
            continue
        ratio = _ratio(cases[(sink, "this")], cases.get((sink, "baseline")))
        verdicts.append(
            Verdict(
                f"whole service, {sink} sink: CPU-s per 10,000 records"
                + (" <= 1/2 of the baseline commit's" if sink == "parquet" else " (no goal)"),
                f"{cases[(sink, 'this')]:.3f} vs {cases.get((sink, 'baseline'), float('nan')):.3f} ({ratio:.2f}x)",
                ratio <= 0.5 if sink == "parquet" else True,
            )
        )
    return verdicts


def peer_goals(figures: dict[str, Any]) -> list[Verdict]:
    cost = figures["per_10k"]
    return [
        Verdict(
            "peer: CPU-s per 10,000 records, async-kinesis vs efo (no goal)",
            f"{cost['async-kinesis']:.3f} vs {cost['efo']:.3f} ({_ratio(cost['async-kinesis'], cost['efo']):.2f}x)",
            True,
        )
    ]


def source_goals(figures: dict[str, Any]) -> list[Verdict]:
    return [
        Verdict(
            f"Spark source, {c['sink']} sink: rows/s >= 0.8x efo run's",
            f"{c['rows_per_s']:,.0f} rows/s, {c['ratio']:.2f}x; CPU-s per 10k rows {c['per_10k']:.3f}",
            c["ratio"] >= 0.8,
        )
        for c in figures["cases"]
        if c["variant"] == "source"
    ]


def latency_goals(figures: dict[str, Any]) -> list[Verdict]:
    return [
        Verdict(
            f"latency, batch.max_wait_s={s['max_wait_s']:g}: "
            f"p50 <= {s['goal_p50_s']:g} s, p99 <= {s['goal_p99_s']:g} s",
            f"p50 {s['p50_s']:.2f} s, p99 {s['p99_s']:.2f} s, max {s['max_s']:.2f} s",
            s["p50_s"] <= s["goal_p50_s"] and s["p99_s"] <= s["goal_p99_s"],
        )
        for s in figures["settings"]
    ]


def memory_goals(figures: dict[str, Any]) -> list[Verdict]:
    return [
        Verdict(
            f"memory, {c['shards']} shards, {c['pool_mib']} MiB pool: peak RSS within the README's bound",
            f"peak {c['peak'] / 2**20:.0f} MiB of {c['bound'] / 2**20:.0f} MiB, margin {c['margin']:.0%}",
            c["peak"] <= c["bound"],
        )
        for c in figures["cases"]
    ]


def workers_goals(figures: dict[str, Any]) -> list[Verdict]:
    import statistics

    verdicts = []
    first = figures["cases"][0]
    for key, goal_key, what in (
        ("failover_s", "failover_goal_s", "SIGKILL -> every shard read again"),
        ("handoff_s", "handoff_goal_s", "SIGTERM release -> new owner's first event"),
    ):
        if first.get(key):
            median = statistics.median(first[key])
            goal = figures[goal_key]
            verdicts.append(Verdict(f"{what}: <= {goal:g} s", f"{median:.2f} s (median)", median <= goal))
    for case in figures["cases"]:
        ratio = case["write_ratio"]
        verdicts.append(
            Verdict(
                f"DynamoDB writes, {case['shards']} shards, 2 workers: <= 1/3 of the KCL model's",
                f"{ratio:.2f} ({case['efo']['writes']:,.0f} vs {case['kcl']['writes']:,.0f} a minute)",
                ratio <= 1 / 3,
            )
        )
    return verdicts


def _fleet_case(cases: list[dict[str, Any]], shards: int, workers: int) -> tuple[dict[str, Any], str]:
    """The case of that size, or (a quick run) the largest one run, named as it is."""
    case = next((c for c in cases if (c["shards"], c["workers"]) == (shards, workers)), None)
    if case is None:
        case = max(cases, key=lambda c: (c["shards"], c["workers"]))
    return case, f"{case['shards']:,} x {case['workers']}"


def _within(goal: str, case: dict[str, Any], phase: str, key: str, limit_s: float) -> Verdict:
    """A fleet phase's seconds against a limit; None (never reached) is not met."""
    seconds = (case.get(phase) or {}).get(key)
    measured = "not reached" if seconds is None else f"{seconds:.1f} s"
    return Verdict(goal, measured, seconds is not None and seconds <= limit_s)


def fleet_goals(figures: dict[str, Any]) -> list[Verdict]:
    cases = figures["cases"]
    verdicts = []
    case, size = _fleet_case(cases, 1024, 16)
    windows = [case[mode] for mode in ("idle", "busy") if case.get(mode, {}).get("lease_plane")]
    if windows:
        worst_2x = max(w["ratio_2x"] for w in windows)
        worst_3x = max(w["ratio_3x"] for w in windows)
        cost = max(w["lease_plane"]["cost_per_s"] for w in windows)
        verdicts.append(
            Verdict(
                f"fleet {size}: lease-plane cost <= 1/10 of the KCL 2.x model's (write = 5 reads)",
                f"{worst_2x:.3f} ({cost:,.1f} vs {windows[0]['models']['2.x']['cost_per_s']:,.1f} read units/s)",
                worst_2x <= 0.1,
            )
        )
        verdicts.append(
            Verdict(
                f"fleet {size}: lease-plane cost below the KCL 3.x model's",
                f"{worst_3x:.3f} ({cost:,.1f} vs {windows[0]['models']['3.x']['cost_per_s']:,.1f} read units/s)",
                worst_3x < 1,
            )
        )
    else:
        verdicts.append(Verdict(f"fleet {size}: lease-plane cost against the KCL models", "not measured", False))
    case = next((c for c in cases if (c["shards"], c["workers"]) == (4096, 64)), None)
    if case is not None:  # run against DynamoDB Local only when asked for (the simulation runs this size)
        verdicts += _local_scale_goals(case, figures["failover_s"])
    case, size = _fleet_case(cases, 1024, 16)
    goal = f"fleet {size}: every worker ready (service.ready) within 30 s of starting next to the free shards"
    verdicts.append(_within(goal, case, "start", "ready_s", 30))
    for case in cases:
        idle = case.get("idle")
        if not idle:
            continue
        other = idle["write_requests_per_min"] - idle["heartbeats_per_min"]
        verdicts.append(
            Verdict(
                f"fleet {case['shards']:,} x {case['workers']} idle: writes = heartbeats only",
                f"{idle['write_requests_per_min']:,.0f} writes/min, {idle['heartbeats_per_min']:,.0f} heartbeats/min",
                abs(other) < 0.5,
            )
        )
    for case in cases:
        if not case["kept_up"]:
            verdicts.append(
                Verdict(
                    f"fleet {case['shards']:,} x {case['workers']}: the local stack kept up",
                    case["why"][:300],
                    False,
                )
            )
    if "simulation" in figures:
        verdicts += fleet_simulation_goals(figures["simulation"])
    return verdicts


def _local_scale_goals(case: dict[str, Any], failover_s: float) -> list[Verdict]:
    """4,096 x 64 against DynamoDB Local: busiest key, balance, takeover."""
    verdicts = []
    size = f"{case['shards']:,} x {case['workers']}"
    busy = case.get("busy") or {}
    busiest = busy.get("busiest", {})
    if busiest:
        reads = busiest.get("read_units", {}).get("read_units_per_s", 0.0)
        writes = busiest.get("write_units", {}).get("write_units_per_s", 0.0)
        measured = f"{reads:,.1f} read, {writes:,.1f} write units/s"
        if not case["kept_up"]:  # at the rate the fleet reached, not the rate of S busy shards: no measure
            needed = case["shards"] / CHECKPOINT_INTERVAL_S
            measured += f" at {busy['checkpoints_per_s']:,.1f} checkpoints/s of {needed:,.0f} (did not keep up)"
        verdicts.append(
            Verdict(
                f"fleet {size} busy: busiest partition key under 1/3 of 3,000 read / 1,000 write units/s",
                measured,
                case["kept_up"] and reads < 1000 and writes < 1000 / 3,
            )
        )
    else:
        verdicts.append(Verdict(f"fleet {size} busy: busiest partition key", "not measured", False))
    verdicts.append(_within(f"fleet {size}: balanced within 30 s of the start", case, "start", "balanced_s", 30))
    limit_s = failover_s + 2
    goal = f"fleet {size}: takeover within failover_s + 2 = {limit_s:g} s"
    verdicts.append(_within(goal, case, "takeover", "takeover_s", limit_s))
    return verdicts


def fleet_simulation_goals(sim: dict[str, Any]) -> list[Verdict]:
    """bench/fleet_sim.py's figures against issue 37's goals, at 4,096 x 64 and 16,384 x 256 (a quick
    run: its largest size). A size asked for that did not run, or a phase it did not finish, is not
    measured, never met."""
    if "failed" in sim:
        return [Verdict("fleet in simulation", f"bench/fleet_sim.py failed ({sim['failed']})", False)]
    cases = {(c["shards"], c["workers"]): c for c in sim["cases"]}
    asked = [(s, w) for s, w in sim["sizes"]]
    sizes = [size for size in FLEET_SIM_GOAL_SIZES if size in asked] or [max(asked)]
    verdicts = []
    for size in sizes:
        verdicts += _simulated_size_goals(cases.get(size) or {"phases": {}, "why": "not run"}, size, sim["failover_s"])
    verdicts += _against_local(sim.get("against_local"))
    return verdicts


def _simulated_size_goals(case: dict[str, Any], size: tuple[int, int], failover_s: float) -> list[Verdict]:
    name = f"fleet {size[0]:,} x {size[1]} in simulation"
    phases = case["phases"]
    missing = f"not measured ({case.get('why') or 'not finished'})"

    def seconds(goal: str, phase: str, key: str, limit_s: float) -> Verdict:
        if phase not in phases:
            return Verdict(goal, missing, False)
        value = phases[phase].get(key)
        return Verdict(
            goal, "not reached" if value is None else f"{value:.1f} s", value is not None and value <= limit_s
        )

    limit_s = failover_s + 2
    verdicts = [
        seconds(f"{name}: balanced within 30 s of a mass start", "start", "balanced_s", 30),
        seconds(f"{name}: balanced within 30 s of a join", "join", "balanced_s", 30),
        seconds(f"{name}: takeover within failover_s + 2 = {limit_s:g} s", "takeover", "takeover_s", limit_s),
    ]
    goal = f"{name}: a rolling deploy leaves no shard unread longer than 5 s"
    roll = phases.get("rolling")
    if roll is None:
        verdicts.append(Verdict(goal, missing, False))
    else:
        unread, whole = roll["longest_unread_s"], roll["replaced"] == roll["of"] and not roll.get("partial")
        measured = f"{unread:.1f} s ({roll['replaced']} of {roll['of']} workers replaced"
        measured += f" when {case.get('why') or 'cut short'})" if roll.get("partial") else ")"
        verdicts.append(Verdict(goal, measured, unread <= 5 and whole))
    goal = f"{name}: no lease in doubt (no fault injected)"
    done = [phase for phase in PHASES if phase in phases and not phases[phase].get("partial")]  # run to their end
    doubts = {phase: phases[phase]["in_doubt"] for phase in done}
    measured = ", ".join(f"{phase} {n}" for phase, n in doubts.items())
    if not done:
        verdicts.append(Verdict(goal, missing, False))
    elif len(done) < len(PHASES):
        verdicts.append(Verdict(goal, f"{measured}; the rest {missing}", False))
    else:
        verdicts.append(Verdict(goal, measured, not any(doubts.values())))
    windows = [phases.get(mode) for mode in ("busy", "idle")]
    if not all(windows):
        verdicts += [
            Verdict(f"{name}: lease-plane cost <= 1/10 of the KCL 3.x model's", missing, False),
            Verdict(f"{name}: busiest partition key under 1/3 of 3,000 read / 1,000 write units/s", missing, False),
            Verdict(f"{name} idle: writes = heartbeats only", missing, False),
        ]
    else:
        busy, idle = windows[0] or {}, windows[1] or {}
        worst = max(busy["ratio_3x"], idle["ratio_3x"])
        cost = max(busy["cost_per_s"], idle["cost_per_s"])
        model = busy["models"]["3.x"]["cost_per_s"]
        measured = f"{worst:.3f} ({cost:,.1f} vs {model:,.1f} read units/s)"
        # The windows come before any worker's first safety-net read: judged by the formula at steady
        # state (production's row sizes) as well, whichever is higher.
        steady = [w["ratio_3x_steady"] for w in (busy, idle) if "ratio_3x_steady" in w]
        if steady:
            at_steady = max(busy["steady_state"]["cost_per_s"], idle["steady_state"]["cost_per_s"])
            measured += f"; at steady state by the formula {max(steady):.3f} ({at_steady:,.1f})"
            worst = max(worst, *steady)
        verdicts.append(
            Verdict(
                f"{name}: lease-plane cost <= 1/10 of the KCL 3.x model's (write = 5 reads)", measured, worst <= 0.1
            )
        )
        reads = max(busy["busiest_key_read_units_per_s"], idle["busiest_key_read_units_per_s"])
        writes = max(busy["busiest_key_write_units_per_s"], idle["busiest_key_write_units_per_s"])
        verdicts.append(
            Verdict(
                f"{name}: busiest partition key under 1/3 of 3,000 read / 1,000 write units/s",
                f"{reads:,.1f} read, {writes:,.1f} write units/s",
                reads < 1000 and writes < 1000 / 3,
            )
        )
        verdicts.append(
            Verdict(
                f"{name} idle: writes = heartbeats only",
                f"{idle['other_writes_per_min']:,.0f} other writes/min, "
                f"{idle['heartbeats_per_min']:,.0f} heartbeats/min",
                idle["other_writes_per_min"] == 0,
            )
        )
    if case.get("violation"):
        verdicts.append(Verdict(f"{name}: every invariant held", f"'{case['invariant']}' violated", False))
    return verdicts


def _against_local(compared: dict[str, Any] | None) -> list[Verdict]:
    """The simulation's lease-plane requests and units within 10 % of DynamoDB Local's, busy and idle."""
    if compared is None:
        return [
            Verdict(
                "fleet: the simulation counts DynamoDB Local's requests and units within 10 %",
                "not measured (no size run by both)",
                False,
            )
        ]
    verdicts = []
    size = f"{compared['shards']:,} x {compared['workers']}"
    for mode in ("busy", "idle"):
        goal = f"fleet {size} {mode}: the simulation's lease-plane requests and units within 10 % of DynamoDB Local's"
        row = compared["windows"].get(mode)
        if row is None:
            verdicts.append(Verdict(goal, "not measured", False))
            continue
        ratios = row["ratios"]
        measured = (
            f"requests {ratios['requests_per_min']:.3f}, read units {ratios['read_units_per_s']:.3f}, "
            f"write units {ratios['write_units_per_s']:.3f} (simulation / DynamoDB Local)"
        )
        kept_up = row.get("local_kept_up") is not False
        if not kept_up:  # a fleet running late is no measure of what the simulation counts
            measured += "; DynamoDB Local did not keep up"
        verdicts.append(Verdict(goal, measured, kept_up and all(abs(r - 1) <= 0.1 for r in ratios.values())))
    return verdicts


GOALS: dict[str, Callable[[dict[str, Any]], list[Verdict]]] = {
    "ingest": ingest_goals,
    "bridge": bridge_goals,
    "service": service_goals,
    "peer": peer_goals,
    "latency": latency_goals,
    "memory": memory_goals,
    "workers": workers_goals,
    "fleet": fleet_goals,
    "bounded": lambda figures: [],  # measured beside its baseline, no goal (issue 22)
    "streams": lambda figures: [],  # one deployment against several, no goal (issue 20)
    "source": source_goals,
}


# ---- the document --------------------------------------------------------------------------


def machine() -> str:
    memory_kib = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:")
    )
    try:
        from importlib.metadata import version

        spark = version("pyspark")
    except Exception:
        spark = "not installed"
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr.splitlines()
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), {memory_kib / 2**20:.0f} GiB memory, "
        f"Python {platform.python_version()}, PySpark {spark}, {java[0] if java else 'no java'}; "
        f"load average at the start {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
    )


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return head + (" (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def document(
    chosen: list[Benchmark], quick: bool, command: str, header: str, results: dict[str, Any], seconds: float
) -> str:
    verdicts = [
        v
        for b in chosen
        for v in (
            [Verdict(b.title, f"the benchmark failed ({results[b.key]['failed']})", False)]
            if "failed" in results[b.key]
            else GOALS[b.key](results[b.key]["figures"])
        )
    ]
    lines = [
        "# Benchmarks",
        "",
        f"Written by `{command}` ({'quick: tiny sizes, the figures mean nothing' if quick else 'a full run'}) "
        f"in {seconds / 60:.1f} minutes.",
        "",
        header,
        "",
        "This machine is shared with other work and noisy: every figure below comes with its baseline measured in "
        "the same run, as a ratio, and is a median of several runs where the table says so. Each section names "
        "the command that produced it; run it alone to repeat one benchmark.",
        "",
        "## Goals",
        "",
        "| goal | measured | met |",
        "|---|---|---|",
        *(f"| {v.goal} | {v.measured} | {'yes' if v.met else '**no**'} |" for v in verdicts),
        "",
    ]
    for b in chosen:
        result = results[b.key]
        body = (
            result.get("markdown", "").strip() or f"Failed ({result.get('failed')}):\n\n```\n{result.get('tail')}\n```"
        )
        lines += [f"## {b.title}", "", f"{b.about} ({result['seconds'] / 60:.1f} minutes in this run.)", "", body, ""]
    if not quick:
        lines += chaos_section(ROOT / "docs" / "chaos.md")
    return "\n".join(lines) + "\n"


def chaos_section(path: Path) -> list[str]:
    """The last ``make chaos`` run's table and legend, as that run wrote them (not re-run here)."""
    if not path.exists():
        return ["## Chaos", "", "No `make chaos` run has written docs/chaos.md yet.", ""]
    text = path.read_text().strip().splitlines()
    body = [line.replace("## ", "### ", 1) if line.startswith("## ") else line for line in text[1:]]
    return ["## Chaos (the last `make chaos` run, from docs/chaos.md)", *body, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, several at once: checks the chain works")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--only", default=None, help="comma-separated keys: " + ",".join(b.key for b in BENCHMARKS))
    args = parser.parse_args()
    chosen = [b for b in BENCHMARKS if args.only is None or b.key in args.only.split(",")]
    command = (
        "python bench/run_all.py" + (" --quick" if args.quick else "") + (f" --only {args.only}" if args.only else "")
    )
    header = f"- date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}\n- machine: {machine()}\n- commit: {commit()}"
    workdir = Path(tempfile.mkdtemp(prefix="efo-bench-"))
    started = time.monotonic()
    if args.quick:  # the figures mean nothing: save the time
        with ThreadPoolExecutor(len(chosen)) as pool:
            futures = {b.key: pool.submit(run, b, True, workdir) for b in chosen}
            results = {key: future.result() for key, future in futures.items()}
    else:
        results = {b.key: run(b, False, workdir) for b in chosen}
    text = document(chosen, args.quick, command, header, results, time.monotonic() - started)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    failed = [b.script for b in chosen if "failed" in results[b.key]]
    print(f"bench: wrote {out} ({len(chosen)} benchmarks, {(time.monotonic() - started) / 60:.1f} minutes)")
    if failed:
        raise SystemExit(f"bench: failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
