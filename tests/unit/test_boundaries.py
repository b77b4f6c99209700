"""Package boundaries: efo never imports pyspark."""

from __future__ import annotations

import subprocess
import sys


def test_importing_efo_and_its_cli_loads_no_pyspark_module() -> None:
    code = (
        "import sys, efo, efo.cli, efo.service, efo.coordinator, efo.kinesis.subscription, efo.leases.table;"
        "from click.testing import CliRunner;"
        "[CliRunner().invoke(efo.cli.cli, [name, '--help']) for name in efo.cli.cli.commands];"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'))"
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
