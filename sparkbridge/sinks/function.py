"""The function a ``handler:`` or ``arrow:`` sink names (``<module>:<function>``), imported when the
sink is made, so that a typo fails before Spark starts."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from efo.errors import ConfigError


def import_function(kind: str, target: str) -> Callable[..., Any]:
    module_name, _, function_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"sink (EFO_SINK) = '{kind}:{target}': cannot import module {module_name!r}: {exc}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"sink (EFO_SINK) = '{kind}:{target}': {module_name} has no function {function_name!r}")
    return function  # type: ignore[no-any-return]
