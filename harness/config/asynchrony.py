"""``rollout.asynchronous`` (also written ``rollout.async``): how far the sampler may run ahead of
the learner, how new weights reach it, and on which clock the two are interleaved.

The modes the peers compare, as fields of one block (docs/async.md has the picture):

* synchronous: ``max_staleness: 0`` (the default): sample with the current weights, then train;
* bounded staleness: ``max_staleness: η`` — AReaL's ``max_head_offpolicyness``, prime-rl's
  ``max_async_level``: samples are submitted under AReaL's capacity rule, so none is consumed more
  than η versions after the one it was submitted under;
* in-flight weight updates: ``weight_updates: in_flight`` — new weights reach the sampler between
  two decode steps, so one sequence's tokens come from several versions; ``in_flight_kv`` says
  whether the running sequences keep the KV cache the old weights computed (PipelineRL, prime-rl)
  or are re-prefilled under the new ones (AReaL's interruptible generation);
* partial rollouts: ``partial: true`` — slime's ``--partial-rollout``: ``over_sample`` × the
  prompts a step consumes are in flight, a step takes the groups that finish first, and the
  unfinished ones continue into later steps.

``rollout.staleness: k`` (every sample exactly k updates old) stays the strict fixed-lag mode; the
two are exclusive (a run sets one or the other).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness.core.fields import option

WeightUpdates = Literal["between_batches", "in_flight"]
InFlightKV = Literal["keep", "recompute"]
Clock = Literal["virtual", "threads"]

# The YAML and --set spelling of the block (``async`` is a Python keyword, so the field itself is
# ``asynchronous``); both name the same fields everywhere.
ASYNC_ALIAS = "rollout.async"
ASYNC_PATH = "rollout.asynchronous"


@dataclass
class AsyncConfig:
    max_staleness: int = option(
        0,
        "η: how many versions the sampler may run ahead of the learner (AReaL "
        "max_head_offpolicyness, prime-rl max_async_level); a group is submitted only while "
        "accepted + running < (η + version + 1) × prompts_per_step, so none is consumed more "
        "than η updates after the version it was submitted under. 0 = synchronous.",
        ge=0,
        le=1000,
    )
    weight_updates: WeightUpdates = option(
        "between_batches",
        "between_batches = the sampler takes new weights only when nothing is running (each "
        "sequence has one version); in_flight = between two decode steps, so a running "
        "sequence continues under the new weights (its tokens span versions).",
    )
    in_flight_kv: InFlightKV = option(
        "keep",
        "With weight_updates: in_flight: keep = running sequences keep the KV cache the old "
        "weights computed (PipelineRL, prime-rl); recompute = prompt + generated prefix are "
        "re-prefilled under the new weights (AReaL's interruptible generation).",
    )
    partial: bool = option(
        False,
        "Partial rollouts (slime/APRIL): over_sample × prompts_per_step groups are in "
        "flight, a step takes the groups that finish first and the unfinished ones continue "
        "into later steps (under newer weights with in_flight). Without it a step takes the "
        "oldest groups, waiting for them to finish.",
    )
    over_sample: float = option(
        1.0,
        "With partial: groups in flight per group a step consumes (slime's "
        "over_sampling_batch_size / rollout_batch_size).",
        ge=1,
        le=16,
    )
    clock: Clock = option(
        "virtual",
        "virtual = the sampler advances in decode steps and each update lands update_time "
        "decode steps after it took its batch: a fixed interleaving, bit-reproducible; "
        "threads = the sampler runs in its own thread beside the learner (real overlap, the "
        "lags are whatever the timing gives, and are recorded).",
    )
    update_time: int | None = option(
        None,
        "Virtual clock: decode steps one learner update takes (null = half of "
        "rollout.max_new_tokens, at least 1: generation is the longer side in most LLM RL, "
        "so updates land while sequences are being generated).",
        ge=1,
        le=1_000_000,
    )
    max_concurrent: int | None = option(
        None,
        "Most groups in flight at once (AReaL max_concurrent_rollouts; null = only the "
        "capacity rule bounds them).",
        ge=1,
        le=1_000_000,
    )

    @property
    def enabled(self) -> bool:
        """Whether the run samples asynchronously (otherwise the block is all defaults)."""
        return self.max_staleness > 0 or self.partial

    def __post_init__(self) -> None:
        if self.over_sample != 1.0 and not self.partial:
            raise ValueError(
                "over_sample: acts only with partial: true (without partial rollouts a step "
                "takes exactly the groups it consumes); leave it at 1"
            )
        if self.in_flight_kv == "recompute" and self.weight_updates != "in_flight":
            raise ValueError(
                "in_flight_kv: 'recompute' acts only with weight_updates: in_flight (between "
                "batches no sequence is running when weights change)"
            )
        if self.weight_updates == "in_flight" and not self.enabled:
            raise ValueError(
                "weight_updates: 'in_flight' acts only with max_staleness >= 1 or partial: true "
                "(synchronously nothing is running when new weights arrive)"
            )
        if self.partial and self.over_sample == 1.0 and self.max_staleness == 0:
            raise ValueError(
                "partial: true with max_staleness 0 and over_sample 1 is synchronous (every "
                "group in flight is consumed); raise over_sample or max_staleness"
            )

    def consumed_in_order(self) -> bool:
        """Whether a step takes the oldest submitted groups (waiting for them) rather than the
        first finished (partial rollouts)."""
        return not self.partial


__all__ = ["ASYNC_ALIAS", "ASYNC_PATH", "AsyncConfig", "Clock", "InFlightKV", "WeightUpdates"]
