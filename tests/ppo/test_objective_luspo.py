"""LUSPO: golden values by hand, TRL's formula (a transcription and TRL's own code), a naive loop,
composition with the decoupled loss, its one aggregation, the TRL map, config errors, a CLI run."""

import math
import random

import pytest
import torch

from harness.config import build_run_config
from harness.core.configtools import from_dict
from harness.peers.trl import grpo_kwargs
from harness.ppo import PPOActorConfig, ppo_actor_loss
from harness.ppo.objectives import objective_loss
from harness.ppo.objectives.luspo import luspo_loss
from tests.support.objective_cli import assert_trains_through_the_cli
from tests.support.objective_rows import assert_refused_in_one_line
from tests.support.tiny import TINY
from tests.support.trl_stand_in import TrainerStandIn, trl_compute_loss

F64 = torch.float64
AGG = {"loss_agg_mode": "seq-mean-token-sum"}
SEQ = {**AGG, "importance_sampling_level": "sequence"}


def test_golden_two_sequences_of_different_lengths():
    # Row 0: three tokens, log-ratios 0.1, 0.2, 0.3 → s = e^0.2 = 1.2214 > 1.2 with A = 1:
    # clipped, ℓ = −1.2 and no gradient.  Row 1: one token, log-ratio −0.1 → s = e^−0.1 =
    # 0.904837, A = −2: ℓ = max(2·0.9048, 2·0.9048) = 1.809675 (inside the clip).
    # loss = (3·(−1.2) + 1·1.809675) / 2.
    lt = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, 0.0, 0.0]], dtype=F64, requires_grad=True)
    lp = lt.detach() - torch.tensor([[0.1, 0.2, 0.3], [-0.1, 0.0, 0.0]], dtype=F64)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]], dtype=F64)
    m = torch.tensor([[True, True, True], [True, False, False]])
    loss, st = luspo_loss(lt, lp, lp, adv, m, **SEQ)
    loss.backward()
    s1 = math.exp(-0.1)
    assert loss.item() == pytest.approx((3 * -1.2 + 2 * s1) / 2, rel=1e-12)
    # d/dℓθ of row 1: (1/2)·1·(2·s1)·d(mean log r)/dℓθ = s1 on its one token; row 0 clipped
    assert lt.grad.tolist() == [pytest.approx([0.0, 0.0, 0.0]), pytest.approx([s1, 0.0, 0.0])]
    assert st["silenced_mask"].tolist() == [[True, True, True], [False, False, False]]
    # GSPO (seq-mean-token-mean) would weight the rows equally: (−1.2 + 1.809675) / 2
    gspo, _ = ppo_actor_loss(
        lt,
        lp,
        lp,
        adv,
        m,
        importance_sampling_level="sequence",
        loss_agg_mode="seq-mean-token-mean",
    )
    assert gspo.item() == pytest.approx((-1.2 + 2 * s1) / 2, rel=1e-12)


# ------------------------------------------------------------------ TRL's formula


