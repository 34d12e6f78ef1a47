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
  (:func:`harness.sampling.vllm_host.reload_weights`), followed by the prefix-cache reset TRL
  does.
* CPU specifics shared with the engine sampler: the engine pins no cores, keeps torch's
  ``set_num_threads`` (its CPU worker replaces it with a no-op), and its few ``torch.compile``d
  helpers run eagerly.
* The process around TRL's ``LLM(...)`` call is the engine sampler's
  (:mod:`harness.sampling.vllm_host`: environment, checkpoint directory, ``engine_start``): the ``transformers`` model classes vLLM's
  Transformers backend decorates (Phi, GPT-NeoX) are put back, so the learner TRL trains, an
  instance of the same class, keeps its forward; the start's console noise is dropped.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from harness.core.scratch import owned_temp_dir
from harness.model.engine_support import engine_dtype, engine_env, quiet_engine_logs
from harness.sampling.vllm_host import (
    engine_eager,
    engine_process_env,
    engine_start,
    reload_weights,
    write_checkpoint,
)
from harness.sampling.vllm_host import shutdown as shutdown_engine

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
            dt = reload_weights(generation.llm, generation.model)
            t0 = time.perf_counter()
            generation.llm.reset_prefix_cache()
            self.sync_seconds += dt + time.perf_counter() - t0
            self.syncs += 1

        generation.sync_weights = sync_weights


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
    env = {**engine_process_env(run.device, cfg.rollout.engine_kv_cache_gib), **quiet_engine_logs()}
    set_threads = torch.set_num_threads
    handle = ColocatedEngine(workdir=workdir, dtype=dtype)
    eager = engine_eager(run.device)
    dist_saved = {k: os.environ.get(k) for k in _DIST_ENV}
    try:
        # TRL passes the engine no dtype: it takes the checkpoint's.
        write_checkpoint(run.model, workdir, dtype=dtype, tokenizer=run.tokenizer)
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
        generation.llm = None
        shutdown_engine(llm)
