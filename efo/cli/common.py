"""What every ``efo`` command shares: the settings options, the stream and the lease table, output
for people (rich tables, colour only on a terminal) and for scripts (``--json``), confirmation,
and waiting with progress."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, NamedTuple, TypeVar

import click
import structlog
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from efo.aws import Clients, Endpoints
from efo.cli.status import worker_statuses
from efo.config import DURATION_ALLOWED, Settings, duration_s, load_settings, setting_sources, stream_name
from efo.errors import EXIT_NOT_FOUND, EXIT_OK, EXIT_RUNTIME, ConfigError, EfoError, ResourceNotFound, translate
from efo.kinesis.registration import StreamInfo, describe_stream
from efo.leases.model import TableState
from efo.leases.table import LeaseTable

T = TypeVar("T")
Command = TypeVar("Command", bound=Callable[..., Any])

NO_STREAM = "no stream given: pass --stream NAME, or set EFO_STREAM (or EFO_STREAMS for several)"
NO_APP = "no application given: pass --app NAME or set EFO_APP (it names the lease table's rows)"
NO_TABLE = "name the lease table with --app (or EFO_TABLE), or start 'efo run' once to create it"

#: Stands in for the application in the settings of a command that can do without one (Settings
#: requires one); :attr:`Scope.app` is None then, and nothing reads the stand-in.
_APP_STAND_IN = "-"


# ---- settings: --config, --stream, --app ---------------------------------------------------------


def settings_options(command: Command) -> Command:
    """``--config``, ``--stream`` and ``--app``: the flags win over EFO_* variables, which win over the file."""
    for option in reversed(
        (
            click.option("--config", metavar="FILE", help="YAML settings file; EFO_* variables win over it."),
            click.option("--stream", metavar="NAME", help="Stream name or ARN (else EFO_STREAM)."),
            click.option("--app", metavar="NAME", help="Application: the lease table's rows (else EFO_APP)."),
        )
    ):
        command = option(command)
    return command


def json_option(command: Command) -> Command:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts (shapes in the README).")(
        command
    )


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2; pyproject allows 8.1
    """A duration option, read as every duration setting is (efo.config.duration_s): ``90``,
    ``2.5``, ``90s``, ``5m``, ``2h``; refused in the same words."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            return duration_s(value)
        except ValueError:
            self.fail(f"{value!r}: {DURATION_ALLOWED}", param, ctx)


def wait_s_option(default_s: float) -> Callable[[Command], Command]:
    return click.option(
        "--wait-s",
        type=Duration(),
        default=default_s,
        show_default=True,
        metavar="DURATION",
        help="How long to wait before giving up (exit 1): seconds, or with a unit (5m).",
    )


@dataclass(frozen=True, slots=True)
class Scope:
    """What an operator command works on: one stream's settings, and the application if given."""

    settings: Settings
    app: str | None

    @property
    def stream(self) -> str:
        """The stream's name or ARN, as configured (or given with --stream)."""
        return self.settings.stream_ref

    @property
    def table(self) -> str | None:
        """The lease table: EFO_TABLE, else the application's name; None without either."""
        return self.settings.table or self.app

    @property
    def consumer_name(self) -> str | None:
        return self.settings.consumer_name or self.app

    def require_app(self) -> str:
        if self.app is None:
            raise ConfigError(NO_APP)
        return self.app


def select_stream(settings: Settings, stream: str, *, listed_only: bool = False) -> Settings:
    """The settings of the stream ``--stream`` names in a ``streams`` configuration: its entry's
    effective settings when it is listed (by name or ARN), else the top level's (a stream removed
    from the list stays reachable, e.g. to delete its rows), or with ``listed_only`` a ConfigError."""
    wanted = stream_name(stream)
    for each in settings.per_stream():
        if stream_name(each.stream_ref) == wanted:
            return each
    if listed_only:
        raise ConfigError(
            f"--stream {stream!r} is not one of the configured streams ({', '.join(settings.stream_names)}): "
            "add it to streams, or name one of them"
        )
    return settings.model_copy(update={"stream": stream.strip(), "streams": None})


def load_for_stream(
    config: str | None,
    stream: str | None,
    *,
    defaults: dict[str, Any] | None = None,
    flags: dict[str, Any] | None = None,
    listed_only: bool = False,
) -> Settings:
    """The settings with ``--stream`` applied. With ``stream`` (or nothing) configured, the flag
    wins over it as any flag does; with ``streams`` configured, the flag selects one stream
    (:func:`select_stream`) rather than colliding with the list. No flag: the settings as loaded."""
    flags = dict(flags or {})
    if stream is not None and setting_sources(config, flags=flags)["streams"].kind == "default":
        return load_settings(config, defaults=defaults, flags={**flags, "stream": stream})
    settings = load_settings(config, defaults=defaults, flags=flags)
    return settings if stream is None else select_stream(settings, stream, listed_only=listed_only)


