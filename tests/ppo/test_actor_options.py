"""Every PPO option reaches the computation: changing it changes the loss or the update."""

import copy
import dataclasses

import pytest
import torch

from harness.config import PPOActorConfig
from harness.model.build import TinyModelConfig, build_model, build_tokenizer
from harness.ppo import NormConfig, RejectionSampling
from harness.ppo.actor import PPOActor
from harness.sampling.local import sample
from tests.support.tiny import TINY


@pytest.fixture(scope="module")
def setup():
    tok = build_tokenizer()
    model = build_model(tok, TinyModelConfig(**TINY), seed=0)
    gen = torch.Generator().manual_seed(0)
    rb = sample(
        model, tok, ["123>", "4567>", "89>", "2468>"], n_samples=4, max_new_tokens=6, generator=gen
    )
    g = torch.Generator().manual_seed(1)
    # Stale behaviour log-probs: the data look as if a different policy had sampled them.
    stale = rb.logprobs + rb.loss_mask * torch.randn(rb.logprobs.shape, generator=g) * 0.5
    rewards = torch.rand(rb.input_ids.shape[0], generator=g) * 10
    batch = {
        "input_ids": rb.input_ids,
        "attention_mask": rb.attention_mask,
        "loss_mask": rb.loss_mask,
        "logprobs": stale,
        "rewards": rewards,
        "group_sizes": rb.group_sizes,
        "truncated": rb.truncated,
    }
    return model, batch


BASE = PPOActorConfig(eps_clip=0.2, ppo_n_minibatches=2, adv_norm=NormConfig())


def loss_with(setup, **changes):
    model, batch = setup
    cfg = dataclasses.replace(BASE, **changes)
    actor = PPOActor(cfg, copy.deepcopy(model))
    loss, _ = actor.compute_loss(copy.copy(batch))
    return loss.item()


LOSS_OPTIONS = {
    "eps_clip": dict(eps_clip=0.05),
    "eps_clip_higher": dict(eps_clip_higher=0.02),
    "c_clip": dict(c_clip=1.05),
    "behave_imp_weight_mode": dict(
        use_decoupled_loss=True, behave_imp_weight_mode="token_truncate", behave_imp_weight_cap=1.2
    ),
    "rejection_sampling": dict(
        use_decoupled_loss=True, rejection_sampling=RejectionSampling(upper=1.2)
    ),
    "use_decoupled_loss": dict(use_decoupled_loss=True),
    "recompute_logprob": dict(recompute_logprob=True),
    "importance_sampling_level": dict(importance_sampling_level="sequence"),
    "loss_agg_mode": dict(loss_agg_mode="seq-mean-token-sum"),
    "adv_norm": dict(adv_norm=NormConfig(mean_level="batch", std_level=None)),
    "reward_norm": dict(reward_norm=NormConfig("group", False, "group", True)),
    "reward_scaling": dict(reward_scaling=3.0),
    # a constant shift survives only without batch centering of the advantages
    "reward_bias": (dict(adv_norm=None), dict(adv_norm=None, reward_bias=-5.0)),
    "reward_clip": dict(reward_clip=2.0),
    "entropy_coef": dict(entropy_coef=0.1),
    "temperature": dict(temperature=0.7),
}


@pytest.mark.parametrize("option", sorted(LOSS_OPTIONS))
def test_option_changes_the_loss(setup, option):
    spec = LOSS_OPTIONS[option]
    before, after = spec if isinstance(spec, tuple) else ({}, spec)
    base = loss_with(setup, **before)
    changed = loss_with(setup, **after)
    assert changed != pytest.approx(base, rel=1e-6, abs=1e-9), option


def test_behave_cap_changes_the_loss(setup):
    a = loss_with(
        setup,
        use_decoupled_loss=True,
        behave_imp_weight_mode="token_mask",
        behave_imp_weight_cap=1.1,
    )
    b = loss_with(
        setup,
        use_decoupled_loss=True,
        behave_imp_weight_mode="token_mask",
        behave_imp_weight_cap=3.0,
    )
    assert a != pytest.approx(b, rel=1e-6)


def test_gae_options_change_advantages(setup):
    model, batch = setup
    values = torch.randn(batch["input_ids"].shape, generator=torch.Generator().manual_seed(3))
    outs = []
    for gamma, lam in ((1.0, 1.0), (0.9, 1.0), (1.0, 0.5)):
        cfg = dataclasses.replace(BASE, discount=gamma, gae_lambda=lam)
        b = PPOActor(cfg, model).compute_advantages({**batch, "values": values})
        outs.append(b["advantages"])
    assert not torch.allclose(outs[0], outs[1]) and not torch.allclose(outs[0], outs[2])


