"""VESPO: golden values by hand, TRL's formula (a transcription and TRL's own code), a naive loop,
composition with the decoupled loss and every aggregation, the TRL map, config errors, a CLI run."""

import math
import random

import pytest
import torch

from harness.config import ConfigError, build_run_config
from harness.core.configtools import from_dict
from harness.peers.trl import grpo_kwargs, trl_problems
from harness.ppo import PPOActorConfig
from harness.ppo.corrections import Correction
from harness.ppo.objectives import objective_loss
from harness.ppo.objectives.vespo import vespo_loss
from tests.support.objective_cli import assert_trains_through_the_cli
from tests.support.objective_rows import assert_config_and_one_row, assert_refused_in_one_line
from tests.support.tiny import tiny_reverse
from tests.support.trl_stand_in import TrainerStandIn, trl_compute_loss

F64 = torch.float64
AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
ONE = torch.ones(1, 3, dtype=torch.bool)


def row(lt, log_r, adv):
    """One row: ℓθ (with gradient), ℓp = ℓθ − log r, advantages."""
    x = torch.tensor([lt], dtype=F64, requires_grad=True)
    lp = torch.tensor([lt], dtype=F64) - torch.tensor([log_r], dtype=F64)
    return x, lp, torch.tensor([adv], dtype=F64)


def test_golden_at_the_peaks_and_at_one():
    lt = [-0.5, -1.0, -2.0]
    # W = 2/3 (Σ log r = log 2/3), A = +1: φ = e³·(4/9)·e⁻² = 4e/9 = 1.20813 (the A ≥ 0 peak)
    third = math.log(2 / 3) / 3
    x, lp, adv = row(lt, [third] * 3, [1.0] * 3)
    loss, st = vespo_loss(x, lp, lp, adv, ONE)
    loss.backward()
    phi = 4 * math.e / 9
    assert phi == pytest.approx(1.208125, abs=1e-6)
    assert loss.item() == pytest.approx(phi * 3.5 / 3, rel=1e-12)
    assert x.grad.tolist()[0] == pytest.approx([-phi / 3] * 3, rel=1e-12)
    assert st["gate"].tolist()[0] == pytest.approx([phi] * 3, rel=1e-12)
    # W = 1.5, A = −2: φ = e²·1.5³·e⁻³ = 3.375/e = 1.24159 (the A < 0 peak)
    x, lp, adv = row(lt, [0.0, math.log(1.5), 0.0], [-2.0] * 3)
    loss, _ = vespo_loss(x, lp, lp, adv, ONE)
    phi = 3.375 / math.e
    assert phi == pytest.approx(1.241593, abs=1e-6)
    assert loss.item() == pytest.approx(-phi * 2 * 3.5 / 3, rel=1e-12)
    # W = 1 (the log-ratios cancel): φ = 1, plain REINFORCE −A·ℓθ
    x, lp, adv = row(lt, [0.3, -0.1, -0.2], [1.0, -1.0, 0.5])
    loss, st = vespo_loss(x, lp, lp, adv, ONE)
    assert loss.item() == pytest.approx((0.5 - 1.0 + 1.0) / 3, rel=1e-12)
    assert st["gate"].tolist()[0] == pytest.approx([1.0] * 3, rel=1e-12)


def test_a_far_sequence_fades_out_and_padding_is_ignored():
    # Σ log r = 25 → log W clamped to 20: φ = e^(3 + 40 − 3e²⁰) underflows to 0 (silenced)
    x, lp, adv = row([-0.5, -1.0, -2.0], [10.0, 10.0, 5.0], [1.0] * 3)
    loss, st = vespo_loss(x, lp, lp, adv, ONE)
    assert loss.item() == 0.0 and st["silenced_mask"].all()
    # a padded position holding −inf log-probs (and a huge log-ratio) changes nothing
    x, lp, adv = row([-0.5, -1.0, -math.inf], [0.1, 0.1, 50.0], [1.0] * 3)
    m = torch.tensor([[True, True, False]])
    loss, st = vespo_loss(x, lp, lp, adv, m)
    loss.backward()
    log_w = 0.2
    phi = math.exp(3 + 2 * log_w - 3 * math.exp(log_w))
    assert loss.item() == pytest.approx(phi * 1.5 / 2, rel=1e-12)
    assert x.grad.tolist()[0] == pytest.approx([-phi / 2, -phi / 2, 0.0], rel=1e-12)


