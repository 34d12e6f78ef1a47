"""Correction filters at ``level: segment``: ROLL's ``agg_type: segment`` for its train–infer
filters, the aggregate over each run of consecutive valid tokens of a row.

The peer's formula is transcribed from ROLL (alibaba/ROLL): ``roll/pipeline/agentic/utils.py``
(``compute_segment_masked_mean``) and ``roll/utils/train_infer_corrections.py``
(``_compute_all_granularity``, ``compute_train_infer_correction``).
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.config import build_run_config, load_run_config
from harness.config.experiment import load_experiment
from harness.core.configtools import ConfigError
from harness.ppo.corrections import Correction, Filter
from harness.ppo.corrections.compute import apply_correction, segment_ids, segment_reduce
from harness.ppo.objectives import ppo_actor_loss
from harness.run.loop import run
from harness.sweep.present.cell_export import export_cell
from tests.support.tiny import TINY

EPS = 0.2
BASE = {
    "steps": 2,
    "task": "reverse",
    "tiny": TINY,
    "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 6},
    "ppo": {"ppo_n_minibatches": 2},
    "eval": {"every": 100, "n_prompts": 4},
    "threads": 1,
}
# ROLL's segment band after a token ratio filter that cuts the completions into runs.
CUT = {
    "sequential": True,
    "filters": [
        {"level": "token", "metric": "ratio", "lower": 0.5, "upper": 2.0},
        {"level": "segment", "metric": "prob_diff", "lower": -0.2, "upper": 0.2},
    ],
}


# -- the peer, transcribed ----------------------------------------------------------------------


def roll_segment_masked_mean(tensor, mask):
    """ROLL ``compute_segment_masked_mean``: per row, each run of consecutive 1s gets the
    masked mean of its values (divisor count + 1e-8), 0 elsewhere."""
    batch_size, seq_len = mask.shape
    result = torch.zeros_like(tensor)
    for b in range(batch_size):
        sample_mask = mask[b]
        sample_tensor = tensor[b]
        diff = torch.diff(sample_mask, prepend=torch.tensor([0]))
        segment_starts = torch.where(diff == 1)[0]
        segment_ends = torch.where(diff == -1)[0]
        if sample_mask[-1] == 1:
            segment_ends = torch.cat([segment_ends, torch.tensor([seq_len])])
        n = min(len(segment_starts), len(segment_ends))
        for start, end in zip(segment_starts[:n], segment_ends[:n], strict=True):
            idx = torch.arange(start, end)
            seg_mask = sample_mask[idx]
            seg = sample_tensor[idx]
            if seg_mask.sum() > 0:
                mean = (seg * seg_mask).sum() / (seg_mask.sum() + 1e-8)
                result[b, idx] = mean * seg_mask
    return result


def roll_segment_filter(old_lp, infer_lp, response_mask, kind, low, high):
    """ROLL ``compute_train_infer_correction`` with one enabled filter of ``agg_type:
    segment`` (``ratio_enabled`` or ``diff_enabled``): the ``filter_mask`` it returns."""
    response_mask = response_mask.long()
    if kind == "ratio":
        log_ratio = old_lp - infer_lp
        stat = roll_segment_masked_mean(log_ratio, response_mask).exp()
    else:
        diff_token = old_lp.exp() - infer_lp.exp()
        stat = roll_segment_masked_mean(diff_token, response_mask)
    return (stat >= low).float() * (stat <= high).float()


def roll_loss(lt, lp, lb, A, M, kind, low, high):
    """ROLL's PPO loss with the filter multiplied into response_mask (token-mean agg_loss)."""
    band = roll_segment_filter(lp, lb, M, kind, low, high)
    mask = M.to(lt.dtype) * band
    ratio = (lt - lp).exp()
    pg = -torch.min(ratio * A, ratio.clamp(1 - EPS, 1 + EPS) * A)
    return (pg * mask).sum() / mask.sum(), band


