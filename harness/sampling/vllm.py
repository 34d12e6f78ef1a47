"""An inference engine (vLLM) as the rollout sampler: backend ``vllm``
(``rollout.sampler_backend: vllm``).

The engine is what every peer samples with (TRL, verl, AReaL, SkyRL, OpenRLHF, prime-rl); with it
the behaviour log-probs ℓb come from the engine's own kernels, not from the learner's torch code,
so the mismatch the harness measures is a real one. The contract is the local sampler's
(:class:`harness.sampling.base.Sampler`): same prompts in (chat template, truncation), same
:class:`~harness.sampling.base.RolloutBatch` out, same meaning of ℓb (docs/mismatch.md, "The
engine").

How it runs (docs/engine.md):

* one engine per run process, started at the first weight load and kept across steps,
  in-process (its process setup: :mod:`harness.sampling.vllm_host`; its start, sync and
  shutdown: :class:`EngineHost`, which the step-level sampler of asynchronous runs,
  :mod:`harness.sampling.vllm_steps`, shares); :meth:`EngineSampler.close` ends it with the run.
  A pack of LoRA runs (``harness/run/packing.py``) instead shares one engine that serves each
  run's adapter itself (:mod:`harness.sampling.vllm_adapters`);
* the model (config and weights) is written once to a run-local directory and the engine
  starts on it; before every rollout the sampling policy's weights (under LoRA: merged into the
  base weights) are copied in with vLLM's in-place ``reload_weights`` when their version
  changed (:meth:`~harness.sampling.base.Sampler.load`). So staleness emulation needs nothing
  special: the engine is synced from whatever policy the loop samples with (the snapshot k
  updates back);
* one request per row with its own seed drawn from the run's sampling generator, so a run is
  reproducible and each row's stream is independent of batching;
* log-probs in ``processed_logprobs`` mode: log_softmax of the logits after temperature, i.e.
  ``log_softmax(logits / T)`` — what the local sampler records and what the learner
  recomputes. ``top_p < 1`` is refused (vLLM's processed log-probs are then renormalised over
  the nucleus, a different quantity from the learner's).
"""

from __future__ import annotations

import contextlib
import functools
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from harness.core.scratch import owned_temp_dir
from harness.model.build import eos_ids
from harness.model.engine_support import INSTALL_HINT, engine_env, engine_installed
from harness.sampling.base import (
    GenerateCall,
    RolloutBatch,
    Sampler,
    assemble_batch,
    repeated_prompts,
)
from harness.sampling.registry import register
from harness.sampling.vllm_host import (
    ENGINE_LOCK,
    EngineError,
    engine_eager,
    engine_process_env,
    engine_start,
    reload_weights,
    shutdown,
    write_checkpoint,
)


def _refuse(settings: Mapping[str, Any]) -> str | None:
    """vLLM's processed log-probs under ``top_p < 1`` are renormalised over the nucleus, a
    different quantity from the learner's."""
    if settings.get("top_p", 1.0) < 1.0:
        return "rollout.top_p: must be 1 with sampler_backend vllm"
    return None


def _preflight() -> str | None:
    return None if engine_installed() else f"vllm is not installed ({INSTALL_HINT})"


@dataclass(frozen=True)
class EngineSpec:
    """How an engine is started: its weight ``dtype``, memory (``kv_cache_gib`` on CPU,
    ``gpu_memory_utilization`` on CUDA), ``seed`` and model length ``max_positions`` (None:
    2048). Serving LoRA adapters (``max_loras`` > 0), the engine holds the base weights and
    applies up to ``max_loras`` adapters of rank <= ``max_lora_rank`` itself
    (:mod:`harness.sampling.vllm_adapters`)."""

    dtype: str = "float32"
    kv_cache_gib: int = 1
    gpu_memory_utilization: float = 0.3
    seed: int = 0
    max_positions: int | None = None
    max_loras: int = 0
    max_lora_rank: int = 0