def trl_luspo(lt, old, adv, mask, *, level, eps_low=0.2, eps_high=0.2):
    """TRL 1.16's luspo loss (``_compute_loss`` with loss_type luspo, no δ), written out."""
    mf = mask.to(lt.dtype)
    log_ratio = lt - old
    if level == "sequence":
        log_w = ((log_ratio * mf).sum(-1) / mf.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        log_w = log_ratio
    c1 = torch.exp(log_w)
    c2 = c1.clamp(1 - eps_low, 1 + eps_high)
    a = adv[:, :1]
    per_token = -torch.min(c1 * a, c2 * a)
    return (per_token * mf).sum(-1).mean()


def random_batch(seed, B=5, T=8, spread=0.2):
    g = torch.Generator().manual_seed(seed)
    lt = -torch.rand(B, T, generator=g, dtype=F64) * 3
    old = lt + torch.randn(B, T, generator=g, dtype=F64) * spread
    adv = (torch.randn(B, 1, generator=g, dtype=F64) * 1.5).expand(B, T).clone()
    mask = torch.rand(B, T, generator=g) < 0.75
    mask[:, 0] = True
    return lt, old, adv, mask


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("level", ["sequence", "token"])
def test_loss_and_gradient_match_trl_formula(seed, level):
    lt, old, adv, mask = random_batch(seed, spread=0.05 + seed / 30)
    eps = (0.2, 0.28) if seed % 2 else (0.1, 0.1)
    x = lt.clone().requires_grad_(True)
    want = trl_luspo(x, old, adv, mask, level=level, eps_low=eps[0], eps_high=eps[1])
    (g_want,) = torch.autograd.grad(want, x)
    y = lt.clone().requires_grad_(True)
    got, _ = luspo_loss(
        y,
        old,
        old,
        adv,
        mask,
        eps_clip=eps[0],
        eps_clip_higher=eps[1],
        importance_sampling_level=level,
        **AGG,
    )
    (g_got,) = torch.autograd.grad(got, y)
    assert got.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-14)
    assert torch.allclose(g_got, g_want, rtol=1e-10, atol=1e-14)


def trl_own_loss(lt, old, adv, mask, level):
    """TRL's own ``GRPOTrainer._compute_loss`` (loss_type luspo, ε = 0.2) on a stand-in."""
    pytest.importorskip("trl.trainer.grpo_trainer")
    x = lt.clone().requires_grad_(True)
    loss = trl_compute_loss(TrainerStandIn("luspo", x, level=level), old, adv[:, 0], mask)
    return loss, x.grad


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("level", ["sequence", "token"])
def test_matches_trl_own_compute_loss(seed, level):
    lt, old, adv, mask = random_batch(seed)
    lt, old, adv = lt.float(), old.float(), adv.float()
    want, g_want = trl_own_loss(lt, old, adv, mask, level)
    y = lt.clone().requires_grad_(True)
    got, _ = luspo_loss(y, old, old, adv, mask, importance_sampling_level=level, **AGG)
    got.backward()
    torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y.grad, g_want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ naive reference


def naive(lt, lp, A, m, *, eps, eps_hi, level):
    rows = [i for i in range(len(lt)) if any(m[i])]
    total = 0.0
    for i in rows:
        toks = [t for t in range(len(lt[i])) if m[i][t]]
        if level == "sequence":
            s = math.exp(sum(lt[i][t] - lp[i][t] for t in toks) / len(toks))
            a = sum(A[i][t] for t in toks) / len(toks)
            per = [(s, a)] * len(toks)
        else:
            per = [(math.exp(lt[i][t] - lp[i][t]), A[i][t]) for t in toks]
        for r, a in per:
            total += max(-a * r, -a * min(max(r, 1 - eps), 1 + eps_hi))
    return total / max(len(rows), 1)


@pytest.mark.parametrize("case", range(50))
def test_matches_a_naive_loop(case):
    rng = random.Random(500 + case)
    B, T = rng.randint(1, 4), rng.randint(1, 7)
    lp = [[-rng.uniform(0.01, 4) for _ in range(T)] for _ in range(B)]
    lt = [[x + rng.gauss(0, rng.choice([0.05, 0.3])) for x in r] for r in lp]
    A = [[rng.gauss(0, 2) for _ in range(T)] for _ in range(B)]
    m = [[rng.random() < 0.8 for _ in range(T)] for _ in range(B)]
    eps, eps_hi = rng.choice([0.1, 0.2]), rng.choice([0.2, 0.28])
    level = rng.choice(["sequence", "token"])
    want = naive(lt, lp, A, m, eps=eps, eps_hi=eps_hi, level=level)
    t = [torch.tensor(x, dtype=F64) for x in (lt, lp, A)]
    opts = {"eps_clip": eps, "eps_clip_higher": eps_hi, "importance_sampling_level": level}
    got, _ = luspo_loss(t[0], t[1], t[1], t[2], torch.tensor(m), **opts, **AGG)
    assert got.item() == pytest.approx(want, rel=1e-9, abs=1e-12)


