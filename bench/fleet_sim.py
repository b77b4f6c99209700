"""The fleet in simulated time: mass start, busy and idle, join, takeover and a rolling deploy at
1,024 x 16, 4,096 x 64 and 16,384 x 256 (shards x workers), beside the KCL 2.x and 3.x models.

**What runs.** :mod:`efo.sim.phases`: W real :class:`efo.coordinator.Coordinator` s against the
simulated DynamoDB and Kinesis of ``efo/sim`` on one virtual clock (README, "Proven in simulated
time"), with every invariant checked as it goes and no fault injected; busy is a record a second
per shard, as bench/fleet.py's busy is. The phases (that module's doc says each): **start** (all W
at once on an empty table) to balanced, as bench/fleet.py defines it; steady **busy** and **idle**
windows (requests a minute by operation, read and write units a second for the fleet and its
busiest partition key, ListShards a minute, every write request by kind); **join** to balanced;
**takeover** after a SIGKILL; a **rolling deploy** (every worker, or ``--roll`` of them, replaced one by
one as Kubernetes rolls the chart's Deployment: a new one, ready for ``--min-ready`` s, then an old one
stopped gracefully as the next new one starts) and the longest any shard went unread;
leases in doubt and lost in each phase. The KCL models are bench/fleet.py's (its ``--help``).

**Each size runs in a child process** (``--run``, with ``PYTHONHASHSEED=0``, so that the command
this prints replays it exactly) that writes its figures after each phase; ``--budget-min`` bounds the
wall time of all sizes together: a size stopped by it keeps the phases it finished, and the rest
(and any size not started) is reported as not measured.

**Against DynamoDB Local** (``--against``: bench/fleet.py's ``--json`` of the same run): at the size
both ran, the simulation's lease-plane requests a minute and read and write units a second beside
what DynamoDB Local's meter counted, as ratios (goal: within 10 %).

    python bench/fleet_sim.py --sizes 1024x16,4096x64 --window 30 --settle 10
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import command_line, write_json
from fleet import READ_LIMIT, WRITE_LIMIT, kcl_model, kcl_times

from efo.sim.fleet import FleetConfig
from efo.sim.phases import MIN_READY_S, PHASES, PhasesConfig, PhasesReport, finished, run_phases

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
HASH_SEED = "0"
WITHIN = 0.10  # the simulation against DynamoDB Local: each ratio within 1 ± this
MODES = ("busy", "idle")


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for size in text.split(","):
        if size.strip():
            shards, _, workers = size.strip().lower().partition("x")
            try:
                sizes.append((int(shards), int(workers)))
            except ValueError:
                raise ValueError(f"--sizes {text}: SHARDSxWORKERS, comma-separated, such as 1024x16,4096x64") from None
    return sizes


def _at(seconds: float) -> str:
    """A moment of simulated time, to the millisecond, without trailing zeros."""
    return f"{seconds:.3f}".rstrip("0").rstrip(".")


def size_name(shards: int, workers: int) -> str:
    return f"{shards:,} × {workers}"


def settings(failover_s: float) -> dict[str, Any]:
    """The workers' settings: the defaults, or bench/fleet.py's ``--failover-s`` (heartbeat 1/5 of it)."""
    if failover_s == 10.0:
        return {}
    return {"lease": {"failover_s": failover_s, "heartbeat_interval_s": failover_s / 5}}


def config(shards: int, workers: int, args: argparse.Namespace) -> PhasesConfig:
    return PhasesConfig(
        fleet=FleetConfig(
            shards=shards,
            workers=workers,
            records_per_shard_s=args.records_per_shard_s,
            settings=settings(args.failover_s),
        ),
        seed=args.seed,
        settle_s=args.settle,
        window_s=args.window,
        timeout_s=args.phase_timeout,
        roll=args.roll,
        min_ready_s=args.min_ready,
    )


# ---- one size, in this process (the child) ---------------------------------------------------------------


def run_one(args: argparse.Namespace) -> None:
    ((shards, workers),) = parse_sizes(args.run)
    out = Path(args.out)

    def save(report: PhasesReport) -> None:
        partial = out.with_suffix(".partial")
        partial.write_text(json.dumps({**report.to_json(), "cpu_s": round(time.process_time(), 1)}))
        partial.replace(out)

    report = run_phases(config(shards, workers, args), progress=save)
    save(report)


# ---- every size, each a child, within the budget -----------------------------------------------------------


def child_command(shards: int, workers: int, args: argparse.Namespace, out: Path) -> list[str]:
    return [
        *(sys.executable, str(BENCH / "fleet_sim.py"), "--run", f"{shards}x{workers}", "--out", str(out)),
        *("--seed", str(args.seed), "--window", f"{args.window:g}", "--settle", f"{args.settle:g}"),
        *("--phase-timeout", f"{args.phase_timeout:g}", "--failover-s", f"{args.failover_s:g}"),
        *("--records-per-shard-s", f"{args.records_per_shard_s:g}"),
        *(("--roll", str(args.roll)) if args.roll is not None else ()),
        *("--min-ready", f"{args.min_ready:g}"),
    ]


def run_sizes(args: argparse.Namespace) -> list[dict[str, Any]]:
    workdir = Path(tempfile.mkdtemp(prefix="efo-fleet-sim-"))
    deadline = None if args.budget_min is None else time.monotonic() + 60 * args.budget_min
    env = {name: value for name, value in os.environ.items() if not name.startswith("EFO_")}
    env["PYTHONHASHSEED"] = HASH_SEED
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    cases = []
    for shards, workers in parse_sizes(args.sizes):
        case: dict[str, Any] = {"shards": shards, "workers": workers, "phases": {}, "finished": False}
        cases.append(case)
        left_s = None if deadline is None else deadline - time.monotonic()
        if left_s is not None and left_s <= 0:
            case["why"] = f"not started: the budget of {args.budget_min:g} min was spent"
            continue
        out = workdir / f"{shards}x{workers}.json"
        print(f"fleet_sim: {shards} shards x {workers} workers ...", file=sys.stderr, flush=True)
        started = time.monotonic()
        with (workdir / f"{shards}x{workers}.log").open("w") as log:
            child = subprocess.Popen(child_command(shards, workers, args, out), cwd=ROOT, env=env, stderr=log)
            try:
                code: int | None = child.wait(left_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
                code = None
        if out.exists():
            case.update(json.loads(out.read_text()))
        case["wall_s"] = round(time.monotonic() - started, 1)
        done = finished(case["phases"])
        if code is None:
            case["why"] = f"stopped by the budget of {args.budget_min:g} min after {', '.join(done) or 'no phase'}"
        elif code != 0:
            tail = (workdir / f"{shards}x{workers}.log").read_text(errors="replace").splitlines()[-5:]
            exited = f"was killed by signal {-code}" if code < 0 else f"exited {code}"
            case["why"] = f"the simulation {exited}" + (f": {' / '.join(tail)[-300:]}" if tail else "")
        elif case.get("violation"):
            case["why"] = f"invariant '{case['invariant']}' violated after {', '.join(done) or 'no phase'}"
        else:
            case["finished"] = len(done) == len(PHASES)
        print(
            f"fleet_sim: {shards} x {workers}: {case.get('simulated_s', 0):.0f} s simulated "
            f"in {case['wall_s']:.0f} s{'' if case['finished'] else ': ' + case.get('why', '')}",
            file=sys.stderr,
            flush=True,
        )
    return cases


# ---- the report ------------------------------------------------------------------------------------------


def _n(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _s(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.1f}"


def lease_plane(window: dict[str, Any]) -> dict[str, float]:
    """The simulated window's lease plane (everything but checkpoints), as bench/fleet.py's lease_plane."""
    return {
        "requests_per_min": window["lease_plane_requests_per_min"],
        "read_units_per_s": window["read_units_per_s"],
        "write_units_per_s": window["write_units_per_s"],
        "cost_per_s": window["cost_per_s"],
    }


def add_models(cases: list[dict[str, Any]]) -> None:
    """Beside each steady window: the KCL models' lease plane for the same size, and the ratios."""
    for case in cases:
        models = {v: kcl_model(v, case["shards"], case["workers"]) for v in ("2.x", "3.x")}
        for mode in MODES:
            window = case["phases"].get(mode)
            if window:
                cost = window["cost_per_s"]
                window["models"] = models
                window["ratio_2x"] = cost / models["2.x"]["cost_per_s"]
                window["ratio_3x"] = cost / models["3.x"]["cost_per_s"]
                if "steady_state" in window:  # the formula at steady state, production's row sizes
                    window["ratio_3x_steady"] = window["steady_state"]["cost_per_s"] / models["3.x"]["cost_per_s"]


