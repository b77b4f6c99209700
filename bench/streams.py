"""Several streams in one deployment against one deployment per stream: memory, CPU and ready time.

``--streams`` streams of ``--shards`` shards each, served by the synthetic SubscribeToShard server
(each stream paced at ``--rate`` records/s of ``--record-size`` bytes, the same offered load in both
layouts), leases in the local DynamoDB, read into ``--sink`` (``parquet``: the Parquet sink through
Spark's embedded JVM, ``local[2]``; ``noop``: the Spark-free ``arrow:sinks:discard``):

* **one**: one ``efo run`` reading every stream (``streams:`` in a YAML file, a consumer per stream);
* **separate**: one ``efo run`` per stream, each with its own JVM, all started at once.

Measured per layout, all processes together (Python and the JVM each one starts):

* ready: from the start of the processes until the last one logged ``service.ready``;
* RSS: resident memory of every process and its children, summed, sampled every 0.5 s over the
  window (peak and mean);
* CPU: CPU-seconds (user + system, from /proc) per 10,000 records committed in the window, and the
  records/s committed.

The window starts ``--warmup`` seconds after the last ``service.ready`` and lasts ``--seconds``.
The layouts alternate which goes first across ``--repeats``; medians.

    python bench/streams.py [--streams 3] [--shards 64] [--rate 2000] [--sink parquet]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from common import (
    EfoProcess,
    at,
    command_line,
    efo_env,
    hermetic_aws_environment,
    rss_bytes,
    start_dynamodb,
    start_synthetic_server,
    write_json,
)
from service_cpu import _children, _stat_cpu
from synthetic_server import consumer_arn, stream_name

LAYOUTS = ("one", "separate")
TAGS = "abcdefghijklmnopqrstuvwxyz"


def tree_cpu_s(pid: int) -> float:
    """CPU-seconds so far of ``pid`` (its exited threads included) and of every descendant."""
    return _stat_cpu(Path(f"/proc/{pid}/stat")) + sum(_stat_cpu(Path(f"/proc/{c}/stat")) for c in _children(pid))


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and every descendant (one that exits meanwhile counts 0)."""

    def rss(one: int) -> int:
        try:
            return rss_bytes(one)
        except OSError:
            return 0

    return rss(pid) + sum(rss(child) for child in _children(pid))


def start_layout(args: argparse.Namespace, layout: str, kinesis: str, dynamodb: str, workdir: Path) -> list[EfoProcess]:
    per_second = round(args.rate / (args.shards * args.records_per_event), 4)
    shape = consumer_arn(args.record_size, args.records_per_event, per_second=per_second)
    names = [stream_name(args.shards, TAGS[i]) for i in range(args.streams)]
    # A consumer belongs to one stream: each its own ARN, of the same shape (the server reads the shape).
    streams = [{"stream": name, "consumer_arn": shape.replace("stream/bench/", f"stream/{name}/")} for name in names]
    run = uuid.uuid4().hex[:6]
    common = {
        "EFO_REGION": "us-east-1",
        "EFO_KINESIS_ENDPOINT": kinesis,
        "EFO_DYNAMODB_ENDPOINT": dynamodb,
        "EFO_INITIAL_POSITION": "LATEST",
        "EFO_SPARK__MASTER": "local[2]",
    }

    def sink(name: str) -> str:
        return "arrow:sinks:discard" if args.sink == "noop" else f"parquet:{workdir / (name + '-parquet')}"

    if layout == "one":
        config = workdir / f"one-{run}.yaml"
        config.write_text(yaml.safe_dump({"streams": streams}))
        env = efo_env(EFO_APP=f"one-{run}", EFO_SINK=sink(f"one-{run}"), **common)
        return [EfoProcess(env, workdir / f"one-{run}.log", cwd=workdir, args=("--config", str(config)))]
    processes = []
    for i, entry in enumerate(streams):
        name = f"separate-{run}-{i}"
        env = efo_env(
            EFO_APP=name,
            EFO_SINK=sink(name),
            EFO_STREAM=entry["stream"],
            EFO_CONSUMER_ARN=entry["consumer_arn"],
            **common,
        )
        processes.append(EfoProcess(env, workdir / f"{name}.log", cwd=workdir))
    return processes


