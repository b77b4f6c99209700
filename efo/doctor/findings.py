"""What ``efo doctor`` found: one :class:`Finding` per check, and the exit code of all of them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeVar

from efo.errors import EXIT_OK, EXIT_RUNTIME, AccessDenied, error_code, translate

T = TypeVar("T")

#: ok: it holds; warn: it holds now, but something will need doing (or could not be known);
#: fail: a deployment would fail on it; skip: the check could not run (the detail says why).
Status = Literal["ok", "warn", "fail", "skip"]
#: Where the IAM policy efo needs is written down.
POLICY = "the IAM policy in the README's 'Pointing it at AWS'"


@dataclass(frozen=True, slots=True)
class Finding:
    """One check: what it is about (``check``: an action such as ``kinesis:ListShards``, or a
    property such as ``table.layout``), on which ``resource`` (an ARN or a name), its ``status``,
    and ``detail``: what holds, or what is wrong and what to do about it."""

    check: str
    resource: str
    status: Status
    detail: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    settings: list[dict[str, Any]] = field(default_factory=list)

    def add(self, check: str, resource: str, status: Status, detail: str) -> Finding:
        finding = Finding(check, resource, status, detail)
        self.findings.append(finding)
        return finding

    def extend(self, findings: Iterable[Finding]) -> None:
        self.findings.extend(findings)

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "fail"]

    @property
    def exit_code(self) -> int:
        return EXIT_RUNTIME if self.failed else EXIT_OK

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": not self.failed,
            "checks": [f.to_json() for f in self.findings],
            "settings": self.settings,
        }


async def probe(
    report: Report,
    action: str,
    resource: str,
    call: Callable[[], Awaitable[T]],
    *,
    allowed: frozenset[str] = frozenset(),
    holds: str = "allowed",
) -> tuple[bool, T | None]:
    """One harmless call that needs ``action`` on ``resource``: ok when it answers (or fails with a
    code in ``allowed``, which only a permitted call gets), fail naming the refusal and what to
    grant when access is denied, fail with the error's own sentence otherwise (a missing resource,
    an endpoint that does not answer). Returns whether it answered, and its result (None on failure)."""
    try:
        result = await call()
    except Exception as exc:
        code = error_code(exc)
        if code in allowed:
            report.add(action, resource, "ok", f"{holds} (answered {code})")
            return True, None
        error = translate(exc, resource=resource)
        if isinstance(error, AccessDenied):
            refused = f"refused ({error.code or 'no credentials'}): grant {action} on {resource}; {POLICY}"
            report.add(action, resource, "fail", refused)
        else:
            report.add(action, resource, "fail", str(error))
        return False, None
    report.add(action, resource, "ok", holds)
    return True, result
