"""Latency of ``efo run``: from a record's arrival in Kinesis to the sink's commit, at half the ceiling.

The real ``efo run`` (leases and checkpoints in the local DynamoDB, efo.devstack.dynamodb) reads
``--shards`` shards from the synthetic SubscribeToShard server (bench/synthetic_server.py, pinned
to another CPU than efo), which stamps every record's ApproximateArrivalTimestamp with the moment
it writes the record's event. The sink is the Spark-free ``arrow:sinks:latency`` (bench/sinks.py):
it commits at once and records, per record, the time from its arrival to that commit.

1. The ceiling: the server sends as fast as efo reads; records/s committed, with the default batch
   settings (medians of ``--windows`` consecutive windows).
2. For the default batch settings and for ``batch.max_wait_s=0.5``: the server paces every shard so
   that all of them together send half the ceiling; p50, p99 and max of arrival-to-commit over
   ``--seconds`` after ``--warmup`` seconds.

The server pushes each event the moment it is due, so the figures are efo's own latency: on AWS,
Kinesis adds its propagation (about 70 ms for Enhanced Fan-Out).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from array import array
from pathlib import Path
from typing import Any

from common import (
    EfoProcess,
    command_line,
    efo_env,
    hermetic_aws_environment,
    percentile,
    pin_cpus,
    start_dynamodb,
    start_synthetic_server,
    write_json,
)
from sinks import BATCHES_FILE_ENV, LATENCY_FILE_ENV
from synthetic_server import consumer_arn, stream_name

from efo.config import BatchSettings

DEFAULT_MAX_WAIT_S = BatchSettings().max_wait_s  # type: ignore[call-arg]
LOW_LATENCY_MAX_WAIT_S = 0.5


class Run:
    """One ``efo run`` on the synthetic stream, with the latency sink's files."""

    def __init__(self, args: argparse.Namespace, kinesis: str, dynamodb: str, workdir: Path, name: str, **env: str):
        self.latencies = workdir / f"{name}.latencies"
        self.batches = workdir / f"{name}.batches"
        app = f"lat-{name}-{uuid.uuid4().hex[:6]}"
        self.process = EfoProcess(
            efo_env(
                EFO_STREAM=stream_name(args.shards),
                EFO_APP=app,
                EFO_SINK="arrow:sinks:latency",
                EFO_REGION="us-east-1",
                EFO_KINESIS_ENDPOINT=kinesis,
                EFO_DYNAMODB_ENDPOINT=dynamodb,
                EFO_INITIAL_POSITION="LATEST",
                **{LATENCY_FILE_ENV: str(self.latencies), BATCHES_FILE_ENV: str(self.batches)},
                **env,
            ),
            workdir / f"{name}.log",
            cpus=args.client_cpus,
        )

    def __enter__(self) -> Run:
        self.process.wait_for("service.ready")
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.stop()

    def committed(self) -> tuple[int, int]:
        """(batch lines, latency values) written so far."""
        lines = self.batches.read_text().count("\n") if self.batches.exists() else 0
        values = self.latencies.stat().st_size // 4 if self.latencies.exists() else 0
        return lines, values

    def batches_since(self, line: int) -> list[tuple[float, int]]:
        rows = self.batches.read_text().splitlines()[line:] if self.batches.exists() else []
        return [(float(t), int(n)) for t, n in (row.split() for row in rows)]

    def latencies_since(self, value: int) -> list[float]:
        values = array("f")
        with self.latencies.open("rb") as data:
            data.seek(4 * value)
            values.frombytes(data.read())
        return sorted(values)


def measure_ceiling(args: argparse.Namespace, kinesis: str, dynamodb: str, workdir: Path) -> list[float]:
    arn = consumer_arn(args.record_bytes, args.records_per_event)
    with Run(args, kinesis, dynamodb, workdir, "ceiling", EFO_CONSUMER_ARN=arn) as run:
        time.sleep(args.warmup)
        rates = []
        for _ in range(args.windows):
            lines, _ = run.committed()
            time.sleep(args.seconds / args.windows)
            deadline = time.monotonic() + 60
            while len(batches := run.batches_since(max(0, lines - 1))) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)  # batches from the last one before the window: at least two
            if len(batches) < 2:
                raise RuntimeError("fewer than two batches in a minute")
            # the records of every batch after the first, over the time between the first and the last
            rates.append(sum(n for _, n in batches[1:]) / (batches[-1][0] - batches[0][0]))
        return rates


