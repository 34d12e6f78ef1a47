"""One behaviour weight in the loss: AReaL's two spellings (``rejection_sampling`` and the legacy
``behave_imp_weight_mode`` / ``_cap``) become one ``Correction`` where options are built (the
config, the pure loss functions), and each gives the same loss as that correction written out.
The loss path reads the built options; it checks nothing per minibatch."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from harness.config import PPOActorConfig, build_run_config
from harness.ppo import PPOActor, RejectionSampling, ppo_actor_loss
from harness.ppo.corrections import Correction, Filter
from harness.ppo.objectives import LossOptions, lookup, loss_options, objective_loss
from harness.ppo.objectives import frame as F

LEGACY = [
    (mode, cap)
    for mode in ("token_mask", "token_truncate", "sequence_mask", "sequence_truncate")
    for cap in (1.5, None)
]


def written_out(mode: str, cap: float | None) -> Correction:
    """A legacy mode as the correction AReaL's migration makes of it, spelled by hand."""
    level, kind = mode.split("_")
    return Correction(
        weight="sequence_geometric" if level == "sequence" else "token",
        filters=(
            Filter(
                level=level,  # type: ignore[arg-type]
                metric="ratio",
                direction="ref_behave",
                agg="mean",
                lower=0.0 if kind == "truncate" else None,
                upper=math.inf if cap is None else cap,
                action="mask" if kind == "mask" else "truncate",
            ),
        ),
        narrow_mask=False,  # the legacy modes keep dropped tokens in the mask with weight 0
    )


def tensors(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    lb = -torch.rand(3, 6, generator=g, dtype=torch.float64) * 2
    lp = lb + 0.4 * torch.randn(3, 6, generator=g, dtype=torch.float64)
    lt = lp + 0.1 * torch.randn(3, 6, generator=g, dtype=torch.float64)
    adv = torch.randn(3, 6, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 6, generator=g) > 0.2
    return lt, lp, lb, adv, mask


def loss_and_grad(fn, *xs, **kw):
    lt = xs[0].clone().requires_grad_()
    loss, stats = fn(lt, *xs[1:], **kw)
    loss.backward()
    return loss.detach(), lt.grad, stats


@pytest.mark.parametrize("mode,cap", LEGACY)
def test_a_legacy_mode_is_its_correction_in_the_config_and_the_pure_function(mode, cap):
    want = written_out(mode, cap)
    cfg = PPOActorConfig(
        use_decoupled_loss=True, behave_imp_weight_mode=mode, behave_imp_weight_cap=cap
    )
    assert cfg.loss_options().correction == want
    assert cfg.correction is None  # the user's field is left as written (exports read it)
    kw = dict(behave_imp_weight_mode=mode, behave_imp_weight_cap=cap)
    assert LossOptions.of_call(lookup("ppo"), **kw).correction == want


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode,cap", LEGACY)
def test_a_legacy_mode_gives_the_loss_of_its_correction(mode, cap, level):
    xs = tensors()
    old = loss_and_grad(
        ppo_actor_loss,
        *xs,
        behave_imp_weight_mode=mode,
        behave_imp_weight_cap=cap,
        importance_sampling_level=level,
    )
    new = loss_and_grad(
        ppo_actor_loss, *xs, correction=written_out(mode, cap), importance_sampling_level=level
    )
    assert torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])
    assert old[2].keys() == new[2].keys()
    for k in old[2]:
        a, b = old[2][k], new[2][k]
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, k


@pytest.mark.parametrize(
    "rs",
    [
        RejectionSampling(upper=1.5),
        RejectionSampling(level="sequence", action="clamp", upper=1.5),
        RejectionSampling(level="sequence", metric="kl_k3", agg="max", upper=0.05),
    ],
)
def test_rejection_sampling_in_the_config_is_the_correction_the_loss_reads(rs):
    cfg = PPOActorConfig(use_decoupled_loss=True, rejection_sampling=rs)
    corr = cfg.loss_options().correction
    assert corr is not None and corr.narrow_mask and len(corr.filters) == 1
    assert LossOptions.of_call(lookup("ppo"), rejection_sampling=rs).correction == corr
    xs = tensors(1)
    old = loss_and_grad(ppo_actor_loss, *xs, rejection_sampling=rs)
    new = loss_and_grad(ppo_actor_loss, *xs, correction=corr)
    assert torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])


def test_an_old_run_config_gives_the_same_actor_loss_as_the_correction_block():
    """The YAML spelling of the legacy options and a ``ppo.correction`` block of the same
    correction: one PPOActor loss, bit for bit."""
    base = {"steps": 1, "task": "reverse", "ppo": {"use_decoupled_loss": True}}
    old = build_run_config(
        base, {"ppo.behave_imp_weight_mode": "token_truncate", "ppo.behave_imp_weight_cap": 1.5}
    ).ppo
    new = build_run_config(
        base,
        {
            "ppo.correction": {
                "weight": "token",
                "narrow_mask": False,
                "filters": [
                    {"upper": 1.5, "lower": 0.0, "direction": "ref_behave", "action": "truncate"}
                ],
            }
        },
    ).ppo
    assert old.loss_options().correction == new.loss_options().correction
    lt, lp, lb, adv, mask = tensors(2)
    pad = torch.zeros(3, 1, dtype=torch.float64)
    batch = {
        "input_ids": torch.zeros(3, 7, dtype=torch.long),
        "attention_mask": torch.ones(3, 7),
        "loss_mask": torch.cat([torch.zeros(3, 1), mask.float()], 1),
        "logprobs": torch.cat([pad, lb], 1).float(),
        "rewards": torch.tensor([1.0, 0.0, 0.5]),
        "prox_logp": torch.cat([lp, pad], 1).float(),
    }
    cur = torch.cat([pad, lt], 1).float()
    a, sa = PPOActor(old).compute_loss(dict(batch, current_logprobs=cur))
    b, sb = PPOActor(new).compute_loss(dict(batch, current_logprobs=cur))
    assert torch.equal(a, b)
    assert torch.equal(sa["behave_imp_weight"], sb["behave_imp_weight"])
    assert float(sa["filtered_fraction"]) > 0  # the cap acted


def test_no_weight_is_no_correction():
    assert PPOActorConfig().loss_options().correction is None
    assert LossOptions.of_call(lookup("ppo")).correction is None


def test_the_loss_path_takes_the_correction_only():
    for fn in (objective_loss, F.policy_inputs):
        params = inspect.signature(fn).parameters
        assert "behave_imp_weight_mode" not in params and "rejection_sampling" not in params
    fields = LossOptions.__dataclass_fields__
    assert "correction" in fields and "behave_imp_weight_mode" not in fields


def test_the_options_are_checked_once_not_per_minibatch(monkeypatch):
    """The actor's loss reads the options its config checked when built: no check runs per
    loss call (a check that ran would raise here)."""
    actor = PPOActor(PPOActorConfig(use_decoupled_loss=True, behave_imp_weight_mode="token_mask"))

    def refuse(*a, **k):
        raise AssertionError("options checked again inside the loss")

    monkeypatch.setattr(loss_options, "check_keywords", refuse)
    monkeypatch.setattr(type(lookup("ppo")), "check", refuse)
    lt, lp, lb, adv, mask = tensors(3)
    loss, stats = objective_loss(actor.loss_options, lt, lp, lb, adv, mask)
    assert torch.isfinite(loss) and "behave_imp_weight" in stats
    # The pure function is its own entry: it checks its keywords on every call.
    with pytest.raises(AssertionError, match="checked again"):
        ppo_actor_loss(lt, lp, lb, adv, mask)