# ------------------------------------------------------------------ TRL's formula


def trl_gamma(adv, log_ratio, mask, k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0):
    """TRL 1.16 ``GRPOTrainer.get_gamma_weights`` (no vLLM weight), written out."""
    lower = math.log(1e-8)
    seq = (log_ratio.clamp(-20.0, 20.0) * mask).sum(-1, keepdim=True)
    log_w = seq.clamp(lower, 20.0)
    pos = adv >= 0
    k = torch.where(pos, k_pos, k_neg)
    lam = torch.where(pos, lambda_pos, lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * log_w.exp()).nan_to_num(0.0, 0.0, 0.0)


def trl_vespo(lt, old, adv, mask, **kw):
    """TRL's vespo loss (per-token −φ·A·ℓθ, dapo aggregation over one generation batch)."""
    mf = mask.to(lt.dtype)
    phi = trl_gamma(adv, (lt - old).detach(), mf, **kw)
    return (-phi * adv * lt * mf).sum() / mf.sum().clamp(min=1.0)


def random_batch(seed, B=5, T=7, spread=0.15, per_sequence_adv=True):
    g = torch.Generator().manual_seed(seed)
    lt = -torch.rand(B, T, generator=g, dtype=F64) * 3
    old = lt + torch.randn(B, T, generator=g, dtype=F64) * spread
    if per_sequence_adv:
        adv = (torch.randn(B, 1, generator=g, dtype=F64) * 1.5).expand(B, T).clone()
    else:
        adv = torch.randn(B, T, generator=g, dtype=F64) * 1.5
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[:, 0] = True
    return lt, old, adv, mask


OPTS = [{}, {"k_pos": 1.0, "lambda_pos": 0.5, "k_neg": 0.5, "lambda_neg": 4.0}]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("opts", OPTS)
def test_loss_and_gradient_match_trl_formula(seed, opts):
    lt, old, adv, mask = random_batch(seed, per_sequence_adv=seed % 2 == 0, spread=0.1 + seed / 20)
    trl_kw = {f"{k}": v for k, v in opts.items()}
    x = lt.clone().requires_grad_(True)
    want = trl_vespo(x, old, adv, mask, **trl_kw)
    (g_want,) = torch.autograd.grad(want, x)
    y = lt.clone().requires_grad_(True)
    got, st = vespo_loss(y, old, old, adv, mask, **opts)
    (g_got,) = torch.autograd.grad(got, y)
    assert got.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-14)
    assert torch.allclose(g_got, g_want, rtol=1e-12, atol=1e-15)
    phi = trl_gamma(adv, lt - old, mask.to(F64), **trl_kw).expand_as(lt)
    assert torch.allclose(st["gate"], torch.where(mask, phi, 0.0), rtol=1e-12)


def trl_own_loss(lt, old, adv, mask):
    """TRL's own ``GRPOTrainer._compute_loss`` (loss_type vespo, default k/λ) on a stand-in."""
    pytest.importorskip("trl.trainer.grpo_trainer")
    x = lt.clone().requires_grad_(True)
    me = TrainerStandIn("vespo", x)
    loss = trl_compute_loss(me, old, adv[:, 0], mask)
    return loss, x.grad, me._metrics["train"]


@pytest.mark.parametrize("seed", range(4))
def test_matches_trl_own_compute_loss(seed):
    lt, old, adv, mask = random_batch(seed)
    lt, old, adv = lt.float(), old.float(), adv.float()
    want, g_want, metrics = trl_own_loss(lt, old, adv, mask)
    y = lt.clone().requires_grad_(True)
    got, st = vespo_loss(y, old, old, adv, mask)
    got.backward()
    torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y.grad, g_want, rtol=1e-5, atol=1e-6)
    assert metrics["vespo/phi_seq_mean"][0] == pytest.approx(st["gate"][:, 0].mean().item(), 1e-5)


