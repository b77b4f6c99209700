"""Draw the dashboard's panels (helm/efo/dashboards/efo.json) from a Prometheus into one PNG, two
panels a row as Grafana lays them out, so the README can show what an operator sees.

    .venv/bin/python -m deploy.dashboard_png --prometheus http://127.0.0.1:9090 --job efo \\
        --minutes 5 --out docs/dashboard.png

The picture in the README comes from tests/integration/test_prometheus.py (a real Prometheus
scraping ``efo run`` on the local stack), run once with EFO_TEST_DASHBOARD_PNG=docs/dashboard.png.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from deploy.dashboard import DASHBOARD_PATH

#: Grafana's unit ids of the dashboard, as axis labels.
UNITS = {"s": "seconds", "rps": "records/s", "Bps": "bytes/s", "percentunit": "fraction", "short": ""}


@dataclass(frozen=True)
class Series:
    legend: str
    times_s: list[float]
    values: list[float]


def concrete(expr: str, job: str, rate_interval: str, stream: str = ".*") -> str:
    """The dashboard's expression with Grafana's variables filled in (``$stream``: every stream)."""
    return expr.replace("$job", job).replace("$stream", stream).replace("$__rate_interval", rate_interval)


def query_range(prometheus: str, expr: str, start_s: float, end_s: float, step_s: float) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": expr, "start": start_s, "end": end_s, "step": step_s})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{query}", timeout=30) as response:
        body = json.loads(response.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()


def panel_series(
    prometheus: str, panel: dict[str, Any], job: str, start_s: float, end_s: float, step_s: float, rate_interval: str
) -> list[Series]:
    found = []
    for target in panel["targets"]:
        for result in query_range(prometheus, concrete(target["expr"], job, rate_interval), start_s, end_s, step_s):
            points = [(float(t), float(v)) for t, v in result["values"] if not math.isnan(float(v))]
            if points:
                found.append(
                    Series(
                        _legend(target.get("legendFormat", ""), result["metric"]),
                        [t - start_s for t, _ in points],
                        [v for _, v in points],
                    )
                )
    return found


def render(
    prometheus: str,
    out: Path,
    *,
    job: str,
    start_s: float,
    end_s: float,
    step_s: float = 1.0,
    rate_interval: str = "10s",
) -> Path:
    board = json.loads(DASHBOARD_PATH.read_text())
    panels = board["panels"]
    rows = math.ceil(len(panels) / 2)
    figure, axes = plt.subplots(rows, 2, figsize=(14, 3.2 * rows), squeeze=False)
    figure.suptitle(board["title"], fontsize=14, fontweight="bold")
    for axis, panel in zip(axes.flat, panels, strict=False):
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        for series in panel_series(prometheus, panel, job, start_s, end_s, step_s, rate_interval):
            axis.plot(series.times_s, series.values, label=series.legend or "value", linewidth=1.4)
        axis.set_title(panel["title"], loc="left", fontsize=11)
        axis.set_ylabel(UNITS.get(unit, unit), fontsize=9)
        axis.set_xlabel("seconds into the run", fontsize=9)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        if axis.lines:
            axis.legend(fontsize=8, loc="upper left", ncols=2)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)
    plt.close(figure)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--job", required=True, help="the job label of the efo release")
    parser.add_argument("--minutes", type=float, default=15.0, help="the last N minutes")
    parser.add_argument("--out", type=Path, default=Path("dashboard.png"))
    args = parser.parse_args()
    end_s = time.time()
    start_s = end_s - args.minutes * 60
    step_s = max(1.0, args.minutes * 60 / 300)
    print(render(args.prometheus, args.out, job=args.job, start_s=start_s, end_s=end_s, step_s=step_s))


if __name__ == "__main__":
    main()
