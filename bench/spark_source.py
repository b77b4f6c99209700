"""The Spark source (``spark.readStream.format("efo")``) beside ``efo run``: rows/s and CPU-s per
10,000 records on the same data into the same sinks, and arrival-to-visible latency.

Both read ``--shards`` shards of ``--record-size`` records (``--records-per-event`` an event) from
the synthetic SubscribeToShard server as fast as each takes them (the server writes an event as soon
as the client reads the last one), in a process of its own with Spark ``local[2]`` and a 1 GiB driver:

* **efo run**: the service with its embedded session, into ``parquet:`` or a handler that writes the
  batch's DataFrame to Spark's ``noop`` format (a Spark job per batch, as the source's noop sink; the
  Spark-free ``arrow:`` sink has no counterpart in a source); batches of ``batch.max_records`` (50,000).
* **source**: a Structured Streaming query, default trigger (the next batch as soon as one ends),
  ``maxRecordsPerTrigger`` 50,000, into ``format("noop")`` or ``format("parquet")``.

The window starts ``--warmup`` seconds after the first batch and lasts ``--seconds``; its rows are
those of the batches that ended in it, its CPU the whole process tree's (Python, the JVM, Spark's
Python workers: for the source, its reader process on the driver, where efo's subscriptions run),
sampled every 0.25 s from /proc and interpolated at the first and last batch ends. Runs alternate
which goes first.

Latency (``--latency-rate``): the server paced (each record's ApproximateArrivalTimestamp is the
moment its event is written, this host's clock), the source read by a query with
``trigger(processingTime="1 second")`` whose ``foreachBatch`` notes, for every row, the time from
its arrival to the moment the batch's rows are visible to it.

    python bench/spark_source.py [--shards 8] [--record-size 1024] [--sinks noop,parquet] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from common import (
    REGION,
    EfoProcess,
    at,
    command_line,
    efo_env,
    hermetic_aws_environment,
    percentile,
    start_dynamodb,
    start_synthetic_server,
    write_json,
)
from service_cpu import _children, _interpolate, _stat_cpu
from synthetic_server import consumer_arn, stream_name

SPARK_CONF = {
    "spark.driver.memory": "1g",
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:G1HeapRegionSize=32m",  # efo run's default
}
RUN_TIMEOUT_S = 600.0


def tree_cpu(pid: int) -> dict[str, float]:
    """CPU-seconds so far of ``pid`` and its descendants; ``reader``: the source's reader processes."""
    total, reader = _stat_cpu(Path(f"/proc/{pid}/stat")), 0.0
    for child in _children(pid):
        seconds = _stat_cpu(Path(f"/proc/{child}/stat"))
        total += seconds
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"python_streaming_source_runner" in command:
            reader += seconds
    return {"total": total, "reader": reader}


@dataclass
class Result:
    variant: str
    sink: str
    rows: int
    seconds: float
    cpu: dict[str, float]

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds

    def per_10k(self, part: str = "total") -> float:
        return self.cpu[part] / self.rows * 10_000


# ---- the source's driver, a child process --------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    """A Spark driver with one query from the efo source; its batches (end time, rows) to ``--events``."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F

    builder = SparkSession.builder.master("local[2]").appName("efo-bench-source")
    for key, value in {
        **SPARK_CONF,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
    }.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    reader = (
        spark.readStream.format("efo")
        .option("streams", args.stream)
        .option("consumerArn", args.consumer_arn)
        .option("region", REGION)
        .option("endpoint", args.endpoint)
        .option("maxRecordsPerTrigger", str(args.batch_rows))
        .load()
    )
    events = Path(args.events)
    if args.sink == "latency":
        latencies = Path(args.events).with_suffix(".latency")

        def visible(df: DataFrame, batch_id: int) -> None:
            now_ms = time.time() * 1000
            arrivals = [r[0] for r in df.select(F.unix_millis("approximateArrivalTimestamp")).collect()]
            with latencies.open("a") as out:
                out.writelines(f"{(now_ms - a) / 1000:.4f}\n" for a in arrivals)

        writer = reader.writeStream.foreachBatch(visible).trigger(processingTime="1 second")
    elif args.sink == "parquet":
        writer = reader.writeStream.format("parquet").option("path", args.out).trigger(processingTime="0 seconds")
    else:
        writer = reader.writeStream.format("noop").trigger(processingTime="0 seconds")
    query = writer.option("checkpointLocation", args.checkpoint).start()
    seen = -1
    while query.isActive:
        for progress in query.recentProgress:
            if progress["batchId"] > seen:
                seen = progress["batchId"]
                began = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
                ended = began + progress["durationMs"]["triggerExecution"] / 1000
                with events.open("a") as out:
                    out.write(
                        json.dumps({"t": ended, "rows": progress["numInputRows"], "ms": progress["durationMs"]}) + "\n"
                    )
        time.sleep(0.2)
    raise SystemExit(f"the query stopped: {query.exception()}")


# ---- the parent ----------------------------------------------------------------------------------


