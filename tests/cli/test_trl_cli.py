"""`harness run` with `trainer: trl` end to end (progress line, tracker, exit code), the chat-template
options TRL cannot take refused up front, and `--set` flags validated together."""

import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness import tracking
from harness.cli import app
from harness.cli.console import PROGRESS_KEYS, progress_info
from harness.config import ConfigError, load_run_config
from harness.tracking import MemoryTracker
from tests.support.tiny import TINY, TINY_SETS

ROOT = Path(__file__).resolve().parents[2]
GROUP = {"mean_level": "group", "std_level": "group"}


def trl_yaml(tmp_path: Path, *, minibatches: int, epochs: int, every: int, steps: int = 2) -> Path:
    """The reported config: trainer trl, group/group reward norm, no adv_norm, 4 prompts x 4
    samples (tiny model, few steps)."""
    doc = {
        "trainer": "trl",
        "steps": steps,
        "tiny": TINY,
        "threads": 1,
        "rollout": {"prompts_per_step": 4, "n_samples": 4, "max_new_tokens": 5},
        "ppo": {
            "ppo_n_minibatches": minibatches,
            "ppo_epochs": epochs,
            "reward_norm": GROUP,
            "adv_norm": None,
        },
        "eval": {"every": every, "n_prompts": 4},
    }
    path = tmp_path / "trl.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def stderr_of(result) -> str:
    return result.stderr if result.stderr is not None else result.output


def one_line_error(result, expect: str, results: Path) -> None:
    err = stderr_of(result)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert expect in lines[0], lines[0]
    assert not results.exists() or not any(results.iterdir())


# ---------------------------------------------------------------- the progress line


def test_progress_line_shows_only_what_the_trainer_logged():
    trl_step = {"objective/reward": 0.25, "policy/clipfrac": 0.0, "policy/entropy": 2.5}
    line = progress_info(trl_step, math.nan)
    assert line == "reward 0.25  eval acc —  clipfrac 0  entropy 2.5"
    assert "kl" not in line  # TRL logs no policy/approx_kl: no column for it, no KeyError
    harness_step = {**trl_step, "policy/approx_kl": 1e-3}
    assert progress_info(harness_step, 0.5) == (
        "reward 0.25  eval acc 0.5  clipfrac 0  kl 0.001  entropy 2.5"
    )
    assert progress_info({}, math.nan) == "eval acc —"  # a trainer that logged none of them
    assert [k for k, _ in PROGRESS_KEYS][0] == "objective/reward"


# ---------------------------------------------------------------- harness run, trainer: trl


@pytest.mark.parametrize(
    ("minibatches", "epochs", "every"),
    [(1, 1, 0), (2, 1, 1), (1, 2, 0), (4, 2, 2)],
    ids=["one-minibatch-no-eval", "two-minibatches-eval-every-step", "two-epochs", "4x2-eval-2"],
)
def test_harness_run_with_trainer_trl(minibatches, epochs, every, tmp_path, monkeypatch):
    tracker = MemoryTracker()
    monkeypatch.setattr(tracking, "open_tracker", lambda uri, results_dir: tracker)
    path = trl_yaml(tmp_path, minibatches=minibatches, epochs=epochs, every=every)
    r = CliRunner().invoke(app, ["run", str(path), "--results-dir", str(tmp_path / "results")])
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output and "KeyError" not in r.output
    assert "reward " in r.output and "entropy " in r.output and "completed" in r.output
    (run,) = tracker.runs.values()
    assert run.status == "FINISHED"
    assert [s for s, _ in run.metrics["objective/reward"]] == [0, 1]  # every step, not one point
    steps = [v for _, v in run.metrics["stability/optimizer_steps"]]
    assert steps == [minibatches * epochs] * 2
    assert "policy/approx_kl" not in run.metrics  # TRL does not produce it; nothing needs it
    evals = [s for s, _ in run.metrics["eval/accuracy"]]
    assert evals == ([0, 1] if every == 1 else [1])  # every N steps and always at the end
    assert run.params["trainer"] == "trl"
    assert run.tags["sampler"] == "TRL's generate (transformers)" and "sampler" in r.output


