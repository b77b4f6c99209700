"""One JSON object per line on standard error, whoever writes the line.

With JSON logs, structlog and the JVM's log4j2 (sparkbridge/log4j2-json.properties) already write
objects with the keys ``timestamp``, ``level``, ``logger`` and ``event``. Everything else that reaches
standard error (the final ``efo: ...`` line, a traceback, the JVM's own start-up warnings) is wrapped
here into an object with the same keys and the line as its ``event``, so that a log pipeline never
meets plain text in the middle of JSON lines.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

#: How long the process waits at exit for a child's last lines (the JVM stops before efo exits).
DRAIN_AT_EXIT_S = 1.0

#: The prefix of the one line an operator reads when efo stops on an error (efo/cli.py, the driver).
ERROR_PREFIX = "efo: "


def wants_json(fmt: str) -> bool:
    """``log.format``: json, console, or auto (JSON unless standard error is a terminal)."""
    return fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())


def as_json_line(line: str, logger: str) -> str:
    """``line`` unchanged if it already is a JSON object, else wrapped into one (no newline)."""
    try:
        if isinstance(orjson.loads(line), dict):
            return line
    except orjson.JSONDecodeError:
        pass
    level = "error" if line.startswith(ERROR_PREFIX) else "warning"
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return orjson.dumps({"timestamp": stamp, "level": level, "logger": logger, "event": line}).decode()


class JsonLinesStream:
    """A text stream for ``sys.stderr`` that writes each complete line to ``wrapped`` as JSON."""

    def __init__(self, wrapped: TextIO, logger: str = "stderr") -> None:
        self.wrapped = wrapped
        self._logger = logger
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._partial = (self._partial + text).split("\n")
            if lines:
                self.wrapped.write("".join(as_json_line(line, self._logger) + "\n" for line in lines if line))
                self.wrapped.flush()
        return len(text)

    def flush(self) -> None:
        self.wrapped.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding ... of the real stream
        return getattr(self.wrapped, name)


@contextmanager
def child_stderr_as_json(logger: str) -> Iterator[None]:
    """Child processes started inside the block (the JVM) write their standard error into a pipe
    whose lines a thread forwards as JSON to this process's standard error, until they exit."""
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    real_fd = os.dup(2)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    forwarder = threading.Thread(target=_forward, args=(read_fd, real_fd, logger), name=f"efo-{logger}", daemon=True)
    forwarder.start()
    atexit.register(forwarder.join, DRAIN_AT_EXIT_S)  # a child's last lines, if it stopped first
    try:
        yield
    finally:
        os.dup2(real_fd, 2)  # ours again; the children keep the pipe's only write end


def _forward(read_fd: int, out_fd: int, logger: str) -> None:
    with os.fdopen(read_fd, "rb") as pipe, os.fdopen(out_fd, "wb", buffering=0) as out:
        for raw in pipe:
            line = raw.decode(errors="replace").rstrip("\r\n")
            if line:
                out.write((as_json_line(line, logger) + "\n").encode())
