"""``python -m efo.sim``: the lease plane in simulated time.

    python -m efo.sim run --shards 256 --workers 16 --seed 7 --minutes 5 --faults all
    python -m efo.sim seeds --count 100 --shards 64 --workers 8 --minutes 3 --faults all

``run`` runs one seed and prints its report (``--json`` for the report as JSON); ``seeds`` runs many
(from ``--first``), one line each, and stops at the first violation with the command that replays it
(``--keep-going``: goes on to the last seed, and exits 1 at the end if any seed failed).
A violation exits 1 and prints the seed, the invariant and the events that led to it. A run is a
function of its arguments: the same command gives the same run (the process fixes its own hash seed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from efo.sim import faults
from efo.sim.dynamodb import Behaviour
from efo.sim.fleet import FleetConfig
from efo.sim.run import BadRunConfig, Report, RunConfig, simulate

HASH_SEED = "0"
#: RunConfig's fields by the flag that sets each (``args``' name): a refusal names what was typed.
FLAGS = {
    "shards": "shards",
    "workers": "workers",
    "duration_s": "minutes",
    "drain_s": "drain_s",
    "records_per_shard_s": "records_per_shard_s",
    "stale_read_s": "stale_read_s",
    "idle_event_s": "idle_event_s",
    "window": "window",
}


def _config(args: argparse.Namespace, seed: int) -> RunConfig:
    settings: dict[str, Any] = {}
    return RunConfig(
        fleet=FleetConfig(
            shards=args.shards,
            workers=args.workers,
            records_per_shard_s=args.records_per_shard_s,
            settings=settings,
            dynamodb=Behaviour(stale_read_s=args.stale_read_s),
            idle_event_s=args.idle_event_s,
        ),
        seed=seed,
        duration_s=args.minutes * 60.0,
        faults=faults.parse(args.faults),
        drain_s=args.drain_s,
        window=_window(args.window),
    )


def _window(text: str | None) -> tuple[float, float] | None:
    if not text:
        return None
    start, _, end = text.partition(":")
    try:
        window = (float(start), float(end))
    except ValueError:
        raise ValueError(f"--window {text!r}: FROM:TO in simulated seconds, such as 120:180") from None
    if not 0 <= window[0] < window[1]:
        raise ValueError(f"--window {text!r}: FROM must be at least 0 and below TO")
    return window


def replay_command(args: argparse.Namespace, seed: int) -> str:
    chosen = args.faults or "none"
    return (
        f"python -m efo.sim run --shards {args.shards} --workers {args.workers} --seed {seed} "
        f"--minutes {args.minutes:g} --faults {chosen} --records-per-shard-s {args.records_per_shard_s:g} "
        f"--stale-read-s {args.stale_read_s:g} --idle-event-s {args.idle_event_s:g} --drain-s {args.drain_s:g}"
    )


def _line(report: Report) -> str:
    takeover = f"{max(report.takeovers_s):.2f}" if report.takeovers_s else "-"
    return (
        f"seed {report.seed}: {report.simulated_s:.0f} s simulated in {report.wall_s:.1f} s, "
        f"{report.records_put} records, {report.duplicates} duplicates, takeover {takeover} s, "
        f"unread at most {report.longest_unread_s:.2f} s, {report.doubts} doubts: "
        + ("ok" if report.invariant is None else f"VIOLATION of {report.invariant}")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m efo.sim", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "seeds"):
        command = commands.add_parser(name)
        command.add_argument("--shards", type=int, default=64)
        command.add_argument("--workers", type=int, default=8)
        command.add_argument("--minutes", type=float, default=3.0, help="simulated minutes of faults and traffic")
        command.add_argument("--faults", default="all", help=f"all, none, or some of: {', '.join(faults.FAULTS)}")
        command.add_argument("--records-per-shard-s", type=float, default=0.5, dest="records_per_shard_s")
        command.add_argument("--stale-read-s", type=float, default=1.0, dest="stale_read_s")
        command.add_argument("--idle-event-s", type=float, default=5.0, dest="idle_event_s")
        command.add_argument("--drain-s", type=float, default=90.0, dest="drain_s")
        command.add_argument(
            "--window", default=None, help="FROM:TO (simulated seconds): DynamoDB and ListShards use as rates"
        )
        if name == "run":
            command.add_argument("--seed", type=int, default=0)
            command.add_argument("--json", action="store_true", help="the report as JSON")
        else:
            command.add_argument("--first", type=int, default=1)
            command.add_argument("--count", type=int, default=100)
            command.add_argument("--keep-going", action="store_true", dest="keep_going")
    args = parser.parse_args(argv)
    if args.faults == "none":
        args.faults = ""
    try:
        if args.command == "seeds" and args.count < 1:
            raise ValueError(f"--count {args.count}: at least 1")
        seeds = [args.seed] if args.command == "run" else range(args.first, args.first + args.count)
        _config(args, seeds[0]).check()  # the seeds' configs differ in the seed alone
    except BadRunConfig as exc:
        flag = FLAGS[exc.field]
        value = getattr(args, flag)
        typed = value if isinstance(value, str) else f"{value:g}"
        print(f"efo.sim: --{flag.replace('_', '-')} {typed}: {exc.allowed}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"efo.sim: {exc}", file=sys.stderr)
        return 2
    failed = False
    for seed in seeds:
        config = _config(args, seed)
        report = simulate(config)
        if args.command == "run" and args.json:
            print(json.dumps(report.to_json(), indent=2))
        else:
            print(_line(report), flush=True)
        if report.violation is not None:
            failed = True
            print(report.violation, file=sys.stderr)
            print(f"replay: {replay_command(args, config.seed)}", file=sys.stderr, flush=True)
            if not getattr(args, "keep_going", False):
                return 1
    return 1 if failed else 0


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:  # set hashing of str and bytes, so a seed replays a run
        os.environ["PYTHONHASHSEED"] = HASH_SEED
        os.execv(sys.executable, [sys.executable, "-m", "efo.sim", *sys.argv[1:]])
    for name in [name for name in os.environ if name.startswith("EFO_")]:
        del os.environ[name]  # the simulation's settings are its own
    sys.exit(main())
