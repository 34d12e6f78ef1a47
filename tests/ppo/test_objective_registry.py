"""The objective registry: one declaration feeds validation, dispatch, peers and docs.

A made-up objective registered here shows up everywhere the registry is read; the retired flat
keys (``ppo.cispo_ratio_max``) are one-line errors naming the new nested key."""

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from harness.cli import app
from harness.config import build_run_config
from harness.core.configtools import ConfigError, from_dict
from harness.core.fields import field_defaults, meta
from harness.metrics import markdown
from harness.peers.trl import trl_problems
from harness.ppo import PPOActorConfig
from harness.ppo.objectives import OBJECTIVES, Options, Terms, objective_loss, register
from harness.ppo.objectives.docs import metrics_markdown, objectives_markdown
from harness.ppo.objectives.registry import lookup, renamed_keys, unregister

ROOT = Path(__file__).resolve().parents[2]


def test_objectives_table_is_generated_from_the_registry():
    assert objectives_markdown() in (ROOT / "docs" / "objectives.md").read_text(), (
        "regenerate with python -m harness.ppo.objectives table"
    )
    assert (ROOT / "docs" / "metrics.md").read_text() == metrics_markdown()


def test_every_objective_declares_its_options_once_with_help_and_defaults():
    defaults = field_defaults(PPOActorConfig)
    for o in OBJECTIVES.values():
        for f in o.option_fields():
            assert f.metadata["help"], (o.name, f.name)
            # the config's default IS the declaration's (no second copy to drift)
            assert defaults[f"{o.name}.{f.name}"] == f.default
    assert defaults["cispo.ratio_max"] == 5.0 and defaults["sapo.temperature_neg"] == 1.05


@pytest.mark.parametrize("old, new", sorted(renamed_keys().items()))
def test_retired_flat_keys_name_their_new_key(old, new):
    with pytest.raises(ConfigError) as err:
        build_run_config({"ppo": {old: 1.5}})
    assert str(err.value) == f"ppo.{old}: renamed to ppo.{new}"


def test_retired_key_on_the_command_line_is_one_line_exit_2(tmp_path):
    results = tmp_path / "r"
    args = ["run", "experiments/run-default.yaml", "--results-dir", str(results)]
    r = CliRunner().invoke(app, [*args, "--set", "ppo.cispo_ratio_max=3"])
    assert r.exit_code == 2
    lines = [ln for ln in (r.stderr or r.output).splitlines() if ln.strip()]
    assert lines == ["error: --set ppo.cispo_ratio_max=3: renamed to ppo.cispo.ratio_max"]
    assert not results.exists() or not (results / "mlflow.db").exists()


def test_nested_keys_from_the_command_line_and_yaml():
    cfg = build_run_config({}, ["ppo.policy_loss=cispo", "ppo.cispo.ratio_max=3"])
    assert cfg.ppo.cispo.ratio_max == 3.0 and cfg.ppo.cispo.ratio_min is None
    cfg = build_run_config({"ppo": {"policy_loss": "sapo", "sapo": {"temperature_pos": 0.5}}})
    assert cfg.ppo.sapo.temperature_pos == 0.5
    with pytest.raises(ConfigError, match=r"^ppo\.sapo\.nope: unknown key"):
        build_run_config({"ppo": {"sapo": {"nope": 1}}})


