"""Correction filters at ``level: segment`` (ROLL's ``agg_type: segment``: the aggregate over each
run of consecutive valid tokens of a row), and ROLL's train–infer correction as a whole
(``denominator: roll``, the preset ``roll_infer_diff``): filter, loss and gradient against a
transcription of ROLL's code on random float64 inputs, every ``agg_type`` and ``loss_agg_mode``,
with the deviations the harness takes pinned (token-mean, seq-mean-token-sum-norm, the 1e-8s on
ROLL's int64 counts).
"""

from __future__ import annotations

import math
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
from harness.ppo.corrections import PRESETS, Correction, Filter
from harness.ppo.corrections.compute import apply_correction, segment_ids, segment_reduce
from harness.ppo.objectives import ppo_actor_loss
from harness.run.loop import run
from harness.sweep.present.cell_export import export_cell
from tests.support.tiny import tiny_reverse

EPS = 0.2
BASE = tiny_reverse(
    2,
    rollout={"max_new_tokens": 6},
    ppo={"ppo_n_minibatches": 2},
    eval={"every": 100, "n_prompts": 4},
)
# ROLL's segment band after a token ratio filter that cuts the completions into runs.
CUT = {
    "sequential": True,
    "filters": [
        {"level": "token", "metric": "ratio", "lower": 0.5, "upper": 2.0},
        {"level": "segment", "metric": "prob_diff", "lower": -0.2, "upper": 0.2},
    ],
}


# -- the peer, transcribed ----------------------------------------------------------------------
# alibaba/ROLL.  roll/utils/functionals.py at 090ac94658ad14006ef7665aa922bf2668f5517c:
# masked_mean, masked_sum, agg_loss.  Of the same release line, whose keys are those of
# roll/configs/base_config.py at 0a6a47e5afdc97749b353425b54f45296d9df3ff (no commit pinned for
# these three): roll/pipeline/agentic/utils.py compute_segment_masked_mean,
# roll/utils/train_infer_corrections.py _compute_all_granularity and the filter loop of
# compute_train_infer_correction, and the PPO path of loss_func in
# roll/pipeline/rlvr/actor_pg_worker.py.


def roll_masked_mean(tensor, mask, dim=None):
    """ROLL ``masked_mean``."""
    if dim is not None:
        mask_sum = mask.sum(axis=dim)
        return torch.where(
            mask_sum > 0,
            (tensor * mask).sum(axis=dim) / (mask_sum + 1e-8),
            torch.zeros_like(mask_sum),
        )
    return (tensor * mask).sum() / (mask.sum() + 1e-8)


def roll_masked_sum(tensor, mask, dim=None):
    """ROLL ``masked_sum``."""
    if dim is not None:
        mask_sum = mask.sum(axis=dim)
        return torch.where(mask_sum > 0, (tensor * mask).sum(axis=dim), torch.zeros_like(mask_sum))
    return (tensor * mask).sum()


def roll_agg_loss(
    loss_mat, loss_mask, loss_agg_mode, batch_num_tokens=None, global_valid_samples=None
):
    """ROLL ``agg_loss`` (weights None: ones)."""
    if batch_num_tokens is None:
        batch_num_tokens = loss_mask.sum()
    if global_valid_samples is None:
        global_valid_samples = loss_mat.size(0)
    weights = torch.ones(loss_mask.shape[0], device=loss_mask.device)
    if loss_agg_mode == "token-mean":
        return (loss_mat * weights.unsqueeze(-1)).sum() / batch_num_tokens
    valid_samples = torch.any(loss_mask > 0, dim=-1).float()
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = roll_masked_sum(loss_mat, loss_mask, dim=-1)
        return (seq_losses * weights * valid_samples).sum() / (global_valid_samples + 1e-8)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = roll_masked_mean(loss_mat, loss_mask, dim=-1)
        return (seq_losses * weights * valid_samples).sum() / (global_valid_samples + 1e-8)
    assert loss_agg_mode == "seq-mean-token-sum-norm"
    seq_losses = roll_masked_sum(loss_mat, loss_mask, dim=-1)
    return (seq_losses * weights * valid_samples).sum() / loss_mask.shape[-1]


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


