"""The Dockerfile, read as text (no Docker engine here): the base image digest, the s3a jars pinned to
the Hadoop version inside the installed pyspark with their checksums, and a HEALTHCHECK that works."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyspark
import pytest

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    """``(KEYWORD, arguments)`` in order, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n(?:\s*#[^\n]*\n)*\s*", " ", (ROOT / "Dockerfile").read_text())
    found = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def args() -> dict[str, str]:
    pairs = (rest.split("=", 1) for keyword, rest in instructions() if keyword == "ARG" and "=" in rest)
    return {name: value for name, value in pairs}


def installed_hadoop_version() -> str:
    jars = Path(pyspark.__file__).parent / "jars"
    versions = {
        m.group(1)
        for p in jars.glob("hadoop-client-api-*.jar")
        if (m := re.fullmatch(r"hadoop-client-api-(.+)\.jar", p.name))
    }
    assert len(versions) == 1, f"one hadoop-client-api jar expected in {jars}, found {versions}"
    return versions.pop()


def test_every_stage_starts_from_the_base_image_pinned_by_digest_with_how_to_move_it() -> None:
    base = args()["BASE_IMAGE"]
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base), base
    froms = [rest.split()[0] for keyword, rest in instructions() if keyword == "FROM"]
    assert froms and set(froms) == {"${BASE_IMAGE}"}, froms
    text = (ROOT / "Dockerfile").read_text()
    comment = text[: text.index("ARG BASE_IMAGE=")]
    assert "docker buildx imagetools inspect python:3.11-slim-bookworm" in comment
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == "3.11"  # the image's Python is the project's


def test_hadoop_aws_is_pinned_to_the_hadoop_version_of_the_installed_pyspark() -> None:
    assert args()["HADOOP_VERSION"] == installed_hadoop_version()


def test_every_downloaded_jar_is_checked_against_its_pinned_sha1_and_lands_in_pyspark_jars() -> None:
    pinned = args()
    run = next(rest for keyword, rest in instructions() if keyword == "RUN" and "sha1sum" in rest)
    downloads = re.findall(r'curl -fsSLO "\$\{MAVEN\}/[^"]+/([^/"]+\.jar)"', run)
    checked = re.search(r"printf '%s  %s\\n' (.*?) \| sha1sum --check --strict -", run)
    assert downloads and checked, run
    pairs = re.findall(r'"\$\{(\w+_SHA1)\}" "([^"]+)"', checked.group(1))
    assert sorted(name for _, name in pairs) == sorted(downloads)
    for sha_arg, _ in pairs:
        assert re.fullmatch(r"[0-9a-f]{40}", pinned[sha_arg]), sha_arg
    assert "hadoop-aws-${HADOOP_VERSION}.jar" in downloads
    copy = next(rest for keyword, rest in instructions() if keyword == "COPY" and "--from=s3a-jars" in rest)
    assert copy.split()[-1] == "/usr/local/lib/python3.11/site-packages/pyspark/jars/"


class Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def healthcheck(port: int) -> int:
    """The image's HEALTHCHECK command, run as Docker runs it (exec form), against ``port``."""
    rest = next(rest for keyword, rest in instructions() if keyword == "HEALTHCHECK")
    command = json.loads(rest[rest.index("CMD ") + 4 :])
    assert command[0] == "python3" and "--start-period=60s" in rest
    env = {**os.environ, "EFO_METRICS_PORT": str(port)}
    return subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=30).returncode


def test_the_healthcheck_passes_on_200_and_fails_on_503_or_nothing_listening(
    health_server: ThreadingHTTPServer,
) -> None:
    port = health_server.server_address[1]
    Health.status = 200
    assert healthcheck(port) == 0
    Health.status = 503
    assert healthcheck(port) != 0
    health_server.shutdown()
    health_server.server_close()
    assert healthcheck(port) != 0


# ---- what the image runs as, what it copies, and how the README says to build it ----------------


def final_stage() -> list[tuple[str, str]]:
    found = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(found) if keyword == "FROM")
    return found[last_from:]


def test_the_image_runs_as_the_non_root_user_it_creates_from_its_last_run_on() -> None:
    stage = final_stage()
    users = [(i, rest) for i, (keyword, rest) in enumerate(stage) if keyword == "USER"]
    assert users, "the final stage sets no USER: the container would run as root"
    at, user = users[-1]
    assert user.isdigit() and int(user) != 0, user  # numeric: Kubernetes' runAsNonRoot can verify it
    assert any(keyword == "RUN" and f"useradd --uid {user}" in rest for keyword, rest in stage[:at])
    assert not [keyword for keyword, _ in stage[at:] if keyword == "RUN"], "a RUN after USER runs as that user"
    assert [keyword for keyword, _ in stage[at:]].count("ENTRYPOINT") == 1


def test_every_path_the_image_copies_from_the_build_context_exists_and_is_not_ignored() -> None:
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip()}
    copies = [rest.split() for keyword, rest in instructions() if keyword == "COPY" and "--from=" not in rest]
    assert copies
    for *sources, _destination in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert source.rstrip("/") not in ignored, f"COPY {source}: .dockerignore leaves it out of the context"


def test_the_readme_says_how_to_build_and_push_the_image_with_the_tag_the_chart_expects() -> None:
    readme = (ROOT / "README.md").read_text()
    chart = (ROOT / "helm" / "efo" / "Chart.yaml").read_text()
    app_version = re.search(r'^appVersion:\s*"?([^"\n]+)"?$', chart, re.MULTILINE)
    project = re.search(r'^version\s*=\s*"([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert app_version and project and app_version.group(1) == project.group(1)  # the image's efo is the chart's
    tag = app_version.group(1)
    section = readme[readme.index("### The image") : readme.index("## Metrics and logs")]
    assert f"docker build -t registry.example/efo:{tag} ." in section
    assert f"docker push registry.example/efo:{tag}" in section
    assert "image: {repository: registry.example/efo" in readme
    for name in args():  # every build argument is explained
        assert f"`{name}`" in section, name
