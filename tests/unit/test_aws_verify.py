"""Certificates are checked wherever TLS is used: only a plain http:// endpoint reached without a
proxy skips the CA bundle (efo.aws.verify_tls)."""

from __future__ import annotations

import pytest

from efo.aws import verify_tls

PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(autouse=True)
def no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXIES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.mark.parametrize("endpoint", [None, "https://kinesis.eu-west-1.amazonaws.com", "HTTPS://127.0.0.1:4567"])
def test_the_sdk_default_for_aws_and_every_https_endpoint(endpoint: str | None) -> None:
    assert verify_tls(endpoint) is None


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:4567", "HTTP://localhost:8000"])
def test_no_ca_bundle_for_a_plain_http_endpoint(endpoint: str) -> None:
    assert verify_tls(endpoint) is False


def test_a_proxy_keeps_the_check_unless_no_proxy_bypasses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "https://proxy.internal:3128")
    assert verify_tls("http://10.0.0.7:4567") is None  # the proxy's TLS is checked
    monkeypatch.setenv("NO_PROXY", "10.0.0.7")
    assert verify_tls("http://10.0.0.7:4567") is False