def roll_granularity(old_log_probs, infer_log_probs, response_mask):
    """ROLL ``_compute_all_granularity``: the ratio and the diff at every ``agg_type``."""
    response_mask = response_mask.long()
    log_ratio = old_log_probs - infer_log_probs
    ratio_token = log_ratio.exp()
    diff_token = old_log_probs.exp() - infer_log_probs.exp()
    log_ratio_geo = roll_masked_mean(log_ratio, response_mask, dim=-1)
    ratio_geometric = log_ratio_geo.exp().unsqueeze(-1).expand_as(ratio_token)
    diff_geometric = (
        roll_masked_mean(diff_token, response_mask, dim=-1).unsqueeze(-1).expand_as(diff_token)
    )
    log_ratio_seq = roll_masked_sum(log_ratio, response_mask, dim=-1)
    ratio_sequence = log_ratio_seq.exp().unsqueeze(-1).expand_as(ratio_token)
    diff_sequence = (
        roll_masked_sum(diff_token, response_mask, dim=-1).unsqueeze(-1).expand_as(diff_token)
    )
    ratio_segment = roll_segment_masked_mean(log_ratio, response_mask).exp()
    diff_segment = roll_segment_masked_mean(diff_token, response_mask)
    return {
        "ratio": {
            "token": ratio_token,
            "geometric": ratio_geometric,
            "sequence": ratio_sequence,
            "segment": ratio_segment,
        },
        "diff": {
            "token": diff_token,
            "geometric": diff_geometric,
            "sequence": diff_sequence,
            "segment": diff_segment,
        },
    }


def roll_filter_mask(old_lp, infer_lp, response_mask, checks):
    """ROLL ``compute_train_infer_correction``'s ``filter_mask``: one (agg_type, 'ratio' or
    'diff', low, high) per enabled check, multiplied together."""
    base_mask = response_mask.long()
    stats = roll_granularity(old_lp, infer_lp, base_mask)
    filter_mask = torch.ones_like(base_mask)
    for agg, kind, low, high in checks:
        m = (stats[kind][agg] >= low).float() * (stats[kind][agg] <= high).float()
        filter_mask = filter_mask * m
    return filter_mask


def roll_loss(lt, lp, lb, A, M, loss_agg_mode, checks, *, as_written=True, masked=False):
    """ROLL ``loss_func``, pg_variant ppo, filtering in the loss (``enable_old_logprobs_recompute``
    false): ``batch_num_tokens`` N and ``global_valid_samples`` G come counted on
    ``response_mask`` before the filter (the strategy's ``_get_batch_num_tokens`` /
    ``_get_global_valid_samples``, each at least 1); then ``response_mask = response_mask *
    filter_mask`` and ``agg_loss``.  ``as_written``: the masks and counts in float64, so the 1e-8s
    stand as written (ROLL's own are int64: ``as_written=False``).  ``masked``: the numerator
    masked, ``torch.where(loss_mask.bool(), loss_mat, 0)`` (the open fix alibaba/ROLL#444)."""
    response_mask = M.long()
    batch_num_tokens = response_mask.sum().clamp(min=1)
    global_valid_samples = torch.any(response_mask > 0, dim=-1).long().sum().clamp(min=1)
    filter_mask = roll_filter_mask(lp, lb, response_mask, checks)
    response_mask = response_mask.long() * filter_mask.long()
    if as_written:
        response_mask = response_mask.double()
        batch_num_tokens = batch_num_tokens.double()
        global_valid_samples = global_valid_samples.double()
    ratio = (lt - lp).exp()
    surr1 = ratio * A
    surr2 = ratio.clamp(1 - EPS, 1 + EPS) * A
    pg_loss = -torch.min(surr1, surr2)
    if masked:
        pg_loss = torch.where(response_mask.bool(), pg_loss, 0.0)
    loss = roll_agg_loss(
        pg_loss,
        response_mask,
        loss_agg_mode,
        batch_num_tokens=batch_num_tokens,
        global_valid_samples=global_valid_samples,
    )
    return loss, filter_mask.bool()


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