def compare(cases: list[dict[str, Any]], against: dict[str, Any]) -> dict[str, Any] | None:
    """The simulation beside DynamoDB Local at the first size both ran: lease-plane requests a minute,
    read and write units a second, busy and idle; the ratio simulation / DynamoDB Local."""
    local = {(c["shards"], c["workers"]): c for c in against.get("cases", [])}
    for case in cases:
        measured = local.get((case["shards"], case["workers"]))
        if measured is None:
            continue
        rows: dict[str, Any] = {}
        for mode in MODES:
            sim, wire = case["phases"].get(mode), measured.get(mode)
            if not sim or not wire:
                rows[mode] = None
                continue
            checkpoints_per_min = 60 * wire["checkpoints_per_s"]
            wire_plane = {
                "requests_per_min": wire["requests_per_min"] - checkpoints_per_min,
                "read_units_per_s": wire["read_units_per_s"],
                "write_units_per_s": max(0.0, wire["write_units_per_s"] - wire["checkpoints_per_s"]),
            }
            operations = {op: o["requests_per_min"] for op, o in wire["operations"].items()}
            if "UpdateItem" in operations:
                operations["UpdateItem"] = max(0.0, operations["UpdateItem"] - checkpoints_per_min)
            sim_plane = lease_plane(sim)
            rows[mode] = {
                "local": wire_plane,
                "simulation": {k: sim_plane[k] for k in wire_plane},
                "ratios": {k: sim_plane[k] / v if v else float("nan") for k, v in wire_plane.items()},
                "local_operations": {op: rate for op, rate in operations.items() if rate},
                "simulation_operations": {op: r for op, r in sim["requests_per_min"].items() if op != "checkpoint"},
                "checkpoints_per_s": (wire["checkpoints_per_s"], sim["checkpoint_write_units_per_s"]),
                "local_kept_up": _kept_up(measured, mode),
            }
        return {"shards": case["shards"], "workers": case["workers"], "windows": rows}
    return None


