"""The loss every policy objective runs in: the shared prologue (shapes, [T] → [B, T], the
behaviour weight, the ratio: token or GSPO's sequence ratio), the objective's ``terms``, then the
behaviour weight, ``loss_agg_mode`` and the stats contract.

The path of a training step is ``PPOActor.compute_loss`` → ``objective_loss`` → the objective's
``terms``; the options it reads (``LossOptions``, :mod:`harness.ppo.objectives.loss_options`)
are built and checked once, where they enter: ``PPOActorConfig.loss_options`` (checked when the
config was built; ``PPOActor`` builds them once), and the pure ``<name>_loss`` functions
(``Objective.loss``, ``LossOptions.of_call``), which check their keywords on every call.  The
behaviour weight is one ``Correction`` here: AReaL's ``rejection_sampling`` and legacy
``behave_imp_weight_mode`` are converted before (``harness.ppo.corrections.areal``).

Source: AReaL ``areal/utils/functional/functional.py`` (``ppo_actor_loss_fn``), main branch.
``docs/ppo-semantics.md`` "PPO actor loss".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from harness.ppo.corrections import Correction, CorrectionResult, apply_correction
from harness.ppo.corrections.roll import ROLL_SEQ_MODES, roll_sequence_mean
from harness.ppo.masks import prompt_mean
from harness.ppo.objectives.loss_options import ClipOptions, LossOptions

if TYPE_CHECKING:
    from harness.ppo.config import PPOActorConfig

Stats = dict[str, torch.Tensor | float]


@dataclass
class PolicyInputs:
    """What every policy objective starts from (built by ``policy_inputs``).

    ``m`` the loss mask, ``m_loss`` the mask the loss sums over (narrowed by the correction's
    filters), ``n0`` = max(Σm, 1), ``denominator`` the correction's ('pre' without one),
    ``prox`` / ``adv`` detached (``adv`` replaced by the sequence
    mean at sequence level), ``log_ratio`` = ℓθ − ℓp (with gradient), ``ratio`` r on m (0
    elsewhere; the GSPO sequence ratio at sequence level), ``w`` the behaviour weight or None,
    ``filtered`` its filtered fraction, ``old`` the behaviour log-probs, ``correction`` what the
    correction did (per-token masked / truncated, for the stats), ``weight_kind`` the
    correction's weight ('token', 'sequence_product', 'sequence_geometric'; a sequence weight
    is one ρ_i per row, broadcast to its tokens in ``w``), None without a correction.
    """

    logprobs: torch.Tensor
    m: torch.Tensor
    m_loss: torch.Tensor
    n0: int
    denominator: str
    prox: torch.Tensor
    old: torch.Tensor
    adv: torch.Tensor
    log_ratio: torch.Tensor
    ratio: torch.Tensor
    w: torch.Tensor | None
    filtered: float
    group_ids: torch.Tensor | None = None  # [B] prompt of each row ('prompt-mean' only)
    correction: CorrectionResult | None = None
    weight_kind: str | None = None

    @property
    def zero(self) -> torch.Tensor:
        return torch.zeros((), dtype=self.logprobs.dtype, device=self.logprobs.device)

    def on_valid(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` on the valid tokens (m), 0 elsewhere: padding may hold any log-prob (−inf
        included), so a product, a sum or an exp of log-probs only ever sees valid tokens."""
        return torch.where(self.m, x, self.zero)


@dataclass
class Terms:
    """What an objective's ``terms`` return: the per-token loss L (before the behaviour weight)
    and how it acted.  ``silenced`` = valid tokens whose gradient it zeroed (default: the clip
    masks), ``reweighted`` = kept but re-weighted or penalised, ``gate`` = its per-token weight,
    ``extra`` = further stats (floats become ``policy/<key>`` metrics).  ``keep``: the valid
    tokens it keeps in the loss mask; the others leave the loss, its denominators and the clip
    statistics, as if the caller had narrowed ``loss_mask`` (None = all).  ``weighted``: the
    loss already carries the behaviour weight ρ (VESPO's ``fold``), so it is not multiplied by
    ρ again."""

    loss: torch.Tensor
    keep: torch.Tensor | None = None
    clip_mask: torch.Tensor | None = None
    dual_clip_mask: torch.Tensor | None = None
    silenced: torch.Tensor | None = None
    reweighted: torch.Tensor | None = None
    gate: torch.Tensor | None = None
    extra: Stats = field(default_factory=dict)
    weighted: bool = False


@dataclass(frozen=True)
class Context:
    """What ``terms`` may read besides the inputs and its own options."""

    clip: ClipOptions
    generator: torch.Generator | None = None


_NAMES = ("logprobs", "proximal_logprobs", "old_logprobs", "advantages", "loss_mask")