def draw(seed: int):
    """Random float64 inputs of random shape: 3–8 rows, some short, whose valid tokens form one
    or more runs; a sampler mismatch of random size; a random band of each kind."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    B, T = rng.randint(3, 8), rng.randint(3, 12)
    lb = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    lp = lb + rng.uniform(0.05, 0.5) * torch.randn(B, T, generator=g, dtype=torch.float64)
    lt = (lp + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    M = torch.rand(B, T, generator=g) > rng.uniform(0.2, 0.7)
    M[0, 0] = True
    A = torch.randn(B, T, generator=g, dtype=torch.float64) * M
    h = rng.uniform(0.01, 0.1)
    r = rng.uniform(0.05, 0.5)
    bands = {"diff": (-h, h), "ratio": (math.exp(-r), math.exp(r))}
    return (lt, lp, lb, A, M), bands


def agree(mine, peer, lt):
    """Loss and gradient to float64 precision (the rule is 1e-9 relative)."""
    (g_mine,) = torch.autograd.grad(mine, lt, retain_graph=True)
    (g_peer,) = torch.autograd.grad(peer, lt, retain_graph=True)
    torch.testing.assert_close(mine, peer, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(g_mine, g_peer, rtol=1e-12, atol=1e-15)


def rel(a, b) -> float:
    a, b = float(a.detach()), float(b.detach())
    return abs(a - b) / max(abs(b), 1e-300)


ROLL_SEQ = ["seq-mean-token-mean", "seq-mean-token-sum"]
# ROLL's agg_type → the harness's filter fields.
AGG_TYPE = {
    "token": {"level": "token"},
    "segment": {"level": "segment", "agg": "mean"},
    "geometric": {"level": "sequence", "agg": "mean"},
    "sequence": {"level": "sequence", "agg": "sum"},
}


def roll_block(agg_type: str, kind: str, band: tuple[float, float]) -> Correction:
    metric = "ratio" if kind == "ratio" else "prob_diff"
    f = Filter(metric=metric, lower=band[0], upper=band[1], **AGG_TYPE[agg_type])
    return Correction(filters=(f,), denominator="roll")


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
    """ROLL adds its 1e-8 to the int64 count of its mask, which torch forms in float32, where it
    rounds away: on ROLL's own mask its segment mean is the exact-count mean the harness takes.
    As written (a float64 mask) the two are at most 1e-8/n apart."""
    for seed in range(20):
        _, lp, lb, _, M = gappy(seed)
        x = lp - lb
        mine = segment_reduce(x, M, "mean")
        torch.testing.assert_close(
            mine, roll_segment_masked_mean(x, M.long()), rtol=1e-12, atol=1e-15
        )
        written = roll_segment_masked_mean(x, M.double())
        gap = ((mine - written).abs() / written.abs().clamp(min=1e-300))[M]
        assert float(gap.max()) <= 1.01e-8 and float(gap.max()) > 1e-10


# -- ROLL's train–infer correction (denominator: roll), against ROLL ---------------------------


@pytest.mark.parametrize("loss_agg_mode", ROLL_SEQ)
@pytest.mark.parametrize("kind", ["diff", "ratio"])
@pytest.mark.parametrize("agg_type", list(AGG_TYPE))
def test_roll_filter_loss_and_gradient_match_roll(agg_type, kind, loss_agg_mode):
    """Every agg_type, ratio and diff checks, both sequence means: filter, loss and gradient
    equal ROLL's to float64 precision on random draws, many of which empty a whole row (ROLL
    keeps that row in G; 'post' drops it and is not ROLL)."""
    emptied = 0
    for seed in range(40):
        (lt, lp, lb, A, M), bands = draw(seed)
        c = roll_block(agg_type, kind, bands[kind])
        peer, keep = roll_loss(lt, lp, lb, A, M, loss_agg_mode, [(agg_type, kind, *bands[kind])])
        res = apply_correction(c, lt, lp, lb, A, M)
        assert torch.equal(res.mask, M & keep)
        mine, _ = ppo_actor_loss(lt, lp, lb, A, M, correction=c, loss_agg_mode=loss_agg_mode)
        agree(mine, peer, lt)
        if (M.any(dim=1) & ~res.mask.any(dim=1)).any() and res.mask.any():
            emptied += 1
            post, _ = ppo_actor_loss(
                lt,
                lp,
                lb,
                A,
                M,
                correction=replace(c, denominator="post"),
                loss_agg_mode=loss_agg_mode,
            )
            assert rel(post, peer) > 1e-6
    assert emptied >= 8, emptied


def test_roll_segment_band_splits_rows():
    """On multi-turn rows the segment band keeps one run of a row and drops another."""
    for seed in range(3):
        lt, lp, lb, A, M = gappy(seed)
        c = roll_block("segment", "diff", (-0.03, 0.03))
        peer, keep = roll_loss(
            lt, lp, lb, A, M, "seq-mean-token-mean", [("segment", "diff", -0.03, 0.03)]
        )
        kept = keep & M
        assert 0 < int(kept.sum()) < int(M.sum())
        assert any(kept[i].any() and (M[i] & ~kept[i]).any() for i in range(M.shape[0]))
        mine, _ = ppo_actor_loss(
            lt, lp, lb, A, M, correction=c, loss_agg_mode="seq-mean-token-mean"
        )
        agree(mine, peer, lt)


@pytest.mark.parametrize("loss_agg_mode", ROLL_SEQ)
def test_the_preset_is_rolls_token_diff_band(loss_agg_mode):
    """roll_infer_diff = ROLL's filters [{agg_type: token, ratio_enabled: false, diff_enabled:
    true, diff_low: -0.2, diff_high: 0.2}], rows emptied by the band included."""
    assert PRESETS["roll_infer_diff"].correction == roll_block("token", "diff", (-0.2, 0.2))
    emptied = 0
    for seed in range(30):
        (lt, lp, lb, A, M), _ = draw(seed)
        lb = lp - 3.0 * (lp - lb)  # a mismatch wide enough for the ±0.2 band to bite
        peer, keep = roll_loss(lt, lp, lb, A, M, loss_agg_mode, [("token", "diff", -0.2, 0.2)])
        mine, _ = ppo_actor_loss(
            lt, lp, lb, A, M, correction="roll_infer_diff", loss_agg_mode=loss_agg_mode
        )
        agree(mine, peer, lt)
        emptied += int((M.any(dim=1) & ~(M & keep).any(dim=1)).any())
    assert emptied >= 3, emptied


@pytest.mark.parametrize("loss_agg_mode", ROLL_SEQ)
def test_roll_epsilons_as_written_and_on_int64_counts(loss_agg_mode):
    """The 1e-8s stand as written (float64 masks and counts: equal to 1e-12).  ROLL's own masks
    and counts are int64, where torch forms n + 1e-8 in float32 and the 1e-8 rounds away: the
    harness is then 1e-8/G to 1e-8/G + 1e-8/min n apart (relative), above the 1e-9 rule, so the
    1e-8s are in the harness's loss."""
    g = torch.Generator().manual_seed(7)
    B, T = 4, 3
    lb = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.05
    lp = lb + 0.05 * torch.randn(B, T, generator=g, dtype=torch.float64)
    lt = (lp + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    M = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    A = torch.rand(B, T, generator=g, dtype=torch.float64).add(0.1) * M  # one sign: no cancelling
    checks = [("token", "diff", -0.2, 0.2)]
    mine, _ = ppo_actor_loss(
        lt, lp, lb, A, M, correction="roll_infer_diff", loss_agg_mode=loss_agg_mode
    )
    written, _ = roll_loss(lt, lp, lb, A, M, loss_agg_mode, checks)
    as_run, _ = roll_loss(lt, lp, lb, A, M, loss_agg_mode, checks, as_written=False)
    agree(mine, written, lt)
    lo = 1e-8 / 4 * 0.99
    hi = (1e-8 / 4 + (1e-8 if loss_agg_mode == "seq-mean-token-mean" else 0.0)) * 1.01
    assert lo < rel(mine, as_run) < hi
    assert rel(mine, as_run) > 1e-9


def test_roll_token_mean_band_is_inert_in_roll_and_masked_here():
    """ROLL's token-mean sums the unmasked loss matrix over N: its band leaves the loss as it is
    without one.  The harness masks the numerator (Σ M′L / N, N counted before the band), as the
    open fix alibaba/ROLL#444 does: a deliberate deviation."""
    acted = 0
    for seed in range(20):
        (lt, lp, lb, A, M), bands = draw(seed)
        checks = [("token", "diff", *bands["diff"])]
        peer, keep = roll_loss(lt, lp, lb, A, M, "token-mean", checks)
        plain, _ = ppo_actor_loss(lt, lp, lb, A, M, loss_agg_mode="token-mean")
        agree(plain, peer, lt)
        fixed, _ = roll_loss(lt, lp, lb, A, M, "token-mean", checks, masked=True)
        c = roll_block("token", "diff", bands["diff"])
        mine, _ = ppo_actor_loss(lt, lp, lb, A, M, correction=c, loss_agg_mode="token-mean")
        agree(mine, fixed, lt)
        pre, _ = ppo_actor_loss(
            lt, lp, lb, A, M, correction=replace(c, denominator="pre"), loss_agg_mode="token-mean"
        )
        agree(mine, pre, lt)
        if (M & ~keep).any():
            acted += 1
            assert rel(mine, peer) > 1e-9
    assert acted >= 10, acted


def test_roll_sum_norm_divides_by_t_alone():
    """seq-mean-token-sum-norm: ROLL divides Σ M′L by T, the harness by G·T (as it does without
    a correction): ROLL's is G times the harness's."""
    for seed in range(10):
        (lt, lp, lb, A, M), bands = draw(seed)
        checks = [("token", "diff", *bands["diff"])]
        peer, _ = roll_loss(lt, lp, lb, A, M, "seq-mean-token-sum-norm", checks)
        c = roll_block("token", "diff", bands["diff"])
        mine, _ = ppo_actor_loss(
            lt, lp, lb, A, M, correction=c, loss_agg_mode="seq-mean-token-sum-norm"
        )
        G = int(M.any(dim=1).sum())
        agree(mine * G, peer, lt)


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
