"""Many seeds of the lease plane in simulated time, with every fault at random (``make chaos``).

Runs ``python -m efo.sim seeds --keep-going`` in two processes (one per core here), each half of the
seeds, and writes what they found to a Markdown page: how many seeds ran, how many kept every
invariant, the violations with the command that replays each, and the longest takeover, unread
stretch and wall time per seed. Exits 1 if any seed violated an invariant.

    python bench/sim_seeds.py --count 1000 --out docs/simulation.md
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from common import command_line

LINE = re.compile(
    r"seed (?P<seed>\d+): (?P<sim>[\d.]+) s simulated in (?P<wall>[\d.]+) s, (?P<records>\d+) records, "
    r"(?P<duplicates>\d+) duplicates, takeover (?P<takeover>[\d.]+|-) s, unread at most (?P<unread>[\d.]+) s, "
    r"(?P<doubts>\d+) doubts: (?P<outcome>.*)"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    started = time.monotonic()
    share = -(-args.count // args.processes)
    runs = []
    for index in range(args.processes):
        first = args.first + index * share
        count = min(share, args.first + args.count - first)
        if count <= 0:
            break
        runs.append(
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "efo.sim", "seeds", "--keep-going", "--faults", "all"),
                    *("--first", str(first), "--count", str(count), "--shards", str(args.shards)),
                    *("--workers", str(args.workers), "--minutes", f"{args.minutes:g}"),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    lines: list[dict[str, str]] = []
    replays: list[str] = []
    for run in runs:
        out, err = run.communicate()
        lines += [m.groupdict() for m in map(LINE.match, out.splitlines()) if m]
        replays += [line.removeprefix("replay: ") for line in err.splitlines() if line.startswith("replay: ")]
    wall_s = time.monotonic() - started
    failed = [line for line in lines if line["outcome"] != "ok"]
    takeovers = [float(line["takeover"]) for line in lines if line["takeover"] != "-"]
    page = [
        "# The lease plane in simulated time: many seeds with every fault",
        "",
        f"`{command_line()}` ({args.shards} shards × {args.workers} workers, {args.minutes:g} simulated minutes "
        f"of every fault at random moments per seed, then a drain; {wall_s / 60:.1f} min of wall time here).",
        "",
        "| seeds | kept every invariant | violated one | wall time per seed (median) | longest takeover | "
        "longest a readable shard went unread outside a fault |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {len(lines)} | {len(lines) - len(failed)} | {len(failed)} | "
        f"{sorted(float(line['wall']) for line in lines)[len(lines) // 2] if lines else 0:.1f} s | "
        f"{max(takeovers, default=0):.2f} s | {max((float(line['unread']) for line in lines), default=0):.2f} s |",
        "",
        "Takeover here counts from a death to the last of its shards read again, and includes deaths during "
        "DynamoDB faults (the invariant counts from the fault's end). \"Outside a fault\" leaves out DynamoDB's "
        "faults and late or slow workers'; a paused worker's shards count from the pause.",
    ]
    if failed:
        page += ["", "## Violations", ""]
        page += [f"- seed {line['seed']}: {line['outcome']}" for line in failed]
        page += ["", "Replay each with:", "", "```", *replays, "```"]
    text = "\n".join(page) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 1 if failed or len(lines) < args.count else 0


if __name__ == "__main__":
    sys.exit(main())
