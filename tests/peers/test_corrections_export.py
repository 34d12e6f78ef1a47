"""ppo.correction in other frameworks' names: harness export (TRL vllm_importance_sampling_* and
off_policy_mask_threshold, verl algorithm.rollout_correction.*), the comments naming what a
target cannot express, and trainer: trl (opsm runs, IS weights are refused in one line)."""

from __future__ import annotations

import math
import shlex

import pytest

from harness.config import build_run_config
from harness.core.configtools import ConfigError
from harness.peers.corrections import trl_settings, verl_settings
from harness.peers.export import export_areal, export_trl, export_verl
from harness.peers.trl import grpo_kwargs, trl_problems
from harness.ppo.corrections import Correction, Filter

RC = "algorithm.rollout_correction"


def cfg(correction, **over):
    return build_run_config(
        {}, {"ppo.use_decoupled_loss": correction != "bypass", "ppo.correction": correction, **over}
    )


def verl_lines(correction) -> dict[str, str]:
    """The exported verl overrides as key → value (shell and Hydra quotes removed)."""
    out = {}
    for line in export_verl(cfg(correction)).splitlines():
        if line.startswith("#"):
            continue
        k, v = shlex.split(line)[0].split("=", 1)
        out[k] = v.strip('"')
    return out


def verl_comments(correction) -> list[str]:
    return [x for x in export_verl(cfg(correction)).splitlines() if x.startswith("#")]