# ------------------------------------------------------------------ composition


def test_decoupled_loss_and_behaviour_weights_as_gspo_summed():
    lt, lb, adv, mask = random_batch(3)
    g = torch.Generator().manual_seed(9)
    lp = lt + torch.randn(lt.shape, generator=g, dtype=F64) * 0.1
    weights = {"behave_imp_weight_mode": "token_truncate", "behave_imp_weight_cap": 1.5}
    cfg = from_dict(
        PPOActorConfig,
        {"policy_loss": "luspo", "use_decoupled_loss": True, **SEQ, **weights},
    )
    got, st = objective_loss(cfg, lt, lp, lb, adv, mask)
    want, want_st = ppo_actor_loss(lt, lp, lb, adv, mask, **SEQ, **weights)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    assert torch.equal(st["clip_mask"], want_st["clip_mask"]) and "behave_imp_weight" in st
    # one row, [T] inputs
    row, rst = luspo_loss(lt[0], lp[0], lb[0], adv[0], mask[0], **SEQ)
    first, _ = luspo_loss(lt[:1], lp[:1], lb[:1], adv[:1], mask[:1], **SEQ)
    assert row.item() == first.item() and rst["clip_mask"].shape == (lt.shape[1],)


# ------------------------------------------------------------------ config and the TRL map


def test_trl_map_is_loss_type_luspo(tmp_path):
    from trl import GRPOConfig

    from harness.run.trainers import train

    base = {
        "trainer": "trl",
        "task": "reverse",
        "tiny": TINY,
        "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 5},
        "ppo": {"reward_norm": {"mean_level": "group", "std_level": "group"}},
    }
    over = {
        "ppo.policy_loss": "luspo",
        "ppo.loss_agg_mode": "seq-mean-token-sum",
        "ppo.importance_sampling_level": "sequence",
        "ppo.eps_clip_higher": 0.28,
    }
    kw = grpo_kwargs(build_run_config(base, over))
    assert kw["loss_type"] == "luspo" and kw["importance_sampling_level"] == "sequence"
    assert (kw["epsilon"], kw["epsilon_high"]) == (0.2, 0.28)
    conf = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)
    assert conf.loss_type == "luspo"
    # and two steps of TRL's own trainer with it
    res = train(build_run_config({**base, "steps": 2, "threads": 1}, over), results_dir=tmp_path)
    assert res.status == "completed" and res.steps_done == 2, res.reason


def test_verl_export_is_gspo_summed_per_sequence():
    from harness.peers.export import export_verl

    cfg = build_run_config(
        {}, {"ppo.policy_loss": "luspo", **{f"ppo.{k}": v for k, v in SEQ.items()}}
    )
    text = export_verl(cfg)
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=gspo" in text
    assert "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum" in text


@pytest.mark.parametrize(
    "over, msg",
    [
        (
            {"ppo.policy_loss": "luspo"},
            "ppo.loss_agg_mode 'token-mean' means nothing under policy_loss 'luspo' "
            "(allowed: seq-mean-token-sum)",
        ),
        (
            {"ppo.policy_loss": "luspo", "ppo.loss_agg_mode": "seq-mean-token-mean"},
            "means nothing under policy_loss 'luspo'",
        ),
    ],
)
def test_bad_luspo_options_are_one_line(over, msg):
    assert_refused_in_one_line(over, msg)


def test_short_train_through_the_cli(tmp_path):
    assert_trains_through_the_cli(
        tmp_path,
        "ppo.policy_loss=luspo",
        "ppo.loss_agg_mode=seq-mean-token-sum",
        "ppo.importance_sampling_level=sequence",
    )
