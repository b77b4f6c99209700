"""Package boundaries: efo never imports pyspark, and never imports sparkbridge (sparkbridge imports
efo; efo reaches it only through the seam efo.spark_side, by name)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import efo

EFO_DIR = Path(efo.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_efo_module_imports_sparkbridge_not_even_lazily() -> None:
    offenders = {
        str(path.relative_to(EFO_DIR.parent)): sorted(
            name for name in _imported_modules(path) if name.split(".")[0] in ("sparkbridge", "pyspark_efo")
        )
        for path in sorted(EFO_DIR.rglob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_seam_names_an_implementation_of_its_protocol_in_sparkbridge() -> None:
    from efo import spark_side

    assert spark_side.IMPLEMENTATION.split(".")[0] == "sparkbridge"
    side = spark_side.load()
    assert isinstance(side, spark_side.SparkSide)
    assert type(side).__module__ == spark_side.IMPLEMENTATION


def test_importing_efo_and_its_cli_loads_no_pyspark_or_sparkbridge_module() -> None:
    code = (
        "import sys, efo, efo.cli, efo.service, efo.coordinator, efo.kinesis.subscription, efo.leases.table,"
        " efo.source.engine, efo.source.replay, efo.spark_side, efo.doctor;"
        "import click; from click.testing import CliRunner; cli = efo.cli.cli;"
        "[CliRunner().invoke(cli, [name, '--help']) for name in cli.list_commands(click.Context(cli))];"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'sparkbridge', 'pyspark_efo')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_lease_model_and_what_decides_on_it_load_no_aws_client() -> None:
    """The lease model, its item codec, balance, clean-up, the view and the cycle's decision are
    logic: no botocore, no aiobotocore."""
    code = (
        "import sys, efo.leases.model, efo.leases.codec, efo.leases.balance, efo.leases.cleanup, efo.leases.view,"
        " efo.worker.decision;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('botocore', 'aiobotocore', 'boto3')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_efo_run_with_an_arrow_sink_loads_no_pyspark_or_py4j() -> None:
    """The arrow sink starts no Spark: what ``efo run`` builds for it (sparkbridge.app.run: the sink,
    the dead-letter sink, the batch runner and the driver), a batch written, and a write that fails
    and is retried, load neither pyspark nor py4j (0.1 CPU-s and 8 MiB more in each process)."""
    code = textwrap.dedent(
        """
        import sys, types
        from efo.config import load_settings
        from efo.pipeline.records import RecordChunk, Row
        from efo.service import Service
        from sparkbridge import app
        from sparkbridge.side import SPARK_SIDE

        tables = []
        def write(table, batch):
            tables.append(table.num_rows)
            if len(tables) == 1:
                raise OSError("the first attempt fails")
        sys.modules["efo_arrow_target"] = module = types.ModuleType("efo_arrow_target")
        module.write = write
        sink = "arrow:efo_arrow_target:write"
        settings = load_settings(
            stream="s", app="a", sink=sink, dead_letter_sink=sink, sink_retry={"retry_backoff_s": 0}
        )
        SPARK_SIDE.check_sink(settings.sink_spec)  # efo doctor's check
        sink = app.make_sink(settings.sink_spec, settings.partition_columns)
        assert app.takes_arrow(sink)
        driver = app._driver(None, sink, settings, Service(settings))
        driver.runner.run("b-1", [RecordChunk.of_rows("s", "shard-0", 0, [Row("1", b"x", "k", 0)])])
        assert tables == [1, 1], tables
        print(sorted({m.split(".")[0] for m in sys.modules} & {"pyspark", "py4j"}))
        """
    )
    env = {name: value for name, value in os.environ.items() if not name.startswith("EFO_")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"  # after the retry's log line
