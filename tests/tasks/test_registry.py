"""The task-source registry: every listing is read from the declarations, a declaration is all a
new source needs, and an options block checks its bounds however it is built."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from harness.cli.commands.fields import field_rows
from harness.config import RunConfig
from harness.core.configtools import ConfigError
from harness.core.fields import field_help, option
from harness.tasks import get_task
from harness.tasks import registry as R
from harness.tasks.base import Example
from harness.tasks.pairs import PairOptions
from harness.tasks.reasoning import HARNESS_OPTIONS

ROOT = Path(__file__).resolve().parents[2]


def test_every_option_declares_its_help_and_every_integer_its_range():
    for source in R.SOURCES.values():
        hints = R.declared_types(source.options)
        for f in dataclasses.fields(source.options):
            assert f.metadata["help"], (source.form, f.name)
            if hints[f.name] is int:
                assert "ge" in f.metadata and "le" in f.metadata, (source.form, f.name)
            # the declared default passes its own declaration
            source.options()


def test_rg_reads_as_its_own_exactly_the_options_its_block_declares():
    fields = {f.name for f in dataclasses.fields(R.SOURCES["rg:NAME"].options)}
    assert fields == set(HARNESS_OPTIONS)


def test_the_listings_follow_the_declarations():
    forms = list(R.SOURCES)
    assert forms[:4] == ["reverse", "add", "sort", "mixed-scale"]
    assert {"jsonl:PATH", "csv:PATH", "hf:PATH", "rg:NAME"} <= set(forms)
    with pytest.raises(ValueError) as err:
        get_task("nope")
    assert str(err.value) == f"task: unknown task 'nope' (allowed: {', '.join(forms)})"
    # the task field's help names each source whose declaration asks for it, with its hint
    help_text = field_help(RunConfig)["task"]
    assert help_text == R.field_help()
    for source in R.SOURCES.values():
        assert (f"{source.form} " in help_text or f"{source.form} |" in help_text) == (
            source.field_help is not None
        ), source.form
        if source.field_help:
            assert source.field_help in help_text
    # harness fields task_options: one row per declared option and per further key
    rows = [(src, name) for src, name, _, _ in R.option_table()]
    want = {
        (s.label, f"task_options.{f.name}")
        for s in R.SOURCES.values()
        for f in dataclasses.fields(s.options)
    } | {(s.label, f"task_options.{k}") for s in R.SOURCES.values() for k in s.further}
    assert len(rows) == len(set(rows)) and set(rows) == want
    shown = [r for r in field_rows() if r[0].startswith("task_options.")]
    assert len(shown) == len(rows)
    assert ("task_options.eval_fraction", "0.1", "[csv:PATH] share of prompts held out.") in shown


def test_the_sources_table_of_the_docs_is_generated():
    assert R.sources_markdown() in (ROOT / "docs" / "tasks.md").read_text(), (
        "docs/tasks.md is stale: paste `python -m harness.tasks table` into it"
    )


class _Const:
    """A made-up task: every prompt is ``PREFIXi=``, and the answer ``i``."""

    max_new_tokens_hint = 4

    def __init__(self, name: str, prefix: str, count: int) -> None:
        self.name = name
        self.rows = [Example(f"{prefix}{i}=", str(i)) for i in range(count)]

    def sample(self, rng, n):  # noqa: ANN001, ANN201
        return [rng.choice(self.rows[1:]) for _ in range(n)]

    def eval_examples(self, n):  # noqa: ANN001, ANN201
        return self.rows[:1][:n]

    def score(self, example, completion):  # noqa: ANN001, ANN201
        return float(completion.strip() == example.answer)

    def demonstration(self, example):  # noqa: ANN001, ANN201
        return example.answer


@dataclasses.dataclass(frozen=True)
class _ConstOptions(R.TaskOptions):
    count: int = option(5, "prompts.", ge=2, le=100)


def test_one_declaration_is_a_whole_new_source(tmp_path):
    source = R.register(
        R.TaskSource(
            form="const:PREFIX",
            summary="a made-up source",
            build=lambda spec, prefix, o: _Const(spec, prefix, o.count),
            options=_ConstOptions,
            rank=99,
            field_help="",
        )
    )
    try:
        task = get_task("const:x", count=3)
        assert [e.prompt for e in task.rows] == ["x0=", "x1=", "x2="]
        assert "const:PREFIX" in R.allowed_forms() and "| const:PREFIX (" in R.field_help()
        assert ("const:PREFIX", "task_options.count", "5", "prompts.") in R.option_table()
        assert "| `const:PREFIX` | a made-up source | `count` 5 |" in R.sources_markdown()
        with pytest.raises(ConfigError, match=r"^task_options.count: must be an integer in \[2,"):
            get_task("const:x", count=1)
        with pytest.raises(ValueError, match=r"unknown option\(s\) size \(allowed: count\)$"):
            get_task("const:x", size=1)
        with pytest.raises(ValueError, match="is registered twice"):
            R.register(source)
        with pytest.raises(ValueError, match="prefix 'const:' is const:PREFIX's"):
            R.register(dataclasses.replace(source, form="const:OTHER"))
    finally:
        R.unregister(source.form)
    assert "const:" not in R.allowed_forms()


def test_an_option_without_help_is_refused_at_registration():
    @dataclasses.dataclass(frozen=True)
    class Bare(R.TaskOptions):
        count: int = 3

    with pytest.raises(TypeError, match=r"count: declare it with option\(default, help"):
        R.register(R.TaskSource("bare:X", "", lambda *a: None, Bare))  # type: ignore[arg-type, return-value]
    assert "bare:X" not in R.SOURCES


@pytest.mark.parametrize(
    "kwargs,expect",
    [
        ({"eval_fraction": 1.0}, "task_options.eval_fraction: must be a finite number in (0, 1)"),
        ({"reward": "fuzzy"}, "task_options.reward: must be one of"),
        ({"format_weight": -0.5}, "task_options.format_weight: must be a finite number in [0, 1]"),
    ],
)
def test_an_options_block_built_in_python_checks_its_declarations(kwargs, expect):
    with pytest.raises(ConfigError) as err:
        PairOptions(**kwargs)
    assert str(err.value).startswith(expect), str(err.value)


def test_an_options_block_converts_to_its_declared_type():
    o = PairOptions(format_weight=1)
    assert isinstance(o.format_weight, float) and o.format_weight == 1.0
    assert (
        typing.get_type_hints(PairOptions)["reward"]
        == typing.Literal["exact", "numeric", "math_verify"]
    )
