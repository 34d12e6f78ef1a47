"""Probability-space gates: OpenRLHF's IS gating ``ratio | binary_kl | tv``
(``harness/ppo/corrections/gating.py``) and ROLL's train–infer probability band
(``roll_infer_diff``), as corrections.  Golden statistics, OpenRLHF's loss AND gradient against a
transcription of its loss code on random float64 tensors, the config paths (preset name from --set
and as a grid axis), composition with every objective, and the exports.  ROLL's band against
ROLL's code: tests/ppo/test_corrections_segment.py."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from harness.config import build_run_config
from harness.config.experiment import load_experiment
from harness.peers.export import export_verl
from harness.ppo.corrections import PRESETS, Correction, Filter
from harness.ppo.corrections.compute import apply_correction, probability_statistic
from harness.ppo.objectives import OBJECTIVES, lookup, ppo_actor_loss
from harness.sweep.present.cell_export import export_cell
from tests.support.peer_inputs import assert_agree, correction_inputs

EPS = 0.2


def masked_mean(x, mask, dim=None):
    """OpenRLHF openrlhf/models/utils.py masked_mean (dim None: over every entry)."""
    if dim is not None:
        return (x * mask).sum(axis=dim) / mask.sum(axis=dim)
    return (x * mask).sum() / mask.sum()


def openrlhf_policy_loss(lt, lp, lb, A, M, level, mode, gating, threshold):
    """OpenRLHF openrlhf/models/loss.py ``PolicyLoss.forward``, policy_loss_type 'ppo',
    token_level_loss, no dual clip: old_log_probs = ℓp (the actor's recompute),
    rollout_log_probs = ℓb."""
    Mf = M.to(lt.dtype)
    log_ratio = (lt - lp).clamp(min=-20.0, max=20.0)
    ratio = log_ratio.exp()
    surr1 = ratio * A
    surr2 = ratio.clamp(1 - EPS, 1 + EPS) * A
    loss = -torch.min(surr1, surr2)
    low, high = threshold
    seq_level = level == "seq"
    is_log_ratio = (lp - lb).detach()
    token_is = is_log_ratio.exp()
    if gating == "ratio":
        stat = masked_mean(is_log_ratio, Mf, dim=-1).unsqueeze(-1) if seq_level else is_log_ratio
        stat = stat.exp()
    else:
        p = lb.exp().clamp(1e-6, 1 - 1e-6)
        q = lp.exp().clamp(1e-6, 1 - 1e-6)
        if gating == "binary_kl":
            stat = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
        else:
            stat = (p - q).abs()
        if seq_level:
            stat = masked_mean(stat, Mf, dim=-1).unsqueeze(-1)
    if mode == "clip":
        coef = stat.clamp(min=low, max=high)
        filtered = (stat < low) | (stat > high)
    else:
        keep = (stat >= low) & (stat <= high)
        coef = torch.where(keep, token_is, 0.0)
        filtered = ~keep
    loss = coef * loss
    return masked_mean(loss, Mf), filtered


def ours(lt, lp, lb, A, M, c):
    out, stats = ppo_actor_loss(lt, lp, lb, A, M, correction=c)
    return out, stats


# --- golden statistics ----------------------------------------------------------------------


def test_golden_probability_statistics():
    lp = torch.tensor([math.log(0.5), math.log(0.999_999_9)], dtype=torch.float64)
    lb = torch.tensor([math.log(0.3), math.log(0.9)], dtype=torch.float64)
    d = probability_statistic("prob_diff", lp, lb)
    assert d[0].item() == pytest.approx(0.2, abs=1e-12)
    assert d[1].item() == pytest.approx(0.0999999, abs=1e-12)
    tv = probability_statistic("tv", lp, lb)
    assert tv[0].item() == pytest.approx(0.2, abs=1e-12)
    assert tv[1].item() == pytest.approx(0.099999, abs=1e-12)  # p_p clamped to 1 − 1e-6
    kl = probability_statistic("binary_kl_directed", lp, lb)
    # KL(Bern(0.3) ‖ Bern(0.5)) = 0.3 ln 0.6 + 0.7 ln 1.4
    assert kl[0].item() == pytest.approx(0.3 * math.log(0.6) + 0.7 * math.log(1.4), rel=1e-12)
    # KL(Bern(0.9) ‖ Bern(1 − 1e-6)) = 0.9 ln(0.9/(1 − 1e-6)) + 0.1 ln(0.1/1e-6)
    expect = 0.9 * math.log(0.9 / (1 - 1e-6)) + 0.1 * math.log(0.1 / 1e-6)
    assert kl[1].item() == pytest.approx(expect, rel=1e-9)
    rev = probability_statistic("binary_kl_directed", lp, lb, "ref_behave")
    assert rev[0].item() == pytest.approx(0.5 * math.log(0.5 / 0.3) + 0.5 * math.log(0.5 / 0.7))


def test_preset_keeps_survivors_weight_and_zeroes_the_gated():
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.5]], dtype=torch.float64))
    lb = torch.log(torch.tensor([[0.45, 0.2, 0.5]], dtype=torch.float64))
    M = torch.ones(1, 3, dtype=torch.bool)
    res = apply_correction(PRESETS["openrlhf_tv"].correction, lp, lp, lb, torch.ones(1, 3), M)
    assert res.mask.tolist() == [[True, False, True]]  # |0.5 − 0.2| = 0.3 > 0.2
    assert res.w is not None
    assert res.w[0].tolist() == pytest.approx([0.5 / 0.45, 0.0, 1.0])
    roll = apply_correction(PRESETS["roll_infer_diff"].correction, lp, lp, lb, torch.ones(1, 3), M)
    assert roll.mask.tolist() == [[True, False, True]] and roll.w is None


# --- OpenRLHF ---------------------------------------------------------------------------------

OPENRLHF = {
    # (level, mode, gating, threshold): the harness block
    "token-mask-ratio": (
        ("token", "mask", "ratio", (0.8, 1.25)),
        Correction(weight="token", filters=(Filter(metric="ratio", lower=0.8, upper=1.25),)),
    ),
    "token-mask-tv": (
        ("token", "mask", "tv", (0.0, 0.04)),
        Correction(weight="token", filters=(Filter(metric="tv", upper=0.04),)),
    ),
    "token-mask-binary_kl": (
        ("token", "mask", "binary_kl", (0.0, 0.005)),
        Correction(weight="token", filters=(Filter(metric="binary_kl_directed", upper=0.005),)),
    ),
    "seq-mask-ratio": (
        ("seq", "mask", "ratio", (0.95, 1.05)),
        Correction(
            weight="token",
            filters=(Filter(level="sequence", metric="ratio", agg="mean", lower=0.95, upper=1.05),),
        ),
    ),
    "seq-mask-tv": (
        ("seq", "mask", "tv", (0.0, 0.055)),
        Correction(
            weight="token",
            filters=(Filter(level="sequence", metric="tv", agg="mean", upper=0.055),),
        ),
    ),
    "seq-mask-binary_kl": (
        ("seq", "mask", "binary_kl", (0.0, 0.015)),
        Correction(
            weight="token",
            filters=(
                Filter(level="sequence", metric="binary_kl_directed", agg="mean", upper=0.015),
            ),
        ),
    ),
    "token-clip-ratio": (
        ("token", "clip", "ratio", (0.8, 1.25)),
        Correction(weight="token", clip_min=0.8, clip_max=1.25),
    ),
}


@pytest.mark.parametrize("case", sorted(OPENRLHF))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_openrlhf_is_gating_loss_and_gradient(case, seed):
    (level, mode, gating, threshold), c = OPENRLHF[case]
    lt, lp, lb, A, M = correction_inputs(seed)
    peer, filtered = openrlhf_policy_loss(lt, lp, lb, A, M, level, mode, gating, threshold)
    mine, stats = ours(lt, lp, lb, A, M, c)
    assert_agree(peer, mine, lt)
    # the draws exercise both sides of the gate
    gated = filtered.expand_as(M)[M]
    assert 0 < int(gated.sum()) < int(M.sum()), (case, seed)
    if mode == "mask":  # the tokens OpenRLHF gates are the ones the correction reports masked
        assert torch.equal(stats["correction_masked"][M], gated)


def test_openrlhf_presets_are_openrlhf_gates():
    for name, (gating, threshold) in {
        "openrlhf_ratio": ("ratio", (0.5, 5.0)),
        "openrlhf_tv": ("tv", (0.0, 0.2)),
        "openrlhf_binary_kl": ("binary_kl", (0.0, 0.05)),
    }.items():
        for seed in (3, 4):
            lt, lp, lb, A, M = correction_inputs(seed)
            lb = lp - 1.5 * (lp - lb)  # a wider mismatch so that the presets' bounds bite
            peer, filtered = openrlhf_policy_loss(
                lt, lp, lb, A, M, "token", "mask", gating, threshold
            )
            assert_agree(peer, ours(lt, lp, lb, A, M, name)[0], lt)


# --- every objective, config, exports ---------------------------------------------------------

GATES = ["openrlhf_ratio", "openrlhf_tv", "openrlhf_binary_kl", "roll_infer_diff"]


@pytest.mark.parametrize("objective", list(OBJECTIVES))
@pytest.mark.parametrize("name", GATES)
def test_every_objective_composes_with_the_gates(objective, name):
    o = lookup(objective)
    agg = "token-mean" if "token-mean" in o.aggregations else o.aggregations[0]
    lt, lp, lb, A, M = correction_inputs(5)
    loss, stats = o.loss(lt, lp, lb, A, M, correction=name, loss_agg_mode=agg)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and torch.isfinite(lt.grad).all()
    assert "correction_masked" in stats


def test_preset_names_from_set_and_as_a_grid_axis(tmp_path):
    cfg = build_run_config({}, {"ppo.correction": "openrlhf_binary_kl"})
    assert cfg.ppo.correction.filters[0].metric == "binary_kl_directed"
    assert cfg.ppo.recomputes_proximal  # the gate reads π_prox: the learner is recomputed
    block = build_run_config(
        {}, {"ppo.correction": {"weight": "token", "filters": [{"metric": "tv", "upper": 0.1}]}}
    )
    assert block.ppo.correction.filters[0].upper == 0.1
    doc = {
        "name": "gates",
        "base": {},
        "grid": {"ppo.correction": GATES},
        "seeds": 1,
        "steps": 2,
    }
    f = tmp_path / "g.yaml"
    f.write_text(yaml.safe_dump(doc))
    exp = load_experiment(f)
    assert sorted(c.overrides["ppo.correction"] for c in exp.cells) == sorted(GATES)


def test_exports_name_what_the_targets_lack():
    for name, metric in (("openrlhf_tv", "tv"), ("roll_infer_diff", "prob_diff")):
        cfg = build_run_config({}, {"ppo.correction": name})
        verl = export_verl(cfg)
        assert f"verl's rollout_rs has no {metric}" in verl
        assert f"token_{metric}" not in verl.replace("# ", "#")
        trl = export_cell(cfg, "trl")
        assert "ppo.correction.filters[0]" in trl
        assert "ppo.correction" in export_cell(cfg, "areal")