def _spark_conf_env() -> dict[str, str]:
    return {"EFO_SPARK__MASTER": "local[2]", "EFO_SPARK__CONF": json.dumps(SPARK_CONF)}


def start(
    variant: str, sink: str, args: argparse.Namespace, kinesis: str, dynamodb: str, workdir: Path, name: str
) -> tuple[Any, Path]:
    """The process of one run, and the file its batches are noted in."""
    arn = consumer_arn(args.record_size, args.records_per_event)
    if variant == "efo run":
        env = efo_env(
            EFO_STREAM=stream_name(args.shards),
            EFO_APP=f"src-{name}-{uuid.uuid4().hex[:6]}",
            EFO_SINK="handler:sinks:spark_noop" if sink == "noop" else f"parquet:{workdir / (name + '-parquet')}",
            EFO_REGION=REGION,
            EFO_KINESIS_ENDPOINT=kinesis,
            EFO_DYNAMODB_ENDPOINT=dynamodb,
            EFO_INITIAL_POSITION="LATEST",
            EFO_CONSUMER_ARN=arn,
            EFO_BATCH__MAX_RECORDS=str(args.batch_rows),
            **_spark_conf_env(),
        )
        log = workdir / f"{name}.log"
        return EfoProcess(env, log, cwd=workdir).process, log
    events = workdir / f"{name}.events"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        *("--sink", sink, "--stream", stream_name(args.shards), "--consumer-arn", arn, "--endpoint", kinesis),
        *("--events", str(events), "--checkpoint", str(workdir / f"{name}-checkpoint")),
        *("--out", str(workdir / f"{name}-parquet"), "--batch-rows", str(args.batch_rows)),
    ]
    env = efo_env()
    from efo.devstack.stack import die_with_parent_process

    with (workdir / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=log, cwd=workdir, preexec_fn=die_with_parent_process
        )
    return process, events


