"""TRL's own vLLM path for ``trainer: trl`` with ``rollout.sampler_backend: vllm``.

TRL 1.16's ``GRPOTrainer(use_vllm=True, vllm_mode="colocate")`` builds a ``vllm.LLM`` in the
trainer's process (``trl/generation/vllm_generation.py``, ``VLLMGeneration._init_vllm``), samples
with it, and applies its own behaviour-weight correction (``vllm_importance_sampling_*``) and
``off_policy_mask_threshold`` to the engine's log-probs.  What that path expects from the process,
and what this module provides around the trainer's lifetime (docs/engine.md, "trainer: trl"):

* ``LLM(model=model.name_or_path, ...)``: a model *directory*.  The policy (merged weights
  under LoRA), its config and its tokenizer are written to a run-local directory, and the model's
  ``name_or_path`` points there while the trainer lives.
* ``dtype`` and ``seed``: TRL passes no ``dtype``, and vLLM's ``"auto"`` turns a float32
  checkpoint into bfloat16 (its "downcast for float32 models"): a float32 run would sample
  from a bfloat16 engine without saying so.  TRL seeds the engine with the process index (0
  for every seed), and in-process the engine reseeds the process's torch RNG with it.  So the
  engine TRL builds gets the run's dtype (``rollout.sampler_dtype``, else the learner's) and
  ``seed``: TRL's module-level ``LLM`` is wrapped while the trainer is built.
* ``distributed_executor_backend="external_launcher"``: the engine joins a torch.distributed
  group of this one process.  TRL sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and a free
  loopback ``MASTER_PORT`` itself; they, and the group, are undone when the run ends, so the
  next run in the same process (a sweep worker) starts clean.
* Weight sync: TRL's colocate sync calls the engine model's ``load_weights`` directly, which the
  CPU build cannot take after its start (it repacks linear weights and drops their loaders:
  ``'Parameter' object has no attribute 'weight_loader'``).  It is replaced by vLLM's in-place
  ``reload_weights``, the call the harness's own engine sampler uses
  (:mod:`harness.run.engine`), followed by the prefix-cache reset TRL does.
* CPU specifics shared with the engine sampler: the engine pins no cores, keeps torch's
  ``set_num_threads`` (its CPU worker replaces it with a no-op), and its few ``torch.compile``d
  helpers run eagerly.
* The process around TRL's ``LLM(...)`` call is the engine sampler's
  (:func:`harness.run.engine_process.engine_start`): the ``transformers`` model classes vLLM's
  Transformers backend decorates (Phi, GPT-NeoX) are put back, so the learner TRL trains, an
  instance of the same class, keeps its forward; the start's console noise is dropped.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from harness.core.scratch import owned_temp_dir
from harness.model.engine_support import (
    engine_dtype,
    engine_env,
    quiet_engine_logs,
    served_architecture,
)
from harness.run.engine import EngineError, engine_weights
from harness.run.engine_process import engine_start

# Set by TRL's colocate start (and by torch.distributed); restored when the run ends.
_DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class ColocatedEngine:
    """The engine TRL runs, as the harness sees it: where it was saved and what syncs cost."""

    workdir: str
    dtype: str
    sync_seconds: float = 0.0
    syncs: int = 0

    def pop_sync_seconds(self) -> float:
        dt, self.sync_seconds = self.sync_seconds, 0.0
        return dt

    def install_sync(self, generation: Any) -> None:
        """Replace TRL's colocate weight sync on ``generation`` (a ``VLLMGeneration``) with
        vLLM's in-place reload (module docstring)."""

        def sync_weights() -> None:
            t0 = time.perf_counter()
            weights = list(engine_weights(generation.model).items())
            try:
                generation.llm.collective_rpc(
                    "reload_weights", kwargs={"weights_iterator": weights}
                )
            except Exception as err:
                raise EngineError(
                    f"engine weight sync failed: {type(err).__name__}: {err}"
                ) from err
            generation.llm.reset_prefix_cache()
            self.sync_seconds += time.perf_counter() - t0
            self.syncs += 1

        generation.sync_weights = sync_weights


