"""What one ``efo`` process loads before its command runs: the test suite and operators start
hundreds of them, and each pays for every module ``efo.cli`` imports (efo.cli.group)."""

from __future__ import annotations

import subprocess
import sys

#: Never needed to parse a command line or print help: the sink's (pyarrow, numpy, pyspark) and the
#: tables' (rich; structlog, which operator commands load, imports it too).
HEAVY = ("pyarrow", "numpy", "pyspark", "sparkbridge", "rich")


def loaded(code: str) -> list[str]:
    """The heavy top-level packages in sys.modules after ``code``, run in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return eval(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_importing_the_cli_loads_no_heavy_package() -> None:
    assert loaded("import efo.cli") == []


def test_the_listing_of_every_command_loads_none_of_them() -> None:
    code = (
        "import sys\nfrom click.testing import CliRunner\nimport efo.cli\n"
        "result = CliRunner().invoke(efo.cli.cli, ['--help'])\nassert result.exit_code == 0, result.output\n"
        "assert not [m for m in sys.modules if m.startswith('efo.cli.') and m != 'efo.cli.group'], sys.modules"
    )
    assert loaded(code) == []


def test_an_operator_command_loads_no_sink_and_no_other_command() -> None:
    code = (
        "import sys\nfrom click.testing import CliRunner\nimport efo.cli\n"
        "result = CliRunner().invoke(efo.cli.cli, ['shards', '--help'])\nassert result.exit_code == 0, result.output\n"
        "assert not {'efo.cli.doctor', 'efo.cli.selftest', 'efo.cli.consumers'} & set(sys.modules)"
    )
    assert not {"pyarrow", "numpy", "pyspark", "sparkbridge"} & set(loaded(code))
