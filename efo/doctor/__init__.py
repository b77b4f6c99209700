"""``efo doctor``: everything a deployment needs, checked from where the pod runs, before it runs.

Each check is a :class:`~efo.doctor.findings.Finding` (ok, warn, fail or skip, and what to do):
the settings and where each came from; credentials and region; per stream, every Kinesis action
efo calls on the resource IAM authorises it on, by a harmless call of each (efo/doctor/stream.py),
the stream and its consumer; the lease table and its rows (efo/doctor/table.py); the sinks
(efo/doctor/sink.py). It changes nothing but its own temporary objects: one DynamoDB item and one
file under the sink's path, each deleted again. (Its SubscribeToShard names a shard no stream has:
a worker's subscription is never taken over.)
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from botocore.exceptions import ProfileNotFound
from botocore.session import Session

from efo.aws import Clients, Endpoints, profile_not_found, sdk_region
from efo.config import Settings
from efo.doctor.findings import Finding, Report
from efo.doctor.sink import check_sinks
from efo.doctor.stream import check_stream
from efo.doctor.table import check_table

__all__ = ["Finding", "Report", "diagnose"]

#: Every AWS check together, at most this long (each call is bounded by the SDK's timeouts too).
AWS_CHECKS_TIMEOUT_S = 180.0
#: The read timeout of the SubscribeToShard check's client.
SUBSCRIBE_READ_TIMEOUT_S = 30.0


def diagnose(settings: Settings, records: list[dict[str, Any]], *, workers: int, write: bool = True) -> Report:
    """Run every check; ``records`` are ``efo config show``'s (each setting, its value and source)."""
    report = Report(settings=records)
    _settings(report, records)
    if _identity(report, settings):
        asyncio.run(_aws(report, settings, workers))
    check_sinks(report, settings, write=write)
    return report


def _settings(report: Report, records: list[dict[str, Any]]) -> None:
    sources = Counter(r["source"] for r in records if r["stream"] is None and r["source"] not in ("default", "missing"))
    given = ", ".join(f"{n} from the {source}" for source, n in sorted(sources.items())) or "none set"
    report.add(
        "settings", "configuration", "ok", f"valid; {given}, the rest defaults (--json lists each, with its source)"
    )


def _identity(report: Report, settings: Settings) -> bool:
    """Credentials (how the SDK found them; never their values) and the region. False: no AWS check can run."""
    credentials: Any = None
    try:
        credentials = Session().get_credentials()
    except ProfileNotFound as exc:
        report.add("credentials", "AWS SDK", "fail", profile_not_found(exc))
    else:
        if credentials is None:
            report.add(
                "credentials",
                "AWS SDK",
                "fail",
                "none found: on EKS give the pod a role (IRSA: the chart's serviceAccount.annotations), elsewhere "
                "AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or an instance profile",
            )
        else:
            report.add("credentials", "AWS SDK", "ok", f"found ({credentials.method})")
    region, origin = (settings.region, "EFO_REGION") if settings.region else sdk_region()
    if region is None:
        why = f" ({origin.removeprefix('none: ')})" if origin else ""
        report.add("region", "AWS SDK", "fail", f"none: set EFO_REGION (or AWS_DEFAULT_REGION){why}")
    else:
        endpoints = [e for e in (settings.kinesis_endpoint, settings.dynamodb_endpoint) if e]
        where = f"; endpoints {', '.join(endpoints)}" if endpoints else ""
        report.add("region", "AWS SDK", "ok", f"{region} ({origin}){where}")
    if credentials is None or region is None:
        report.add("aws", "Kinesis, DynamoDB", "skip", "not checked: no credentials or no region")
        return False
    return True


async def _aws(report: Report, settings: Settings, workers: int) -> None:
    endpoints = Endpoints(settings.region, settings.kinesis_endpoint, settings.dynamodb_endpoint)
    try:
        async with asyncio.timeout(AWS_CHECKS_TIMEOUT_S), Clients(endpoints) as clients:
            kinesis = await clients.kinesis()
            dynamodb = await clients.dynamodb()
            subscriber = clients.subscriber(SUBSCRIBE_READ_TIMEOUT_S)
            streams = []
            for each in settings.per_stream():
                facts = await check_stream(report, each, kinesis, subscriber, workers)
                if facts is not None:
                    streams.append((each, facts))
            await check_table(report, settings, dynamodb, kinesis, streams, workers)
    except TimeoutError:
        report.add(  # unknown is not holding: a helm test must not pass on it
            "aws",
            "Kinesis, DynamoDB",
            "fail",
            f"the checks after this did not finish within {AWS_CHECKS_TIMEOUT_S:g} s: the endpoints answer slowly "
            "or not at all; check the network path to them (VPC endpoints, proxy, EFO_*_ENDPOINT) and run it again",
        )