# ------------------------------------------------------------------ naive per-token reference


def naive(lt, lp, A, m, *, kp, lp_, kn, ln, agg):
    B, T = len(lt), len(lt[0])
    per = [[0.0] * T for _ in range(B)]
    for i in range(B):
        s = sum(max(-20.0, min(20.0, lt[i][t] - lp[i][t])) for t in range(T) if m[i][t])
        log_w = max(math.log(1e-8), min(20.0, s))
        for t in range(T):
            if m[i][t]:
                k, lam = (kp, lp_) if A[i][t] >= 0 else (kn, ln)
                phi = math.exp(lam + k * log_w - lam * math.exp(log_w))
                per[i][t] = -phi * A[i][t] * lt[i][t]
    n = max(sum(map(sum, m)), 1)
    rows = [i for i in range(B) if any(m[i])]
    if agg == "token-mean":
        return sum(map(sum, per)) / n
    if agg == "seq-mean-token-mean":
        return sum(sum(per[i]) / sum(m[i]) for i in rows) / max(len(rows), 1)
    if agg == "seq-mean-token-sum":
        return sum(sum(per[i]) for i in rows) / max(len(rows), 1)
    return sum(sum(per[i]) for i in rows) / (max(len(rows), 1) * T)


@pytest.mark.parametrize("case", range(60))
def test_matches_a_naive_per_token_loop(case):
    rng = random.Random(700 + case)
    B, T = rng.randint(1, 4), rng.randint(1, 6)
    lt = [[math.log(rng.uniform(0.01, 0.99)) for _ in range(T)] for _ in range(B)]
    lp = [[x + rng.gauss(0, rng.choice([0.05, 0.3, 1.5])) for x in r] for r in lt]
    A = [[rng.choice([0.0, rng.gauss(0, 2)]) for _ in range(T)] for _ in range(B)]
    m = [[rng.random() < 0.8 for _ in range(T)] for _ in range(B)]
    m[0][0] = True
    kp, lp_, kn, ln = (rng.choice([0.5, 2.0, 3.0]) for _ in range(4))
    agg = rng.choice(AGGS)
    want = naive(lt, lp, A, m, kp=kp, lp_=lp_, kn=kn, ln=ln, agg=agg)
    t = [torch.tensor(x, dtype=F64) for x in (lt, lp, A)]
    opts = {"k_pos": kp, "lambda_pos": lp_, "k_neg": kn, "lambda_neg": ln, "loss_agg_mode": agg}
    got, _ = vespo_loss(t[0], t[1], t[1], t[2], torch.tensor(m), **opts)
    assert got.item() == pytest.approx(want, rel=1e-9, abs=1e-12)


# ------------------------------------------------------------------ composition


def test_decoupled_loss_takes_w_against_the_proximal_policy_times_the_behaviour_weight():
    lt, lb, adv, mask = random_batch(3, spread=0.1)
    g = torch.Generator().manual_seed(4)
    lp = lt + torch.randn(lt.shape, generator=g, dtype=F64) * 0.1
    cfg = from_dict(
        PPOActorConfig,
        {
            "policy_loss": "vespo",
            "use_decoupled_loss": True,
            "behave_imp_weight_mode": "token_truncate",
            "behave_imp_weight_cap": 1.5,
        },
    )
    got, st = objective_loss(cfg, lt, lp, lb, adv, mask)
    w = torch.exp(lp - lb).clamp(max=1.5) * mask  # float64 inputs: a float64 weight
    phi = trl_gamma(adv, lt - lp, mask.to(F64))
    want = (torch.where(mask, -phi * adv * lt, 0.0) * w).sum() / mask.sum()
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    assert "behave_imp_weight" in st
    # W is taken against π_prox, not π_behave: the other anchor gives another loss
    other = (torch.where(mask, -trl_gamma(adv, lt - lb, mask.to(F64)) * adv * lt, 0.0) * w).sum()
    assert got.item() != pytest.approx((other / mask.sum()).item(), rel=1e-4)


