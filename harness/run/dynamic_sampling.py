"""The reward-side stability options of one training step: the overlong penalty on the scored
rollout, and DAPO's dynamic sampling (drop zero-variance groups, refill with more rounds).

A *round* is one sampling call of ``prompts_per_step`` prompts with its scores.  ``refill`` drops
the groups whose rewards are all equal (``harness.ppo.shaping.zero_variance_groups``), draws up to
``rollout.max_resample_rounds`` more rounds while fewer than ``prompts_per_step`` groups are
left, and keeps the first ``prompts_per_step`` good groups (SkyRL/verl truncate the same way).
The result can be smaller than asked (rounds ran out) or empty (the step then skips its update).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.ppo.shaping import overlong_penalty, zero_variance_groups
from harness.sampling.base import RolloutBatch


@dataclass
class Round:
    """One scored sampling round: the rollout, one example per row, the (format, correct)
    score parts per row, and the reward the update sees (task score + overlong penalty)."""

    rb: RolloutBatch
    per_row: list[Any]
    parts: list[tuple[float, float]]
    rewards: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    penalty: torch.Tensor = field(default_factory=lambda: torch.zeros(0))

    @property
    def scores(self) -> list[float]:
        return [fmt + correct for fmt, correct in self.parts]


def score_round(r: Round, ppo: Any, max_new_tokens: int, device: Any) -> Round:
    """Fill ``rewards`` (and ``penalty``) of a round: the task score, plus AReaL's overlong
    penalty when ``ppo.overlong_reward_penalty`` is on (before every reward shaping option)."""
    scores = torch.tensor(r.scores, dtype=torch.float32, device=device)
    penalty = torch.zeros_like(scores)
    if ppo.overlong_reward_penalty:
        penalty = overlong_penalty(
            r.rb.response_lens.to(device),
            max_new_tokens,
            ppo.overlong_tokens,
            ppo.overlong_penalty_factor,
        )
    r.rewards, r.penalty = scores + penalty, penalty
    return r


def _pad_cols(x: torch.Tensor, width: int, value: Any, *, left: bool) -> torch.Tensor:
    extra = width - x.shape[1]
    if extra <= 0:
        return x
    pad = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
    return torch.cat([pad, x] if left else [x, pad], dim=1)


def concat_rollouts(rbs: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Rows of several rollouts in one token-layout batch: prompts re-left-padded to the widest
    prompt, responses re-right-padded to the longest response (padding is masked out)."""
    if len(rbs) == 1:
        return rbs[0]
    P = max(rb.prompt_width for rb in rbs)
    T = max(rb.input_ids.shape[1] - rb.prompt_width for rb in rbs)
    parts: dict[str, list[torch.Tensor]] = {}
    columns: list[tuple[str, Any]] = [
        ("input_ids", pad_id),
        ("attention_mask", 0),
        ("loss_mask", 0),
        ("logprobs", 0.0),
    ]
    if all(rb.versions is not None for rb in rbs):
        columns.append(("versions", -1))
    for rb in rbs:
        w = rb.prompt_width
        for name, value in columns:
            x = getattr(rb, name)
            prompt = _pad_cols(x[:, :w], P, value, left=True)
            resp = _pad_cols(x[:, w:], T, value, left=False)
            parts.setdefault(name, []).append(torch.cat([prompt, resp], dim=1))
    return RolloutBatch(
        **{k: torch.cat(v, dim=0) for k, v in parts.items()},
        prompt_lens=torch.cat([rb.prompt_lens for rb in rbs]),
        response_lens=torch.cat([rb.response_lens for rb in rbs]),
        truncated=torch.cat([rb.truncated for rb in rbs]),
        completions=[c for rb in rbs for c in rb.completions],
        group_sizes=[g for rb in rbs for g in rb.group_sizes],
        prompt_width=P,
    )


def select_groups(r: Round, groups: list[int]) -> Round:
    """The rows of the given groups (indices into ``r.rb.group_sizes``), in that order."""
    starts = [0]
    for n in r.rb.group_sizes:
        starts.append(starts[-1] + n)
    rows = [i for g in groups for i in range(starts[g], starts[g + 1])]
    idx = torch.tensor(rows, dtype=torch.long, device=r.rb.input_ids.device)
    rb = r.rb
    picked = RolloutBatch(
        input_ids=rb.input_ids[idx],
        attention_mask=rb.attention_mask[idx],
        loss_mask=rb.loss_mask[idx],
        logprobs=rb.logprobs[idx],
        prompt_lens=rb.prompt_lens[idx],
        response_lens=rb.response_lens[idx],
        truncated=rb.truncated[idx],
        completions=[rb.completions[i] for i in rows],
        group_sizes=[rb.group_sizes[g] for g in groups],
        prompt_width=rb.prompt_width,
        versions=rb.versions[idx] if rb.versions is not None else None,
    )
    ridx = idx.to(r.rewards.device)
    return Round(
        picked,
        [r.per_row[i] for i in rows],
        [r.parts[i] for i in rows],
        r.rewards[ridx],
        r.penalty[ridx],
    )


