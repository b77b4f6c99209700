"""What the whole ``efo run`` spends per record: CPU-seconds per 10,000 records, Python and JVM together.

The real ``efo run`` (leases in the local DynamoDB) reads ``--shards`` shards of ``--record-size``
records from the synthetic SubscribeToShard server, paced so that all shards together send
``--rate`` records/s (the same offered load for every run), into each ``--sinks``:

* ``noop``: the Spark-free ``arrow:sinks:discard`` (the batch as a ``pyarrow.Table``, dropped): no JVM;
* ``parquet``: the Parquet sink through the embedded Spark session (``local[2]``).

Each run is made twice, interleaved (alternating which goes first): with efo of this tree and with
efo of the baseline commit (``--baseline``, extracted with ``git archive`` into a temporary
directory at run time), so the baseline is measured in the same run on the same machine.

The CPU time comes from ``/proc``: per thread of the efo process (bench/named_threads.py gives
each thread its Python name in the kernel) and the whole of its child processes (Spark's JVM).
Split as:

* subscription: the service thread (``efo-service``: the asyncio loop with every subscription,
  decoding, the pool, leases and checkpoints);
* bridge: the driver's threads (``MainThread``: the driver loop, ``createDataFrame``'s Python
  side and the sink call; ``efo-arrow_0``: taking batches and building their Arrow tables);
* other: every other thread of the process (the watchdog, py4j, aiohttp's resolver, exited ones);
* Spark: the JVM (and any other child process).

The window starts at the first batch committed ``--warmup`` seconds after ``service.ready`` and
ends at the last batch committed within ``--seconds`` after that; its records are those of the
batches committed in it, and its CPU time is interpolated at the two commits' log timestamps from
samples taken every 0.25 s.

    python bench/service_cpu.py [--shards 64] [--record-size 1024] [--rate 6400] [--sinks noop,parquet]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

from common import (
    BENCH,
    ROOT,
    EfoProcess,
    at,
    command_line,
    efo_env,
    hermetic_aws_environment,
    start_dynamodb,
    start_synthetic_server,
    write_json,
)
from synthetic_server import consumer_arn, stream_name

ROLES = ("subscription", "bridge", "other", "spark")
#: The JVM's threads by what they do (Java names its threads in the kernel), for the Spark column's detail.
JVM_PARTS = ("jit", "gc", "tasks", "jvm other")
TICKS = os.sysconf("SC_CLK_TCK")
#: The commit before issue 21: the main commit the issue's branch sits on (f8b2ae8, "run_all: the
#: busiest-key goal of a fleet size that did not keep up is not met"), pinned rather than computed
#: (``git merge-base HEAD main`` would be HEAD itself once the branch is merged). Rebasing the branch
#: onto a newer main means moving this pin to that main commit (tests/unit/test_service_cpu.py checks it).
BASELINE = "f8b2ae8"


def _stat_cpu(path: Path) -> float:
    """utime + stime of a /proc stat file, in seconds (0 if it is gone)."""
    try:
        text = path.read_text()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid``."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _role(name: str) -> str:
    if name == "efo-service":
        return "subscription"
    if name == "MainThread" or name.startswith("efo-arrow"):
        return "bridge"
    return "other"


def sample_cpu(pid: int) -> dict[str, float]:
    """CPU-seconds so far, by role, of the efo process ``pid`` and its children."""
    cpu = dict.fromkeys(ROLES, 0.0)
    named = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        seconds = _stat_cpu(task / "stat")
        role = _role(name)
        if role != "other":
            cpu[role] += seconds
            named += seconds
    cpu["other"] = _stat_cpu(Path(f"/proc/{pid}/stat")) - named  # the process' total counts exited threads too
    for part in JVM_PARTS:
        cpu[part] = 0.0
    for child in _children(pid):
        cpu["spark"] += _stat_cpu(Path(f"/proc/{child}/stat"))
        try:
            tasks = list(Path(f"/proc/{child}/task").iterdir())
        except OSError:  # exited meanwhile
            continue
        for task in tasks:
            try:
                name = (task / "comm").read_text().strip()
            except OSError:
                continue
            seconds = _stat_cpu(task / "stat")
            cpu[_jvm_part(name)] += seconds
            group = "jvm:" + name.rstrip("0123456789#-").strip()
            cpu[group] = cpu.get(group, 0.0) + seconds
    return cpu


def _jvm_part(name: str) -> str:
    if name.startswith(("C1 Compiler", "C2 Compiler")):
        return "jit"
    if name.startswith(("GC Thread", "G1 ", "VM Thread", "GC ")) or "Conc" in name:
        return "gc"
    if name.startswith("Executor task"):
        return "tasks"
    return "jvm other"


@dataclass
class Result:
    records: int
    seconds: float
    cpu: dict[str, float]
    batches: int
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list, repr=False)

    @property
    def total(self) -> float:
        return sum(self.cpu[role] for role in ROLES)

    def per_10k(self, role: str | None = None) -> float:
        return (self.total if role is None else self.cpu[role]) / self.records * 10_000


def _interpolate(samples: list[tuple[float, dict[str, float]]], t: float) -> dict[str, float]:
    """CPU-seconds at ``t``, linear between the two samples around it."""
    times = [s[0] for s in samples]
    i = bisect_left(times, t)
    if i <= 0:
        return samples[0][1]
    if i >= len(samples):
        return samples[-1][1]
    (t0, a), (t1, b) = samples[i - 1], samples[i]
    w = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
    return {k: a.get(k, 0.0) + (b[k] - a.get(k, 0.0)) * w for k in b}


def run_once(
    args: argparse.Namespace, tree: Path, sink: str, kinesis: str, dynamodb: str, workdir: Path, name: str
) -> Result:
    per_second = args.rate / (args.shards * args.records_per_event)
    app = f"cpu-{name}-{uuid.uuid4().hex[:6]}"
    env = efo_env(
        EFO_STREAM=stream_name(args.shards),
        EFO_APP=app,
        EFO_SINK="arrow:sinks:discard" if sink == "noop" else f"parquet:{workdir / (name + '-parquet')}",
        EFO_REGION="us-east-1",
        EFO_KINESIS_ENDPOINT=kinesis,
        EFO_DYNAMODB_ENDPOINT=dynamodb,
        EFO_INITIAL_POSITION="LATEST",
        EFO_CONSUMER_ARN=consumer_arn(args.record_size, args.records_per_event, per_second=round(per_second, 4)),
    )
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH), str(tree)])  # efo of that tree, the bench's sinks
    env.update(item.split("=", 1) for item in args.env)
    log_path = workdir / f"{name}.log"
    process = EfoProcess(env, log_path, cwd=workdir, module="named_threads")
    samples: list[tuple[float, dict[str, float]]] = []
    profiler: subprocess.Popen[bytes] | None = None
    try:
        ready = at(process.wait_for("service.ready", timeout_s=180))
        text = log_path.read_text(errors="replace")
        if f"efo from {tree}" not in text:
            raise RuntimeError(f"efo run did not import efo from {tree}; see {log_path}")
        deadline = time.monotonic() + args.warmup + args.seconds + 60
        window_end: float | None = None
        while time.monotonic() < deadline:
            now = time.time()
            samples.append((now, sample_cpu(process.pid)))
            if process.process.poll() is not None:
                raise RuntimeError(f"efo run exited {process.process.returncode}; see {log_path}")
            if window_end is None:
                started = [at(e) for e in process.events("batch.committed") if at(e) >= ready + args.warmup]
                if started:
                    window_end = started[0] + args.seconds
                    if args.py_spy:
                        profiler = _py_spy(process.pid, args.seconds, workdir / f"{name}.py-spy.txt")
            elif now > window_end + 1.0:
                break
            time.sleep(0.25)
        commits = [(at(e), int(e["records"])) for e in process.events("batch.committed")]
    finally:
        if profiler is not None:
            profiler.wait()
            print(f"    py-spy profile: {workdir / (name + '.py-spy.txt')}", file=sys.stderr, flush=True)
        process.stop()
    if window_end is None:
        raise RuntimeError(f"no batch committed within the run; see {log_path}")
    inside = [(t, n) for t, n in commits if ready + args.warmup <= t <= window_end]
    if len(inside) < 2:
        raise RuntimeError(f"fewer than two batches committed in the window; see {log_path}")
    (t0, _), (t1, _) = inside[0], inside[-1]
    records = sum(n for _, n in inside[1:])
    a, b = _interpolate(samples, t0), _interpolate(samples, t1)
    return Result(records, t1 - t0, {k: b.get(k, 0.0) - a.get(k, 0.0) for k in b}, len(inside) - 1, samples)


def _py_spy(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` (every thread, GIL holders or not, idle excluded) into collapsed stacks."""
    command = [
        str(Path(sys.executable).parent / "py-spy"),
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(int(seconds)),
    ]
    command += ["--format", "raw", "--threads", "--rate", "200", "--output", str(out), "--nonblocking"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def baseline_tree(commit: str, into: Path) -> Path:
    """efo and sparkbridge of ``commit``, extracted (no git worktree left behind)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "efo", "sparkbridge"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def tree_state(root: Path = ROOT) -> tuple[str, bool]:
    """This tree's commit (short) and whether it has uncommitted changes to tracked files."""
    commit = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    status = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return commit, bool(status.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--records-per-event", type=int, default=100)
    parser.add_argument("--rate", type=float, default=6400, help="records/s offered, all shards together")
    parser.add_argument("--sinks", default="noop,parquet", help="noop and/or parquet")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds after service.ready before the window")
    parser.add_argument("--seconds", type=float, default=30.0, help="the measured window")
    parser.add_argument("--repeats", type=int, default=1, help="runs per variant and sink; medians")
    parser.add_argument("--baseline", default=BASELINE, help="the commit measured beside this tree")
    parser.add_argument(
        "--env", action="append", default=[], help="KEY=VALUE added to the environment of every efo run (repeatable)"
    )
    parser.add_argument(
        "--py-spy", action="store_true", help="profile each run's window with py-spy (collapsed stacks)"
    )
    parser.add_argument("--json", default=None, help="write the figures here (for bench/run_all.py)")
    args = parser.parse_args()
    sinks = [s for s in args.sinks.split(",") if s]

    this_commit, dirty = tree_state()
    this_label = f"this tree ({this_commit}{', with uncommitted changes' if dirty else ''})"

    hermetic_aws_environment()
    workdir = Path(tempfile.mkdtemp(prefix="efo-bench-cpu-"))
    trees = {"baseline": baseline_tree(args.baseline, workdir / "baseline"), "this": ROOT}
    server, kinesis = start_synthetic_server(None)
    dynamodb_process, dynamodb = start_dynamodb(workdir)
    results: dict[tuple[str, str], list[Result]] = {}
    began = time.perf_counter()
    try:
        for repeat in range(args.repeats):
            for s, sink in enumerate(sinks):
                order = ("baseline", "this") if (repeat + s) % 2 == 0 else ("this", "baseline")
                for variant in order:
                    name = f"{sink}-{variant}-{repeat}"
                    result = run_once(args, trees[variant], sink, kinesis, dynamodb, workdir, name)
                    results.setdefault((sink, variant), []).append(result)
                    print(
                        f"  {sink:8} {variant:8} {result.records:>8,} records in {result.seconds:5.1f} s: "
                        f"{result.per_10k():.3f} CPU-s/10k "
                        + " ".join(f"{r} {result.per_10k(r):.3f}" for r in (*ROLES, *JVM_PARTS)),
                        file=sys.stderr,
                        flush=True,
                    )
                    threads = sorted(
                        ((k, v) for k, v in result.cpu.items() if k.startswith("jvm:")), key=lambda kv: -kv[1]
                    )
                    if threads:
                        print(
                            "    JVM threads, CPU-s/10k: "
                            + ", ".join(f"{k[4:]} {v / result.records * 10_000:.3f}" for k, v in threads[:10]),
                            file=sys.stderr,
                            flush=True,
                        )
    finally:
        server.kill()
        server.wait()
        dynamodb_process.kill()
        dynamodb_process.wait()
    elapsed = time.perf_counter() - began

    def median(sink: str, variant: str, role: str | None = None) -> float:
        return statistics.median(r.per_10k(role) for r in results[(sink, variant)])

    print(f"command: `{command_line()}`\n")
    print(
        f"`efo run`, {args.shards} shards of {args.record_size} B records ({args.records_per_event} an event) from the "
        f"synthetic server paced at {args.rate:,.0f} records/s in all; baseline: efo at commit {args.baseline}, "
        f"beside {this_label}, "
        f"measured in the same run, interleaved; {args.warmup:g} s warm-up, then a window of about "
        f"{args.seconds:g} s between two batch commits; median of {args.repeats} run(s); {elapsed:.0f} s in all\n"
    )
    print(
        "| sink | efo | records | CPU-s / 10k records | subscription | bridge | other Python | Spark (JVM) "
        "| records/s per core | vs baseline |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    cases = []
    for sink in sinks:
        for variant in ("baseline", "this"):
            total = median(sink, variant)
            ratio = total / median(sink, "baseline")
            label = f"{args.baseline} (baseline)" if variant == "baseline" else this_label
            records = statistics.median(r.records for r in results[(sink, variant)])
            print(
                f"| {sink} | {label} | {records:,.0f} | {total:.3f} | "
                + " | ".join(f"{median(sink, variant, r):.3f}" for r in ROLES)
                + f" | {10_000 / total:,.0f} | {ratio:.2f} |"
            )
            cases.append(
                {
                    "sink": sink,
                    "variant": variant,
                    "per_10k": total,
                    "by_role": {r: median(sink, variant, r) for r in ROLES},
                    "runs": [
                        {"records": r.records, "seconds": r.seconds, "cpu": r.cpu} for r in results[(sink, variant)]
                    ],
                }
            )
    write_json(
        args.json,
        {"cases": cases, "baseline": args.baseline, "this": this_commit, "dirty": dirty, "rate": args.rate},
    )
    shutil.rmtree(workdir / "baseline", ignore_errors=True)


if __name__ == "__main__":
    main()