@pytest.mark.parametrize("agg", AGGS)
def test_every_aggregation_through_the_config_and_one_row(agg):
    assert_config_and_one_row("vespo", vespo_loss, random_batch(11), agg, "gate")


# ------------------------------------------------------------------ config and the TRL map


def trl_cfg(**over):
    group = {"mean_level": "group", "std_level": "group"}
    base = tiny_reverse(2, trainer="trl", ppo={"reward_norm": group})
    return build_run_config(base, {"ppo.policy_loss": "vespo", **over})


def test_trl_map_names_vespo_and_its_options(tmp_path):
    from trl import GRPOConfig

    kw = grpo_kwargs(trl_cfg(**{"ppo.vespo.k_neg": 1.5, "ppo.vespo.lambda_pos": 2.5}))
    assert kw["loss_type"] == "vespo"
    assert (kw["vespo_k_pos"], kw["vespo_lambda_pos"]) == (2.0, 2.5)
    assert (kw["vespo_k_neg"], kw["vespo_lambda_neg"]) == (1.5, 2.0)
    conf = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)
    assert conf.loss_type == "vespo" and conf.vespo_k_neg == 1.5
    # TRL aggregates vespo like dapo only: another aggregation is refused when the config is built
    with pytest.raises(ConfigError) as err:
        trl_cfg(**{"ppo.loss_agg_mode": "seq-mean-token-mean"})
    assert "ppo.loss_agg_mode: not expressible with trainer: trl" in str(err.value)
    assert "TRL's vespo loss is token-mean only" in str(err.value)
    assert trl_problems(trl_cfg()) == []


def test_two_steps_with_trainer_trl(tmp_path):
    from harness.run.trainers import train

    over = {"ppo.ppo_n_minibatches": 2, "ppo.ppo_epochs": 2, "ppo.vespo.k_pos": 1.5}
    res = train(trl_cfg(**over), results_dir=tmp_path)
    assert res.status == "completed" and res.steps_done == 2, res.reason


@pytest.mark.parametrize(
    "over, msg",
    [
        ({"ppo.vespo.k_pos": 1.0}, "ppo.vespo.k_pos means nothing under policy_loss 'ppo'"),
        (
            {"ppo.policy_loss": "vespo", "ppo.importance_sampling_level": "sequence"},
            "importance_sampling_level 'sequence' means nothing under policy_loss 'vespo'",
        ),
        ({"ppo.policy_loss": "vespo", "ppo.vespo.lambda_neg": 0.0}, "ppo.vespo.lambda_neg: must"),
        ({"ppo.policy_loss": "vespo", "ppo.vespo.k_pos": -1.0}, "ppo.vespo.k_pos: must"),
        ({"ppo.policy_loss": "vespo", "ppo.eps_clip": 0.3}, "ppo.eps_clip means nothing under"),
    ],
)
def test_bad_vespo_options_are_one_line(over, msg):
    assert_refused_in_one_line(over, msg)


def test_short_train_through_the_cli(tmp_path):
    assert_trains_through_the_cli(tmp_path, "ppo.policy_loss=vespo", "rollout.staleness=1")


FOLD = {"ppo.policy_loss": "vespo", "ppo.vespo.behaviour_weight": "fold"}


@pytest.mark.parametrize(
    "correction, got",
    [
        (None, "(it is null)"),
        ({"weight": "sequence_geometric", "clip_max": 2.0}, "(got 'sequence_geometric')"),
        ("opsm", "(got 'none')"),
    ],
)
def test_fold_without_a_token_or_sequence_product_weight_is_one_line(correction, got):
    over = FOLD | {"ppo.use_decoupled_loss": True, "ppo.correction": correction}
    with pytest.raises(ConfigError) as err:
        build_run_config({}, over)
    msg = str(err.value)
    assert "vespo.behaviour_weight 'fold' needs ppo.correction with weight 'token'" in msg
    assert "or 'sequence_product'" in msg and msg.endswith(got) and "\n" not in msg


