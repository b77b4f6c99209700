"""The sink of ``efo selftest``'s worker (``EFO_SINK=arrow:efo.selftest.sink:write``): each committed
row's record number, key and shard, appended in commit order to ``$EFO_SELFTEST_OUTPUT/rows.jsonl``.
The records are the selftest's own (``{"n": ..., "key": ...}``), never a user's data."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: Where the rows go (a tooling variable, not a setting: efo.config.NON_SETTINGS).
OUTPUT_VARIABLE = "EFO_SELFTEST_OUTPUT"
ROWS_FILE = "rows.jsonl"


def write(table: Any, batch: Any) -> None:
    rows = table.select(["shard_id", "sequence_number", "data"]).to_pylist()
    lines = []
    for row in rows:
        record = json.loads(row["data"])
        lines.append(
            json.dumps(
                {"n": record["n"], "key": record["key"], "shard": row["shard_id"], "seq": row["sequence_number"]}
            )
        )
    with (Path(os.environ[OUTPUT_VARIABLE]) / ROWS_FILE).open("a") as out:
        out.write("".join(line + "\n" for line in lines))
        out.flush()
        os.fsync(out.fileno())


def read_rows(directory: Path) -> list[dict[str, Any]]:
    """The rows committed so far, in commit order (a line being written is left for the next read)."""
    try:
        text = (directory / ROWS_FILE).read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]