def objective_loss(
    o: LossOptions | PPOActorConfig,
    *xs: torch.Tensor,
    generator: torch.Generator | None = None,
    group_ids: torch.Tensor | None = None,
    token_keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """The loss of ``o.objective`` on ``xs`` = (logprobs, proximal, old, advantages, mask),
    [B, T] or [T] (one sequence), checked by name and shape: the prologue every objective
    shares, its ``terms``, then weight, aggregate, stats.  ``o``: ``LossOptions``, or a
    ``PPOActorConfig`` (read with its ``loss_options()``).  ``group_ids`` [B]: each row's prompt
    ('prompt-mean'); ``token_keep``: tokens whose loss is kept, the others multiplied by 0 with
    every denominator unchanged (``ppo.top_entropy_quantile``)."""
    if not isinstance(o, LossOptions):
        o = o.loss_options()
    _check_shapes(**dict(zip(_NAMES, xs, strict=True)))
    if xs[0].dim() == 1:
        keep1 = None if token_keep is None else token_keep[None]
        return one_row(
            lambda *x: objective_loss(
                o,
                *x,
                generator=generator,
                group_ids=torch.zeros(1, dtype=torch.long, device=x[0].device),
                token_keep=keep1,
            ),
            *xs,
        )
    if xs[0].dim() != 2:
        raise ValueError(f"expected [B, T] or [T] tensors; got {tuple(xs[0].shape)}")
    p = policy_inputs(
        *xs,
        importance_sampling_level=o.importance_sampling_level,
        correction=o.correction,
        group_ids=group_ids,
    )
    t = o.objective.terms(p, o.options, Context(clip=o.clip, generator=generator))
    if token_keep is not None:  # TRL: the mask multiplies the per-token loss, after the gate
        t.loss = torch.where(token_keep.bool(), t.loss, torch.zeros((), dtype=t.loss.dtype))
    return finish(p, t, o.loss_agg_mode)


def _check_shapes(**tensors: torch.Tensor) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"shape mismatch: {shapes}")


def one_row(
    fn: Callable[..., tuple[torch.Tensor, Stats]], *xs: torch.Tensor, **kw: Any
) -> tuple[torch.Tensor, Stats]:
    """Run a [B, T] objective on one [T] sequence; per-token stats come back as [T]."""
    loss, row_stats = fn(*(x[None] for x in xs), **kw)
    return loss, {
        k: (v[0] if isinstance(v, torch.Tensor) and v.dim() == 2 else v)
        for k, v in row_stats.items()
    }


def policy_inputs(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    importance_sampling_level: str = "token",
    correction: Correction | None = None,
    group_ids: torch.Tensor | None = None,
) -> PolicyInputs:
    """The behaviour weight (the correction) and the policy ratio (token, or GSPO's sequence
    ratio) of [B, T] inputs — the part shared by every objective."""
    m = loss_mask.bool()
    n0 = max(int(m.sum()), 1)
    prox = proximal_logprobs.detach()
    adv = advantages.detach()
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)

    w: torch.Tensor | None = None
    filtered = 0.0
    m_loss = m
    result: CorrectionResult | None = None
    if correction is not None:
        result = apply_correction(correction, logprobs, prox, old_logprobs, adv, m)
        w, m_loss = result.w, result.mask
        masked, truncated = result.fractions(m)
        filtered = masked + truncated
        if correction.denominator == "post":  # verl: dropped tokens leave every denominator
            m = m_loss
            n0 = max(int(m.sum()), 1)

    log_ratio = logprobs - prox
    if importance_sampling_level == "token":
        ratio = torch.where(m, torch.exp(log_ratio), zero)
    else:
        n_i = m_loss.sum(dim=1, keepdim=True).clamp(min=1)
        seq_log_ratio = torch.where(m_loss, log_ratio, zero).sum(dim=1, keepdim=True) / n_i
        ratio = torch.where(m_loss, torch.exp(seq_log_ratio).expand_as(log_ratio), zero)
        seq_adv = (
            torch.where(m_loss, adv, torch.zeros((), dtype=adv.dtype)).sum(dim=1, keepdim=True)
            / n_i
        )
        adv = torch.where(m_loss, seq_adv.expand_as(adv), torch.zeros((), dtype=adv.dtype))
    return PolicyInputs(
        logprobs=logprobs,
        m=m,
        m_loss=m_loss,
        n0=n0,
        denominator="pre" if correction is None else correction.denominator,
        prox=prox,
        old=old_logprobs,
        adv=adv,
        log_ratio=log_ratio,
        ratio=ratio,
        w=w,
        filtered=filtered,
        group_ids=group_ids,
        correction=result,
        weight_kind=None if correction is None else correction.weight,
    )


