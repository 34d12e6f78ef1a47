"""`harness export`: a cell in TRL / verl / AReaL names; each mapping pinned; TRL output builds a
valid GRPOConfig; what a target lacks is a comment; --best takes a finished study's top cell."""

import functools
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.config import build_run_config
from harness.config.experiment import load_experiment
from harness.peers.export import export_areal, export_trl, export_verl
from harness.sweep.scheduler.spec import StudySpec
from tests.support.extras import usable_here

ROOT = Path(__file__).resolve().parents[2]
GROUP = {"mean_level": "group", "std_level": "group"}


def export(args: list[str]) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, ["export", *args])
    err = r.stderr if r.stderr is not None else ""
    return r.exit_code, r.stdout, err


def grpo_config_from(text: str, tmp_path: Path):
    """Run the exported snippet (it imports GRPOConfig itself) and return its ``args``."""
    namespace: dict = {}
    exec(compile(text, "export", "exec"), namespace)  # noqa: S102 — our own printed code
    return namespace["args"]


def shipped_grid_cells():
    for f in sorted((ROOT / "experiments").rglob("*.yaml")):
        doc = yaml.safe_load(f.read_text())
        if isinstance(doc, dict) and "grid" in doc and usable_here(f):
            spec = load_experiment(f)
            for i, c in enumerate(spec.cells):
                yield pytest.param(f, c.label, i == 0, id=f"{f.stem}:{c.label}")


@functools.cache
def _study_spec(path: Path) -> StudySpec:
    # Validating a file checks every cell (a second per ~5 cells): once per file, not per cell.
    return StudySpec.from_experiment(load_experiment(path))


@pytest.mark.parametrize(("path", "label", "through_cli"), list(shipped_grid_cells()))
def test_every_shipped_cell_exports_to_a_valid_grpo_config(path, label, through_cli, tmp_path):
    """Every cell's snippet builds a GRPOConfig; the first cell of each file goes through
    ``harness export`` itself (the others through the function the command prints)."""
    ss = _study_spec(path)
    cfg = ss.cell_config(label, 0)
    if through_cli:
        code, out, err = export([str(path), "--cell", label, "--to", "trl"])
        assert code == 0, err
        assert out.startswith(f"# harness cell {label!r}")
        assert out.endswith(export_trl(cfg))
    else:
        out = export_trl(cfg)
    args = grpo_config_from(out, tmp_path)
    assert args.epsilon == cfg.ppo.eps_clip
    assert args.num_generations == cfg.rollout.n_samples
    assert args.generation_batch_size == cfg.rollout.prompts_per_step * cfg.rollout.n_samples
    assert args.max_steps == ss.steps * cfg.ppo.ppo_n_minibatches * cfg.ppo.ppo_epochs
    # what TRL cannot express is named, never dropped silently
    if cfg.ppo.adv_norm is not None:
        assert "# ppo.adv_norm: not expressible in TRL" in out
    if cfg.rollout.staleness:
        assert "# rollout.staleness: not expressible in TRL" in out


def test_trl_export_pins_the_mapping(tmp_path):
    cfg = build_run_config(
        {},
        {
            "ppo.eps_clip": 0.1,
            "ppo.eps_clip_higher": 0.3,
            "ppo.c_clip": 4.0,
            "ppo.importance_sampling_level": "sequence",
            "ppo.loss_agg_mode": "seq-mean-token-mean",
            "ppo.reward_norm": {"mean_level": "group", "std_level": None},
            "ppo.ppo_epochs": 2,
            "optim.lr": 5e-5,
        },
    )
    out = export_trl(cfg)
    args = grpo_config_from(out, tmp_path)
    assert (args.epsilon, args.epsilon_high, args.delta) == (0.1, 0.3, 4.0)
    assert args.importance_sampling_level == "sequence" and args.loss_type == "grpo"
    assert args.scale_rewards == "none" and args.num_iterations == 2
    assert args.steps_per_generation == 4 and args.per_device_train_batch_size == 8
    assert args.learning_rate == 5e-5 and args.beta == 0.0
    assert not [ln for ln in out.splitlines() if ln.startswith("# ppo.")]  # all expressible


def test_verl_export_pins_the_mapping():
    base = {"ppo.reward_norm": GROUP, "ppo.eps_clip_higher": 0.28, "ppo.c_clip": 3.0}
    lines = export_verl(build_run_config({}, base)).splitlines()
    for expect in (
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.clip_ratio_c=3.0",
        "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 8 prompts / 4 minibatches
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=8",
        "data.max_response_length=12",
    ):
        assert expect in lines, (expect, lines)
    drgrpo = export_verl(
        build_run_config({}, {"ppo.reward_norm": {"mean_level": "group", "std_level": None}})
    )
    assert "algorithm.norm_adv_by_std_in_grpo=False" in drgrpo.splitlines()
    assert "actor_rollout_ref.actor.clip_ratio_c=1e9" in drgrpo  # verl always dual-clips
    assert "# ppo.c_clip null" in drgrpo
    rloo = export_verl(
        build_run_config(
            {},
            {
                "ppo.reward_norm": {
                    "mean_level": "group",
                    "mean_leave1out": True,
                    "std_level": None,
                }
            },
        )
    )
    assert "algorithm.adv_estimator=rloo" in rloo.splitlines()
    gspo_kl = export_verl(
        build_run_config(
            {},
            {
                "ppo.reward_norm": GROUP,
                "ppo.importance_sampling_level": "sequence",
                "ppo.kl_ctl": 0.05,
                "ppo.kl_estimator": "k3",
                "rollout.staleness": 2,
            },
        )
    ).splitlines()
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=gspo" in gspo_kl
    assert "algorithm.use_kl_in_reward=True" in gspo_kl
    assert "algorithm.kl_penalty=low_var_kl" in gspo_kl
    assert "algorithm.kl_ctrl.kl_coef=0.05" in gspo_kl
    assert any(ln.startswith("# rollout.staleness") for ln in gspo_kl)
    cov = export_verl(build_run_config({}, {"ppo.policy_loss": "clip_cov"})).splitlines()
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov" in cov
    assert "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.0002" in cov