class EngineHost:
    """One in-process engine over a policy, started as ``spec`` says: started on the policy's
    weights (:meth:`start`), synced in place (:meth:`sync`), ended (:meth:`close`, idempotent).
    What the batch sampler (:class:`EngineSampler`) and the step-level one
    (:class:`harness.sampling.vllm_steps.EngineStepSampler`) share."""

    def __init__(self, device: torch.device, spec: EngineSpec = EngineSpec()) -> None:
        self.device = device
        self.spec = spec
        self.llm: Any = None
        self.workdir: str | None = None

    def start(self, model: Any) -> None:
        """Start the engine on ``model``'s weights (merged under LoRA, or the base alone when
        it serves adapters); :class:`EngineError` with the reason when it cannot."""
        # Named after this process: a later run sweeps it if this one is killed (core.scratch).
        self.workdir = owned_temp_dir("harness-engine-")
        # The policy as a checkpoint the engine loads (merged under LoRA). Starting on dummy
        # weights and syncing afterwards was measured to leave the engine's log-probs ~0.9 off
        # the learner's on the tiny Llama; loading real weights first, then syncing, matches.
        spec = self.spec
        write_checkpoint(model, self.workdir, merged=not spec.max_loras)
        kwargs: dict[str, Any] = {
            "model": self.workdir,
            "skip_tokenizer_init": True,
            "dtype": spec.dtype,
            "enforce_eager": True,
            "max_model_len": int(spec.max_positions or 2048),
            "seed": spec.seed,
            "logprobs_mode": "processed_logprobs",
            "enable_prefix_caching": False,
            "use_tqdm_on_load": False,  # a progress bar per run start on the sweep's console
        }
        if self.device.type == "cuda":
            kwargs["gpu_memory_utilization"] = spec.gpu_memory_utilization
        if spec.max_loras:
            kwargs |= {
                "enable_lora": True,
                "max_loras": spec.max_loras,
                "max_cpu_loras": spec.max_loras,
                "max_lora_rank": engine_lora_rank(spec.max_lora_rank),
            }
        try:
            # Quiet, and the process left as the run and later runs in it expect
            # (harness/sampling/vllm_host.py: the model classes, torch.set_num_threads).
            with (
                ENGINE_LOCK,
                engine_env(engine_process_env(self.device, spec.kv_cache_gib)),
                engine_start(),
            ):
                from vllm import LLM

                self.llm = LLM(**kwargs)
        except Exception as err:  # any start failure ends the run with its reason
            self.close()
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise EngineError(
                f"inference engine failed to start: {type(err).__name__}: {first}"
            ) from err

    def sync(self, model: Any) -> float:
        """Copy ``model``'s weights into the engine, started on first use; the seconds the copy
        took (the start not counted)."""
        if self.llm is None:
            self.start(model)
        with ENGINE_LOCK:
            return reload_weights(self.llm, model)

    def close(self) -> None:
        """End the engine and remove its run-local directory (idempotent)."""
        llm, self.llm = self.llm, None
        with ENGINE_LOCK:
            shutdown(llm)
        del llm
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def eager(self) -> contextlib.AbstractContextManager[Any]:
        return engine_eager(self.device)


@register(
    "vllm",
    options={
        "dtype": "the engine's weight dtype (float32, bfloat16, float16)",
        "kv_cache_gib": "on CPU: GiB reserved for the engine's KV cache (VLLM_CPU_KVCACHE_SPACE)",
        "gpu_memory_utilization": "on CUDA: the share of the GPU's memory the engine may take",
        "seed": "the engine's seed",
    },
    refuse=_refuse,
    preflight=_preflight,
)
class EngineSampler(Sampler):
    """The engine as a :class:`~harness.sampling.base.Sampler` (module docstring), started as
    ``spec`` says; its model length, unless ``spec`` names one, is ``sample_kw``'s
    ``max_positions`` (the prompts' limit)."""

    copies_weights = True

    spec_type = EngineSpec
    spec: EngineSpec

    def _setup(self) -> None:
        if self.spec.max_positions is None:
            self.spec = replace(self.spec, max_positions=self.sample_kw.get("max_positions"))
        self.host = EngineHost(self.device, self.spec)

    @property
    def _llm(self) -> Any:
        """The running ``vllm.LLM`` (None before the first load and after close)."""
        return self.host.llm

    def _close(self) -> None:
        self.host.close()

    def _eager(self) -> contextlib.AbstractContextManager[Any]:
        return self.host.eager()

    # ---- weights
    def _sync(self, weights: Any) -> float:
        """Copy ``weights`` (the policy module) into the engine, started on first use; the
        seconds the copy took (the start not counted)."""
        return self.host.sync(weights)

    def count_sync(self, seconds: float) -> None:
        """Count a weight copy made for this run by another engine of it (the step-level
        sampler of an asynchronous run), so that :meth:`stats` holds the run's copies."""
        self.syncs += 1
        self.sync_seconds += seconds

    # ---- sampling
    def lora_request(self) -> Any:
        """The engine's LoRA adapter every row is sampled under (None: the engine's own
        weights, merged under LoRA); a view over an engine that serves adapters names its
        own (:class:`harness.sampling.vllm_adapters.AdapterSampler`)."""
        return None

    def generate_ids(
        self,
        prompt_ids: list[list[int]],
        seeds: list[int],
        *,
        max_new_tokens: int,
        temperature: float,
        eos_token_ids: list[int],
    ) -> list[tuple[list[int], list[float]]]:
        """One request per row: its sampled token ids and their engine log-probs."""
        lora = self.lora_request()
        params = [
            request_params(
                max_tokens=max_new_tokens,
                temperature=temperature,
                seed=int(s),
                eos_token_ids=eos_token_ids,
            )
            for s in seeds
        ]
        try:
            with ENGINE_LOCK, self._eager():
                outs = self._llm.generate(
                    [{"prompt_token_ids": ids} for ids in prompt_ids],
                    params,
                    use_tqdm=False,
                    **({"lora_request": lora} if lora is not None else {}),
                )
        except Exception as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise EngineError(f"engine generation failed: {type(err).__name__}: {first}") from err
        rows = []
        for out in outs:
            comp = out.outputs[0]
            toks = list(comp.token_ids)
            lps = [float(d[t].logprob) for t, d in zip(toks, comp.logprobs or [], strict=True)]
            rows.append((toks, lps))
        return rows

    def _generate(self, call: GenerateCall) -> RolloutBatch:
        tokenizer, prompts, params, generator = call
        refused = _refuse({"top_p": params.top_p})
        if refused:  # RolloutConfig refuses it; a direct caller gets the same answer
            raise ValueError(refused)
        kw = self.sample_kw
        eos_token_ids = kw.get("eos_token_ids")
        if not eos_token_ids:
            eos_token_ids = eos_ids(self.model, tokenizer)
        prompt_ids, prompt_mask = repeated_prompts(
            tokenizer,
            prompts,
            params.n_samples,
            params.max_new_tokens,
            max_prompt_tokens=kw.get("max_prompt_tokens"),
            max_positions=kw.get("max_positions"),
            chat_template=kw.get("chat_template"),
        )
        device = self.device
        rows = [
            [int(t) for t, m in zip(ids, mask, strict=True) if m]
            for ids, mask in zip(prompt_ids.tolist(), prompt_mask.tolist(), strict=True)
        ]
        # Per-row seeds from the run's sampling generator: reproducible, batch-independent.
        seeds = torch.randint(
            0, 2**31 - 1, (len(rows),), generator=generator, device=generator.device
        ).tolist()
        results = self.generate_ids(
            rows,
            seeds,
            max_new_tokens=params.max_new_tokens,
            # vLLM decodes greedily at temperature 0 (evaluation's argmax).
            temperature=0.0 if params.greedy else params.temperature,
            eos_token_ids=list(eos_token_ids),
        )
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_token_ids[0]
        eos = torch.tensor(eos_token_ids, dtype=torch.long)
        groups = [params.n_samples] * len(prompts)
        rb = engine_batch(tokenizer, prompt_ids, prompt_mask, results, eos, pad_id, groups)
        return rb.to(device) if device.type != "cpu" else rb


