"""``PPOActor``: batch dict → advantages → loss → minibatch updates (AReaL's actor, one process).

The batch is a dict of padded tensors in *token layout* (position j describes token j), as
produced by ``harness.sampling.local.sample``:

    input_ids       [B, L] long   prompt (left-padded) + response (right-padded)
    attention_mask  [B, L]        1 on real tokens
    loss_mask       [B, L]        1 exactly on generated tokens
    logprobs        [B, L]        behaviour log-probs of each token (0 off the loss mask)
    rewards         [B]           one scalar per sequence
    group_sizes     list[int]     optional: rows per prompt (consecutive), for group normalization
    truncated       [B] bool      optional: hit the length limit without EOS (GAE bootstraps;
                                  ``ppo.truncated_completions``)
    values          [B, L]        optional: critic values, "predicting" layout (position t = the
                                  state before token t+1)
    ref_logprobs    [B, L]        optional: reference-policy log-probs, token layout
    prox_logp       [B, L]        optional (AReaL's key): π_prox, the learner's log-probs at the
                                  old parameters, *predicting* layout as ``compute_logp`` returns
                                  them; used instead of a recompute by the decoupled loss, a
                                  correction or recompute_logprob (refused otherwise)
    versions        [B, L] long   with ``prox_logp_method: loglinear`` (AReaL's key): the policy
                                  version that sampled each token, token layout, negative off the
                                  generated tokens
    current_version int           with ``loglinear``: the learner's version (updates made so far)
    current_logprobs [B, L]       optional, model-free use only: the current policy's log-probs
                                  (token layout, carrying the gradient)
    current_entropy [B, L]        optional, model-free use only: its entropy (token layout)

``compute_advantages`` rolls everything into the *predicting* layout used by the math (position t
holds the quantity for predicting token t+1, as in AReaL; docs/ppo-semantics.md "Data layout")
and adds ``mask``, ``old_logprobs``, ``prox_logprobs``, ``advantages``, ``returns``,
``kl_rewards``, ``token_rewards`` and ``group_ids`` (each row's prompt, for 'prompt-mean').
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from harness.metrics import OBJECTIVE_METRICS
from harness.model import logprobs
from harness.ppo.advantages import gae, kl_estimate, shape_rewards
from harness.ppo.masks import group_ids_from_sizes, top_entropy_mask, truncated_row_mask
from harness.ppo.normalization import normalize
from harness.ppo.objectives import objective_loss
from harness.ppo.proximal import loglinear_proximal

if TYPE_CHECKING:
    from harness.ppo.config import PPOActorConfig

LogprobFn = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def roll_left(x: torch.Tensor) -> torch.Tensor:
    """Token layout → predicting layout (AReaL rolls by −1; the last column wraps to position 0,
    which is a prompt/padding slot and therefore 0 for masks and behaviour log-probs)."""
    return torch.roll(x, shifts=-1, dims=-1)


def minibatch_indices(token_counts: list[int], n: int) -> list[list[int]]:
    """AReaL's token-balanced first-fit-decreasing split into exactly ``n`` bins (sorted indices).

    Sequences are taken longest first and each goes to the bin with the fewest tokens so far
    (ties: the lowest bin).  Bins can be empty when there are fewer sequences than bins.
    """
    n = max(1, min(n, len(token_counts)))
    order = sorted(range(len(token_counts)), key=lambda i: (-token_counts[i], i))
    bins: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in order:
        k = min(range(n), key=lambda b: (load[b], b))
        bins[k].append(i)
        load[k] += token_counts[i]
    return [sorted(b) for b in bins]


class PPOActor:
    """PPO actor with AReaL's semantics and AReaL's Python API (``PPOActor(config)``,
    ``compute_loss``; docs/ppo-semantics.md "Departures from AReaL", API).

    ``PPOActor(config)`` works without a model for pure loss computations (the batch then carries
    ``current_logprobs``); ``PPOActor(config, model=..., optimizer=...)`` can also recompute
    log-probs and run ``ppo_update``.
    """

    def __init__(
        self,
        config: PPOActorConfig,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        scheduler: Any = None,
        grad_clip: float | None = 1.0,
        logprob_fn: LogprobFn | None = None,
        autocast_dtype: torch.dtype | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        self.config = config
        # The loss options, read and converted once (the config was checked when built).
        self.loss_options = config.loss_options()
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.grad_clip = grad_clip
        self.autocast_dtype = autocast_dtype
        self._logprob_fn = logprob_fn
        # The first minibatch's rows and log-probs of the last ppo_update, before any update on
        # the batch (predicting layout, no grad).
        self.first_logprobs: tuple[list[int], torch.Tensor] | None = None
        # Seconds the last compute_advantages spent recomputing π_prox (0 without a forward).
        self.prox_seconds = 0.0
        # Clip-Cov's random draw; the training loop seeds it from the run seed (determinism).
        self.generator = generator if generator is not None else torch.Generator().manual_seed(0)

    # ------------------------------------------------------------------ log-probs
    def compute_logp(
        self, batch: dict[str, Any], *, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Current-policy log-probs (and entropy) in predicting layout; carries the gradient."""
        if self.model is None:
            if "current_logprobs" not in batch:
                raise ValueError("PPOActor has no model: the batch must carry 'current_logprobs'")
            ent = batch.get("current_entropy")
            return roll_left(batch["current_logprobs"]), (
                roll_left(ent.float()) if ent is not None else None
            )
        fn = self._logprob_fn
        if fn is None:
            fn = logprobs.forward_logprobs  # looked up here: tests replace it
        # The same precision context as the sampler (harness.model.build.precision): autocast to
        # ``autocast_dtype`` on the model's device, or explicitly off.
        dev = next(self.model.parameters()).device.type
        ctx = torch.autocast(
            device_type=dev,
            dtype=self.autocast_dtype or torch.bfloat16,
            enabled=self.autocast_dtype is not None,
        )
        with ctx:
            logp, ent = fn(
                self.model,  # type: ignore[arg-type]
                batch["input_ids"],
                batch["attention_mask"],
                temperature=self.config.temperature,
                with_entropy=with_entropy,
            )
        logp = roll_left(logp.float())
        return logp, (roll_left(ent.float()) if ent is not None else None)

    # ------------------------------------------------------------------ advantages
    def compute_advantages(self, batch: dict[str, Any]) -> dict[str, Any]:
        """As AReaL: shape → reward_norm → KL penalty → GAE → adv_norm.  Returns the batch with
        predicting-layout keys added (it is modified in place and returned)."""
        cfg = self.config
        loss_mask = batch["loss_mask"]
        B = loss_mask.shape[0]
        m = roll_left(loss_mask).bool()
        truncated = batch.get("truncated")
        if cfg.truncated_completions == "mask" and truncated is not None:
            m = truncated_row_mask(m, truncated)  # TRL: before any count or denominator
        mf = m.float()
        group_sizes = batch.get("group_sizes") or None
        batch["group_ids"] = group_ids_from_sizes(group_sizes, B, m.device)

        old = self._log_prob_roles(batch, m)
        rewards = _sequence_rewards(cfg, batch, group_sizes, truncated)
        kl, kl_rewards, token_rewards = _token_rewards(cfg, batch, m, old, rewards)

        values = batch.get("values")
        values = values.float() * mf if values is not None else torch.zeros_like(mf)
        advantages, returns = gae(
            token_rewards,
            values,
            m,
            gamma=cfg.discount,
            lam=cfg.gae_lambda,
            bootstrap=truncated
            if (truncated is not None and batch.get("values") is not None)
            else None,
        )
        if cfg.adv_norm is not None:
            advantages = normalize(advantages, cfg.adv_norm, m, group_sizes=group_sizes)
        batch["advantages"] = advantages * mf
        batch["returns"] = returns
        batch["kl"] = kl
        batch["kl_rewards"] = kl_rewards
        batch["token_rewards"] = token_rewards
        return batch

    def _log_prob_roles(self, batch: dict[str, Any], m: torch.Tensor) -> torch.Tensor:
        """Set the batch's ``mask``, ``old_logprobs`` and ``prox_logprobs`` (predicting layout)
        and return the old log-probs."""
        cfg = self.config
        loss_mask = batch["loss_mask"]
        mf = m.float()
        # Old (behaviour, or recomputed) and proximal log-probs, predicting layout
        # (docs/ppo-semantics.md "Log-probability roles").  A correction weighing π_prox
        # against the sampler recomputes π_prox even without use_decoupled_loss, as TRL's
        # vllm_importance_sampling_correction does (docs/corrections.md "Without the
        # decoupled loss"); with old = prox its weight would be 1 everywhere.
        decoupled = cfg.recomputes_proximal
        interpolated = cfg.interpolates_proximal
        needs_recompute = decoupled or cfg.recompute_logprob
        behaviour = roll_left(batch["logprobs"].float()) * mf
        given = batch.get("prox_logp")
        if given is not None and not needs_recompute:
            raise ValueError(
                "batch['prox_logp'] (π_prox) is used only with use_decoupled_loss, "
                "recompute_logprob or a correction that reads π_prox (and not with "
                "prox_logp_method: loglinear, which interpolates it); drop it or set one"
            )
        if interpolated:
            batch["versions_p"] = self._proximal_versions(batch, m)
        recomputed = None
        self.prox_seconds = 0.0
        if given is not None:  # AReaL's key: the caller's π_prox, predicting layout
            if tuple(given.shape) != tuple(loss_mask.shape):
                raise ValueError(
                    f"batch['prox_logp'] has shape {tuple(given.shape)}; the batch's loss_mask "
                    f"has {tuple(loss_mask.shape)}"
                )
            recomputed = given.detach().float() * mf
        elif needs_recompute and self.model is not None:
            t0 = time.perf_counter()
            with torch.no_grad():
                recomputed = self.compute_logp(batch)[0] * mf
            self.prox_seconds = time.perf_counter() - t0
        elif needs_recompute:
            what = (
                "use_decoupled_loss"
                if cfg.use_decoupled_loss
                else ("ppo.correction" if decoupled else "recompute_logprob")
            )
            raise ValueError(
                f"PPOActor has no model, so {what} has no π_prox: pass the batch's 'prox_logp' "
                "(the learner's log-probs at the old parameters, predicting layout, as "
                "PPOActor.compute_logp returns them)"
            )
        if decoupled:
            old = behaviour
            prox = recomputed if recomputed is not None else behaviour
        elif interpolated:
            # π_prox depends on the live ℓθ: compute_loss interpolates it per minibatch; until
            # then it holds ℓb (what α = 0 gives).
            old = prox = behaviour
        elif cfg.recompute_logprob and recomputed is not None:
            old = prox = recomputed
        else:
            old = prox = behaviour
        batch["mask"] = m
        batch["old_logprobs"] = old
        batch["prox_logprobs"] = prox
        return old

    @staticmethod
    def _proximal_versions(batch: dict[str, Any], m: torch.Tensor) -> torch.Tensor:
        """The sampling version of each token in predicting layout, for ``loglinear``: AReaL's
        batch keys ``versions`` (token layout) and ``current_version``, both required."""
        missing = [k for k in ("versions", "current_version") if batch.get(k) is None]
        if missing:
            raise ValueError(
                "prox_logp_method: 'loglinear' interpolates π_prox from policy versions: the "
                f"batch needs {' and '.join(repr(k) for k in missing)} (the version that "
                "sampled each token, token layout, and the learner's version)"
            )
        v = batch["versions"]
        if tuple(v.shape) != tuple(batch["loss_mask"].shape):
            raise ValueError(
                f"batch['versions'] has shape {tuple(v.shape)}; the batch's loss_mask has "
                f"{tuple(batch['loss_mask'].shape)}"
            )
        # Each position gets the version of the token it predicts; off the mask, −1 (α = 0).
        return torch.where(m, roll_left(v.long()), torch.full_like(v.long(), -1))

    # ------------------------------------------------------------------ loss
    def compute_loss(
        self,
        batch: dict[str, Any],
        *,
        logprobs: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The PPO loss of ``batch`` (computing advantages first if they are missing, on a
        copy: the caller's dict is left as it was, so another actor's options are not
        answered with this one's advantages)."""
        cfg = self.config
        if "advantages" not in batch:
            batch = self.compute_advantages(dict(batch))
        top_entropy = cfg.top_entropy_quantile < 1.0
        if logprobs is None:
            logprobs, entropy = self.compute_logp(
                batch,
                with_entropy=cfg.entropy_coef > 0 or top_entropy or self.model is not None,
            )
        m = batch["mask"]
        prox = batch["prox_logprobs"]
        if cfg.interpolates_proximal:
            versions = batch.get("versions_p")
            if versions is None:
                versions = self._proximal_versions(batch, m)
            prox = loglinear_proximal(
                batch["old_logprobs"], logprobs, versions, int(batch["current_version"])
            ) * m.to(logprobs.dtype)
        keep = None
        if top_entropy:
            if entropy is None:
                raise ValueError("top_entropy_quantile < 1 needs the policy's entropy")
            keep = top_entropy_mask(entropy, m, cfg.top_entropy_quantile)
        group_ids = batch.get("group_ids")
        if group_ids is None:
            group_ids = group_ids_from_sizes(batch.get("group_sizes"), m.shape[0], m.device)
        loss, stats = objective_loss(
            self.loss_options,
            logprobs,
            prox,
            batch["old_logprobs"],
            batch["advantages"],
            m,
            generator=self.generator,
            group_ids=group_ids,
            token_keep=keep,
        )
        stats["policy_loss"] = loss.detach()
        if keep is not None:
            stats["entropy_mask"] = keep
        if entropy is not None:
            # The bonus acts on the tokens the policy loss keeps (TRL's effective mask).
            m_ent = m if keep is None else m & keep
            n = max(int(m_ent.sum()), 1)
            zero = torch.zeros((), dtype=entropy.dtype)
            mean_entropy = torch.where(m_ent, entropy, zero).sum() / n
            stats["entropy"] = entropy.detach()
            if cfg.entropy_coef > 0:
                loss = loss - cfg.entropy_coef * mean_entropy
        return loss, stats

    # ------------------------------------------------------------------ update
    def ppo_update(self, batch: dict[str, Any]) -> dict[str, float]:
        """Minibatch updates over ``batch``: ``ppo_epochs`` passes over ``ppo_n_minibatches``
        token-balanced minibatches, one optimizer step each.  A step whose gradient norm is not
        finite is skipped (no parameter change) and counted.  Returns aggregated statistics."""
        if self.model is None or self.optimizer is None:
            raise ValueError("ppo_update needs PPOActor(config, model=..., optimizer=...)")
        cfg = self.config
        if "advantages" not in batch:
            self.compute_advantages(batch)
        m_all = batch["mask"]
        counts = m_all.sum(dim=1).tolist()
        bins = [b for b in minibatch_indices([int(c) for c in counts], cfg.ppo_n_minibatches) if b]
        acc = _StatsAccumulator()
        self.first_logprobs = None
        was_training = self.model.training
        # Train mode for the update only (gradient checkpointing needs it); the caller zeroes
        # dropout at load time (harness.model.build.disable_dropout), so the function is unchanged.
        self.model.train()
        try:
            for epoch in range(cfg.ppo_epochs):
                for j, idx in enumerate(bins):
                    mb = _select_rows(batch, idx)
                    self.optimizer.zero_grad(set_to_none=True)
                    if epoch == 0 and j == 0:
                        # Before any update on this batch: how far the learner's log-probs are
                        # from the sampler's (bf16 sampler and learner kernels round differently).
                        logprobs, entropy = self.compute_logp(mb, with_entropy=True)
                        acc.sampler_gap = sampler_logprob_gap(logprobs.detach(), mb)
                        # Kept for the mismatch metrics (harness.run.mismatch): this forward is
                        # the learner at the current weights on these rows, at no extra cost.
                        self.first_logprobs = (idx, logprobs.detach())
                        loss, stats = self.compute_loss(mb, logprobs=logprobs, entropy=entropy)
                    else:
                        loss, stats = self.compute_loss(mb)
                    if not torch.isfinite(loss):
                        acc.add_skipped(float("nan"))
                        continue
                    loss.backward()
                    params = [
                        p
                        for g in self.optimizer.param_groups
                        for p in g["params"]
                        if p.grad is not None
                    ]
                    grad_norm = float(
                        torch.nn.utils.clip_grad_norm_(params, self.grad_clip or math.inf)
                    )
                    if not math.isfinite(grad_norm):
                        self.optimizer.zero_grad(set_to_none=True)
                        acc.add_skipped(grad_norm)
                        continue
                    self.optimizer.step()
                    if self.scheduler is not None:
                        self.scheduler.step()
                    acc.add(mb, stats, float(loss.detach()), grad_norm)
        finally:
            self.model.train(was_training)
        return acc.result()


def sampler_logprob_gap(logprobs: torch.Tensor, batch: dict[str, Any]) -> float:
    """Mean |ℓ_behave − ℓ_θ| over the valid tokens of ``batch`` (predicting layout, after
    ``compute_advantages``): ``logprobs`` are the learner's, the behaviour ones are the
    sampler's as recorded in the rollout; NaN without valid tokens."""
    m = batch["mask"]
    if not m.any():
        return float("nan")
    behaviour = roll_left(batch["logprobs"].float())
    return float((logprobs.float() - behaviour)[m].abs().mean())


def _select_rows(batch: dict[str, Any], idx: list[int]) -> dict[str, Any]:
    B = batch["mask"].shape[0]
    index = torch.tensor(idx, device=batch["mask"].device)
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == B:
            out[k] = v.index_select(0, index)
        elif k == "group_sizes":
            out[k] = None  # group structure is used before the split only
        else:
            out[k] = v
    return out


class _StatsAccumulator:
    """Token-weighted aggregation of per-minibatch loss statistics into one step's metrics."""

    def __init__(self) -> None:
        self.n_tok = 0
        self.sums: dict[str, float] = {}
        self.mins: dict[str, float] = {}
        self.maxs: dict[str, float] = {}
        self.grad_norms: list[float] = []
        self.losses: list[float] = []
        self.skipped = 0
        self.nonfinite = 0
        self.filtered: list[float] = []
        self.n_behave = 0
        self.n_gate = 0
        self.n_corr = 0
        self.norm_factors: list[float] = []
        # Covariance objectives: per optimizer step (count, candidates, threshold, penalty |δ|).
        self.cov: dict[str, list[float]] = {}
        self.sampler_gap = float("nan")  # set on the first minibatch of the first epoch

    def add_skipped(self, grad_norm: float) -> None:
        self.skipped += 1
        self.nonfinite += 1

    def _put(self, key: str, values: torch.Tensor) -> None:
        if values.numel() == 0:
            return
        v = values.double()
        self.sums[key] = self.sums.get(key, 0.0) + float(v.sum())
        self.mins[key] = min(self.mins.get(key, math.inf), float(v.min()))
        self.maxs[key] = max(self.maxs.get(key, -math.inf), float(v.max()))

    def add(self, mb: dict[str, Any], stats: dict[str, Any], loss: float, grad_norm: float) -> None:
        m = mb["mask"]
        n = int(m.sum())
        self.n_tok += n
        self.grad_norms.append(grad_norm)
        self.losses.append(loss)
        log_ratio = (stats["approx_kl"])[m]  # ℓθ − ℓp
        self._put("ratio", torch.exp(log_ratio))
        self._put("approx_kl_k1", -log_ratio)
        self._put("approx_kl", torch.expm1(log_ratio) - log_ratio)  # k3 = (r − 1) − log r
        for key in ("clip_mask", "clip_low_mask", "clip_high_mask", "dual_clip_mask"):
            self._put(key, stats[key][m].double())
        silenced = stats.get("silenced_mask", stats["clip_mask"] | stats["dual_clip_mask"])
        self._put("silenced", silenced[m].double())
        if "reweighted_mask" in stats:
            self._put("reweighted", stats["reweighted_mask"][m].double())
        if "gate" in stats:
            self._put("gate", stats["gate"][m].double())
            self.n_gate += n
        # Per-step floats an objective reports (``cov_selected`` ...): ``policy/<key>``.
        for key, value in stats.items():
            if isinstance(value, float) and f"policy/{key}" in OBJECTIVE_METRICS:
                self.cov.setdefault(key, []).append(value)
        if "entropy" in stats:
            self._put("entropy", stats["entropy"][m])
        if "entropy_mask" in stats:
            self._put("entropy_masked", (~stats["entropy_mask"][m]).double())
        self._put("advantages", mb["advantages"][m])
        if "correction_masked" in stats:
            self._put("corr_masked", stats["correction_masked"][m].double())
            self._put("corr_truncated", stats["correction_truncated"][m].double())
            self.n_corr += n
            if "correction_norm_factor" in stats:
                self.norm_factors.append(float(stats["correction_norm_factor"]))
        if "behave_imp_weight" in stats:
            w = stats["behave_imp_weight"][m].double()
            self._put("behave_w", w)
            self._put("behave_w_sq", w * w)
            self._put("behave_approx_kl", stats["behave_approx_kl"][m])
            self.filtered.append(float(stats["filtered_fraction"]) * n)
            self.n_behave += n

    def result(self) -> dict[str, float]:
        n = max(self.n_tok, 1)
        nan = float("nan")

        def mean(k: str) -> float:
            return self.sums[k] / n if k in self.sums else nan

        out = {
            "policy/ratio_mean": mean("ratio"),
            "policy/ratio_min": self.mins.get("ratio", nan),
            "policy/ratio_max": self.maxs.get("ratio", nan),
            "policy/approx_kl": mean("approx_kl"),
            "policy/approx_kl_k1": mean("approx_kl_k1"),
            "policy/clipfrac": mean("clip_mask"),
            "policy/clipfrac_low": mean("clip_low_mask"),
            "policy/clipfrac_high": mean("clip_high_mask"),
            "policy/dual_clipfrac": mean("dual_clip_mask"),
            "policy/entropy": mean("entropy"),
            "policy/loss": sum(self.losses) / len(self.losses) if self.losses else nan,
            "stability/grad_norm": sum(self.grad_norms) / len(self.grad_norms)
            if self.grad_norms
            else nan,
            "stability/grad_norm_max": max(self.grad_norms) if self.grad_norms else nan,
            "stability/skipped_updates": float(self.skipped),
            "stability/nonfinite_count": float(self.nonfinite),
            "stability/optimizer_steps": float(len(self.grad_norms)),
        }
        out["policy/sampler_logprob_gap"] = self.sampler_gap
        if "entropy_masked" in self.sums:
            out["policy/entropy_masked_frac"] = mean("entropy_masked")
        out["policy/silenced_frac"] = mean("silenced")
        # PPO-clip re-weights nothing: 0 rather than a missing value, so objectives line up.
        reweighted = mean("reweighted") if "reweighted" in self.sums else 0.0
        out["policy/reweighted_frac"] = reweighted if self.n_tok else nan
        if self.n_gate:
            out["policy/gate_mean"] = self.sums["gate"] / self.n_gate
        for key, values in self.cov.items():
            finite = [v for v in values if math.isfinite(v)]
            # the threshold exists only in updates that selected a token
            out[f"policy/{key}"] = sum(finite) / len(finite) if finite else nan
        if self.n_corr:
            out["policy/correction_masked_frac"] = self.sums["corr_masked"] / self.n_corr
            out["policy/correction_truncated_frac"] = self.sums["corr_truncated"] / self.n_corr
        if self.norm_factors:
            out["policy/correction_norm_factor"] = sum(self.norm_factors) / len(self.norm_factors)
        if self.n_behave:
            s, s2 = self.sums["behave_w"], self.sums["behave_w_sq"]
            out.update(
                {
                    "policy/behave_weight_mean": s / self.n_behave,
                    "policy/behave_weight_min": self.mins["behave_w"],
                    "policy/behave_weight_max": self.maxs["behave_w"],
                    # Kish effective sample size of the weights, as a fraction of the tokens.
                    "policy/behave_ess": (s * s) / (self.n_behave * s2) if s2 > 0 else 0.0,
                    "policy/behave_approx_kl": self.sums["behave_approx_kl"] / self.n_behave,
                    "policy/filtered_fraction": sum(self.filtered) / self.n_behave,
                }
            )
        return out


def _sequence_rewards(
    cfg: PPOActorConfig,
    batch: dict[str, Any],
    group_sizes: list[int] | None,
    truncated: torch.Tensor | None,
) -> torch.Tensor:
    """Sequence rewards: scale/clip, then normalize (per sequence, groups = a prompt's
    samples); stored as ``normalized_rewards``."""
    rewards = shape_rewards(
        batch["rewards"].float(),
        scaling=cfg.reward_scaling,
        bias=cfg.reward_bias,
        clip=cfg.reward_clip,
    )
    if cfg.reward_norm is not None:
        rewards = normalize(rewards, cfg.reward_norm, group_sizes=group_sizes)
    if cfg.truncated_completions == "zero_reward" and truncated is not None:
        # AReaL mask_no_eos_with_zero: the normalized reward, tokens stay in the loss
        rewards = torch.where(truncated.bool(), torch.zeros_like(rewards), rewards)
    batch["normalized_rewards"] = rewards
    return rewards


def _token_rewards(
    cfg: PPOActorConfig,
    batch: dict[str, Any],
    m: torch.Tensor,
    old: torch.Tensor,
    rewards: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(KL, KL rewards, token rewards): −kl_ctl·KL to the reference per token, plus R at the
    last generated token."""
    mf = m.float()
    B = m.shape[0]
    # With no reference model there is no KL term at all (AReaL would turn −kl_ctl·ℓ_old
    # into a surprisal bonus): docs/ppo-semantics.md, "Q1: a KL coefficient without a
    # reference model".
    if cfg.kl_ctl > 0 and batch.get("ref_logprobs") is not None:
        ref = roll_left(batch["ref_logprobs"].float()) * mf
        kl = kl_estimate(old, ref, cfg.kl_estimator) * mf
        kl_rewards = -cfg.kl_ctl * kl
    else:
        kl = torch.zeros_like(mf)
        kl_rewards = torch.zeros_like(mf)
    T = m.shape[1]
    pos = torch.arange(T, device=m.device).expand(B, T)
    last = torch.where(m, pos, -1).max(dim=1).values  # position predicting the last token
    token_rewards = kl_rewards.clone()
    has_tokens = last >= 0
    rows = torch.arange(B, device=m.device)[has_tokens]
    token_rewards[rows, last[has_tokens]] += rewards[has_tokens]
    return kl, kl_rewards, token_rewards
