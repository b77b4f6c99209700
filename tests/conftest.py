"""Shared fixtures: the local AWS stack (kinesis-local behind the conformance proxy, moto DynamoDB)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from aiobotocore.session import get_session
from botocore.config import Config
from hypothesis import settings

from efo.devstack.stack import LocalStack, StackEndpoints

# Property tests draw the same examples at every run of make test (derandomized: a failure replays, as
# a simulation seed does, and CI never fails on a case no run before drew); make chaos explores new ones
# (EFO_HYPOTHESIS=explore). A case found that way goes into the test as an @example.
settings.register_profile("replay", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("EFO_HYPOTHESIS", "replay"))

DUMMY_CREDENTIALS = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}


@pytest.fixture(scope="session")
def stack_subscription_lifetime_s() -> float:
    """Subscription lifetime the session stack's proxy enforces (0 = off); env EFO_TEST_SUBSCRIPTION_LIFETIME_S."""
    return float(os.environ.get("EFO_TEST_SUBSCRIPTION_LIFETIME_S", "0"))


@pytest.fixture(scope="session")
def local_stack(
    tmp_path_factory: pytest.TempPathFactory, stack_subscription_lifetime_s: float
) -> Iterator[StackEndpoints]:
    log_dir: Path = tmp_path_factory.mktemp("devstack-logs")
    with LocalStack(subscription_lifetime_s=stack_subscription_lifetime_s, log_dir=log_dir) as endpoints:
        yield endpoints


@pytest.fixture
def kinesis_client(local_stack: StackEndpoints) -> Any:
    """A boto3 Kinesis client (through the proxy) with retries off, so injected errors surface."""
    return boto3.client(
        "kinesis",
        endpoint_url=local_stack.kinesis_endpoint,
        region_name=local_stack.region,
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
        **DUMMY_CREDENTIALS,
    )


@pytest.fixture
def dynamodb_client(local_stack: StackEndpoints) -> Any:
    return boto3.client(
        "dynamodb", endpoint_url=local_stack.dynamodb_endpoint, region_name=local_stack.region, **DUMMY_CREDENTIALS
    )


@pytest.fixture
def aio_kinesis_client(local_stack: StackEndpoints) -> Callable[..., Any]:
    """Factory for aiobotocore Kinesis clients: ``async with aio_kinesis_client() as client: ...``.

    ``endpoint_url`` may be overridden (e.g. to point at an in-process proxy).
    """

    def create(endpoint_url: str | None = None) -> Any:
        return get_session().create_client(
            "kinesis",
            endpoint_url=endpoint_url or local_stack.kinesis_endpoint,
            region_name=local_stack.region,
            config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
            **DUMMY_CREDENTIALS,
        )

    return create


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what tests measured (``record_property``): CI runs with -q, which hides their output.
    And the chaos table, from the outcomes the chaos tests put in their teardown reports."""
    reports = [report for reports in terminalreporter.stats.values() for report in reports]
    measured = [
        (report.nodeid, report.user_properties)
        for report in reports
        if getattr(report, "when", None) == "call" and getattr(report, "user_properties", None)
    ]
    if measured:
        terminalreporter.section("measured")
        for nodeid, properties in measured:
            terminalreporter.write_line(f"{nodeid}: " + ", ".join(f"{name}={value}" for name, value in properties))
    after = [
        (name, value)
        for report in reports
        if getattr(report, "when", None) == "teardown"
        for name, value in getattr(report, "user_properties", ())
    ]
    if after:
        from tests.chaos.harness import REPORT_PROPERTY, Outcome, summary

        outcomes = [Outcome.from_json(value) for name, value in after if name == REPORT_PROPERTY]
        if outcomes:
            summary(terminalreporter, outcomes)


#: The order the suite's folders run in: the slowest files first (a Spark driver's JVM, several
#: processes of efo), the unit tests last. ``make test`` hands out files to its processes in this
#: order as each runs low (:func:`pytest_xdist_make_scheduler`), so the many short files at the end
#: even out when the processes finish. pytest-xdist's own order (the files with the most tests
#: first) left single long tests to the end: a 72 s Spark test started when the others were done.
FOLDERS_FIRST_TO_LAST = ("spark", "chaos", "integration", "sim", "unit")
#: Run by one process, one after the other: the tests of this folder share a Spark session (a JVM
#: of about 20 s of CPU to start), one a process that runs any of them.
ONE_PROCESS_FOLDERS = ("tests/spark/",)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown to a run without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """For --dist loadfile (``make test``): pytest-xdist's own scheduler of a file at a time to each
    process, with the files handed out in collection order and each of ONE_PROCESS_FOLDERS handed
    out whole. Any other --dist mode gets pytest-xdist's own (None)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class InOrderByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((folder for folder in ONE_PROCESS_FOLDERS if path.startswith(folder)), path)

    config.option.loadscopereorder = False  # collection order, not the files with the most tests first
    return InOrderByFile(config, log)


def _folder_rank(item: pytest.Item) -> int:
    folder = item.path.parent.name
    return FOLDERS_FIRST_TO_LAST.index(folder) if folder in FOLDERS_FIRST_TO_LAST else len(FOLDERS_FIRST_TO_LAST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``long`` run only with EFO_LONG_TESTS=1 (``make chaos``), to keep ``make test``
    short; the others run folder by folder in FOLDERS_FIRST_TO_LAST's order (a stable sort: each
    file's tests stay together and in their order)."""
    items.sort(key=_folder_rank)
    if os.environ.get("EFO_LONG_TESTS") == "1":
        return
    long = [item for item in items if item.get_closest_marker("long")]
    if long:
        config.hook.pytest_deselected(items=long)
        items[:] = [item for item in items if not item.get_closest_marker("long")]
