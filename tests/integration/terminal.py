"""One ``efo`` command on a pseudo-terminal (stdlib ``pty``), as an operator at a terminal runs it:
its prompt can be answered, and its output is what the terminal shows (standard output and error,
interleaved, colours included)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass

from efo.devstack.stack import die_with_parent_process

PROMPT = b"[y/N]"
ANSI_ESCAPE = "\x1b["


@dataclass(frozen=True)
class TerminalRun:
    code: int
    output: str  # as shown on the terminal, escape sequences included
    prompted: bool


def efo_on_terminal(env: dict[str, str], *args: str, answer: str | None = None, timeout_s: float = 60.0) -> TerminalRun:
    """Run ``efo *args`` with a pseudo-terminal as standard input, output and error, 160 columns
    wide; when it asks ``[y/N]``, type ``answer`` and Enter."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "efo.cli", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**env, "TERM": "xterm-256color"},
        start_new_session=True,  # the pty becomes its controlling terminal
        preexec_fn=die_with_parent_process,
    )
    os.close(slave)
    output = b""
    prompted = False
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every end of the terminal is closed, the command has exited
                break
            if not chunk:
                break
            output += chunk
            if not prompted and PROMPT in output:
                prompted = True
                if answer is not None:
                    os.write(master, answer.encode() + b"\n")
        else:
            process.kill()
            raise AssertionError(f"efo {' '.join(args)} still running after {timeout_s} s:\n{output.decode()}")
        code = process.wait(timeout=timeout_s)
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
            process.wait()
    return TerminalRun(code, output.decode(errors="replace"), prompted)