def padded(rows: Sequence[Sequence[float]], fill: float, dtype: torch.dtype) -> torch.Tensor:
    """Per-row lists as one ``[N, W]`` tensor, ``fill`` after each row's end (``W``: the
    longest row, at least 1)."""
    out = torch.full((len(rows), max(1, max(len(r) for r in rows))), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def engine_batch(
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    rows: Sequence[tuple[list[int], list[float]]],
    eos: torch.Tensor,
    pad_id: int,
    group_sizes: list[int],
) -> RolloutBatch:
    """The engine's sampled ``rows`` (each row's token ids and their log-probs, on the CPU)
    behind their left-padded prompts, in token layout: how the batch sampler lays out a call
    and the step sampler a group."""
    tokens = padded([t for t, _ in rows], pad_id, torch.long)
    logps = padded([lp for _, lp in rows], 0.0, torch.float32)
    return assemble_batch(
        tokenizer, prompt_ids, prompt_mask, tokens, logps, eos, group_sizes=group_sizes
    )


def request_params(
    *, max_tokens: int, temperature: float, seed: int, eos_token_ids: list[int], delta: bool = False
) -> Any:
    """One row's ``vllm.SamplingParams``: ``max_tokens`` at ``temperature`` (0 = greedy) from its
    own ``seed``, the sampled token's processed log-prob, stopping on the harness's EOS set;
    ``delta``: each output carries only the tokens new since the last one (stepping)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        n=1,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=1.0,
        top_k=-1 if _top_k_minus_one() else 0,
        logprobs=0,
        seed=int(seed),
        detokenize=False,
        # Stop exactly on the harness's EOS set (the engine's own EOS is not known without a
        # tokenizer); the stop token stays in the output, as locally.
        ignore_eos=True,
        stop_token_ids=list(eos_token_ids),
        output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.CUMULATIVE,
    )


# The adapter ranks vLLM can be started for (its LoRAConfig takes no other max_lora_rank).
ENGINE_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def engine_lora_rank(rank: int) -> int:
    """The smallest rank the engine can be started for that holds adapters of rank ``rank``;
    :class:`EngineError` beyond the largest."""
    for r in ENGINE_LORA_RANKS:
        if rank <= r:
            return r
    raise EngineError(
        f"model_options.lora.r: the engine serves adapters of rank <= {ENGINE_LORA_RANKS[-1]}, "
        f"not {rank}"
    )


@functools.cache
def _top_k_minus_one() -> bool:
    """vLLM's "top-k off" value: 0 in recent releases, -1 in older ones."""
    try:
        from vllm import SamplingParams

        SamplingParams(top_k=0)
        return False
    except Exception:
        return True


__all__ = [
    "ENGINE_LORA_RANKS",
    "EngineError",
    "EngineHost",
    "EngineSampler",
    "EngineSpec",
    "engine_batch",
    "engine_lora_rank",
    "padded",
    "request_params",
]