def test_areal_export_pins_the_mapping():
    cfg = build_run_config(
        {},
        {
            "ppo.c_clip": 3.0,
            "ppo.adv_norm": {"mean_level": "batch", "std_level": "batch"},
            "rollout.staleness": 2,
            "ppo.use_decoupled_loss": True,
            "ppo.behave_imp_weight_mode": "token_mask",
            "ppo.behave_imp_weight_cap": 5.0,
            "ppo.ppo_epochs": 2,
        },
    )
    text = export_areal(cfg)
    doc = yaml.safe_load(text)
    a = doc["actor"]
    assert a["eps_clip"] == 0.2 and a["c_clip"] == 3.0 and a["use_decoupled_loss"] is True
    assert a["adv_norm"]["mean_level"] == "batch" and a["adv_norm"]["std_level"] == "batch"
    # AReaL main has no behave_imp_weight_*: the legacy mode is its rejection_sampling migration
    assert "behave_imp_weight_mode" not in a
    assert a["rejection_sampling"] == {
        "level": "token",
        "action": "mask",
        "metric": "ratio",
        "agg": "mean",
        "upper": 5.0,
        "lower": None,
    }
    assert a["ppo_n_minibatches"] == 4 and a["optimizer"]["lr"] == 3e-4
    assert doc["rollout"]["max_head_offpolicyness"] == 2
    assert doc["gconfig"] == {
        "n_samples": 4,
        "max_new_tokens": 12,
        "temperature": 1.0,
        "top_p": 1.0,
    }
    assert doc["train_dataset"]["batch_size"] == 8
    assert "# ppo.ppo_epochs=2" in text  # AReaL lacks it: named, not dropped


def test_cell_by_label_pairs_any_order_or_dotted(tmp_path):
    f = str(ROOT / "tests" / "fixtures" / "grid-2x2.yaml")
    outs = set()
    for cell in (
        "eps_clip=0.2 c_clip=3",
        "c_clip=3.0 eps_clip=0.2",
        "ppo.c_clip=3 ppo.eps_clip=0.2",
    ):
        code, out, err = export([f, "--cell", cell, "--to", "verl"])
        assert code == 0, err
        outs.add(out)
    assert len(outs) == 1 and "clip_ratio_c=3.0" in outs.pop()


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--cell", "c_clip=7", "--to", "trl"], "matches no cell"),
        (["--cell", "c_clip=3", "--to", "trl"], "matches 2 cells"),
        (["--cell", "c_clip=3", "--to", "rllib"], "--to must be one of"),
        (["--to", "trl"], "exactly one of --cell or --best"),
    ],
)
def test_bad_export_is_one_line_exit_2(args, expect, tmp_path):
    code, out, err = export([str(ROOT / "tests" / "fixtures" / "grid-2x2.yaml"), *args])
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert code == 2 and len(lines) == 1 and expect in lines[0], (code, err)
    assert out == ""


def test_best_takes_the_finished_studys_top_cell(tmp_path):
    from harness.report import ranking
    from harness.sweep.scheduler.results import load_study_data

    doc = yaml.safe_load((ROOT / "experiments" / "smoke.yaml").read_text())
    doc.update(name="exportbest", seeds=1, steps=2)
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    missing = export([str(exp), "--best", "--to", "trl", "--results-dir", str(results)])
    assert missing[0] == 2 and "no study store" in missing[2]
    r = CliRunner().invoke(app, ["ablate", str(exp), "--results-dir", str(results), "--no-report"])
    assert r.exit_code == 0, r.output
    code, out, err = export([str(exp), "--best", "--to", "areal", "--results-dir", str(results)])
    assert code == 0, err
    import optuna

    from harness.sweep.stores.storage import make_storage

    st = optuna.load_study(study_name="exportbest", storage=make_storage(None, results))
    top = ranking(load_study_data(st, None), n_boot=200)[0].label
    assert out.splitlines()[0].startswith(f"# harness cell {top!r}")
    c_clip = yaml.safe_load("\n".join(ln for ln in out.splitlines() if not ln.startswith("#")))[
        "actor"
    ]["c_clip"]
    assert c_clip == (None if top == "c_clip=none" else 3.0)