def load_scopes(config: str | None, stream: str | None, app: str | None, *, need_app: bool) -> list[Scope]:
    """The streams an operator command works on, each with its effective settings (the sink is
    not needed: console): the one ``--stream`` names, else every configured stream. The
    application is required only when ``need_app``."""
    sources = setting_sources(config, flags={"stream": stream, "app": app})
    if sources["stream"].kind == "default" and sources["streams"].kind == "default":
        raise ConfigError(NO_STREAM)
    has_app = sources["app"].kind != "default"
    if need_app and not has_app:
        raise ConfigError(NO_APP)
    defaults = {"sink": "console"} | ({} if has_app else {"app": _APP_STAND_IN})
    settings = load_for_stream(config, stream, defaults=defaults, flags={"app": app})
    return [Scope(each, each.app if has_app else None) for each in settings.per_stream()]


def one_stream(scopes: Sequence[Scope]) -> Scope:
    """The one stream of a command that acts on one: with several configured, a usage error naming
    them and ``--stream`` (nothing is done to every stream at once by default)."""
    if len(scopes) == 1:
        return scopes[0]
    command = click.get_current_context().command_path
    names = ", ".join(stream_name(scope.stream) for scope in scopes)
    raise ConfigError(f"'{command}' acts on one stream and {len(scopes)} are configured ({names}): pass --stream NAME")


def streams_text(scopes: Sequence[Scope]) -> str:
    """``stream 'orders'``, or ``streams 'orders', 'payments'``, for sentences."""
    names = ", ".join(repr(scope.stream) for scope in scopes)
    return f"stream {names}" if len(scopes) == 1 else f"streams {names}"


def scoped(*, need_app: bool) -> Callable[[Command], Command]:
    """Add the settings options to a command that acts on one stream and hand it a :class:`Scope`
    as ``scope`` (refused without --stream when several streams are configured)."""

    def decorate(command: Command) -> Command:
        @functools.wraps(command)
        def with_scope(*args: Any, config: str | None, stream: str | None, app: str | None, **kwargs: Any) -> Any:
            scope = one_stream(load_scopes(config, stream, app, need_app=need_app))
            return command(*args, scope=scope, **kwargs)

        return settings_options(with_scope)  # type: ignore[return-value]

    return decorate


def scoped_streams(*, need_app: bool) -> Callable[[Command], Command]:
    """Add the settings options to a command that shows every configured stream (or the one
    --stream names) and hand it their :class:`Scope` list as ``scopes``."""

    def decorate(command: Command) -> Command:
        @functools.wraps(command)
        def with_scopes(*args: Any, config: str | None, stream: str | None, app: str | None, **kwargs: Any) -> Any:
            return command(*args, scopes=load_scopes(config, stream, app, need_app=need_app), **kwargs)

        return settings_options(with_scopes)  # type: ignore[return-value]

    return decorate


# ---- AWS: the stream, the lease table ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connection:
    """The clients of one command, with its stream described (so a missing stream fails first)."""

    scope: Scope
    clients: Clients
    kinesis: Any
    stream: StreamInfo

    async def lease_table(self) -> LeaseTable:
        """The application's rows in the lease table, which must exist."""
        app = self.scope.require_app()
        table = LeaseTable(
            await self.clients.dynamodb(),
            table=str(self.scope.table),
            app=app,
            stream_arn=self.stream.arn,
            worker_id="efo-cli",
        )
        try:
            await table.ensure_table(create=False)
        except ResourceNotFound as exc:
            raise ResourceNotFound(f"{exc}; {NO_TABLE}") from None
        return table

    async def table_state(self) -> TableState:
        """Every row of the application on this stream; ResourceNotFound when it has none."""
        table = await self.lease_table()
        state = await table.read()
        if state.meta is None and not state.leases and not state.workers:
            raise ResourceNotFound(
                f"application {self.scope.app!r} has no rows for stream {self.stream.name!r} in DynamoDB table "
                f"{table.table!r}; check --app (or EFO_APP, EFO_TABLE), or start 'efo run' once"
            )
        return state


def live_workers(state: TableState, scope: Scope) -> set[str]:
    """The workers whose heartbeat is younger than ``lease.failover_s``, now."""
    statuses = worker_statuses(state, now(), scope.settings.lease.failover_s)
    return {worker_id for worker_id, status in statuses.items() if status.live}


def with_stream(scope: Scope, body: Callable[[Connection], Awaitable[T]]) -> T:
    """Run ``body`` with the AWS clients and the described stream."""
    [result] = for_each_stream([scope], body).results
    return result


@dataclass(frozen=True, slots=True)
class Covered(Generic[T]):
    """What a command found on each stream it covers: the results in the streams' order, and what
    was not found (one sentence each, without repeats: a missing lease table is missing once)."""

    results: list[T]
    missing: list[str]

    def report_missing(self) -> int:
        """Each thing not found as its own error line: exit 3 when there is one, else 0."""
        for message in self.missing:
            click.echo(f"efo: {message}", err=True)
        return EXIT_NOT_FOUND if self.missing else EXIT_OK