@pytest.mark.parametrize("weight", ["token", "sequence_product"])
def test_fold_takes_a_token_or_sequence_product_weight(weight):
    c = {"weight": weight, "clip_min": 0.5, "clip_max": 2.0}
    cfg = build_run_config({}, FOLD | {"ppo.use_decoupled_loss": True, "ppo.correction": c})
    assert cfg.ppo.vespo.behaviour_weight == "fold" and cfg.ppo.correction.weight == weight


@pytest.mark.parametrize("correction", [None, "opsm", Correction(weight="sequence_geometric")])
def test_the_pure_call_refuses_fold_as_the_config_does(correction):
    lt, lb, adv, mask = random_batch(5)
    with pytest.raises(ValueError) as err:
        vespo_loss(lt, lb, lb, adv, mask, correction=correction, behaviour_weight="fold")
    msg = str(err.value)
    assert msg.startswith("vespo.behaviour_weight 'fold' needs ppo.correction with weight")
    assert "\n" not in msg


def test_fold_adds_a_sequence_weight_once_per_row_by_hand():
    # ℓp − ℓb = 0.1 on each of 3 valid tokens: sequence_product ρ = e^0.3, folded ONCE
    # (not 3·0.3); ℓθ = ℓp, so log W = 0.3 alone; padding (ℓp − ℓb = 5) enters neither.
    lt = torch.tensor([[-0.5, -1.0, -2.0, -0.7]], dtype=F64, requires_grad=True)
    lp = lt.detach().clone()
    lb = lp - torch.tensor([[0.1, 0.1, 0.1, 5.0]], dtype=F64)
    m = torch.tensor([[True, True, True, False]])
    adv = torch.full((1, 4), 1.0, dtype=F64)
    c = Correction(weight="sequence_product")
    loss, st = vespo_loss(lt, lp, lb, adv, m, correction=c, behaviour_weight="fold")
    loss.backward()
    phi = math.exp(3 + 2 * 0.3 - 3 * math.exp(0.3))  # k_pos 2, λ_pos 3, W = e^0.3
    assert phi == pytest.approx(0.637898, abs=1e-6)
    assert st["gate"].tolist()[0] == pytest.approx([phi] * 3 + [0.0], rel=1e-12)
    assert loss.item() == pytest.approx(phi * 3.5 / 3, rel=1e-12)  # not multiplied by ρ again
    assert lt.grad.tolist()[0] == pytest.approx([-phi / 3] * 3 + [0.0], rel=1e-12)
    # the per-token weight of the same log-ratios is three factors: log W = 0.3 as well
    tok, _ = vespo_loss(
        lt.detach(), lp, lb, adv, m, correction=Correction(weight="token"), behaviour_weight="fold"
    )
    assert tok.item() == pytest.approx(loss.item(), rel=1e-12)
    # sequence_mask outside [C_min, C_max]: ρ_i = 0 → log W = log 1e-8 once → φ ≈ 0
    c = Correction(weight="sequence_product", clip_max=1.2, zero_outside=True)
    _, st = vespo_loss(lt.detach(), lp, lb, adv, m, correction=c, behaviour_weight="fold")
    assert st["gate"].tolist()[0] == pytest.approx([math.exp(3 - 2 * 18.420681)] * 3 + [0.0])


def test_trl_export_says_which_vespo_composition_the_cell_uses():
    from harness.peers.export import export_trl

    over = {
        "ppo.policy_loss": "vespo",
        "ppo.use_decoupled_loss": True,
        "ppo.correction": {"weight": "token", "clip_min": 0.5, "clip_max": 2.0},
    }
    folded = export_trl(build_run_config({}, {**over, "ppo.vespo.behaviour_weight": "fold"}))
    assert "# ppo.vespo.behaviour_weight=fold: TRL's own VESPO composition" in folded
    assert "vllm_importance_sampling_mode='token_truncate'" in folded
    multiplied = export_trl(build_run_config({}, over))
    assert "# ppo.vespo.behaviour_weight: not expressible in TRL (TRL's VESPO folds ρ" in multiplied
    assert "Set fold for TRL's composition" in multiplied
    assert "behaviour_weight=fold" not in multiplied