def finish(p: PolicyInputs, t: Terms, loss_agg_mode: str) -> tuple[torch.Tensor, Stats]:
    """L·w, ``loss_agg_mode``, and the stats contract (``ppo_actor_loss``'s keys, plus
    ``silenced_mask``, ``reweighted_mask`` and, where the objective has one, ``gate``).
    ``silenced_mask`` and ``reweighted_mask`` stay on the caller's mask (a token the objective
    dropped with ``keep`` counts as silenced where its ``silenced`` says so)."""
    valid = p.m
    if t.keep is not None:
        keep = t.keep & p.m
        p = dataclasses.replace(p, m=keep, m_loss=p.m_loss & keep, n0=max(int(keep.sum()), 1))
    none = torch.zeros_like(p.m)
    clip_mask = none if t.clip_mask is None else t.clip_mask
    dual_clip_mask = none if t.dual_clip_mask is None else t.dual_clip_mask
    pg = t.loss if t.weighted else behaviour_weighted(t.loss, p)
    loss = aggregate(pg, p, loss_agg_mode)
    stats = base_stats(p, pg, clip_mask, dual_clip_mask)
    silenced = clip_mask | dual_clip_mask if t.silenced is None else t.silenced
    stats["silenced_mask"] = silenced & valid
    stats["reweighted_mask"] = (none if t.reweighted is None else t.reweighted) & valid
    if t.gate is not None:
        gate = t.gate.detach()
        stats["gate"] = torch.where(valid, gate, torch.zeros((), dtype=gate.dtype))
    stats.update(t.extra)
    return loss, stats


def behaviour_weighted(pg: torch.Tensor, p: PolicyInputs) -> torch.Tensor:
    """L·w when behaviour weighting is on (applied after every clip, as AReaL does)."""
    return pg * p.w if p.w is not None else pg


def aggregate(pg: torch.Tensor, p: PolicyInputs, loss_agg_mode: str) -> torch.Tensor:
    """Mask and ``loss_agg_mode`` (see ``ppo_actor_loss``): weighted per-token L → loss."""
    contrib = torch.where(p.m_loss, pg, p.zero)
    m = p.m
    if loss_agg_mode == "token-mean":
        return contrib.sum() / p.n0
    if loss_agg_mode == "prompt-mean":
        if p.group_ids is None:
            raise ValueError("loss_agg_mode 'prompt-mean' needs the rows' group_ids")
        return prompt_mean(contrib, m, p.group_ids)
    if p.denominator == "roll" and loss_agg_mode in ROLL_SEQ_MODES:
        return roll_sequence_mean(contrib, m, p.m_loss, loss_agg_mode)
    nonempty = m.any(dim=1)
    n_seq = max(int(nonempty.sum()), 1)
    per_seq = contrib.sum(dim=1)
    if loss_agg_mode == "seq-mean-token-mean":
        per_seq = per_seq / m.sum(dim=1).clamp(min=1)
        return per_seq.sum() / n_seq
    if loss_agg_mode == "seq-mean-token-sum":
        return per_seq.sum() / n_seq
    return per_seq.sum() / (n_seq * m.shape[1])  # seq-mean-token-sum-norm


def base_stats(
    p: PolicyInputs,
    pg: torch.Tensor,
    clip_mask: torch.Tensor,
    dual_clip_mask: torch.Tensor,
) -> Stats:
    """The per-token stats contract every objective returns (see ``ppo_actor_loss``)."""
    # As AReaL main (docs/ppo-semantics.md, "Q8: clip and ratio statistics use the pre-filter
    # mask").
    stat_mask = p.m
    adv = p.adv
    stats: Stats = {
        "loss": pg.detach(),
        "importance_weight": p.ratio.detach(),
        "approx_kl": p.log_ratio.detach(),
        "clip_mask": clip_mask & stat_mask,
        "clip_low_mask": clip_mask & stat_mask & (adv < 0),
        "clip_high_mask": clip_mask & stat_mask & (adv > 0),
        "dual_clip_mask": dual_clip_mask & stat_mask,
    }
    if p.w is not None:
        w = p.w
        behave_mask = (w > 0) & p.m_loss
        stats["behave_imp_weight"] = w
        stats["behave_mask"] = behave_mask
        stats["behave_approx_kl"] = torch.where(
            behave_mask,
            (p.prox - p.old.detach()).float(),
            torch.zeros((), dtype=torch.float32),
        )
        stats["filtered_fraction"] = p.filtered
    if p.correction is not None:
        stats["correction_masked"] = p.correction.masked
        stats["correction_truncated"] = p.correction.truncated
        stats["correction_norm_factor"] = p.correction.norm_factor
    return stats