@dataclass
class Refill:
    """What dynamic sampling did in one step (the ``rollout/*`` metrics of the option)."""

    train: Round | None  # the update batch; None when no group with a signal was left
    rounds: list[Round]  # every round drawn, the first one first
    dropped: int  # zero-variance groups dropped, over all rounds
    extra_rounds: int


def refill(
    first: Round, draw: Callable[[], Round], n_groups: int, max_rounds: int, pad_id: int
) -> Refill:
    """Drop zero-variance groups, drawing up to ``max_rounds`` more rounds until ``n_groups``
    good groups are collected; the first ``n_groups`` of them are the update batch."""
    rounds = [first]
    kept: list[Round] = []
    n_kept = dropped = 0
    current = first
    while True:
        zv = zero_variance_groups(current.rewards.cpu(), current.rb.group_sizes)
        dropped += int(zv.sum())
        good = [g for g in range(len(zv)) if not zv[g]][: max(n_groups - n_kept, 0)]
        if good:
            kept.append(select_groups(current, good))
            n_kept += len(good)
        if n_kept >= n_groups or len(rounds) - 1 >= max_rounds:
            break
        current = draw()
        rounds.append(current)
    train = None
    if kept:
        train = Round(
            concat_rollouts([k.rb for k in kept], pad_id),
            [e for k in kept for e in k.per_row],
            [p for k in kept for p in k.parts],
            torch.cat([k.rewards for k in kept]),
            torch.cat([k.penalty for k in kept]),
        )
    return Refill(train, rounds, dropped, len(rounds) - 1)


def option_metrics(
    cfg: Any, first: Round, dyn: Refill | None, batch: dict[str, Any] | None
) -> dict[str, float]:
    """The step metrics of the options that are on (off: not logged): the overlong penalty of
    the step's sampled completions, the truncated rows of the update batch, dynamic sampling."""
    p, out = cfg.ppo, {}
    if p.overlong_reward_penalty:
        out["reward/overlong_penalty"] = float(first.penalty.mean())
    if batch is not None and p.truncated_completions != "keep":
        frac = float(batch["truncated"].float().mean()) if batch["truncated"].numel() else 0.0
        key = "rollout/truncated_masked_frac" if p.truncated_completions == "mask" else None
        out[key or "reward/truncated_zeroed_frac"] = frac
    if dyn is not None:
        out["rollout/zero_variance_dropped"] = float(dyn.dropped)
        out["rollout/resample_rounds"] = float(dyn.extra_rounds)
        out["rollout/train_groups"] = float(len(dyn.train.rb.group_sizes) if dyn.train else 0)
        out["rollout/update_skipped"] = 0.0 if dyn.train is not None else 1.0
    return out


def round_metrics(first: Round, n_samples: int) -> dict[str, float]:
    """The metrics of a step's first sampling round (its rewards and completions), whether or not
    the step updates: the same numbers in the loop's step metrics and a skipped step's."""
    rewards = torch.tensor(first.scores, dtype=torch.float32)
    groups = rewards.view(-1, n_samples)
    n = max(len(first.parts), 1)
    return {
        "objective/reward": float(rewards.mean()),
        "objective/reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "reward/format": sum(f for f, _ in first.parts) / n,
        "reward/correct": sum(c for _, c in first.parts) / n,
        "rollout/response_length": float(first.rb.response_lens.float().mean()),
        "rollout/truncated_frac": float(first.rb.truncated.float().mean()),
        "rollout/zero_std_groups": float(
            (groups.max(1).values == groups.min(1).values).float().mean()
        ),
    }


def skipped_step_metrics(
    cfg: Any, first: Round, dyn: Refill | None, t0: float, t_rollout: float
) -> dict[str, float]:
    """A step whose every group was zero-variance: the rollout's metrics, no update's."""

    return {
        **round_metrics(first, cfg.rollout.n_samples),
        "perf/step_time": time.perf_counter() - t0,
        "perf/rollout_time": t_rollout,
        **option_metrics(cfg, first, dyn, None),
    }
