"""The docs stay in step with the code."""

from pathlib import Path

import harness.ppo.objectives  # noqa: F401  (registers what each objective reports)
from harness.metrics import STEP_METRICS, markdown

ROOT = Path(__file__).resolve().parents[2]


def test_metrics_doc_is_generated_from_the_vocabulary():
    assert (ROOT / "docs" / "metrics.md").read_text() == markdown()
    assert len(STEP_METRICS) >= 40


def test_readme_names_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert "make test" in text and "make ablate" in text


def test_fields_command_lists_every_config_field_with_help():
    from typer.testing import CliRunner

    from harness.cli import app
    from harness.config import RunConfig
    from harness.core.fields import field_help

    helps = field_help(RunConfig)
    assert all(helps.values()), [k for k, v in helps.items() if not v]  # a help string per field
    r = CliRunner().invoke(app, ["fields", "ppo."], env={"COLUMNS": "250"})
    assert r.exit_code == 0
    assert "ppo.eps_clip_higher" in r.output and "ppo.adv_norm.mean_leave1out" in r.output
    assert "rollout.staleness" not in r.output