@pytest.mark.slow  # the reported command as typed, MLflow's SQLite store included (~20 s)
def test_the_reported_trl_run_records_every_step_in_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    results = tmp_path / "results"
    path = trl_yaml(tmp_path, minibatches=1, epochs=1, every=0, steps=3)
    r = CliRunner().invoke(app, ["run", str(path), "--results-dir", str(results)])
    assert r.exit_code == 0, r.output
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name == "harness-run"]
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    assert len(client.get_metric_history(run.info.run_id, "objective/reward")) == 3


# ---------------------------------------------------------------- chat templates under trl


@pytest.mark.parametrize("template", ["auto", "PATH"])
def test_trl_with_a_chat_template_is_refused_before_anything_runs(template, tmp_path):
    if template == "PATH":
        f = tmp_path / "t.jinja"
        f.write_text("{{ messages[0]['content'] }}")
        template = str(f)
    results = tmp_path / "results"
    path = trl_yaml(tmp_path, minibatches=1, epochs=1, every=0)
    doc = yaml.safe_load(path.read_text())
    doc["rollout"]["chat_template"] = template
    path.write_text(yaml.safe_dump(doc))
    r = CliRunner().invoke(app, ["run", str(path), "--results-dir", str(results)])
    what = "auto" if template == "auto" else "a template file"
    one_line_error(
        r,
        f"trl.yaml: rollout.chat_template: not expressible with trainer: trl (the trainer feeds "
        f"TRL the task's prompts as plain text, so {what} cannot be applied; use none)",
        results,
    )
    assert not results.exists()
    # the same as a flag names the flag
    r = CliRunner().invoke(
        app,
        [
            "run",
            str(trl_yaml(tmp_path, minibatches=1, epochs=1, every=0)),
            "--set",
            f"rollout.chat_template={template}",
            "--results-dir",
            str(results),
        ],
    )
    one_line_error(r, f"--set rollout.chat_template={template}: not expressible", results)
    assert not results.exists()


def test_trl_chat_template_in_an_experiment_fails_the_dry_run(tmp_path):
    doc = yaml.safe_load((ROOT / "experiments" / "smoke.yaml").read_text())
    doc["base"].update(trainer="trl", rollout={**doc["base"].get("rollout", {})})
    doc["base"]["rollout"]["chat_template"] = "auto"
    doc["base"]["ppo"]["reward_norm"] = GROUP
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    r = CliRunner().invoke(app, ["ablate", str(f), "--dry-run", "--results-dir", str(results)])
    one_line_error(r, "rollout.chat_template: not expressible with trainer: trl", results)


# ---------------------------------------------------------------- --set flags together


def test_flags_valid_only_together_are_accepted_together(tmp_path):
    cfg = load_run_config(
        None,
        [
            "trainer=trl",
            "ppo.reward_norm.mean_level=group",
            "ppo.reward_norm.std_level=group",
            "ppo.adv_norm=null",
        ],
    )
    assert cfg.trainer == "trl" and cfg.ppo.reward_norm.std_level == "group"
    f = tmp_path / "c3.yaml"
    f.write_text("ppo: {c_clip: 3}\n")
    cfg = load_run_config(f, ["ppo.c_clip=null", "ppo.policy_loss=cispo"])
    assert cfg.ppo.policy_loss == "cispo" and cfg.ppo.c_clip is None
    # a file that is invalid alone is fine when a flag repairs it
    g = tmp_path / "bad-alone.yaml"
    g.write_text("trainer: trl\n")
    assert load_run_config(g, ["ppo.reward_norm.mean_level=group"]).trainer == "trl"