def measure(args: argparse.Namespace, layout: str, kinesis: str, dynamodb: str, workdir: Path) -> dict[str, Any]:
    started = time.time()
    processes = start_layout(args, layout, kinesis, dynamodb, workdir)
    try:
        ready = max(at(process.wait_for("service.ready", timeout_s=240)) for process in processes)
        time.sleep(max(0.0, ready + args.warmup - time.time()))
        window_start = time.time()
        cpu_start = sum(tree_cpu_s(p.pid) for p in processes)
        rss: list[int] = []
        while time.time() < window_start + args.seconds:
            for process in processes:
                if process.process.poll() is not None:
                    raise RuntimeError(f"efo run exited {process.process.returncode}; see {process.log_path}")
            rss.append(sum(tree_rss_bytes(p.pid) for p in processes))
            time.sleep(0.5)
        window_end = time.time()
        cpu_s = sum(tree_cpu_s(p.pid) for p in processes) - cpu_start
        records = sum(
            int(event["records"])
            for process in processes
            for event in process.events("batch.committed")
            if window_start <= at(event) <= window_end
        )
    finally:
        for process in processes:
            process.stop()
    if records == 0:
        raise RuntimeError(f"nothing committed in the window of layout {layout}; see {workdir}")
    return {
        "processes": len(processes),
        "ready_s": ready - started,
        "rss_peak_mib": max(rss) / 2**20,
        "rss_mean_mib": statistics.fmean(rss) / 2**20,
        "cpu_s": cpu_s,
        "records": records,
        "records_per_s": records / (window_end - window_start),
        "cpu_per_10k": cpu_s / records * 10_000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--shards", type=int, default=64, help="shards per stream")
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--records-per-event", type=int, default=20)
    parser.add_argument(
        "--rate", type=float, default=2000, help="records/s offered per stream, all its shards together"
    )
    parser.add_argument("--sink", choices=("parquet", "noop"), default="parquet")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds after the last service.ready")
    parser.add_argument("--seconds", type=float, default=30.0, help="the measured window")
    parser.add_argument("--repeats", type=int, default=1, help="runs per layout, alternating which goes first")
    parser.add_argument("--json", default=None, help="write the figures here (for bench/run_all.py)")
    args = parser.parse_args()
    if not 1 <= args.streams <= len(TAGS):
        parser.error(f"--streams must be 1..{len(TAGS)}")

    hermetic_aws_environment()
    workdir = Path(tempfile.mkdtemp(prefix="efo-bench-streams-"))
    server, kinesis = start_synthetic_server(None)
    dynamodb_process, dynamodb = start_dynamodb(workdir)
    results: dict[str, list[dict[str, Any]]] = {layout: [] for layout in LAYOUTS}
    began = time.perf_counter()
    try:
        for repeat in range(args.repeats):
            for layout in LAYOUTS if repeat % 2 == 0 else LAYOUTS[::-1]:
                result = measure(args, layout, kinesis, dynamodb, workdir)
                results[layout].append(result)
                print(
                    f"  {layout:9} ready {result['ready_s']:.1f} s, RSS peak {result['rss_peak_mib']:,.0f} MiB, "
                    f"{result['cpu_per_10k']:.3f} CPU-s/10k, {result['records_per_s']:,.0f} records/s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        dynamodb_process.kill()
        server.kill()
    elapsed = time.perf_counter() - began

    def median(layout: str, key: str) -> float:
        return statistics.median(r[key] for r in results[layout])

    print(f"command: `{command_line()}`\n")
    print(
        f"{args.streams} streams of {args.shards} shards, each offered {args.rate:,.0f} records/s of "
        f"{args.record_size} B (synthetic SubscribeToShard server, leases in the local DynamoDB), into the "
        f"{args.sink} sink; one `efo run` reading every stream against one per stream (each with its own "
        f"{'JVM' if args.sink == 'parquet' else 'process'}); every process and its children together, a "
        f"{args.seconds:g} s window {args.warmup:g} s after the last `service.ready`; medians of {args.repeats}; "
        f"{elapsed:.0f} s in all\n"
    )
    print("| layout | processes | ready s | RSS peak MiB | RSS mean MiB | CPU-s per 10,000 records | records/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for layout in LAYOUTS:
        label = f"one deployment, {args.streams} streams" if layout == "one" else f"{args.streams} deployments"
        print(
            f"| {label} | {results[layout][0]['processes']} | {median(layout, 'ready_s'):.1f} | "
            f"{median(layout, 'rss_peak_mib'):,.0f} | {median(layout, 'rss_mean_mib'):,.0f} | "
            f"{median(layout, 'cpu_per_10k'):.3f} | {median(layout, 'records_per_s'):,.0f} |"
        )
    ratios = {key: median("one", key) / median("separate", key) for key in ("rss_peak_mib", "cpu_per_10k", "ready_s")}
    print(
        f"\none / separate: RSS peak {ratios['rss_peak_mib']:.2f}x, CPU per record {ratios['cpu_per_10k']:.2f}x, "
        f"ready {ratios['ready_s']:.2f}x"
    )
    write_json(args.json, {"runs": results, "ratios": ratios, "streams": args.streams, "shards": args.shards})


if __name__ == "__main__":
    main()
