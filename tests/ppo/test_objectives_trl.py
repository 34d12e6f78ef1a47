"""Agreement with TRL's own loss computation (``GRPOTrainer._compute_loss``, TRL 1.16).

TRL's method is called unbound on a minimal stand-in for the trainer that supplies exactly the
attributes the loss reads (loss type, ε, SAPO temperatures, a one-process accelerator) and returns
our per-token log-probs from its forward pass; the loss and its gradient are compared with the
harness objective on identical inputs:

    TRL loss_type | harness
    cispo         | policy_loss cispo, ratio_max = epsilon_high, token-mean
    sapo          | policy_loss sapo, same temperatures, seq-mean-token-mean
    dapo          | ppo-clip, token-mean
    grpo          | ppo-clip, seq-mean-token-mean
    dr_grpo       | ppo-clip, seq-mean-token-sum-norm (max_completion_length = T)
"""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402

from harness.ppo import ppo_actor_loss  # noqa: E402
from harness.ppo.objectives import cispo_loss, sapo_loss  # noqa: E402


class _Accelerator:
    num_processes = 1

    def reduce(self, x, reduction="sum"):
        return x

    def gather(self, x):
        return x

    gather_for_metrics = gather


class _TrainerStandIn:
    """The attributes ``GRPOTrainer._compute_loss`` reads, for one process, no reference model,
    no vLLM, no entropy mask or bonus, one gradient-accumulation step per generation batch."""

    def __init__(self, loss_type, logps, *, eps_low=0.2, eps_high=0.2, tau_pos=1.0, tau_neg=1.05):
        self.loss_type = loss_type
        self.epsilon_low = eps_low
        self.epsilon_high = eps_high
        self.importance_sampling_level = "token"
        self.beta = 0.0
        self.top_entropy_quantile = 1.0
        self.off_policy_mask_threshold = None
        self.use_vllm = False
        self.vllm_importance_sampling_correction = False
        self._entropy_bonus_enabled = False
        self.aux_loss_enabled = False
        self.current_gradient_accumulation_steps = 1
        self.max_completion_length = logps.shape[1]
        self.model = SimpleNamespace(training=True)
        self.accelerator = _Accelerator()
        self.args = SimpleNamespace(
            delta=None,
            sapo_temperature_pos=tau_pos,
            sapo_temperature_neg=tau_neg,
            steps_per_generation=1,
            use_bias_correction_kl=False,
        )
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._logps = logps

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, keep, **_):
        return self._logps, torch.zeros_like(self._logps), None


def trl_loss(loss_type, lt, old, adv, mask, **kw):
    """TRL's loss and d loss / d ℓθ on [B, T] completions."""
    x = lt.clone().requires_grad_(True)
    stand_in = _TrainerStandIn(loss_type, x, **kw)
    B, Tn = lt.shape
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, Tn, dtype=torch.long),
        "completion_mask": mask.to(lt.dtype),
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum().to(lt.dtype),
    }
    loss = GRPOTrainer._compute_loss(stand_in, None, inputs)
    loss.backward()
    return loss.detach(), x.grad, stand_in._metrics["train"]


def ours(fn, lt, old, adv, mask, **kw):
    x = lt.clone().requires_grad_(True)
    loss, stats = fn(x, old, old, adv, mask, **kw)
    loss.backward()
    return loss.detach(), x.grad, stats


def random_batch(seed, B=6, Tn=7, spread=0.4, per_sequence_adv=False):
    g = torch.Generator().manual_seed(seed)
    lt = -torch.rand(B, Tn, generator=g) * 4
    old = lt + torch.randn(B, Tn, generator=g) * spread
    if per_sequence_adv:
        adv = (torch.randn(B, 1, generator=g) * 1.5).expand(B, Tn).clone()
    else:
        adv = torch.randn(B, Tn, generator=g) * 1.5
    mask = torch.rand(B, Tn, generator=g) < 0.75
    mask[:, 0] = True  # every completion has a token (TRL's sequence means count every row)
    return lt, old, adv, mask


SEEDS = range(8)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("eps_max", [1.5, 5.0])
def test_cispo_agrees_with_trl(seed, eps_max):
    lt, old, adv, mask = random_batch(seed, spread=0.8)
    want, g_want, metrics = trl_loss("cispo", lt, old, adv, mask, eps_high=eps_max)
    got, g_got, stats = ours(cispo_loss, lt, old, adv, mask, ratio_max=eps_max)
    close(got, want)
    close(g_got, g_want)
    # TRL's cispo_clip_ratio counts capped tokens with A > 0 only
    capped_pos = (stats["reweighted_mask"] & (adv > 0)).sum() / mask.sum()
    assert metrics["cispo_clip_ratio"][0] == pytest.approx(capped_pos.item(), abs=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.3, 2.0)])
def test_sapo_agrees_with_trl(seed, taus):
    lt, old, adv, mask = random_batch(seed, spread=0.8)
    want, g_want, _ = trl_loss("sapo", lt, old, adv, mask, tau_pos=taus[0], tau_neg=taus[1])
    got, g_got, _ = ours(
        sapo_loss,
        lt,
        old,
        adv,
        mask,
        temperature_pos=taus[0],
        temperature_neg=taus[1],
        loss_agg_mode="seq-mean-token-mean",
    )
    close(got, want)
    close(g_got, g_want)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "loss_type, agg",
    [
        ("dapo", "token-mean"),
        ("grpo", "seq-mean-token-mean"),
        ("dr_grpo", "seq-mean-token-sum-norm"),
    ],
)
@pytest.mark.parametrize("eps", [(0.2, 0.2), (0.2, 0.28)])
def test_ppo_aggregations_agree_with_trl(seed, loss_type, agg, eps):
    lt, old, adv, mask = random_batch(seed, spread=0.4)
    want, g_want, metrics = trl_loss(loss_type, lt, old, adv, mask, eps_low=eps[0], eps_high=eps[1])
    got, g_got, stats = ours(
        ppo_actor_loss,
        lt,
        old,
        adv,
        mask,
        eps_clip=eps[0],
        eps_clip_higher=eps[1],
        loss_agg_mode=agg,
    )
    close(got, want)
    close(g_got, g_want)
    n = mask.sum().item()
    low = metrics["clip_ratio/low_mean"][0]
    high = metrics["clip_ratio/high_mean"][0]
    assert low == pytest.approx(stats["clip_low_mask"].sum().item() / n, abs=1e-6)
    assert high == pytest.approx(stats["clip_high_mask"].sum().item() / n, abs=1e-6)
