"""The reasoning recipes as shipped: docs/tasks.md's countdown-on-Qwen YAML loads as a run config
(a tiny Qwen2 directory with a chat template stands in for Qwen2.5-0.5B-Instruct), and
experiments/reasoning.yaml expands into its grid without training."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.config import load_run_config
from tests.support.docs import doc_block

pytest.importorskip("reasoning_gym")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_countdown_recipe_loads_as_a_run_config(docs_qwen):
    text = doc_block("# countdown-qwen.yaml")  # the recipe's 256 + 256 tokens fit the model
    Path("countdown-qwen.yaml").write_text(text)

    cfg = load_run_config("countdown-qwen.yaml")
    assert cfg.model == str(docs_qwen)
    assert cfg.task == "rg:countdown"
    assert cfg.task_options["min_numbers"] == 3 and cfg.task_options["format_weight"] == 0.1
    assert cfg.model_options.dtype == "bfloat16"
    assert cfg.model_options.lora is not None and cfg.model_options.lora.r == 16
    assert cfg.rollout.chat_template == "auto"
    assert (cfg.eval.samples, cfg.eval.k) == (8, 8)
    assert cfg.ppo.kl_ctl == pytest.approx(0.01)
    assert cfg.warm_start.steps == 0


def test_the_reasoning_experiment_dry_runs():
    r = CliRunner().invoke(
        app, ["ablate", str(ROOT / "experiments" / "reasoning.yaml"), "--dry-run"]
    )
    assert r.exit_code == 0, r.output
    assert "2 cells x 3 seeds = 6 trials" in r.output
    assert "variant=grpo" in r.output and "variant=dr_grpo" in r.output
