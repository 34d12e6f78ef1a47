"""The run's rollout sampler: ``cfg.rollout`` mapped onto a backend of :mod:`harness.sampling`.

Everything downstream of sampling (rewards, advantages, the mismatch metrics, behaviour-weight
corrections) consumes a :class:`~harness.sampling.base.RolloutBatch` and never asks which sampler
made it. The local backend (:class:`~harness.sampling.local.LocalSampler`) carries the three
sources of training–inference mismatch the harness can dial (``rollout.sampler_dtype``,
``rollout.sampler_logit_noise``, ``rollout.sampler_backend``; docs/mismatch.md); the vLLM
inference engine (:class:`~harness.sampling.vllm.EngineSampler`, ``sampler_backend: vllm``) takes
the policy's weights and returns the batch with its own log-probs in ``logprobs``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from harness.core.configtools import check_value
from harness.model.engine_support import SamplerDtype, engine_dtype
from harness.run.policies import frozen_copy
from harness.sampling import Sampler, SamplingParams, make_backend
from harness.sampling.decoders import _fast_path_ok
from harness.sampling.local import LocalSpec
from harness.sampling.local_steps import LocalStepSampler
from harness.sampling.stepping import StepSetup
from harness.sampling.vllm import EngineHost, EngineSpec
from harness.sampling.vllm_adapters import AdapterEngine
from harness.sampling.vllm_steps import EngineStepSampler

if TYPE_CHECKING:
    from harness.config import RunConfig

# The noise stream's seed is the run seed shifted by this, so it never coincides with the
# sampling generator's stream (seeded with the run seed itself).
NOISE_SEED_OFFSET = 0x6E015E


def noise_seed(cfg: RunConfig) -> int:
    """The seed of the run's logit-noise stream (the batch and the step-level local sampler's)."""
    return (cfg.seed + NOISE_SEED_OFFSET) % 2**63


_DTYPES: dict[str, torch.dtype | None] = {
    "float32": None,  # autocast off
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def sampler_autocast(name: str | None, learner: torch.dtype | None) -> torch.dtype | None:
    """The sampler's autocast dtype: ``rollout.sampler_dtype`` (None = the learner's ``learner``
    autocast dtype; ``"float32"`` = autocast off)."""
    if name is None:
        return learner
    return _DTYPES[check_value(name, SamplerDtype, {}, "rollout.sampler_dtype")]


def make_sampler(
    cfg: RunConfig, device: torch.device, learner: torch.dtype | None, sample_kw: dict[str, Any]
) -> Sampler:
    """The run's sampler, not started (a context manager: leaving it closes the sampler): the
    inference engine for ``rollout.sampler_backend: vllm`` (started at its first weight load),
    else the local one as ``cfg.rollout`` configures it (``learner``: the learner's
    autocast)."""
    if cfg.rollout.sampler_backend == "vllm":
        return make_backend(
            "vllm", device=device, spec=engine_spec(cfg, sample_kw), sample_kw=sample_kw
        )
    return make_backend("local", device=device, spec=local_spec(cfg, learner), sample_kw=sample_kw)


def local_spec(cfg: RunConfig, learner: torch.dtype | None) -> LocalSpec:
    """How the run samples locally, from ``cfg.rollout`` (``learner``: the learner's autocast,
    the sampler's unless ``sampler_dtype`` names one); the batch and step-level local samplers
    sample so."""
    r = cfg.rollout
    return LocalSpec(
        dtype=sampler_autocast(r.sampler_dtype, learner),
        decoder=r.sampler_backend,
        logit_noise=r.sampler_logit_noise,
        noise_seed=noise_seed(cfg),
    )


def engine_spec(cfg: RunConfig, sample_kw: dict[str, Any]) -> EngineSpec:
    """How the run's engine starts, from ``cfg.rollout`` (its weight dtype: ``sampler_dtype``,
    else the learner's) and the prompts' ``max_positions``; every engine of a run (batch,
    step-level, a pack's) starts so."""
    r = cfg.rollout
    return EngineSpec(
        dtype=engine_dtype(r.sampler_dtype, cfg.model_options.dtype),
        kv_cache_gib=r.engine_kv_cache_gib,
        gpu_memory_utilization=r.engine_gpu_memory_utilization,
        seed=cfg.seed,
        max_positions=sample_kw.get("max_positions"),
    )


def pack_engine(
    cfg: RunConfig,
    device: torch.device,
    sample_kw: dict[str, Any],
    n_adapters: int,
    *,
    on_start: Callable[[], None] | None = None,
    on_join: Callable[[], None] | None = None,
) -> AdapterEngine:
    """The one engine of a pack of LoRA runs under ``rollout.sampler_backend: vllm``, not
    started: set up as :func:`make_sampler`'s (the settings are the pack's shared base fields),
    serving up to ``n_adapters`` adapters of the configured rank; each run samples through an
    :class:`~harness.sampling.vllm_adapters.AdapterSampler` over it."""
    lora = cfg.model_options.lora
    if lora is None:
        raise ValueError("model_options.lora: the pack's engine serves LoRA adapters")
    spec = replace(engine_spec(cfg, sample_kw), max_loras=n_adapters, max_lora_rank=lora.r)
    return AdapterEngine(EngineHost(device, spec), on_start=on_start, on_join=on_join)


def rollout_params(cfg: RunConfig) -> SamplingParams:
    """What one rollout samples, from ``cfg.rollout`` and the PPO temperature."""
    r = cfg.rollout
    return SamplingParams(
        n_samples=r.n_samples,
        max_new_tokens=r.max_new_tokens,
        temperature=cfg.ppo.temperature,
        top_p=r.top_p,
    )


def step_setup(run: Any) -> StepSetup:
    """What an asynchronous run's step-level sampler samples from: its own copy of the policy,
    the run's sampling settings, and a sampling generator seeded as the batch samplers' (so a
    synchronous schedule samples the same tokens)."""
    cfg = run.cfg
    generator = torch.Generator(device=run.device).manual_seed(cfg.seed)
    return StepSetup(
        frozen_copy(run.model), run.tokenizer, rollout_params(cfg), generator, run.sample_kw
    )


def local_step_sampler(run: Any, learner: torch.dtype | None) -> LocalStepSampler:
    """The step-level local sampler of an asynchronous run (``rollout.async``): the local
    sampler's options and noise stream (:func:`make_sampler`'s) over :func:`step_setup`."""
    return LocalStepSampler(step_setup(run), device=run.device, spec=local_spec(run.cfg, learner))


def engine_step_sampler(
    run: Any,
    learner: torch.dtype | None,
    *,
    on_sync: Callable[[float], None] | None = None,
) -> EngineStepSampler:
    """The step-level engine sampler of an asynchronous run under ``rollout.sampler_backend:
    vllm``: :func:`step_setup` (its copy of the policy merged into the engine under LoRA; row
    seeds from the same generator as the batch engine sampler's) on an engine set up as
    :func:`make_sampler`'s (started at the first load); ``on_sync`` is told the seconds of
    each weight copy. ``learner`` is unused: the engine's precision is its weight dtype
    (``rollout.sampler_dtype``, else the learner's)."""
    del learner
    host = EngineHost(run.device, engine_spec(run.cfg, run.sample_kw))
    return EngineStepSampler(step_setup(run), host=host, on_sync=on_sync)


__all__ = [
    "NOISE_SEED_OFFSET",
    "engine_spec",
    "engine_step_sampler",
    "local_spec",
    "local_step_sampler",
    "make_sampler",
    "pack_engine",
    "sampler_autocast",
    "step_setup",
]


def sampler_text(cfg: RunConfig, model: torch.nn.Module) -> str:
    """Which sampler the run's rollouts came from, resolved, for the run's summary and tags:
    ``vLLM engine (float32)``, ``local, fast decoder``, ``local, HF generate decoder (bfloat16)``."""
    r = cfg.rollout
    learner = cfg.model_options.dtype or "float32"
    if r.sampler_backend == "vllm":
        text = f"vLLM engine ({engine_dtype(r.sampler_dtype, cfg.model_options.dtype)})"
    else:
        fast = r.sampler_backend != "hf" and _fast_path_ok(model)  # type: ignore[arg-type]
        text = f"local, {'fast' if fast else 'HF generate'} decoder"
        if r.sampler_dtype is not None and r.sampler_dtype != learner:
            text += f" ({r.sampler_dtype}; learner {learner})"
        if r.sampler_logit_noise:
            text += f", logit noise {r.sampler_logit_noise:g}"
    return text + async_text(cfg)


def async_text(cfg: RunConfig) -> str:
    """How the sampler ran beside the learner, for the sampler text: nothing when
    synchronously, else ``; async η 2, in-flight (KV kept), virtual clock``."""
    a = cfg.rollout.asynchronous
    if not a.enabled:
        return ""
    parts = [f"async η {a.max_staleness}"]
    if a.weight_updates == "in_flight":
        kv = "KV kept" if a.in_flight_kv == "keep" else "KV recomputed"
        parts.append(f"in-flight ({kv})")
    if a.partial:
        parts.append(f"partial, over-sample {a.over_sample:g}")
    parts.append(f"{a.clock} clock")
    return "; " + ", ".join(parts)