def measure_latency(
    args: argparse.Namespace, kinesis: str, dynamodb: str, workdir: Path, rate: float, max_wait_s: float
) -> dict[str, Any]:
    per_shard_events = rate / args.shards / args.records_per_event
    arn = consumer_arn(args.record_bytes, args.records_per_event, per_second=round(per_shard_events, 3))
    settings = {"EFO_CONSUMER_ARN": arn, "EFO_BATCH__MAX_WAIT_S": str(max_wait_s)}
    with Run(args, kinesis, dynamodb, workdir, f"wait{max_wait_s:g}", **settings) as run:
        time.sleep(args.warmup)
        lines, values = run.committed()
        time.sleep(args.seconds)
        deadline = time.monotonic() + max_wait_s + 30
        while len(batches := run.batches_since(lines)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # a window shorter than max_wait_s (quick runs): wait for two batches
        latencies = run.latencies_since(values)
    if not latencies:
        raise RuntimeError(f"nothing committed with batch.max_wait_s={max_wait_s}")
    span = (batches[-1][0] - batches[0][0]) if len(batches) > 1 else float("nan")
    return {
        "max_wait_s": max_wait_s,
        "rate": rate,
        "committed_rate": sum(n for _, n in batches[1:]) / span if len(batches) > 1 else float("nan"),
        "records": len(latencies),
        "batches": len(batches),
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
        "max_s": latencies[-1],
        "goal_p50_s": max_wait_s + 0.3,
        "goal_p99_s": max_wait_s + 1.5,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--records-per-event", type=int, default=100)
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after service.ready before measuring")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per setting")
    parser.add_argument("--windows", type=int, default=3, help="windows of the ceiling measurement (median)")
    parser.add_argument("--load", type=float, default=0.5, help="the paced rate, as a share of the ceiling")
    parser.add_argument("--no-pin", action="store_true", help="do not pin server and efo to different CPUs")
    parser.add_argument("--json", default=None, help="write the figures here (for bench/run_all.py)")
    args = parser.parse_args()
    hermetic_aws_environment()
    client_cpu, server_cpu = pin_cpus(args.no_pin)
    args.client_cpus = {client_cpu} if client_cpu is not None else None
    workdir = Path(tempfile.mkdtemp(prefix="efo-latency-"))
    server, kinesis = start_synthetic_server(server_cpu)
    dynamodb_process, dynamodb = start_dynamodb(workdir)
    try:
        rates = measure_ceiling(args, kinesis, dynamodb, workdir)
        ceiling = statistics.median(rates)
        print(f"  ceiling {ceiling:,.0f} records/s (windows: {', '.join(f'{r:,.0f}' for r in rates)})", file=sys.stderr)
        results = []
        for max_wait_s in (DEFAULT_MAX_WAIT_S, LOW_LATENCY_MAX_WAIT_S):
            result = measure_latency(args, kinesis, dynamodb, workdir, args.load * ceiling, max_wait_s)
            print(f"  {result}", file=sys.stderr, flush=True)
            results.append(result)
    finally:
        server.kill()
        dynamodb_process.terminate()
        server.wait()
        dynamodb_process.wait()

    print(f"command: `{command_line()}`\n")
    print(
        f"`efo run` reading {args.shards} shards of {args.record_bytes} B records ({args.records_per_event} per event) "
        f"from the synthetic server, Spark-free sink that commits at once; server and efo pinned to one CPU each. "
        f"Ceiling (no pacing, default batch settings, same run): **{ceiling:,.0f} records/s** "
        f"(median of {len(rates)} windows). Each setting then ran at {args.load:.0%} of it for {args.seconds:g} s "
        f"after {args.warmup:g} s of warm-up.\n"
    )
    print(
        "| batch settings | offered records/s | committed records/s | records | batches "
        "| p50 s | p99 s | max s | goal p50 / p99 s | met |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for r in results:
        setting = "default" if r["max_wait_s"] == DEFAULT_MAX_WAIT_S else "low latency"
        met = r["p50_s"] <= r["goal_p50_s"] and r["p99_s"] <= r["goal_p99_s"]
        r["met"] = met
        print(
            f"| {setting} (`batch.max_wait_s={r['max_wait_s']:g}`) | {r['rate']:,.0f} | {r['committed_rate']:,.0f} "
            f"| {r['records']:,} | {r['batches']} | {r['p50_s']:.3f} | {r['p99_s']:.3f} | {r['max_s']:.3f} "
            f"| ≤ {r['goal_p50_s']:g} / ≤ {r['goal_p99_s']:g} | {'yes' if met else 'NO'} |"
        )
    write_json(args.json, {"ceiling": ceiling, "ceiling_windows": rates, "settings": results})


if __name__ == "__main__":
    main()