def batches(variant: str, path: Path) -> list[tuple[float, int]]:
    """(end time, rows) of each batch so far."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if variant == "efo run" and event.get("event") == "batch.committed":
            out.append((at(event), int(event["records"])))
        elif variant == "source" and "t" in event and event["rows"]:
            out.append((float(event["t"]), int(event["rows"])))
    return out


def next_window(window: tuple[float, float], ends: list[float], now: float) -> tuple[tuple[float, float], bool]:
    """The window, and whether it is closed: a second after its end (a batch's end is noted up to
    0.2 s late), once at least two batches ended in it; else it grows to now, however slow they are."""
    if now <= window[1] + 1.0:
        return window, False
    if len([t for t in ends if window[0] <= t <= window[1]]) >= 2:
        return window, True
    return (window[0], now), False


def run_once(
    variant: str, sink: str, args: argparse.Namespace, kinesis: str, dynamodb: str, workdir: Path, name: str
) -> Result:
    process, path = start(variant, sink, args, kinesis, dynamodb, workdir, name)
    samples: list[tuple[float, dict[str, float]]] = []
    deadline = time.monotonic() + RUN_TIMEOUT_S
    window: tuple[float, float] | None = None
    try:
        while time.monotonic() < deadline:
            samples.append((time.time(), tree_cpu(process.pid)))
            if process.poll() is not None:
                raise RuntimeError(f"{variant} exited {process.returncode}; see {workdir / name}.log")
            done = batches(variant, path)
            if window is None and done:
                first = done[0][0] + args.warmup
                window = (first, first + args.seconds)
            if window is not None:
                window, closed = next_window(window, [t for t, _ in done], time.time())
                if closed:
                    break
            time.sleep(0.25)
        else:
            raise RuntimeError(f"{variant} did not finish its window within {RUN_TIMEOUT_S:g} s")
    finally:
        if process.poll() is None:
            process.terminate()  # the driver process only: its JVM follows when its standard input closes
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert window is not None
    inside = [(t, n) for t, n in batches(variant, path) if window[0] <= t <= window[1]]
    if len(inside) < 2:
        raise RuntimeError(f"{variant}: fewer than two batches ended in the window; see {workdir / name}.log")
    (t0, _), (t1, _) = inside[0], inside[-1]
    a, b = _interpolate(samples, t0), _interpolate(samples, t1)
    return Result(variant, sink, sum(n for _, n in inside[1:]), t1 - t0, {k: b[k] - a[k] for k in b})


def latency(args: argparse.Namespace, kinesis: str, workdir: Path) -> dict[str, float]:
    per_event = max(1, args.records_per_event // 10)
    events_per_s = args.latency_rate / (args.shards * per_event)
    arn = consumer_arn(args.record_size, per_event, per_second=round(events_per_s, 4))
    name = "latency"
    events = workdir / f"{name}.events"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        *("--sink", "latency", "--stream", stream_name(args.shards), "--consumer-arn", arn, "--endpoint", kinesis),
        *("--events", str(events), "--checkpoint", str(workdir / f"{name}-checkpoint")),
    ]
    from efo.devstack.stack import die_with_parent_process

    with (workdir / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(
            command, env=efo_env(), stdout=log, stderr=log, cwd=workdir, preexec_fn=die_with_parent_process
        )
    values = events.with_suffix(".latency")
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not values.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the latency query read nothing; see {workdir / name}.log")
            time.sleep(0.5)
        time.sleep(args.warmup)
        skip = len(values.read_text().splitlines())
        time.sleep(args.seconds)
        seconds = [float(v) for v in values.read_text().splitlines()[skip:]]
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if not seconds:
        raise RuntimeError(f"no row visible in the latency window; see {workdir / name}.log")
    return {
        "rows": len(seconds),
        "p50_s": percentile(sorted(seconds), 50),
        "p99_s": percentile(sorted(seconds), 99),
        "max_s": max(seconds),
        "rate": args.latency_rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--records-per-event", type=int, default=100)
    parser.add_argument("--sinks", default="noop,parquet")
    parser.add_argument("--batch-rows", type=int, default=50_000, help="maxRecordsPerTrigger and batch.max_records")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds after the first batch before the window")
    parser.add_argument("--seconds", type=float, default=30.0, help="the measured window")
    parser.add_argument("--repeats", type=int, default=2, help="runs per variant and sink; medians")
    parser.add_argument(
        "--latency-rate", type=float, default=2000, help="records/s offered in the latency run (0: none)"
    )
    parser.add_argument("--json", default=None, help="write the figures here (for bench/run_all.py)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--sink", "--stream", "--consumer-arn", "--endpoint", "--events", "--checkpoint", "--out"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    hermetic_aws_environment()
    sinks = [s for s in args.sinks.split(",") if s]
    workdir = Path(tempfile.mkdtemp(prefix="efo-bench-source-"))
    server, kinesis = start_synthetic_server(None)
    dynamodb_process, dynamodb = start_dynamodb(workdir)
    results: dict[tuple[str, str], list[Result]] = {}
    began = time.perf_counter()
    try:
        for repeat in range(args.repeats):
            for s, sink in enumerate(sinks):
                order = ("efo run", "source") if (repeat + s) % 2 == 0 else ("source", "efo run")
                for variant in order:
                    name = f"{sink}-{variant.replace(' ', '-')}-{repeat}"
                    result = run_once(variant, sink, args, kinesis, dynamodb, workdir, name)
                    results.setdefault((sink, variant), []).append(result)
                    print(
                        f"  {sink:8} {variant:8} {result.rows:>9,} rows in {result.seconds:5.1f} s: "
                        f"{result.rows_per_s:,.0f} rows/s, {result.per_10k():.3f} CPU-s/10k "
                        f"(reader process {result.per_10k('reader'):.3f})",
                        file=sys.stderr,
                        flush=True,
                    )
        lag = latency(args, kinesis, workdir) if args.latency_rate > 0 else None
    finally:
        server.kill()
        server.wait()
        dynamodb_process.kill()
        dynamodb_process.wait()
    elapsed = time.perf_counter() - began

    print(f"command: `{command_line()}`\n")
    print(
        f"{args.shards} shards of {args.record_size} B records ({args.records_per_event} an event) from the synthetic "
        f"server, read as fast as each takes them; Spark local[2], 1 GiB driver, batches of at most "
        f"{args.batch_rows:,} rows; {args.warmup:g} s warm-up, then a window of about {args.seconds:g} s; "
        f"median of {args.repeats} run(s) each, alternating; {elapsed:.0f} s in all.\n"
    )
    print("| sink | reader | rows/s | vs efo run | CPU-s / 10k rows | of which the source's reader process |")
    print("|---|---|---:|---:|---:|---:|")
    cases = []
    for sink in sinks:
        base = statistics.median(r.rows_per_s for r in results[(sink, "efo run")])
        for variant in ("efo run", "source"):
            mine = results[(sink, variant)]
            rate = statistics.median(r.rows_per_s for r in mine)
            cost = statistics.median(r.per_10k() for r in mine)
            reader = statistics.median(r.per_10k("reader") for r in mine)
            reader_cell = f"{reader:.3f}" if variant == "source" else ""
            print(f"| {sink} | {variant} | {rate:,.0f} | {rate / base:.2f} | {cost:.3f} | {reader_cell} |")
            cases.append(
                {
                    "sink": sink,
                    "variant": variant,
                    "rows_per_s": rate,
                    "ratio": rate / base,
                    "per_10k": cost,
                    "reader_per_10k": reader,
                    "runs": [{"rows": r.rows, "seconds": r.seconds, "cpu": r.cpu} for r in mine],
                }
            )
    figures: dict[str, Any] = {"cases": cases, "latency": lag}
    if lag is not None:
        print(
            f'\nArrival to visible in a `processingTime("1 second")` query\'s `foreachBatch`, {lag["rate"]:,.0f} '
            f"records/s offered, {lag['rows']:,} rows: p50 {lag['p50_s']:.2f} s, p99 {lag['p99_s']:.2f} s, "
            f"max {lag['max_s']:.2f} s (the trigger alone adds up to 1 s)."
        )
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