@pytest.mark.parametrize(
    ("file", "sets", "expect"),
    [
        # the flag whose key the message names, even when another flag comes first
        (
            None,
            ["trainer=trl", "ppo.reward_norm.mean_level=batch"],
            "--set ppo.reward_norm.mean_level=batch: ppo.reward_norm: not expressible with "
            "trainer: trl",
        ),
        # no flag names the key: the first flag that brings the problem in
        (None, ["trainer=trl"], "--set trainer=trl: ppo.reward_norm: not expressible"),
        (
            "ppo: {c_clip: 3}\n",
            ["ppo.policy_loss=cispo"],
            "--set ppo.policy_loss=cispo: ppo.c_clip means nothing under policy_loss 'cispo'",
        ),
        # the file's own problem names the file, not an unrelated flag
        ("ppo: {eps_clip: -1}\n", ["steps=3"], "f.yaml: ppo.eps_clip: must be a finite number"),
        # a flag's own value, its key stripped from the message
        ("ppo: {eps_clip: 0.3}\n", ["ppo.eps_clip=-1"], "--set ppo.eps_clip=-1: must be a finite"),
    ],
    ids=["named-key", "first-cause", "cispo-vs-file", "file-itself", "own-value"],
)
def test_a_refusal_names_its_source(file, sets, expect, tmp_path):
    path = None
    if file is not None:
        path = tmp_path / "f.yaml"
        path.write_text(file)
    with pytest.raises(ConfigError) as err:
        load_run_config(path, sets)
    msg = str(err.value).replace(str(tmp_path) + "/", "")
    assert msg.startswith(expect), msg
    assert "\n" not in msg


def test_the_cli_takes_the_reported_flags_together(tmp_path, monkeypatch):
    tracker = MemoryTracker()
    monkeypatch.setattr(tracking, "open_tracker", lambda uri, results_dir: tracker)
    sets = [
        "trainer=trl",
        "ppo.reward_norm.mean_level=group",
        "ppo.reward_norm.std_level=group",
        "ppo.adv_norm=null",
        "steps=1",
        "ppo.ppo_n_minibatches=1",
        "rollout.prompts_per_step=2",
        "rollout.n_samples=2",
        "rollout.max_new_tokens=4",
        "eval.n_prompts=2",
        "threads=1",
        *TINY_SETS,
    ]
    args = ["run", "--results-dir", str(tmp_path / "r")]
    for s in sets:
        args += ["--set", s]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    (run,) = tracker.runs.values()
    assert run.status == "FINISHED" and run.params["trainer"] == "trl"


# ---------------------------------------------------------------- grid axes together


def _grid(tmp_path: Path, grid: dict) -> Path:
    doc = yaml.safe_load((ROOT / "experiments" / "smoke.yaml").read_text())
    doc["base"]["ppo"].pop("reward_norm", None)
    doc["base"]["ppo"].pop("adv_norm", None)
    doc["grid"] = grid
    doc.pop("baseline", None)
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


def test_a_grid_value_valid_only_with_its_cells_other_axes_is_accepted(tmp_path):
    from harness.config.experiment import load_experiment

    # trainer=trl alone on this base has no reward_norm TRL can express; every cell sets one
    f = _grid(tmp_path, {"trainer": ["harness", "trl"], "ppo.reward_norm.mean_level": ["group"]})
    spec = load_experiment(f)
    assert sorted(c.label for c in spec.cells) == [
        "mean_level=group trainer=harness",
        "mean_level=group trainer=trl",
    ]
    r = CliRunner().invoke(app, ["ablate", str(f), "--dry-run", "--results-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output


def test_a_grid_cell_that_stays_invalid_names_the_value(tmp_path):
    f = _grid(
        tmp_path, {"trainer": ["harness", "trl"], "ppo.reward_norm.mean_level": ["group", "batch"]}
    )
    results = tmp_path / "results"
    r = CliRunner().invoke(app, ["ablate", str(f), "--dry-run", "--results-dir", str(results)])
    one_line_error(
        r, "grid.trainer: value 'trl' rejected: ppo.reward_norm: not expressible", results
    )
