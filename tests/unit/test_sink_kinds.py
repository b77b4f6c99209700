"""Sink kinds: each declared once (efo.sink_kinds, the grammar the settings take) and written by one
module of the Spark side (sparkbridge.sinks.<kind>), whose capabilities agree with the declaration."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from efo.config import SinkSpec, load_settings
from efo.errors import ConfigError
from efo.sink_kinds import SINK_GRAMMAR, SINK_KINDS, Target
from sparkbridge.sinks import capabilities_of, make_sink, sink_class

EXAMPLE_TARGETS = {Target.NONE: "", Target.PATH: "/tmp/out", Target.FUNCTION: "efo_sink_kinds_fn:write"}


@pytest.fixture
def function_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "efo_sink_kinds_fn.py").write_text("def write(df, batch): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "efo_sink_kinds_fn", raising=False)


def test_the_grammar_lists_every_kind_as_before() -> None:
    assert SINK_GRAMMAR == "parquet:<path or URI>, handler:<module>:<function>, arrow:<module>:<function>, console"


@pytest.mark.usefixtures("function_module")
@pytest.mark.parametrize("kind", SINK_KINDS, ids=lambda kind: kind.name)
def test_every_declared_kind_has_its_module_whose_sink_takes_what_the_declaration_says(kind: object) -> None:
    from efo.sink_kinds import SinkKind

    assert isinstance(kind, SinkKind)
    target = EXAMPLE_TARGETS[kind.target]
    spec = SinkSpec.parse(f"{kind.name}:{target}" if target else kind.name)
    assert spec.declared is kind
    assert sink_class(kind.name) is type(make_sink(spec))
    assert capabilities_of(make_sink(spec)).takes_arrow is (not kind.needs_spark)


@pytest.mark.parametrize("text", ["parquet", "parquet:", "handler:nocolon", "arrow:a b:c", "console:x", "delta:/x"])
def test_a_sink_setting_outside_the_grammar_names_the_field_and_every_kind(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(stream="s", app="a", sink=text)
    assert "EFO_SINK" in str(caught.value) and SINK_GRAMMAR in str(caught.value)


def test_a_sink_of_the_callers_that_declares_nothing_gets_a_dataframe_made_on_the_driver() -> None:
    class Mine:
        def write(self, df: object, batch: object) -> None:
            pass

    capabilities = capabilities_of(Mine())
    assert (capabilities.takes_arrow, capabilities.rows_in_tasks) == (False, False)


def test_only_the_kinds_that_need_no_spark_let_an_arrow_sink_start_without_it() -> None:
    with pytest.raises(ConfigError, match="value_format"):
        load_settings(stream="s", app="a", sink="arrow:m:f", value_format="utf8")
    with pytest.raises(ConfigError, match="dead_letter_sink"):
        load_settings(stream="s", app="a", sink="arrow:m:f", dead_letter_sink="console")
    assert load_settings(stream="s", app="a", sink="arrow:m:f", dead_letter_sink="arrow:m:g").dead_letter_sink
