"""The stability options against their peers.

TRL 1.16 ``GRPOTrainer._compute_loss`` with ``top_entropy_quantile`` and the entropy bonus
    (called unbound on tests/support/trl_stand_in.py's stand-in): loss and gradient, w.r.t.
    the log-probs and the entropies, agree with ``PPOActor.compute_loss``;
TRL ``mask_truncated_completions`` (the completion mask zeroed before ``_compute_loss``):
    the same loss and gradient as ``truncated_completions: mask``;
AReaL ``overlong_reward_penalty`` and verl's DAPO reward manager (transcribed): the penalty;
AReaL ``mask_no_eos_with_zero`` (transcribed): the normalized rewards;
SkyRL ``prompt_mean`` (transcribed: advantages pre-scaled, then a plain sum): loss, gradient;
verl ``filter_groups`` / SkyRL ``zero_variance_filter`` (transcribed): which groups go.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402

from harness.ppo import PPOActor  # noqa: E402
from harness.ppo.config import PPOActorConfig  # noqa: E402
from harness.ppo.masks import top_entropy_mask  # noqa: E402
from harness.ppo.normalization import NormConfig  # noqa: E402
from harness.ppo.objectives import ppo_actor_loss  # noqa: E402
from harness.ppo.shaping import overlong_penalty, zero_variance_groups  # noqa: E402
from tests.support.trl_stand_in import (  # noqa: E402
    TrainerStandIn,
    random_batch,
    trl_compute_loss,
)

close = torch.testing.assert_close


class _EntropyStandIn(TrainerStandIn):
    """Adds what the top-entropy mask and the entropy bonus read."""

    get_high_entropy_mask = GRPOTrainer.get_high_entropy_mask

    def __init__(self, loss_type, logps, entropies, *, rho, coef):
        super().__init__(loss_type, logps, entropies=entropies)
        self.top_entropy_quantile = rho
        self._entropy_bonus_enabled = coef > 0
        self.entropy_coef = coef
        self.use_adaptive_entropy = False


def trl_loss(loss_type, lt, H, old, adv_rows, mask, *, rho, coef):
    x = lt.clone().requires_grad_(True)
    h = H.clone().requires_grad_(True)
    stand_in = _EntropyStandIn(loss_type, x, h, rho=rho, coef=coef)
    loss = trl_compute_loss(stand_in, old, adv_rows, mask)
    return loss, x.grad, h.grad


def ours(cfg, lt, H, old, adv, mask):
    x = lt.clone().requires_grad_(True)
    h = H.clone().requires_grad_(True)
    batch = {"mask": mask, "prox_logprobs": old, "old_logprobs": old, "advantages": adv}
    loss, _ = PPOActor(cfg).compute_loss(batch, logprobs=x, entropy=h)
    loss.backward()
    return loss.detach(), x.grad, h.grad


AGG = {"dapo": "token-mean", "bnpo": "token-mean", "grpo": "seq-mean-token-mean"}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("loss_type", sorted(AGG))
@pytest.mark.parametrize("rho, coef", [(0.2, 0.0), (0.5, 0.01), (0.0, 0.05), (1.0, 0.01)])
def test_top_entropy_quantile_and_bonus_agree_with_trl(seed, loss_type, rho, coef):
    lt, old, _, mask = random_batch(seed, spread=0.4)
    g = torch.Generator().manual_seed(100 + seed)
    adv_rows = torch.randn(lt.shape[0], generator=g)
    H = torch.rand(lt.shape, generator=g) * 3
    want, gl_want, gh_want = trl_loss(loss_type, lt, H, old, adv_rows, mask, rho=rho, coef=coef)
    cfg = PPOActorConfig(top_entropy_quantile=rho, entropy_coef=coef, loss_agg_mode=AGG[loss_type])
    adv = adv_rows[:, None].expand_as(lt).clone()
    got, gl_got, gh_got = ours(cfg, lt, H, old, adv, mask)
    close(got, want, rtol=1e-5, atol=1e-6)
    close(gl_got, gl_want, rtol=1e-5, atol=1e-6)
    if coef > 0:
        close(gh_got, gh_want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(10))
def test_the_mask_is_trls_get_high_entropy_mask(seed):
    _, _, _, mask = random_batch(seed, B=5, Tn=9)
    g = torch.Generator().manual_seed(seed)
    H = (torch.rand(mask.shape, generator=g) * 4).round(decimals=1)  # ties
    stand_in = _EntropyStandIn("dapo", torch.zeros(mask.shape), H, rho=0.3, coef=0.0)
    for rho in (0.0, 0.2, 0.5, 0.8, 1.0 - 1e-9):
        want = GRPOTrainer.get_high_entropy_mask(stand_in, H, mask.int(), 1 - rho)
        assert top_entropy_mask(H, mask, rho).tolist() == want.tolist(), rho


@pytest.mark.parametrize("seed", range(4))
def test_mask_truncated_completions_agrees_with_trl(seed):
    """TRL zeroes a truncated row's completion mask before the loss; the harness narrows its
    loss mask in compute_advantages: the same loss and gradient (dapo = token-mean)."""
    lt, old, _, mask = random_batch(seed, B=4, Tn=5)
    g = torch.Generator().manual_seed(seed)
    truncated = torch.tensor([False, True, False, True])
    rewards = torch.randn(4, generator=g)
    B, Tn = lt.shape
    # token layout: one prompt column, then the completion (the actor rolls left by one)
    pad = torch.zeros(B, 1)
    batch = {
        "input_ids": torch.zeros(B, Tn + 1, dtype=torch.long),
        "attention_mask": torch.ones(B, Tn + 1, dtype=torch.long),
        "loss_mask": torch.cat([pad, mask.float()], 1).long(),
        "logprobs": torch.cat([pad, old * mask], 1),
        "rewards": rewards,
        "group_sizes": [2, 2],
        "truncated": truncated,
    }
    actor = PPOActor(
        PPOActorConfig(
            truncated_completions="mask", reward_norm=NormConfig(mean_level="group", std_level=None)
        )
    )
    actor.compute_advantages(batch)
    # TRL: the advantage is per row (r − group mean, every row's reward included)
    adv_rows = rewards - rewards.view(2, 2).mean(1).repeat_interleave(2)
    # predicting layout: the completion at 0..Tn-1, the wrapped prompt column last
    x = lt.clone().requires_grad_(True)
    loss, _ = actor.compute_loss(batch, logprobs=torch.cat([x, pad], 1), entropy=None)
    loss.backward()
    trl_mask = mask & ~truncated[:, None]
    want, g_want, _ = trl_loss(
        "dapo", lt, torch.zeros_like(lt), old, adv_rows, trl_mask, rho=1.0, coef=0.0
    )
    close(loss, want, rtol=1e-5, atol=1e-6)
    close(x.grad, g_want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ transcriptions


def areal_overlong(seq_lens, max_new_tokens, overlong_tokens, factor):
    """AReaL's actor, per sequence: the penalty added to the outcome reward."""
    out = []
    for n in seq_lens:
        out.append(min(-(n - (max_new_tokens - overlong_tokens)) / overlong_tokens * factor, 0))
    return out


