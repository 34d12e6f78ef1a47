"""An inference engine (vLLM) as the rollout sampler: ``rollout.sampler_backend: vllm``.

The engine is what every peer samples with (TRL, verl, AReaL, SkyRL, OpenRLHF, prime-rl); with it
the behaviour log-probs ℓb come from the engine's own kernels, not from the learner's torch code,
so the mismatch the harness measures is a real one. The contract is the local sampler's
(:class:`harness.run.sampler.Sampler`): same prompts in (chat template, truncation), same
:class:`~harness.run.rollout.RolloutBatch` out, same meaning of ℓb (docs/mismatch.md, "The
engine").

How it runs (docs/engine.md):

* one engine per run process, started at the first rollout and kept across steps, in-process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine-core subprocess, no ``spawn`` re-importing
  the caller's ``__main__``); :meth:`EngineSampler.close` ends it with the run;
* the model's config is written once to a run-local directory and the engine starts on dummy
  weights; before every rollout the sampling policy's weights (under LoRA: merged into the
  base weights) are copied in with vLLM's in-place ``reload_weights``. So staleness emulation
  needs nothing special: the engine is synced from whatever policy the loop samples with (the
  snapshot k updates back);
* one request per row with its own seed drawn from the run's sampling generator, so a run is
  reproducible and each row's stream is independent of batching;
* log-probs in ``processed_logprobs`` mode: log_softmax of the logits after temperature, i.e.
  ``log_softmax(logits / T)`` — what the local sampler records and what the learner
  recomputes. ``top_p < 1`` is refused (vLLM's processed log-probs are then renormalised over
  the nucleus, a different quantity from the learner's).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from harness.core.scratch import owned_temp_dir
from harness.model.build import eos_ids
from harness.model.engine_support import (
    INSTALL_HINT,
    engine_dtype,
    engine_env,
    engine_installed,
    quiet_engine_logs,
    served_architecture,
)
from harness.model.lora import is_lora
from harness.run.engine_process import engine_start
from harness.run.rollout import RolloutBatch, assemble_batch, encode_prompts

if TYPE_CHECKING:
    from harness.config import RunConfig


class EngineError(RuntimeError):
    """The engine failed (start, weight sync or generation): the run FAILS with this reason."""


def _merged_lora_state(model: Any) -> dict[str, torch.Tensor]:
    """The base model's weights with every LoRA adapter merged in, W + scale·B·A, under the
    base model's own parameter names; the live model is not modified (peft's
    ``get_delta_weight`` computes the delta of one adapted layer)."""
    base = model.get_base_model()
    out: dict[str, torch.Tensor] = {}
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    d = module.get_delta_weight(adapter).detach()
                    key = f"{name}.weight"
                    deltas[key] = deltas[key] + d if key in deltas else d
    for name, t in base.state_dict().items():
        if "lora_" in name:
            continue
        clean = name.replace(".base_layer.", ".")
        t = t.detach()
        if clean in deltas:
            t = t + deltas[clean].to(t.dtype)
        out[clean] = t
    return out


def tied_output_weights(model: Any) -> set[str]:
    """The state-dict names of ``model``'s output embedding when its config ties it to the input
    embedding (``tie_word_embeddings``), else none.  The engine ties them itself, from the
    config; some of its loaders skip a tied ``lm_head.weight`` (Llama, Qwen2), others reject it
    (Gemma2: "There is no module or parameter named 'lm_head'"), so it is never sent."""
    base = model.get_base_model() if is_lora(model) else model
    config = base.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not (
        getattr(text, "tie_word_embeddings", False) or getattr(config, "tie_word_embeddings", False)
    ):
        return set()
    out = base.get_output_embeddings()
    return {f"{name}.weight" for name, module in base.named_modules() if module is out}


def engine_weights(model: Any) -> dict[str, torch.Tensor]:
    """The weights the engine serves for ``model``: its state dict, or under LoRA the merged
    weights, less a tied output embedding (:func:`tied_output_weights`). Float tensors only
    (buffers such as RoPE tables are the engine's own)."""
    state = _merged_lora_state(model) if is_lora(model) else model.state_dict()
    tied = tied_output_weights(model)
    return {n: t.detach() for n, t in state.items() if t.is_floating_point() and n not in tied}


@dataclass
class EngineSampler:
    """The engine as a :class:`~harness.run.sampler.Sampler` (module docstring)."""

    device: torch.device
    dtype: str = "float32"
    kv_cache_gib: int = 1
    gpu_memory_utilization: float = 0.3
    seed: int = 0
    sample_kw: dict[str, Any] = field(default_factory=dict)  # EOS ids, truncation, template
    sync_seconds: float = 0.0  # weight-sync time since the last pop_sync_seconds()
    syncs: int = 0
    _llm: Any = None
    _workdir: str | None = None

    # ---- lifecycle
    def _start(self, model: Any) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = base.config
        arch = served_architecture(config, type(base).__name__)
        if arch is None:
            raise EngineError(
                f"rollout.sampler_backend: vllm cannot serve {type(base).__name__} "
                "(not in the engine's model registry)"
            )
        # Named after this process: a later run sweeps it if this one is killed (core.scratch).
        self._workdir = owned_temp_dir("harness-engine-")
        # The policy as a checkpoint the engine loads (merged under LoRA). Starting on dummy
        # weights and syncing afterwards was measured to leave the engine's log-probs ~0.9 off
        # the learner's on the tiny Llama; loading real weights first, then syncing, matches.
        from safetensors.torch import save_file  # noqa: PLC0415 - only when the engine starts

        config.save_pretrained(self._workdir)
        with open(os.path.join(self._workdir, "config.json")) as f:
            data = json.load(f)
        data["architectures"] = [arch]
        with open(os.path.join(self._workdir, "config.json"), "w") as f:
            json.dump(data, f)
        weights = {
            n: t.detach().to("cpu").contiguous().clone() for n, t in engine_weights(model).items()
        }
        save_file(weights, os.path.join(self._workdir, "model.safetensors"))
        del weights
        limit = self.sample_kw.get("max_positions") or 2048
        env = {
            # The engine core in this process (no subprocess, no spawn of __main__).
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            # CPU build: GiB of KV cache.
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
        }
        if self.device.type == "cpu":
            # In-process, the engine computes on torch's own intra-op threads (RunConfig.threads);
            # it must not pin OpenMP threads to cores that other workers on the machine share.
            env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        kwargs: dict[str, Any] = {
            "model": self._workdir,
            "skip_tokenizer_init": True,
            "dtype": self.dtype,
            "enforce_eager": True,
            "max_model_len": int(limit),
            "seed": self.seed,
            "logprobs_mode": "processed_logprobs",
            "enable_prefix_caching": False,
            "use_tqdm_on_load": False,  # a progress bar per run start on the sweep's console
        }
        if self.device.type == "cuda":
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        try:
            # Quiet, and the process left as the run and later runs in it expect
            # (harness/run/engine_process.py: the model classes, torch.set_num_threads).
            with engine_env(env), engine_start():
                from vllm import LLM

                self._llm = LLM(**kwargs)
        except Exception as err:  # any start failure ends the run with its reason
            self.close()
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise EngineError(
                f"inference engine failed to start: {type(err).__name__}: {first}"
            ) from err

    def close(self) -> None:
        """End the engine and remove its run-local directory (idempotent)."""
        llm, self._llm = self._llm, None
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def _eager(self) -> contextlib.AbstractContextManager[Any]:
        """On CPU, the engine's few ``torch.compile``d helpers (the sampled token's rank among
        the log-probs) run eagerly: compiling them with inductor costs minutes on a loaded
        2-core machine for nothing the harness reads. Scoped to the engine's calls."""
        if self.device.type != "cpu":
            return contextlib.nullcontext()
        return torch._dynamo.config.patch(disable=True)

    # ---- weights
    def sync(self, model: Any) -> float:
        """Copy ``model``'s weights into the engine; the seconds it took."""
        if self._llm is None:
            self._start(model)
        t0 = time.perf_counter()
        weights = list(engine_weights(model).items())
        try:
            self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        except Exception as err:
            raise EngineError(f"engine weight sync failed: {type(err).__name__}: {err}") from err
        dt = time.perf_counter() - t0
        self.sync_seconds += dt
        self.syncs += 1
        return dt

    def pop_sync_seconds(self) -> float:
        """The weight-sync seconds since the last call (for ``perf/weight_sync_s``)."""
        dt, self.sync_seconds = self.sync_seconds, 0.0
        return dt

    # ---- sampling
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
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=1,
                max_tokens=max_new_tokens,
                temperature=temperature,
                top_p=1.0,
                top_k=-1 if _top_k_minus_one() else 0,
                logprobs=0,
                seed=int(s),
                detokenize=False,
                # Stop exactly on the harness's EOS set (the engine's own EOS is not known
                # without a tokenizer); the stop token stays in the output, as locally.
                ignore_eos=True,
                stop_token_ids=list(eos_token_ids),
            )
            for s in seeds
        ]
        try:
            with self._eager():
                outs = self._llm.generate(
                    [{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False
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

    def sample(
        self,
        model: Any,
        tokenizer: Any,
        prompts: list[str],
        *,
        n_samples: int,
        max_new_tokens: int,
        generator: torch.Generator,
        temperature: float,
        top_p: float,
    ) -> RolloutBatch:
        if top_p < 1.0:  # RolloutConfig refuses it; a direct caller gets the same answer
            raise ValueError("rollout.top_p: must be 1 with sampler_backend vllm")
        self.sync(model)
        kw = self.sample_kw
        eos_token_ids = kw.get("eos_token_ids")
        if not eos_token_ids:
            eos_token_ids = eos_ids(model, tokenizer)
        enc = encode_prompts(
            tokenizer, prompts, kw.get("max_prompt_tokens"), kw.get("chat_template")
        )
        device = self.device
        prompt_ids = enc["input_ids"].repeat_interleave(n_samples, dim=0)
        prompt_mask = enc["attention_mask"].repeat_interleave(n_samples, dim=0)
        longest = int(prompt_mask.sum(-1).max())
        limit = kw.get("max_positions")
        if limit is not None and longest + max_new_tokens > limit:
            raise ValueError(
                f"rollout: a prompt of {longest} tokens + max_new_tokens {max_new_tokens} exceeds "
                f"the model's {limit} positions (set rollout.max_prompt_tokens)"
            )
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
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            eos_token_ids=list(eos_token_ids),
        )
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_token_ids[0]
        width = max(1, max(len(t) for t, _ in results))
        tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
        logps = torch.zeros(len(rows), width, dtype=torch.float32)
        for i, (toks, lps) in enumerate(results):
            tokens[i, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            logps[i, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
        eos = torch.tensor(eos_token_ids, dtype=torch.long)
        rb = assemble_batch(
            tokenizer,
            prompt_ids,
            prompt_mask,
            tokens,
            logps,
            eos,
            group_sizes=[n_samples] * len(prompts),
        )
        return rb.to(device) if device.type != "cpu" else rb


def _top_k_minus_one() -> bool:
    """vLLM's "top-k off" value: 0 in recent releases, -1 in older ones."""
    try:
        from vllm import SamplingParams

        SamplingParams(top_k=0)
        return False
    except Exception:
        return True


def engine_sampler(
    cfg: RunConfig, device: torch.device, sample_kw: dict[str, Any]
) -> EngineSampler:
    """The run's engine sampler as ``cfg.rollout`` configures it (not started yet)."""
    r = cfg.rollout
    return EngineSampler(
        device=device,
        dtype=engine_dtype(r.sampler_dtype, cfg.model_options.dtype),
        kv_cache_gib=r.engine_kv_cache_gib,
        gpu_memory_utilization=r.engine_gpu_memory_utilization,
        seed=cfg.seed,
        sample_kw=dict(sample_kw),
    )


__all__ = [
    "INSTALL_HINT",
    "EngineError",
    "EngineSampler",
    "engine_dtype",
    "engine_installed",
    "engine_sampler",
    "engine_weights",
    "quiet_engine_logs",
    "served_architecture",
]