def _save_model(model: Any, tokenizer: Any, workdir: str, dtype: str) -> None:
    """The policy as a checkpoint directory the engine loads (merged weights under LoRA)."""
    from safetensors.torch import save_file  # noqa: PLC0415 - only when the engine starts

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    arch = served_architecture(base.config, type(base).__name__)
    if arch is None:
        raise EngineError(
            f"rollout.sampler_backend: vllm cannot serve {type(base).__name__} "
            "(not in the engine's model registry)"
        )
    base.config.save_pretrained(workdir)
    path = os.path.join(workdir, "config.json")
    with open(path) as f:
        data = json.load(f)
    data["architectures"] = [arch]
    # TRL passes the engine no dtype: it takes the checkpoint's.
    data["torch_dtype"] = data["dtype"] = dtype
    with open(path, "w") as f:
        json.dump(data, f)
    gen = getattr(base, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(workdir)
    tokenizer.save_pretrained(workdir)
    weights = {
        n: t.detach().to("cpu").contiguous().clone() for n, t in engine_weights(model).items()
    }
    save_file(weights, os.path.join(workdir, "model.safetensors"))


@contextlib.contextmanager
def _engine_args(dtype: str, seed: int) -> Iterator[None]:
    """TRL's ``LLM(...)`` call with the run's ``dtype`` and ``seed`` (module docstring)."""
    import trl.generation.vllm_generation as trl_vllm

    real = trl_vllm.LLM

    def llm(*args: Any, **kwargs: Any) -> Any:
        kwargs["use_tqdm_on_load"] = False
        kwargs["dtype"] = dtype
        kwargs["seed"] = seed
        with engine_start():  # quiet; the learner's model classes kept (engine_process.py)
            return real(*args, **kwargs)

    trl_vllm.LLM = llm  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        trl_vllm.LLM = real  # type: ignore[misc]


def _end_distributed() -> None:
    """Undo the single-process group the engine joined, so a later run can form its own."""
    with contextlib.suppress(Exception):
        from vllm.distributed.parallel_state import (
            destroy_distributed_environment,
            destroy_model_parallel,
        )

        destroy_model_parallel()
        destroy_distributed_environment()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        with contextlib.suppress(Exception):
            torch.distributed.destroy_process_group()


@contextlib.contextmanager
def colocated_engine(run: Any) -> Iterator[ColocatedEngine]:
    """The process set up for TRL's colocated engine while the trainer lives (module
    docstring); on exit the engine is shut down and everything is restored."""
    cfg = run.cfg
    dtype = engine_dtype(cfg.rollout.sampler_dtype, cfg.model_options.dtype)
    workdir = owned_temp_dir("harness-trl-engine-")  # swept by a later run if this one is killed
    base = run.model.get_base_model() if hasattr(run.model, "get_base_model") else run.model
    saved_name = (base.config._name_or_path, getattr(base, "name_or_path", None))
    env = {
        # The engine core in this process (no subprocess, no spawn of __main__).
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(cfg.rollout.engine_kv_cache_gib),
        **quiet_engine_logs(),
    }
    if run.device.type == "cpu":
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    set_threads = torch.set_num_threads
    handle = ColocatedEngine(workdir=workdir, dtype=dtype)
    eager = (
        torch._dynamo.config.patch(disable=True)
        if run.device.type == "cpu"
        else contextlib.nullcontext()
    )
    dist_saved = {k: os.environ.get(k) for k in _DIST_ENV}
    try:
        _save_model(run.model, run.tokenizer, workdir, dtype)
        base.config._name_or_path = base.name_or_path = workdir
        with engine_env(env), eager, _engine_args(dtype, cfg.seed):
            yield handle
    finally:
        torch.set_num_threads = set_threads
        base.config._name_or_path, base.name_or_path = saved_name
        _end_distributed()
        for k, v in dist_saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        gc.collect()
        shutil.rmtree(workdir, ignore_errors=True)


def shutdown(generation: Any) -> None:
    """End the engine TRL started (idempotent; the trainer object may outlive the run)."""
    llm = getattr(generation, "llm", None)
    if llm is not None:
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        generation.llm = None