def verl_dapo_overlong(valid_response_length, max_resp_len, buffer_len, penalty_factor):
    """verl's DAPO reward manager with overlong_buffer_cfg.enable."""
    assert max_resp_len >= buffer_len > 0
    expected_len = max_resp_len - buffer_len
    exceed_len = valid_response_length - expected_len
    return min(-exceed_len / buffer_len * penalty_factor, 0)


@pytest.mark.parametrize("L, Lc, f", [(16, 4, 1.0), (16, 16, 0.5), (9, 1, 2.0), (12, 5, 0.3)])
def test_overlong_penalty_is_areals_and_verls(L, Lc, f):
    lens = list(range(0, L + 1))
    got = overlong_penalty(torch.tensor(lens), L, Lc, f).tolist()
    for a, b, c in zip(got, areal_overlong(lens, L, Lc, f), lens, strict=True):
        assert a == pytest.approx(b, abs=1e-6)
        assert a == pytest.approx(verl_dapo_overlong(c, L, Lc, f), abs=1e-6)


def test_zero_reward_is_areals_mask_no_eos_with_zero():
    """AReaL: after reward normalization, rewards of rows that fill the padded length → 0."""
    g = torch.Generator().manual_seed(3)
    rewards = torch.randn(6, generator=g)
    seq_lens = torch.tensor([3, 5, 5, 2, 5, 1])
    max_len = 5
    no_eos = seq_lens == max_len
    norm = NormConfig(mean_level="group", std_level="group", group_size=3)
    T = max_len + 1
    loss_mask = (torch.arange(T)[None] >= 1) & (torch.arange(T)[None] <= seq_lens[:, None])
    batch = {
        "input_ids": torch.zeros(6, T, dtype=torch.long),
        "attention_mask": torch.ones(6, T, dtype=torch.long),
        "loss_mask": loss_mask.long(),
        "logprobs": torch.zeros(6, T),
        "rewards": rewards,
        "group_sizes": [3, 3],
        "truncated": no_eos,
    }
    PPOActor(
        PPOActorConfig(reward_norm=norm, truncated_completions="zero_reward")
    ).compute_advantages(batch)
    # transcription: normalize per group of 3 (unbiased std, eps 1e-5), then zero the no-EOS rows
    r = rewards.view(2, 3).double()
    want = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + norm.eps)).view(-1)
    want = torch.where(no_eos, torch.zeros((), dtype=want.dtype), want).float()
    close(batch["normalized_rewards"], want, rtol=1e-5, atol=1e-6)
    assert batch["mask"].sum(1).tolist() == seq_lens.tolist()  # tokens stay in the loss


