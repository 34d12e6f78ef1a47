"""The one place the vLLM engine's process is set up: what the engine sampler
(:mod:`harness.sampling.vllm`) and TRL's colocated engine (``harness/run/trl_engine.py``) share.

* **Environment** (:func:`engine_process_env`): the engine core in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine-core subprocess, no ``spawn`` re-importing the
  caller's ``__main__``), its CPU KV cache, and no OpenMP core pinning on CPU (in-process, the
  engine computes on torch's own intra-op threads, which other workers on the machine share).
* **Checkpoint directory** (:func:`write_checkpoint`): the policy's config and weights (merged
  under LoRA, :func:`engine_weights`) in a run-local directory the engine loads.
* **Weight sync** (:func:`reload_weights`): vLLM's in-place ``reload_weights``, timed.
* **Thread guard and compile** (:func:`engine_start`, :func:`engine_eager`): ``torch.set_num_threads``
  kept (the CPU worker replaces it with a no-op for the whole process), the engine's few
  ``torch.compile``d helpers eager on CPU.
* **Shutdown** (:func:`shutdown`).

Starting the engine in the run's own process changes that process in ways the run, and every
later run in the same process (a sweep worker), would otherwise see:

* **Model classes.** vLLM serves some architectures (Phi, GPT-NeoX, ...) through its
  Transformers backend, which builds the model from the ``transformers`` class itself and
  decorates that class for ``torch.compile`` in place (``support_torch_compile``: a base class
  added, ``__init__`` and ``__call__`` replaced). The learner's model is an instance of the same
  class: its next forward fails (``'PhiModel' object has no attribute 'do_not_compile'``) and a
  later run building the class fails in its constructor (``Current vLLM config is not set``).
  :func:`model_classes_kept` puts every loaded ``transformers`` model class back as it was once
  the engine is built. The engine's own instance keeps working: it runs eagerly
  (``enforce_eager``, or dynamo disabled on CPU), where the decorated ``__call__`` only calls
  ``forward``, as ``nn.Module.__call__`` does.
* **Console.** vLLM's start prints, besides its log lines (:func:`quiet_engine_logs`), a C++
  warning on the process's stderr, below Python (the CPU worker binding its memory to a NUMA
  node), and Python warnings about its own code (deprecated torch APIs it touches): none is about
  the user's run, and a sweep's console repeated them per cell. :func:`engine_start_quiet` drops
  exactly those while the engine starts.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import transformers

from harness.model.engine_support import engine_env, quiet_engine_logs, served_architecture
from harness.model.lora import is_lora

# Python warnings vLLM's start raises about its own code, not the user's: its scan of every
# loaded module's attributes touches the deprecated ``torch.distributed.reduce_op``, and it
# decorates with the deprecated ``torch.jit.script_method``.
ENGINE_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    (r".*torch\.distributed\.reduce_op", FutureWarning),
    (r".*torch\.jit\.script_method", DeprecationWarning),
)
# The C++ warning the CPU worker prints on stderr when it binds the process's memory to a NUMA
# node (``init_cpu_memory_env``); it goes past Python's logging and warnings.
STDERR_NOISE = re.compile(r"NUMA binding: Using \w+ policy")


def _model_classes() -> list[type]:
    """Every loaded ``transformers`` model class (the ones vLLM's Transformers backend may
    decorate: it decorates the decoder class of the model it builds)."""
    seen: dict[type, None] = {}
    todo = [transformers.PreTrainedModel]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen[sub] = None
                todo.append(sub)
    return list(seen)


@contextlib.contextmanager
def model_classes_kept() -> Iterator[None]:
    """Every loaded ``transformers`` model class as it was before the block: its bases and its
    own attributes (module docstring)."""
    saved = {cls: (cls.__bases__, dict(cls.__dict__)) for cls in _model_classes()}
    try:
        yield
    finally:
        for cls, (bases, attrs) in saved.items():
            _restore(cls, bases, attrs)


def _restore(cls: type, bases: tuple[type, ...], attrs: dict[str, Any]) -> None:
    now = dict(cls.__dict__)
    for name in now.keys() - attrs.keys():
        with contextlib.suppress(AttributeError, TypeError):
            delattr(cls, name)
    for name, value in attrs.items():
        if name in ("__dict__", "__weakref__"):
            continue
        if now.get(name, _MISSING) is not value:
            with contextlib.suppress(AttributeError, TypeError):
                setattr(cls, name, value)
    if cls.__bases__ != bases:
        cls.__bases__ = bases


_MISSING = object()


@contextlib.contextmanager
def stderr_filtered(noise: re.Pattern[str] = STDERR_NOISE) -> Iterator[None]:
    """The process's stderr (file descriptor 2, where C++ code writes) passed through, less the
    lines matching ``noise``.  A thread forwards what is written as it comes (a progress display
    on stderr keeps refreshing); a partial line is held only while it may still turn out to be a
    C++ warning line (those start ``[W``)."""
    fd = 2  # where C++ writes, whatever Python's sys.stderr is at the moment
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    try:
        saved = os.dup(fd)
    except OSError:  # no stderr to filter
        yield
        return
    read, write = os.pipe()
    os.dup2(write, fd)
    os.close(write)

    def forward() -> None:
        held = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(read, 65536):
                held += chunk
                *lines, held = held.split(b"\n")
                out = b"".join(
                    line + b"\n"
                    for line in lines
                    if not noise.search(line.decode("utf-8", "replace"))
                )
                if held and not held.startswith(b"[W"):
                    out, held = out + held, b""
                if out:
                    os.write(saved, out)
        if held and not noise.search(held.decode("utf-8", "replace")):
            with contextlib.suppress(OSError):
                os.write(saved, held)
        os.close(read)
        os.close(saved)

    thread = threading.Thread(target=forward, name="engine-stderr", daemon=True)
    thread.start()
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, fd)  # closes the pipe's last write end: the thread reads EOF, ends
        # A process started in the block that still holds the pipe keeps its stderr forwarded
        # until it exits (the thread closes both ends then), rather than writing into a closed pipe.
        thread.join(timeout=2)


@contextlib.contextmanager
def engine_start_quiet() -> Iterator[None]:
    """The engine's start without its noise on the console (module docstring): its Python
    warnings about its own code and its C++ NUMA line dropped, its log lines at ERROR (unless
    the user set ``VLLM_LOGGING_LEVEL``)."""
    with engine_env(quiet_engine_logs()), warnings.catch_warnings(), stderr_filtered():
        for message, category in ENGINE_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield


@contextlib.contextmanager
def engine_start() -> Iterator[None]:
    """Around building a ``vllm.LLM`` in this process: quiet (:func:`engine_start_quiet`), and
    the model classes and ``torch.set_num_threads`` left as they were (the CPU worker replaces
    ``set_num_threads`` with a no-op for the whole process: it expects a process of its own)."""
    set_threads = torch.set_num_threads
    try:
        with model_classes_kept(), engine_start_quiet():
            yield
    finally:
        torch.set_num_threads = set_threads


# vLLM keeps the forward context of the step it computes (the attention metadata) in a module
# global, and an engine's start and shutdown touch process-wide state (the collector's frozen
# heap, the distributed groups, the model classes): two in-process engines of one run (the
# asynchronous sampler's and evaluation's under ``eval.sampler: run``, in two threads on the
# threads clock) must never do either at once. Every engine call of this package holds it.
ENGINE_LOCK = threading.RLock()


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


def _base_state(model: Any) -> dict[str, torch.Tensor]:
    """The base model's own weights below ``model``'s LoRA adapters (none merged), under the
    base model's parameter names."""
    state = model.get_base_model().state_dict()
    return {n.replace(".base_layer.", "."): t for n, t in state.items() if "lora_" not in n}


def engine_weights(model: Any, *, merged: bool = True) -> dict[str, torch.Tensor]:
    """The weights the engine serves for ``model``: its state dict, or under LoRA the merged
    weights (``merged=False``: the base weights alone, for an engine that applies the adapters
    itself), less a tied output embedding (:func:`tied_output_weights`). Float tensors only
    (buffers such as RoPE tables are the engine's own)."""
    if is_lora(model):
        state = _merged_lora_state(model) if merged else _base_state(model)
    else:
        state = model.state_dict()
    tied = tied_output_weights(model)
    return {n: t.detach() for n, t in state.items() if t.is_floating_point() and n not in tied}


def engine_process_env(device: torch.device, kv_cache_gib: int) -> dict[str, str]:
    """The environment the in-process engine starts under (module docstring)."""
    env = {
        # The engine core in this process (no subprocess, no spawn of __main__).
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        # CPU build: GiB of KV cache.
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
    }
    if device.type == "cpu":
        # In-process, the engine computes on torch's own intra-op threads (RunConfig.threads);
        # it must not pin OpenMP threads to cores that other workers on the machine share.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    return env


def engine_eager(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """On CPU, the engine's few ``torch.compile``d helpers (the sampled token's rank among
    the log-probs) run eagerly: compiling them with inductor costs minutes on a loaded
    2-core machine for nothing the harness reads. Scoped to the engine's calls."""
    if device.type != "cpu":
        return contextlib.nullcontext()
    return torch._dynamo.config.patch(disable=True)


def served_base(model: Any) -> tuple[Any, str]:
    """The base model of ``model`` (below a LoRA wrapper) and the architecture the engine
    serves it as; :class:`EngineError` when the engine has none for it."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    arch = served_architecture(base.config, type(base).__name__)
    if arch is None:
        raise EngineError(
            f"rollout.sampler_backend: vllm cannot serve {type(base).__name__} "
            "(not in the engine's model registry)"
        )
    return base, arch


def write_checkpoint(
    model: Any,
    workdir: str,
    *,
    dtype: str | None = None,
    tokenizer: Any = None,
    merged: bool = True,
) -> None:
    """The policy as a checkpoint directory the engine loads (merged weights under LoRA, or
    the base alone with ``merged=False``): its config naming the served architecture (and
    ``dtype`` when given: an engine told no dtype takes the checkpoint's), its generation
    config and ``tokenizer`` when given."""
    from safetensors.torch import save_file  # noqa: PLC0415 - only when the engine starts

    base, arch = served_base(model)
    base.config.save_pretrained(workdir)
    path = os.path.join(workdir, "config.json")
    with open(path) as f:
        data = json.load(f)
    data["architectures"] = [arch]
    if dtype is not None:
        data["torch_dtype"] = data["dtype"] = dtype
    with open(path, "w") as f:
        json.dump(data, f)
    if tokenizer is not None:
        gen = getattr(base, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(workdir)
        tokenizer.save_pretrained(workdir)
    weights = {
        n: t.detach().to("cpu").contiguous().clone()
        for n, t in engine_weights(model, merged=merged).items()
    }
    save_file(weights, os.path.join(workdir, "model.safetensors"))


def reload_weights(llm: Any, model: Any) -> float:
    """Copy ``model``'s weights into the running engine ``llm`` with vLLM's in-place
    ``reload_weights``; the seconds it took (:class:`EngineError` on failure)."""
    t0 = time.perf_counter()
    weights = list(engine_weights(model).items())
    try:
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
    except Exception as err:
        raise EngineError(f"engine weight sync failed: {type(err).__name__}: {err}") from err
    return time.perf_counter() - t0


def shutdown(llm: Any) -> None:
    """End the engine ``llm`` (its engine core) and collect what it held; never raises."""
    if llm is None:
        return
    with contextlib.suppress(Exception):
        llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


__all__ = [
    "ENGINE_LOCK",
    "ENGINE_WARNINGS",
    "EngineError",
    "engine_eager",
    "engine_process_env",
    "engine_weights",
    "reload_weights",
    "served_base",
    "shutdown",
    "tied_output_weights",
    "write_checkpoint",
    "STDERR_NOISE",
    "engine_start",
    "engine_start_quiet",
    "model_classes_kept",
    "stderr_filtered",
]
