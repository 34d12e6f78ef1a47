"""TRL's own loss as an oracle: ``GRPOTrainer._compute_loss`` (TRL 1.16) called unbound on a
minimal stand-in for the trainer, whose forward pass returns our per-token log-probs.

The stand-in supplies exactly the attributes the loss reads: the loss type, ε, the SAPO
temperatures, VESPO's k and λ at TRL's defaults, TRL's own static gates, a one-process
accelerator; no reference model, no vLLM, no entropy mask or bonus, one gradient-accumulation
step per generation batch.  A test sets what its case adds (vLLM importance sampling, the
off-policy mask threshold, the entropy options) on the instance.

TRL is imported when a stand-in is built, so a module that uses one only in some tests still
collects without TRL (those tests call ``pytest.importorskip`` first)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import torch


class OneProcessAccelerator:
    """What the loss asks of ``accelerate``, for one process: every reduction is the identity."""

    num_processes = 1
    sync_gradients = True

    def reduce(self, x: Any, reduction: str = "sum") -> Any:
        return x

    def gather(self, x: Any) -> Any:
        return x

    gather_for_metrics = gather

    def pad_across_processes(self, x: Any, dim: int = 0, pad_index: int = 0) -> Any:
        return x


class TrainerStandIn:
    """The attributes ``GRPOTrainer._compute_loss`` reads; its forward pass returns ``logps``
    (and ``entropies``, zeros unless given)."""

    def __init__(
        self,
        loss_type: str,
        logps: torch.Tensor,
        *,
        entropies: torch.Tensor | None = None,
        level: str = "token",
        eps_low: float = 0.2,
        eps_high: float = 0.2,
        tau_pos: float = 1.0,
        tau_neg: float = 1.05,
    ) -> None:
        from trl.trainer.grpo_trainer import GRPOTrainer

        self.loss_type = loss_type
        self.epsilon_low = eps_low
        self.epsilon_high = eps_high
        self.importance_sampling_level = level
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
        self.accelerator = OneProcessAccelerator()
        self.args = SimpleNamespace(
            delta=None,
            sapo_temperature_pos=tau_pos,
            sapo_temperature_neg=tau_neg,
            vespo_k_pos=2.0,  # TRL's defaults
            vespo_lambda_pos=3.0,
            vespo_k_neg=3.0,
            vespo_lambda_neg=2.0,
            steps_per_generation=1,
            use_bias_correction_kl=False,
        )
        # TRL's own static methods, unbound as TRL calls them
        self.get_off_policy_mask = GRPOTrainer.get_off_policy_mask
        self.get_gamma_weights = GRPOTrainer.get_gamma_weights
        self._metrics: dict[str, Any] = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._logps = logps
        self._entropies = entropies

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, keep, **_):
        entropies = torch.zeros_like(self._logps) if self._entropies is None else self._entropies
        return self._logps, entropies, None


def trl_compute_loss(
    stand_in: TrainerStandIn, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, **more: Any
) -> torch.Tensor:
    """TRL's loss on ``[B, T]`` completions (``more``: further inputs, e.g. the vLLM
    importance-sampling ratio), backpropagated into the stand-in's log-probs; returns it
    detached."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    logps = stand_in._logps
    B, T = logps.shape
    m = mask.to(logps.dtype)
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": m,
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": m.sum(),
        **more,
    }
    loss = GRPOTrainer._compute_loss(stand_in, None, inputs)
    loss.backward()
    return loss.detach()


def random_batch(
    seed: int, B: int = 6, Tn: int = 7, spread: float = 0.4, per_sequence_adv: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random ``(ℓθ, ℓold, advantages, mask)`` of ``[B, Tn]`` completions: ℓold is ℓθ plus noise
    of sd ``spread``; the advantages are per token, or one per completion with
    ``per_sequence_adv``."""
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