def skyrl_prompt_mean_ppo(lt, old, adv, mask, group_ids, eps=0.2):
    """SkyRL's prompt_mean: scale each row's advantage by 1/(P·max(1, tokens of its prompt)),
    then the plain masked sum of the PPO-clip loss."""
    P = len(torch.unique(group_ids))
    tok = {int(g): max(1.0, float(mask[group_ids == g].sum())) for g in torch.unique(group_ids)}
    scale = torch.tensor([1.0 / (P * tok[int(g)]) for g in group_ids])[:, None]
    a = adv * scale
    ratio = torch.exp(lt - old)
    per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps, 1 + eps) * a)
    return (per_token * mask).sum()


@pytest.mark.parametrize("seed", range(8))
def test_prompt_mean_agrees_with_skyrls_advantage_prescaling(seed):
    lt, old, adv, mask = random_batch(seed, B=6, Tn=5, spread=0.4)
    mask[5] = False  # a prompt whose row has no token still counts in P
    gid = torch.tensor([0, 0, 0, 1, 1, 2])
    x = lt.clone().requires_grad_(True)
    got, _ = ppo_actor_loss(x, old, old, adv, mask, loss_agg_mode="prompt-mean", group_ids=gid)
    got.backward()
    y = lt.clone().requires_grad_(True)
    want = skyrl_prompt_mean_ppo(y, old, adv, mask, gid)
    want.backward()
    close(got, want.detach(), rtol=1e-5, atol=1e-6)
    close(x.grad, y.grad, rtol=1e-5, atol=1e-6)


def verl_filter_groups(rewards, group_sizes):
    """verl's filter_groups: a prompt stays if its std > 0 or it has a single sample."""
    kept, start = [], 0
    for n in group_sizes:
        vals = rewards[start : start + n].tolist()
        std = torch.tensor(vals).std(unbiased=True).item() if n > 1 else 0.0
        kept.append(std > 0 or n == 1)
        start += n
    return kept


def skyrl_zero_variance(rewards, group_sizes, tol=1e-6):
    out, start = [], 0
    for n in group_sizes:
        g = rewards[start : start + n]
        out.append(n > 1 and float(g.max() - g.min()) <= tol)
        start += n
    return out


@pytest.mark.parametrize("seed", range(8))
def test_zero_variance_groups_are_verls_and_skyrls(seed):
    g = torch.Generator().manual_seed(seed)
    sizes = [4, 4, 1, 3, 4]
    rewards = torch.randint(0, 2, (sum(sizes),), generator=g).float()
    zv = zero_variance_groups(rewards, sizes).tolist()
    assert zv == [not k for k in verl_filter_groups(rewards, sizes)]
    assert zv == skyrl_zero_variance(rewards, sizes)  # 0/1 rewards: the tolerance is moot