def for_each_stream(scopes: Sequence[Scope], body: Callable[[Connection], Awaitable[T]]) -> Covered[T]:
    """Run ``body`` on each stream in turn, with one set of AWS clients. With one stream, anything
    not found fails the command (exit 3); with several, a stream that is not found (or an
    application without rows on it) is kept in :attr:`Covered.missing` and the others are shown."""
    settings = scopes[0].settings  # the endpoints and the region are the application's, not a stream's
    operator_logging()

    async def main() -> Covered[T]:
        endpoints = Endpoints(settings.region, settings.kinesis_endpoint, settings.dynamodb_endpoint)
        covered: Covered[T] = Covered([], [])
        try:
            async with Clients(endpoints) as clients:
                kinesis = await clients.kinesis()
                for scope in scopes:
                    try:
                        stream = await describe_stream(kinesis, scope.stream)
                        covered.results.append(await body(Connection(scope, clients, kinesis, stream)))
                    except ResourceNotFound as exc:
                        if len(scopes) == 1:
                            raise
                        if str(exc) not in covered.missing:
                            covered.missing.append(str(exc))
        except EfoError:
            raise
        except Exception as exc:  # e.g. no region configured: one line and its exit code, no traceback
            raise translate(exc, resource="the AWS clients") from None
        return covered

    return asyncio.run(main())


def operator_logging() -> None:
    """Only warnings of the libraries reach standard error, as plain lines: what a command did, it
    says itself. (The service's configure_logging turns standard error into JSON lines for a log
    pipeline; an operator's terminal or script gets plain lines, errors included.)"""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


# ---- output --------------------------------------------------------------------------------------


def stdout_console() -> Console:
    """Tables on standard output: as wide as the terminal on one, never wrapped in a pipe."""
    terminal = sys.stdout.isatty()
    return Console(highlight=False, soft_wrap=not terminal, width=None if terminal else 100_000)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


class Column(NamedTuple):
    header: str
    text: Callable[[dict[str, Any]], str]
    style: Callable[[dict[str, Any]], str] | None = None  # a rich style, seen on a terminal only


#: The first column of every listing that covers the configured streams.
STREAM_COLUMN = Column("stream", lambda r: r["stream"])


def print_table(records: Sequence[dict[str, Any]], columns: Sequence[Column], *, empty: str) -> None:
    """One row per record; ``empty`` (a sentence on standard error) when there is none. Empty cells
    print as ``-`` so that every row splits into the same number of words."""
    if not records:
        print(empty, file=sys.stderr)
        return
    table = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
    for column in columns:
        table.add_column(column.header.upper(), overflow="fold")
    for record in records:
        cells = []
        for column in columns:
            text = column.text(record) or "-"
            style = column.style(record) if column.style else ""
            cells.append(f"[{style}]{escape(text)}[/]" if style else escape(text))
        table.add_row(*cells)
    console = stdout_console()
    if console.is_terminal:
        console.print(table)
        return
    with console.capture() as captured:
        console.print(table)
    print("\n".join(line.rstrip() for line in captured.get().splitlines()))


def say(message: str) -> None:
    """A sentence for people on standard output (what a command did)."""
    print(message)


def iso(moment: datetime | None) -> str | None:
    """A time for ``--json``: ISO-8601 in UTC."""
    return None if moment is None else moment.astimezone(UTC).isoformat()


def shown(moment: datetime | str | None) -> str:
    """A time (or its ISO-8601 text) for people: ``2026-11-23 14:46:08Z``."""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    return "" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def now() -> datetime:
    return datetime.now(UTC)


# ---- confirmation and waiting --------------------------------------------------------------------


class NotConfirmed(EfoError):
    exit_code = EXIT_RUNTIME


def refuse_without_terminal(action: str, *, yes: bool) -> None:
    """Before anything is read: without ``--yes`` a command asks on a terminal, and refuses (exit 2)
    when there is none to ask on."""
    if not yes and not sys.stdin.isatty():
        raise ConfigError(f"refusing to {action} without --yes (there is no terminal to ask on)")


def confirm(question: str, *, yes: bool) -> None:
    """Ask ``question`` on the terminal unless ``--yes``; a no (or no answer) does nothing, exit 1."""
    if yes:
        return
    if not click.confirm(question, default=False, err=True):
        raise NotConfirmed("nothing done: not confirmed")


@contextmanager
def progress(message: str) -> Iterator[Callable[[str], None]]:
    """A spinner on standard error while waiting, updated with the yielded function; without a
    terminal, ``message`` once (scripts see what they are waiting for, and no animation)."""
    console = Console(stderr=True, highlight=False)
    if not console.is_terminal:
        print(message, file=sys.stderr)
        yield lambda _text: None
        return
    with console.status(message) as status:
        yield lambda text: status.update(text)


async def wait_until(
    check: Callable[[], Awaitable[tuple[bool, str]]], *, message: str, timeout_s: float, interval_s: float = 0.5
) -> tuple[bool, float]:
    """Poll ``check`` (done, what to show) until done or ``timeout_s``: (done, seconds waited)."""
    started = time.monotonic()
    with progress(message) as update:
        while True:
            done, text = await check()
            waited_s = time.monotonic() - started
            if done or waited_s >= timeout_s:
                return done, waited_s
            update(f"{text} ({waited_s:.0f} s)")
            await asyncio.sleep(interval_s)