def gappy(seed: int, B: int = 6, T: int = 12):
    """Rows whose valid tokens form several runs (a multi-turn mask), float64."""
    g = torch.Generator().manual_seed(seed)
    lb = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    lp = lb + 0.25 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lt = (lp + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    M = torch.rand(B, T, generator=g) > 0.35
    M[:, 1] = True
    A = torch.randn(B, T, generator=g, dtype=torch.float64) * M
    return lt, lp, lb, A, M


# -- the pure functions -------------------------------------------------------------------------


def test_segments_golden():
    m = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0], [0] * 8]).bool()
    x = torch.arange(24.0).reshape(3, 8)
    assert segment_ids(m).tolist() == [
        [0, 1, 1, 0, 2, 2, 2, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [0] * 8,
    ]
    want = {
        "sum": [[0, 3, 3, 0, 15, 15, 15, 0], [38, 38, 38, 38, 0, 0, 0, 0]],
        "mean": [[0, 1.5, 1.5, 0, 5, 5, 5, 0], [9.5, 9.5, 9.5, 9.5, 0, 0, 0, 0]],
        "max": [[0, 2, 2, 0, 6, 6, 6, 0], [11, 11, 11, 11, 0, 0, 0, 0]],
        "min": [[0, 1, 1, 0, 4, 4, 4, 0], [8, 8, 8, 8, 0, 0, 0, 0]],
    }
    for agg, rows in want.items():
        got = segment_reduce(x, m, agg)
        assert got[:2].tolist() == rows, agg
        assert got[2].tolist() == [0.0] * 8  # an empty row


@pytest.mark.parametrize("agg", ["sum", "mean", "max", "min"])
def test_segment_reduce_matches_a_naive_loop(agg):
    rng = random.Random(agg)
    g = torch.Generator().manual_seed(len(agg))
    reduce = {"sum": sum, "mean": lambda v: sum(v) / len(v), "max": max, "min": min}[agg]
    for _ in range(40):
        B, T = rng.randint(1, 5), rng.randint(1, 14)
        x = torch.randn(B, T, generator=g, dtype=torch.float64)
        m = torch.rand(B, T, generator=g) > rng.random()
        got = segment_reduce(x, m, agg)
        for i in range(B):
            t = 0
            while t < T:
                if not m[i, t]:
                    assert got[i, t] == 0.0
                    t += 1
                    continue
                end = t
                while end < T and m[i, end]:
                    end += 1
                want = reduce([float(x[i, s]) for s in range(t, end)])
                for s in range(t, end):
                    assert float(got[i, s]) == pytest.approx(want, rel=1e-12, abs=1e-12)
                t = end


def test_segment_mean_matches_roll():
    for seed in range(20):
        _, lp, lb, _, M = gappy(seed)
        x = lp - lb
        torch.testing.assert_close(
            segment_reduce(x, M, "mean"),
            roll_segment_masked_mean(x, M.long()),
            rtol=1e-7,  # ROLL divides by count + 1e-8
            atol=1e-12,
        )


# -- the filter, the loss and its gradient, against ROLL -------------------------------------


@pytest.mark.parametrize("kind,low,high", [("ratio", 0.9, 1.1), ("diff", -0.03, 0.03)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_filter_loss_and_gradient_match_roll(kind, low, high, seed):
    lt, lp, lb, A, M = gappy(seed)
    metric = "ratio" if kind == "ratio" else "prob_diff"
    c = Correction(
        filters=(Filter(level="segment", metric=metric, agg="mean", lower=low, upper=high),),
        denominator="post",  # ROLL multiplies the filter into response_mask before agg_loss
    )
    res = apply_correction(c, lt, lp, lb, A, M)
    peer, band = roll_loss(lt, lp, lb, A, M, kind, low, high)
    assert torch.equal(res.mask, M & band.bool())
    # the band acts, and not on whole rows only: some row keeps one run and drops another
    kept = band.bool() & M
    assert 0 < int(kept.sum()) < int(M.sum())
    assert any(kept[i].any() and (M[i] & ~kept[i]).any() for i in range(M.shape[0]))
    mine, _ = ppo_actor_loss(lt, lp, lb, A, M, correction=c)
    (g_peer,) = torch.autograd.grad(peer, lt)
    (g_mine,) = torch.autograd.grad(mine, lt)
    torch.testing.assert_close(mine, peer, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(g_mine, g_peer, rtol=1e-12, atol=1e-13)
    assert g_mine.abs().sum() > 0


def test_segment_differs_from_sequence_on_multi_run_rows():
    """The same band at sequence level averages over the whole row: other tokens survive."""
    lt, lp, lb, A, M = gappy(3)
    seg = Filter(level="segment", metric="prob_diff", lower=-0.03, upper=0.03)
    seq = Filter(level="sequence", metric="prob_diff", lower=-0.03, upper=0.03)
    a = apply_correction(Correction(filters=(seg,)), lt, lp, lb, A, M).mask
    b = apply_correction(Correction(filters=(seq,)), lt, lp, lb, A, M).mask
    assert not torch.equal(a, b)
    # one run per row (a single-turn completion): the two are the same
    one = torch.arange(12)[None] < torch.tensor([[12], [7], [3], [9], [12], [5]])
    a = apply_correction(Correction(filters=(seg,)), lt, lp, lb, A, one).mask
    b = apply_correction(Correction(filters=(seq,)), lt, lp, lb, A, one).mask
    assert torch.equal(a, b)


def test_sequential_token_filter_cuts_the_segments():
    """Under ``sequential: true`` a token filter before it splits a row into segments."""
    m = torch.ones(1, 6, dtype=torch.bool)
    lb = torch.log(torch.full((1, 6), 0.5, dtype=torch.float64))
    # token 2's ratio is 4 (dropped by the token filter); the runs [0, 1] and [3, 5] remain
    lp = torch.log(torch.tensor([[0.5, 0.9, 2.0, 0.5, 0.5, 0.5]], dtype=torch.float64))
    A = torch.ones(1, 6, dtype=torch.float64)
    token = Filter(level="token", metric="ratio", lower=0.25, upper=3.0)
    band = Filter(level="segment", metric="prob_diff", lower=-0.1, upper=0.1)
    c = Correction(filters=(token, band), sequential=True)
    got = apply_correction(c, lp, lp, lb, A, m).mask
    # run [0, 1]: mean diff 0.2 → dropped; run [3, 5]: 0 → kept
    assert got.tolist() == [[False, False, False, True, True, True]]
    # at sequence level the row mean over the kept tokens (0.4/5 = 0.08) keeps all five
    seq = Correction(filters=(token, replace(band, level="sequence")), sequential=True)
    assert apply_correction(seq, lp, lp, lb, A, m).mask.tolist() == [
        [True, True, False, True, True, True]
    ]


# -- configuration ------------------------------------------------------------------------------


def _refused(args, expect, tmp_path):
    results = tmp_path / "results"
    r = CliRunner().invoke(app, ["run", "--results-dir", str(results), *args])
    err = r.stderr if r.stderr is not None else r.output
    assert r.exit_code == 2, r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert expect in lines[0], lines[0]
    assert not results.exists() or not any(results.iterdir())


def test_cli_refuses_a_segment_filter_that_equals_sequence(tmp_path):
    block = "{filters: [{level: segment, metric: prob_diff, lower: -0.2, upper: 0.2}]}"
    _refused(
        ["--set", f"ppo.correction={block}"],
        "ppo.correction.filters[0].level: 'segment' aggregates over each run",
        tmp_path,
    )
    # a token filter before it, but not sequential: every filter sees the whole completion
    block = (
        "{filters: [{level: token, metric: ratio, lower: 0.5, upper: 2}, "
        "{level: segment, metric: prob_diff, lower: -0.2, upper: 0.2}]}"
    )
    _refused(["--set", f"ppo.correction={block}"], "filters[1].level: 'segment'", tmp_path)
    _refused(["--set", "ppo.correction.filters=[{level: part, upper: 1}]"], "level", tmp_path)


def test_from_the_cli_a_file_and_a_grid(tmp_path: Path):
    cfg = build_run_config(BASE, {"ppo.correction": CUT})
    assert cfg.ppo.correction.filters[1].level == "segment"
    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump({**BASE, "ppo": {**BASE["ppo"], "correction": CUT}}))
    assert load_run_config(f).ppo.correction == cfg.ppo.correction

    seq = {**CUT, "filters": [CUT["filters"][0], {**CUT["filters"][1], "level": "sequence"}]}
    exp = tmp_path / "exp.yaml"
    doc = {
        "name": "segment",
        "base": {k: v for k, v in BASE.items() if k != "steps"},
        "grid": {"ppo.correction": [seq, CUT]},
        "seeds": 1,
        "steps": 2,
    }
    exp.write_text(yaml.safe_dump(doc))
    assert len(load_experiment(exp).cells) == 2
    doc["grid"] = {"ppo.correction": [seq, {**CUT, "sequential": False}]}
    exp.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="level: 'segment' aggregates over each run"):
        load_experiment(exp)


def test_exports_name_what_the_targets_lack():
    cfg = build_run_config(BASE, {"ppo.correction": CUT})
    verl = export_cell(cfg, "verl")
    assert "# ppo.correction.filters[1]: not expressible in verl (verl's rollout_rs " in verl
    assert "per segment" in verl
    trl = export_cell(cfg, "trl")
    assert "ppo.correction.filters[1]: not expressible in TRL" in trl


def test_a_tiny_run_trains_with_a_segment_filter(tmp_path):
    res = run(build_run_config(BASE, {"ppo.correction": CUT}), results_dir=tmp_path)
    assert res.status == "completed", res.status
    frac = res.history["policy/correction_masked_frac"]
    assert len(frac) == BASE["steps"] and all(0.0 <= v <= 1.0 for v in frac)
