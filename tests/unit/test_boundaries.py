"""Package boundaries: efo never imports pyspark, and never imports sparkbridge (sparkbridge imports
efo; efo reaches it only through the seam efo.spark_side, by name)."""

from __future__ import annotations

import ast
import subprocess
import sys
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
    """The lease model, balance, clean-up and the view are logic: no botocore, no aiobotocore."""
    code = (
        "import sys, efo.leases.model, efo.leases.balance, efo.leases.cleanup, efo.leases.view;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('botocore', 'aiobotocore', 'boto3')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
