"""Standard error stays one JSON object per line: wrapped lines, Python warnings, a child's output."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

from efo.stderr_json import JsonLinesStream, as_json_line


def test_a_json_object_passes_unchanged_and_anything_else_is_wrapped_with_the_log_keys() -> None:
    line = '{"event": "batch.committed", "level": "info"}'
    assert as_json_line(line, "stderr") == line
    for plain, level in (("efo: stream 'orders' not found", "error"), ("[1, 2]", "warning"), ("{oops", "warning")):
        wrapped = json.loads(as_json_line(plain, "jvm"))
        assert wrapped == {"timestamp": wrapped["timestamp"], "level": level, "logger": "jvm", "event": plain}
        assert wrapped["timestamp"].endswith("Z")


def test_the_stream_writes_whole_lines_only_as_they_complete() -> None:
    real = io.StringIO()
    stream = JsonLinesStream(real)
    stream.write("efo: half")
    assert real.getvalue() == ""
    stream.write(" and the rest\nsecond\n\nthird")
    lines = real.getvalue().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["efo: half and the rest", "second"]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, check=False
    )


def test_with_json_logs_warnings_prints_and_the_final_error_line_are_json_objects() -> None:
    done = run_python(
        """
        import sys, warnings, structlog
        from efo.observability import configure_logging
        configure_logging("INFO", "json")
        structlog.get_logger("efo.test").info("service.ready", shards=2)
        warnings.warn("pandas is old", DeprecationWarning, stacklevel=1)
        print("a stray print", file=sys.stderr)
        print("efo: sink failed on batch 7 after 5 attempts", file=sys.stderr)
        """
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(e["logger"], e["level"]) for e in events] == [
        ("efo.test", "info"),
        ("py.warnings", "warning"),
        ("stderr", "warning"),
        ("stderr", "error"),
    ]
    assert "DeprecationWarning: pandas is old" in events[1]["event"]
    assert events[-1]["event"] == "efo: sink failed on batch 7 after 5 attempts"


def test_console_logs_leave_standard_error_as_it_is() -> None:
    done = run_python(
        """
        import sys
        from efo.observability import configure_logging
        configure_logging("INFO", "console")
        print("efo: plain for a person", file=sys.stderr)
        """
    )
    assert done.stderr == "efo: plain for a person\n"


def test_a_child_started_inside_the_block_has_its_lines_forwarded_as_json_until_it_exits() -> None:
    done = run_python(
        """
        import os, subprocess, sys
        from efo.stderr_json import child_stderr_as_json
        with child_stderr_as_json("jvm"):
            child = subprocess.Popen(["sh", "-c", 'echo "WARNING: Using incubator modules" >&2; sleep 0.5; '
                                      'echo \\'{"event": "already json"}\\' >&2'])
        os.write(2, b"the parent writes plainly again\\n")
        child.wait()
        """
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "the parent writes plainly again" in lines
    forwarded = [json.loads(line) for line in lines if line.startswith("{")]
    assert forwarded[0]["event"] == "WARNING: Using incubator modules" and forwarded[0]["logger"] == "jvm"
    assert forwarded[1] == {"event": "already json"}