def test_kl_ctl_changes_advantages_only_with_a_reference(setup):
    model, batch = setup
    ref = batch["logprobs"] - 0.3 * batch["loss_mask"]
    plain = PPOActor(BASE, model).compute_advantages(dict(batch))["advantages"]
    no_ref = PPOActor(dataclasses.replace(BASE, kl_ctl=0.5), model).compute_advantages(dict(batch))[
        "advantages"
    ]
    with_ref = PPOActor(dataclasses.replace(BASE, kl_ctl=0.5), model).compute_advantages(
        {**batch, "ref_logprobs": ref}
    )["advantages"]
    # No reference model: no KL term at all (docs/ppo-semantics.md, "Q1: a KL coefficient
    # without a reference model").
    assert torch.equal(plain, no_ref)
    assert not torch.allclose(plain, with_ref)
    k3 = PPOActor(
        dataclasses.replace(BASE, kl_ctl=0.5, kl_estimator="k3"), model
    ).compute_advantages({**batch, "ref_logprobs": ref})["advantages"]
    assert not torch.allclose(with_ref, k3)


def _update(setup, lr=1e-2, grad_clip=1.0, **changes):
    model, batch = setup
    m = copy.deepcopy(model)
    cfg = dataclasses.replace(BASE, **changes)
    opt = torch.optim.AdamW(m.parameters(), lr=lr)
    stats = PPOActor(cfg, m, opt, grad_clip=grad_clip).ppo_update(copy.copy(batch))
    flat = torch.cat([p.detach().flatten() for p in m.parameters()])
    return stats, flat


@pytest.mark.parametrize(
    "changes",
    [dict(ppo_n_minibatches=4), dict(ppo_epochs=2), dict(lr=1e-3), dict(grad_clip=0.01)],
    ids=["ppo_n_minibatches", "ppo_epochs", "lr", "grad_clip"],
)
def test_update_options_change_the_weights(setup, changes):
    s0, w0 = _update(setup)
    s1, w1 = _update(setup, **changes)
    assert not torch.allclose(w0, w1)
    if "ppo_n_minibatches" in changes or "ppo_epochs" in changes:
        assert s1["stability/optimizer_steps"] == 2 * s0["stability/optimizer_steps"]


def test_nonfinite_gradient_step_is_skipped(setup):
    model, batch = setup
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    bad = dict(batch)
    bad["rewards"] = torch.full_like(batch["rewards"], float("nan"))
    before = torch.cat([p.detach().flatten().clone() for p in m.parameters()])
    stats = PPOActor(BASE, m, opt).ppo_update(bad)
    after = torch.cat([p.detach().flatten() for p in m.parameters()])
    assert stats["stability/skipped_updates"] == 2 and stats["stability/optimizer_steps"] == 0
    assert torch.equal(before, after)


def test_areal_style_examples_run_with_only_import_changes():
    """The three AReaL-style examples of docs/python-api.md, with new import lines."""
    from harness.ppo import NormConfig as NC
    from harness.ppo import PPOActor as Actor
    from harness.ppo import PPOConfig

    g = torch.Generator().manual_seed(0)
    B, L = 4, 6
    rollout_batch = {
        "input_ids": torch.randint(0, 20, (B, L), generator=g),
        "attention_mask": torch.ones(B, L),
        "loss_mask": torch.tensor([[0, 0, 1, 1, 1, 0]] * B),
        "logprobs": -torch.rand(B, L, generator=g),
        "current_logprobs": -torch.rand(B, L, generator=g),
        "rewards": torch.tensor([1.0, 0.0, 0.5, 0.0]),
        "group_sizes": [2, 2],
    }
    config = PPOConfig(eps_clip=0.2, c_clip=None, behave_imp_weight_mode="disabled", adv_norm=None)
    actor = Actor(config)
    loss, stats = actor.compute_loss(dict(rollout_batch))
    assert torch.isfinite(loss) and "clip_mask" in stats

    config = PPOConfig(
        eps_clip=0.2,
        eps_clip_higher=0.3,
        c_clip=5.0,
        behave_imp_weight_mode="token_mask",
        behave_imp_weight_cap=5.0,
        use_decoupled_loss=True,
    )
    actor = Actor(config)
    # Without a model π_prox comes with the batch, under AReaL's key (predicting layout).
    prox = {"prox_logp": torch.roll(rollout_batch["logprobs"], -1, 1) + 0.3}
    loss2, stats2 = actor.compute_loss({**rollout_batch, **prox})
    assert torch.isfinite(loss2) and "behave_imp_weight" in stats2

    norm_cfg = NC(
        mean_level="group",
        group_size=2,
        std_level="group",
        std_unbiased=True,
        mean_leave1out=True,
        eps=1e-6,
    )
    config = PPOConfig(eps_clip=0.2, adv_norm=norm_cfg)
    actor = Actor(config)
    loss3, _ = actor.compute_loss(dict(rollout_batch))
    assert torch.isfinite(loss3) and loss3.item() != loss.item()