def _kept_up(measured: dict[str, Any], mode: str) -> bool | None:
    """Whether DynamoDB Local kept up in this steady window (its whole run's verdict where the
    window's own is not given)."""
    if "lagging" in measured:
        return mode not in measured["lagging"]
    kept_up: bool | None = measured.get("kept_up")
    return kept_up


def report(cases: list[dict[str, Any]], args: argparse.Namespace, against: dict[str, Any] | None) -> dict[str, Any]:
    failover_s = args.failover_s
    print(f"command: `{command_line()}`\n")
    roll = "every worker" if args.roll is None else f"{args.roll} workers"
    print(
        f"The lease plane's real code on W workers against the simulated DynamoDB and Kinesis (`efo/sim`, virtual "
        f"time, every invariant checked, no fault injected), seed {args.seed}, lease defaults"
        f"{'' if failover_s == 10 else f' but failover {failover_s:g} s, heartbeat {failover_s / 5:g} s'}; "
        f"busy: {args.records_per_shard_s:g} record a second per shard. Steady windows of {args.window:g} simulated "
        f"s after {args.settle:g} s of settling; a rolling deploy of {roll} (minReadySeconds {args.min_ready:g}). "
        "A size that did not finish within "
        f"the budget ({'none' if args.budget_min is None else f'{args.budget_min:g} min of wall time'}) shows "
        "what it finished; the rest is not measured. Replay one size: `PYTHONHASHSEED=0 python bench/fleet_sim.py "
        "--sizes SxW` with the same flags.\n"
    )
    print("**What the simulated fleet spent** (steady windows, counted by the simulated DynamoDB's meter)\n")
    print(
        "| shards × workers | mode | requests/min by operation | lease plane: read / write units/s | "
        "checkpoint write units/s | busiest key: read units/s | busiest key: write units/s | ListShards/min | "
        "write requests/min other than heartbeats |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        size = size_name(case["shards"], case["workers"])
        for mode in MODES:
            w = case["phases"].get(mode)
            if not w:
                print(f"| {size} | {mode} | not measured | | | | | | |")
                continue
            ops = ", ".join(f"{op} {_n(rate)}" for op, rate in w["requests_per_min"].items())
            reads, writes = w["busiest_key_read_units_per_s"], w["busiest_key_write_units_per_s"]
            print(
                f"| {size} | {mode} | {ops} | {_n(w['read_units_per_s'], 1)} / {_n(w['write_units_per_s'], 1)} | "
                f"{_n(w['checkpoint_write_units_per_s'], 1)} | {_n(reads, 1)} ({reads / READ_LIMIT:.1%}) | "
                f"{_n(writes, 1)} ({writes / WRITE_LIMIT:.1%}) | {_n(w['list_shards_per_min'])} | "
                f"{_n(w['other_writes_per_min'])} |"
            )
    print(
        "\n**The lease plane against the KCL models** (everything but checkpoint writes; cost in read-unit "
        "equivalents a second, a write unit = 5 read units; ratio = efo / model, the same S and W)\n"
    )
    print(
        "| shards × workers | mode | efo requests/min | efo read / write units/s | efo cost/s | "
        "KCL 2.x requests/min | KCL 2.x cost/s | efo / 2.x | KCL 3.x requests/min | KCL 3.x cost/s | efo / 3.x |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case in cases:
        size = size_name(case["shards"], case["workers"])
        for mode in MODES:
            w = case["phases"].get(mode)
            if not w:
                print(f"| {size} | {mode} | not measured | | | | | | | | |")
                continue
            k2, k3 = w["models"]["2.x"], w["models"]["3.x"]
            print(
                f"| {size} | {mode} | {_n(w['lease_plane_requests_per_min'])} | {_n(w['read_units_per_s'], 1)} / "
                f"{_n(w['write_units_per_s'], 1)} | {_n(w['cost_per_s'], 1)} | {_n(k2['requests_per_min'])} | "
                f"{_n(k2['cost_per_s'], 1)} | {w['ratio_2x']:.3f} | {_n(k3['requests_per_min'])} | "
                f"{_n(k3['cost_per_s'], 1)} | {w['ratio_3x']:.3f} |"
            )
    print(
        f"\n**Balance, takeover and a rolling deploy** (simulated seconds; takeover goal `failover_s` + 2 = "
        f"{failover_s + 2:g} s; leases in doubt and lost: the workers' `lease.in_doubt` and `lease.lost` events "
        "in each phase: start, busy, idle, join, takeover, rolling)\n"
    )
    print(
        "| shards × workers | start → balanced | start → every worker ready | join → balanced | takeover (shards) | "
        "rolling deploy: replaced, seconds | rolling: longest unread | rolling → balanced | leases in doubt | "
        "leases lost | "
        "KCL 2.x model: takeover, join | KCL 3.x model: takeover | simulated s in wall s (CPU s) |"
    )
    print("|---|---:|---:|---:|---:|---|---:|---:|---|---|---|---|---|")
    for case in cases:
        p = case["phases"]
        times = kcl_times(case["shards"], case["workers"])

        def cell(phase: str, key: str, p: dict[str, Any] = p) -> str:
            return _s(p[phase].get(key)) if phase in p and key in p[phase] else "not measured"

        roll = p.get("rolling")
        rolled = "not measured"
        if roll:
            rolled = f"{roll['replaced']} of {roll['of']}, {roll['seconds']:.0f} s" + (
                " (cut short)" if roll.get("partial") else ""
            )
        doubts = ", ".join(str(p[n]["in_doubt"]) if n in p else "-" for n in PHASES)
        lost = ", ".join(str(p[n]["lost"]) if n in p else "-" for n in PHASES)
        takeover = (
            f"{cell('takeover', 'takeover_s')} ({p['takeover']['shards']})" if "takeover" in p else "not measured"
        )
        speed = f"{case.get('simulated_s', 0):,.0f} in {case.get('wall_s', 0):,.0f} ({case.get('cpu_s', 0):,.0f})" + (
            "" if case["finished"] else f" ({case.get('why', 'not finished')})"
        )
        print(
            f"| {size_name(case['shards'], case['workers'])} | {cell('start', 'balanced_s')} | "
            f"{cell('start', 'ready_s')} | {cell('join', 'balanced_s')} | {takeover} | {rolled} | "
            f"{cell('rolling', 'longest_unread_s')} | {cell('rolling', 'balanced_s')} | {doubts} | {lost} | "
            f"{times['takeover_2x']}, {times['join_2x']} | {times['takeover_3x']} | {speed} |"
        )
    for case in cases:
        named = case["phases"].get("rolling", {}).get("longest_unread")
        if named:
            until = "the phase's end"
            if named.get("to_s") is not None:
                until = f"{_at(named['to_s'])} s"
            elif case["phases"]["rolling"].get("partial"):
                until = "when the phase was cut short"
            print(
                f"\nThe rolling deploy's longest unread at {size_name(case['shards'], case['workers'])}: "
                f"{named['shard']} from {_at(named['from_s'])} s to {until} (simulated), read by "
                f"{named.get('before') or 'nobody'} before and {named.get('after') or 'nobody'} after."
            )
    compared = compare(cases, against) if against is not None else None
    if against is not None:
        print_comparison(compared)
    return {
        "seed": args.seed,
        "failover_s": failover_s,
        "window_s": args.window,
        "roll": args.roll,
        "min_ready_s": args.min_ready,
        "budget_min": args.budget_min,
        "sizes": [[s, w] for s, w in parse_sizes(args.sizes)],
        "cases": cases,
        "against_local": compared,
    }


def print_comparison(compared: dict[str, Any] | None) -> None:
    if compared is None:
        print("\nNo size was run both here and against DynamoDB Local (bench/fleet.py): nothing to compare.")
        return
    size = size_name(compared["shards"], compared["workers"])
    print(
        f"\n**The simulation against DynamoDB Local at {size}** (the lease plane, everything but checkpoints, as "
        f"bench/fleet.py counted it at the wire in the same `make bench` run; ratio = simulation / DynamoDB Local, "
        f"goal within {WITHIN:.0%}; checkpoints are shown, not judged: they follow how many busy shards the local "
        "bench kept reading)\n"
    )
    print(
        "| mode | requests/min: local, simulation, ratio | read units/s: local, simulation, ratio | "
        "write units/s: local, simulation, ratio | requests/min by operation: local; simulation | "
        "checkpoints/s: local, simulation |"
    )
    print("|---|---|---|---|---|---|")
    lagging = []
    for mode in MODES:
        row = compared["windows"].get(mode)
        if row is not None and row["local_kept_up"] is False:
            lagging.append(mode)
        if row is None:
            print(f"| {mode} | not measured | | | | |")
            continue

        def triple(key: str, digits: int, row: dict[str, Any] = row) -> str:
            local, sim, ratio = row["local"][key], row["simulation"][key], row["ratios"][key]
            return f"{_n(local, digits)}, {_n(sim, digits)}, {ratio:.3f}"

        ops = "; ".join(
            ", ".join(f"{op} {_n(rate)}" for op, rate in sorted(side.items()))
            for side in (row["local_operations"], row["simulation_operations"])
        )
        print(
            f"| {mode} | {triple('requests_per_min', 0)} | {triple('read_units_per_s', 1)} | "
            f"{triple('write_units_per_s', 1)} | {ops} | {_n(row['checkpoints_per_s'][0], 1)}, "
            f"{_n(row['checkpoints_per_s'][1], 1)} |"
        )
    if lagging:
        print(
            f"\nDynamoDB Local's {' and '.join(lagging)} window{'s' if len(lagging) > 1 else ''} **did not keep up** "
            "(its section above says where the time went): its counts there are those of a fleet running late, "
            "not a measure of the simulation."
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1024x16,4096x64,16384x256", help="comma-separated SHARDSxWORKERS")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--window", type=float, default=60.0, help="simulated seconds of each steady window")
    parser.add_argument("--settle", type=float, default=10.0, help="simulated seconds before a window and a join")
    parser.add_argument("--phase-timeout", type=float, default=120.0, help="at most this long to balance")
    parser.add_argument("--failover-s", type=float, default=10.0, help="lease.failover_s (heartbeat: 1/5 of it)")
    parser.add_argument("--records-per-shard-s", type=float, default=1.0, help="busy: records a second per shard")
    parser.add_argument("--roll", type=int, default=None, help="workers replaced in the rolling deploy (all)")
    parser.add_argument(
        "--min-ready", type=float, default=MIN_READY_S, help="the rolling deploy's minReadySeconds (the chart's)"
    )
    parser.add_argument("--budget-min", type=float, default=None, help="wall minutes for every size together")
    parser.add_argument("--against", default=None, help="bench/fleet.py's --json of the same run")
    parser.add_argument("--json", default=None, help="write the figures here (for bench/run_all.py)")
    parser.add_argument("--run", default=None, help=argparse.SUPPRESS)  # one size, in this process
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_one(args)
        return
    try:
        for shards, workers in parse_sizes(args.sizes):
            config(shards, workers, args).check()  # refused before anything runs
    except ValueError as exc:
        parser.error(str(exc))
    cases = run_sizes(args)
    add_models(cases)
    against = json.loads(Path(args.against).read_text()) if args.against else None
    write_json(args.json, report(cases, args, against))


if __name__ == "__main__":
    main()
