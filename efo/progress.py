"""A bounded run's progress on a terminal: one line that rich redraws (shards done of shards in
total, records and bytes read, the slowest shard's lag, the time so far), with the log lines
printed above it instead of through it. Only when standard error is a terminal and the logs are
not JSON; a log pipeline gets the ``run.progress`` events instead."""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from efo.stderr_json import wants_json


def wanted(log_format: str) -> bool:
    """Show it: standard error (the real one) is a terminal, and the logs are for people."""
    stream = getattr(sys.stderr, "wrapped", sys.stderr)
    return bool(getattr(stream, "isatty", lambda: False)()) and not wants_json(log_format)


class _Above:
    """A stream for the log handler while the display runs: each line printed above the display."""

    def __init__(self, console: Console) -> None:
        self._console = console

    def write(self, text: str) -> int:
        if text.strip():
            self._console.print(text.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
        return len(text)

    def flush(self) -> None:
        pass


class TerminalProgress:
    def __init__(self, until: str, stream: TextIO | None = None) -> None:
        console = Console(file=stream or getattr(sys.stderr, "wrapped", sys.stderr), highlight=False)
        self._progress = Progress(
            TextColumn(f"efo run --until {until}"),
            BarColumn(),
            TextColumn("{task.fields[done]}/{task.fields[shards]} shards"),
            TextColumn("{task.fields[records]:,} records"),
            TextColumn("{task.fields[mb]:.1f} MB"),
            TextColumn("{task.fields[lag]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._task = self._progress.add_task("run", total=1, done=0, shards="?", records=0, mb=0.0, lag="")
        self._handlers: list[tuple[logging.StreamHandler[Any], Any]] = []

    def start(self) -> TerminalProgress:
        self._progress.start()
        above = _Above(self._progress.console)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler):
                self._handlers.append((handler, handler.setStream(above)))  # type: ignore[arg-type]
        return self

    def update(self, fields: dict[str, Any]) -> None:
        lag_ms = fields.get("max_lag_ms")
        self._progress.update(
            self._task,
            completed=fields["shards_done"],
            total=max(fields["shards_total"], 1),
            done=fields["shards_done"],
            shards=fields["shards_total"],
            records=fields["records"],
            mb=fields["bytes"] / 1e6,
            lag="" if lag_ms is None else f"slowest {lag_ms / 1000:.1f} s behind",
        )

    def close(self) -> None:
        """Idempotent: the display's last state stays on the terminal; the log goes on below it."""
        for handler, stream in self._handlers:
            handler.setStream(stream)
        self._handlers.clear()
        self._progress.stop()


def combined(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """Several streams' progress as one line: shards, records and bytes summed, the slowest lag."""
    lags = [s["max_lag_ms"] for s in snapshots if s.get("max_lag_ms") is not None]
    return {
        "shards_done": sum(s["shards_done"] for s in snapshots),
        "shards_total": sum(s["shards_total"] for s in snapshots),
        "records": sum(s["records"] for s in snapshots),
        "bytes": sum(s["bytes"] for s in snapshots),
        "max_lag_ms": max(lags) if lags else None,
    }