@pytest.mark.parametrize(
    "name,expect",
    [
        ("token_tis", {"rollout_is": "token", "rollout_is_threshold": "2.0"}),
        ("seq_tis", {"rollout_is": "sequence", "rollout_is_threshold": "2.0"}),
        ("icepop", {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"}),
        ("k3_rs", {"rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.01"}),
        ("bypass", {"bypass_mode": "True", "loss_type": "ppo_clip"}),
    ],
)
def test_verl_export_of_the_presets(name, expect):
    lines = verl_lines(name)
    for k, v in expect.items():
        assert lines[f"{RC}.{k}"] == v, lines
    assert not [c for c in verl_comments(name) if "ppo.correction" in c]
    # the decoupled-loss note of a run without a correction is gone
    assert not [c for c in verl_comments(name) if "not mapped" in c and "behaviour" in c]


def test_verl_geo_rs_threshold_reads_back_as_the_bounds():
    lines = verl_lines("geo_rs")
    assert lines[f"{RC}.rollout_rs"] == "seq_mean_k1"
    lo, hi = (float(x) for x in lines[f"{RC}.rollout_rs_threshold"].split("_"))
    assert lo == pytest.approx(0.999, rel=1e-12) and hi == pytest.approx(1.001, rel=1e-12)


def test_verl_stacked_filters_and_ratio_filters_become_k1():
    c = Correction(
        weight="token",
        clip_max=3.0,
        log_clamp=20.0,
        batch_normalize=True,
        filters=(
            Filter(level="sequence", agg="sum", lower=0.5, upper=2.0),  # ratio: w ∈ [a, b]
            Filter(level="sequence", metric="k2", agg="max", upper=0.1),
        ),
        denominator="post",
    )
    kv, problems = verl_settings(c)
    got = dict(kv)
    assert problems == []
    assert got[f"{RC}.rollout_rs"] == "seq_sum_k1,seq_max_k2"
    assert got[f"{RC}.rollout_rs_threshold"] == "0.5_2.0,0.1"  # k1 ∈ [log 1/b, log 1/a]
    assert got[f"{RC}.rollout_is_batch_normalize"] is True


@pytest.mark.parametrize(
    "name,field",
    [
        ("opsm", "ppo.correction.filters[0]"),  # advantage sign: no verl option
        ("token_mis", "ppo.correction.clip_min"),  # TRL-style mask with no lower bound
        ("geo_mask", "ppo.correction.denominator"),  # SkyRL's pre-filter vs verl's post
    ],
)
def test_verl_names_what_it_cannot_express(name, field):
    comments = verl_comments(name)
    assert any(c.startswith(f"# {field}: not expressible in verl") for c in comments), comments


def test_trl_export_builds_a_grpo_config_with_the_vllm_settings(tmp_path):
    from trl import GRPOConfig

    text = export_trl(cfg("icepop"))
    # Exported, with the condition under which TRL applies them (not as inexpressible).
    assert "# ppo.correction: vllm_importance_sampling_* below take effect only with" in text
    assert "ppo.correction.weight: not expressible" not in text
    kw, problems = trl_settings(cfg("icepop").ppo.correction)
    assert kw == {
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "token_mask",
        "vllm_importance_sampling_clip_min": 0.5,
        "vllm_importance_sampling_clip_max": 5.0,
    }
    assert problems == []
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, **kw)
    assert args.vllm_importance_sampling_mode == "token_mask"
    for name, mode in (("token_tis", "token_truncate"), ("seq_mis", "sequence_mask")):
        assert f"vllm_importance_sampling_mode={mode!r}" in export_trl(cfg(name))


def test_trl_names_what_it_cannot_express():
    _, problems = trl_settings(cfg("geo_rs").ppo.correction)
    assert [f for f, _ in problems] == ["ppo.correction.filters[0]"]
    _, problems = trl_settings(Correction(weight="sequence_geometric", clip_max=2.0))
    assert [f for f, _ in problems] == ["ppo.correction.weight"]
    assert "# ppo.correction.bypass: not expressible in TRL" in export_trl(cfg("bypass"))


def test_areal_export_says_correction_is_not_mapped():
    assert "# ppo.correction: AReaL's actor has rejection_sampling only" in export_areal(
        cfg("token_tis")
    )


TRL_BASE = {
    "trainer": "trl",
    "steps": 2,
    "task": "reverse",
    "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 5},
    "ppo": {"reward_norm": {"mean_level": "group", "std_level": "group"}},
    "threads": 1,
}


def test_trainer_trl_runs_opsm_as_off_policy_mask_threshold():
    c = build_run_config(TRL_BASE, {"ppo.correction": "opsm"})
    assert trl_problems(c) == []
    assert grpo_kwargs(c)["off_policy_mask_threshold"] == 0.5
    assert not any(k.startswith("vllm_") for k in grpo_kwargs(c))


def test_trainer_trl_refuses_is_weights_in_one_line():
    with pytest.raises(ConfigError) as err:
        build_run_config(TRL_BASE, {"ppo.correction": "token_tis"})
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("ppo.correction.weight: not expressible with trainer: trl"), msg
    assert "vLLM" in msg


def test_k1_direction_is_explicit_in_the_export():
    # AReaL's direction (k1 = ℓp − ℓb) flips the bounds of verl's k1 = ℓb − ℓp.
    f = Filter(level="token", metric="k1", direction="ref_behave", lower=-0.1, upper=0.2)
    kv, _ = verl_settings(Correction(filters=(f,), denominator="post"))
    lo, hi = (float(x) for x in dict(kv)[f"{RC}.rollout_rs_threshold"].split("_"))
    assert (lo, hi) == pytest.approx((math.exp(-0.2), math.exp(0.1)))


def test_verl_export_of_bypass_pg_is_is_verls_preset():
    """reinforce + bypass_pg_is = verl's RolloutCorrectionConfig.bypass_pg_is(): sequence IS,
    threshold 2, loss_type reinforce; verl picks its bypass_mode loss itself (no loss_mode)."""
    text = export_verl(
        cfg("bypass_pg_is", **{"ppo.policy_loss": "reinforce", "ppo.use_decoupled_loss": False})
    )
    lines = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            k, v = shlex.split(line)[0].split("=", 1)
            lines[k] = v.strip('"')
    for k, v in {
        "bypass_mode": "True",
        "loss_type": "reinforce",
        "rollout_is": "sequence",
        "rollout_is_threshold": "2.0",
    }.items():
        assert lines[f"{RC}.{k}"] == v, lines
    assert "actor_rollout_ref.actor.policy_loss.loss_mode" not in lines
    assert not [c for c in text.splitlines() if c.startswith("#") and "correction" in c]


def test_verl_export_of_reinforce_without_bypass_is_gpg_and_cispo_under_bypass_says_why():
    text = export_verl(cfg(None, **{"ppo.policy_loss": "reinforce"}))
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=gpg" in text.splitlines()
    text = export_verl(cfg("bypass", **{"ppo.policy_loss": "cispo"}))
    assert "# ppo.correction.bypass: not expressible in verl (verl's bypass_mode loss is " in text


def test_reinforce_with_bypass_pg_is_trains_through_the_cli(tmp_path):
    from tests.support.objective_cli import assert_trains_through_the_cli

    assert_trains_through_the_cli(
        tmp_path,
        "ppo.policy_loss=reinforce",
        "ppo.correction=bypass_pg_is",
        "ppo.use_decoupled_loss=false",
        "rollout.staleness=1",
    )
