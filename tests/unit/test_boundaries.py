"""Package boundaries: efo never imports pyspark."""

from __future__ import annotations

import subprocess
import sys


def test_importing_efo_and_its_cli_loads_no_pyspark_module() -> None:
    code = (
        "import sys, efo, efo.cli, efo.service, efo.coordinator, efo.kinesis.subscription, efo.leases.table,"
        " efo.source.engine, efo.source.replay;"
        "from click.testing import CliRunner;"
        "[CliRunner().invoke(efo.cli.cli, [name, '--help']) for name in efo.cli.cli.commands];"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