def test_grid_over_a_nested_key_dry_runs(tmp_path):
    f = tmp_path / "g.yaml"
    f.write_text(
        "name: g\nbase: {task: reverse, ppo: {policy_loss: cispo}}\n"
        "grid: {ppo.cispo.ratio_max: [2.0, 5.0]}\nseeds: 1\nsteps: 2\n"
        "baseline: {ppo.cispo.ratio_max: 5.0}\nmetric: final/reward\n"
    )
    r = CliRunner().invoke(app, ["ablate", str(f), "--dry-run"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "ratio_max=2.0" in r.output and "ratio_max=5.0" in r.output


# ------------------------------------------------------------------ a made-up objective


@dataclass(frozen=True)
class ScaledOptions(Options):
    scale: float = field(default=1.0, metadata=meta("Made up: multiplies −A·r.", gt=0, le=10))


def _scaled_terms(p, o, ctx):
    """Made up: L = −scale·A·r (scale 1 when the config has no block for it)."""
    scale = 1.0 if o is None else o.scale
    return Terms(-scale * p.adv * p.ratio, reweighted=p.adv < 0)


@pytest.fixture
def made_up():
    spec = register(
        "made_up",
        summary="a test objective: −scale·A·r",
        rank=99,
        options=ScaledOptions,
        aggregations=("token-mean", "seq-mean-token-mean"),
        stats={"policy/reweighted_frac": "tokens with A < 0 (made up)"},
    )(_scaled_terms)
    yield spec
    unregister("made_up")
    assert "made_up" not in OBJECTIVES


def test_made_up_objective_is_validated_dispatched_and_documented(made_up):
    cfg = PPOActorConfig(policy_loss="made_up")
    lt = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    lp = torch.tensor([[-1.0, -2.0 - 0.5]], dtype=torch.float64)
    adv = torch.tensor([[2.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True]])
    loss, stats = objective_loss(cfg, lt, lp, lp, adv, mask)
    # token-mean of −A·r: (−2·1 + 1·e^0.5) / 2
    want = (-2.0 + torch.exp(torch.tensor(0.5, dtype=torch.float64))) / 2
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)
    assert stats["reweighted_mask"].tolist() == [[False, True]]
    # its pure function, its options by name, bounds from the declaration
    loss2, _ = made_up.loss(lt, lp, lp, adv, mask, scale=2.0)
    assert loss2.item() == pytest.approx(2 * want.item(), rel=1e-12)
    with pytest.raises(ValueError, match=r"^made_up\.scale: must be a finite number in \(0, 10\]"):
        made_up.loss(lt, lp, lp, adv, mask, scale=11.0)
    # the levels and aggregations it allows
    with pytest.raises(ValueError, match="importance_sampling_level 'sequence' means nothing"):
        PPOActorConfig(policy_loss="made_up", importance_sampling_level="sequence")
    with pytest.raises(ValueError) as err:
        from_dict(
            PPOActorConfig,
            {"policy_loss": "made_up", "loss_agg_mode": "seq-mean-token-sum"},
            "ppo",
        )
    assert str(err.value) == (
        "ppo.loss_agg_mode 'seq-mean-token-sum' means nothing under policy_loss 'made_up' "
        "(allowed: token-mean, seq-mean-token-mean)"
    )
    # docs: the objectives table row and the per-objective metric section
    assert "| `made_up` | a test objective: −scale·A·r | `ppo.made_up.scale` 1.0 |" in (
        objectives_markdown()
    )
    assert "| `made_up` | `policy/reweighted_frac` | tokens with A < 0 (made up) |" in markdown()
    assert lookup("made_up") is made_up
    # peers: TRL has no loss_type for it
    run = build_run_config({}, [])
    run.ppo.policy_loss = "made_up"
    have = ", ".join(o.name for o in OBJECTIVES.values() if o.trl is not None)
    assert have.startswith("ppo, cispo, sapo")
    assert ("ppo.policy_loss", f"TRL has no loss_type for 'made_up' ({have})") in trl_problems(run)


def test_unselected_objective_options_and_clip_options_are_refused(made_up):
    with pytest.raises(ValueError) as err:
        from_dict(PPOActorConfig, {"policy_loss": "made_up", "cispo": {"ratio_max": 3.0}}, "ppo")
    assert str(err.value) == (
        "ppo.cispo.ratio_max means nothing under policy_loss 'made_up' (it is an option of "
        "cispo); leave it at 5.0"
    )
    with pytest.raises(ValueError, match=r"^ppo\.eps_clip means nothing under policy_loss"):
        from_dict(PPOActorConfig, {"policy_loss": "made_up", "eps_clip": 0.3}, "ppo")


def test_registering_twice_or_an_unknown_metric_is_refused(made_up):
    with pytest.raises(ValueError, match="registered twice"):
        register("made_up", summary="again")(_scaled_terms)
    with pytest.raises(KeyError, match="not in harness.metrics.STEP_METRICS"):
        register("bad_metric", summary="x", stats={"policy/nope": "?"})(_scaled_terms)
    assert "bad_metric" not in OBJECTIVES


@pytest.mark.parametrize(
    "base, grid, expect",
    [
        (
            "{}",
            "{ppo.cispo_ratio_max: [2.0, 5.0]}",
            "ppo.cispo_ratio_max: renamed to ppo.cispo.ratio_max",
        ),
        (
            "{ppo: {sapo_temperature_pos: 2.0}}",
            "{ppo.eps_clip: [0.1, 0.2]}",
            "base: ppo.sapo_temperature_pos: renamed to ppo.sapo.temperature_pos",
        ),
    ],
)
def test_retired_keys_in_an_experiment_file_name_the_new_key(base, grid, expect, tmp_path):
    f = tmp_path / "g.yaml"
    f.write_text(f"name: g\nbase: {base}\ngrid: {grid}\nseeds: 1\nsteps: 2\nmetric: final/reward\n")
    r = CliRunner().invoke(app, ["ablate", str(f), "--dry-run", "--results-dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in (r.stderr or r.output).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], lines
