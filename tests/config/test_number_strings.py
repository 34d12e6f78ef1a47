"""One rule of string coercion for every number field: a number is written as a number.

A value that YAML would read as a number but that was quoted (``"10"``) is a string, and a number
field refuses it with one line naming the field (exit 2, nothing written): in a run file, in an
experiment file, in ``--set`` and in ``task_options`` alike.  ``--set steps=10`` is parsed as
YAML, so it is the number.  Text that YAML itself leaves a string, ``1e-3`` (PyYAML reads an
exponent without a dot as text), is the number it spells."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.config.experiment import load_experiment
from harness.config.loading import load_run_config
from harness.core.configtools import ConfigError, check_value, parse_override
from harness.sweep.scheduler.spec import StudySpec
from harness.tasks import get_task
from tests.support.tiny import TINY

BASE = {
    "task": "reverse",
    "tiny": TINY,
    "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 4},
    "eval": {"every": 0, "n_prompts": 4},
    "steps": 2,
}


def _cli(argv: list[str], tmp: Path) -> tuple[int, str, Path]:
    results = tmp / "results"
    r = CliRunner().invoke(app, [*argv, "--results-dir", str(results)])
    return r.exit_code, r.stderr if r.stderr is not None else r.output, results


def _assert_refused(code: int, err: str, results: Path, expect: str) -> None:
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2, (code, err[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert expect in lines[0], (expect, lines[0])
    assert "(write it without quotes)" in lines[0]
    assert not results.exists(), sorted(p.name for p in results.rglob("*"))


def _experiment(tmp: Path, **over: object) -> Path:
    doc = {
        "name": "strings",
        "base": BASE,
        "grid": {"ppo.eps_clip": [0.1, 0.2]},
        "seeds": 1,
        "steps": 2,
        **over,
    }
    path = tmp / "e.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


# --- a run file (harness run) -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expect",
    [
        ('steps: "10"', "steps: must be an integer, not a string; got '10'"),
        ("ppo: {eps_clip: '0.3'}", "ppo.eps_clip: must be a number, not a string; got '0.3'"),
    ],
)
def test_a_run_file_number_in_quotes_is_one_line(text, expect, tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({k: v for k, v in BASE.items() if k != "steps"}) + text + "\n")
    _assert_refused(*_cli(["run", str(run)], tmp_path), expect)


# --- --set (harness run) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "setting,expect",
    [
        ('steps="10"', "--set steps=\"10\": must be an integer, not a string; got '10'"),
        ("optim.lr='0.001'", "--set optim.lr='0.001': must be a number, not a string; got '0.001'"),
    ],
)
def test_a_set_number_in_quotes_is_one_line(setting, expect, tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump(BASE))
    _assert_refused(*_cli(["run", str(run), "--set", setting], tmp_path), expect)


def test_a_set_number_without_quotes_is_the_number(tmp_path):
    assert parse_override("steps=10") == ("steps", 10)
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump(BASE))
    cfg = load_run_config(run, ["steps=10", "optim.lr=1e-3", "ppo.eps_clip=0.3"])
    assert (cfg.steps, cfg.optim.lr, cfg.ppo.eps_clip) == (10, 0.001, 0.3)


# --- an experiment file (harness ablate --dry-run) ----------------------------------------------


@pytest.mark.parametrize(
    "over,expect",
    [
        ({"steps": "10"}, "steps: must be an integer, not a string; got '10'"),
        (
            {"base": {**BASE, "optim": {"lr": "0.001"}}},
            "optim.lr: must be a number, not a string; got '0.001'",
        ),
        (
            {"grid": {"ppo.eps_clip": ["0.1", 0.2]}},
            "grid.ppo.eps_clip: value '0.1' rejected: must be a number, not a string",
        ),
    ],
)
def test_an_experiment_number_in_quotes_is_one_line(over, expect, tmp_path):
    path = _experiment(tmp_path, **over)
    _assert_refused(*_cli(["ablate", str(path), "--dry-run"], tmp_path), expect)


# --- task_options, in an experiment file and with --set -----------------------------------------


@pytest.mark.parametrize(
    "options,expect",
    [
        ({"eval_fraction": "0.2"}, "task_options.eval_fraction: must be a number, not a string"),
        ({"max_rows": "10"}, "task_options.max_rows: must be an integer, not a string; got '10'"),
    ],
)
def test_a_task_option_in_quotes_is_one_line(options, expect, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"prompt": "{i}=", "answer": "{i}"}}\n' for i in range(20)))
    base = {**BASE, "task": f"jsonl:{data}", "task_options": options}
    path = _experiment(tmp_path, base=base)
    _assert_refused(*_cli(["ablate", str(path), "--dry-run"], tmp_path), expect)
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump(BASE))
    ((name, value),) = options.items()
    argv = [
        "run",
        str(run),
        "--set",
        f"task=jsonl:{data}",
        "--set",
        f'task_options.{name}="{value}"',
    ]
    _assert_refused(*_cli(argv, tmp_path), expect)


# --- what YAML leaves a string, and the rule's edges --------------------------------------------


def test_an_exponent_without_a_dot_is_the_number_everywhere(tmp_path):
    """PyYAML reads ``1e-3`` and ``5e-1`` as text; in a file they are the numbers they spell."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"prompt": "{i}=", "answer": "{i}"}}\n' for i in range(20)))
    base = {k: v for k, v in BASE.items() if k != "steps"}
    text = yaml.safe_dump({**base, "task": f"jsonl:{data}"})
    text += "optim: {lr: 1e-3}\ntask_options: {eval_fraction: 5e-1}\n"
    assert yaml.safe_load(text)["optim"]["lr"] == "1e-3"  # what the loader hands on: text
    run = tmp_path / "run.yaml"
    run.write_text(text)
    cfg = load_run_config(run)
    assert cfg.optim.lr == 0.001
    assert get_task(cfg.task, **cfg.task_options).eval_fraction == 0.5
    spec = load_experiment(_experiment(tmp_path, grid={"optim.lr": ["1e-3", "3e-4"]}))
    study = StudySpec.from_experiment(spec)
    assert [study.cell_config(c.label, 0).optim.lr for c in spec.cells] == [0.001, 0.0003]


@pytest.mark.parametrize(
    "value,tp,expect",
    [
        ("10", int, "x: must be an integer, not a string; got '10'"),
        ("10", float, "x: must be a number, not a string; got '10'"),
        ("10", int | float, "x: must be a number, not a string; got '10'"),
        ("1.5", float | None, "x: must be a number, not a string; got '1.5'"),
        (".inf", float, "x: must be a number, not a string; got '.inf'"),
        ("1e3", int, "x: must be an integer; got '1e3'"),  # 1000.0 is not an integer either
    ],
)
def test_the_rule_on_one_value(value, tp, expect):
    with pytest.raises(ConfigError) as err:
        check_value(value, tp, {}, "x")
    assert str(err.value).startswith(expect), str(err.value)


def test_text_fields_and_choices_keep_their_text():
    assert check_value("10", str | float, {}, "x") == "10"  # a field that takes text: the text
    assert check_value("2e-2", float, {}, "x") == 0.02
    assert check_value(10, float, {}, "x") == 10.0
